"""Settings load from the environment, strictly, with zero-setup defaults.

Each case imports the settings module in a fresh interpreter with a controlled environment.
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import hashlib, json
from dexagents_site import settings as s
print(json.dumps({
    "debug": s.DEBUG,
    "secret_key_digest": hashlib.sha256(s.SECRET_KEY.encode()).hexdigest(),
    "allowed_hosts": s.ALLOWED_HOSTS,
    "session_cookie_secure": getattr(s, "SESSION_COOKIE_SECURE", False),
    "db_engine": s.DATABASES["default"]["ENGINE"],
    "db_name": str(s.DATABASES["default"]["NAME"]),
    "db_options": s.DATABASES["default"].get("OPTIONS", {}),
    "channel_backend": s.CHANNEL_LAYERS["default"]["BACKEND"],
    "broker": s.CELERY_BROKER_URL,
    "broker_transport": getattr(s, "CELERY_BROKER_TRANSPORT", None),
    "broker_options": s.CELERY_BROKER_TRANSPORT_OPTIONS,
    "result_backend": getattr(s, "CELERY_RESULT_BACKEND", None),
    "cache": s.CACHES["default"],
    "web_processes": s.DEXAGENTS["WEB_PROCESSES"],
    "workers": s.DEXAGENTS["WORKERS"],
    "conn_max_age": s.DATABASES["default"]["CONN_MAX_AGE"],
    "dex": s.DEXAGENTS["DEX_SERVER_ADDRESS"],
    "embedded_engine": s.DEXAGENTS["EMBEDDED_ENGINE"],
    "web_port": s.DEXAGENTS["WEB_PORT"],
    "demo_api_base": s.DEXAGENTS["DEMO_MODEL_API_BASE"],
    "heartbeat": str(s.DEXAGENTS["WORKER_HEARTBEAT_DIR"]),
    "apps": s.INSTALLED_APPS,
}))
"""

CONTROLLED = (
    "DEBUG",
    "SECRET_KEY",
    "DATABASE_URL",
    "REDIS_URL",
    "DEX_SERVER_ADDRESS",
    "DEX_PORT",
    "DEMO_MODEL_PORT",
    "DEXAGENTS_VAR_DIR",
    "DEXAGENTS_ENGINE_TIMEOUT",
    "PORT",
    "ALLOWED_HOSTS",
    "SESSION_COOKIE_SECURE",
    "CSRF_COOKIE_SECURE",
    "DEXAGENTS_WEB_PROCESSES",
    "DEXAGENTS_WORKERS",
)


def load(tmp_path: Path, **overrides: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in CONTROLLED}
    env["DEXAGENTS_VAR_DIR"] = str(tmp_path / "var")
    env.update(overrides)
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def loaded(tmp_path: Path, **overrides: str) -> dict[str, object]:
    result = load(tmp_path, **overrides)
    assert result.returncode == 0, result.stderr
    data: dict[str, object] = json.loads(result.stdout)
    return data


def test_zero_setup_defaults(tmp_path: Path) -> None:
    data = loaded(tmp_path)
    var = tmp_path / "var"
    assert data["debug"] is False
    assert data["allowed_hosts"] == ["localhost", "127.0.0.1", "[::1]"]
    assert data["session_cookie_secure"] is True
    assert data["db_engine"] == "django.db.backends.sqlite3"
    assert data["db_name"] == str(var / "db.sqlite3")
    options = data["db_options"]
    assert isinstance(options, dict)
    assert "journal_mode=WAL" in options["init_command"]
    assert options["transaction_mode"] == "IMMEDIATE"
    assert data["channel_backend"] == "channels.layers.InMemoryChannelLayer"
    assert data["broker"] == "filesystem://localhost//"
    assert data["broker_transport"] == "agents_app.dev.kombu_filesystem:Transport"
    broker_options = data["broker_options"]
    assert isinstance(broker_options, dict)
    assert Path(broker_options["data_folder_in"]).is_dir()
    assert Path(broker_options["data_folder_in"]).is_relative_to(var / "celery")
    assert data["dex"] == "127.0.0.1:8801"
    assert data["embedded_engine"] is True
    assert data["web_port"] == 8000
    assert data["demo_api_base"] == "http://127.0.0.1:8811/v1"
    assert data["heartbeat"] == str(var / "run" / "workers")
    assert data["result_backend"] is None
    assert data["cache"] == {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}
    assert (data["web_processes"], data["workers"]) == (1, 1)
    assert data["conn_max_age"] == 0
    for app in (
        "agents_app",
        "mcp_registry",
        "rest_framework",
        "drf_spectacular",
        "django_filters",
        "channels",
        "django_celery_beat",
    ):
        assert app in data["apps"]  # type: ignore[operator]


def test_production_switches(tmp_path: Path) -> None:
    data = loaded(
        tmp_path,
        DEBUG="false",
        SECRET_KEY="x" * 60,
        DATABASE_URL="postgres://app:pw@db.internal:5432/dexagents",
        REDIS_URL="redis://cache.internal:6379/0",
        DEX_SERVER_ADDRESS="dex.internal:7233",
        DEMO_MODEL_PORT="9911",
        DEXAGENTS_WEB_PROCESSES="4",
        DEXAGENTS_WORKERS="64",
    )
    assert data["debug"] is False
    assert data["db_engine"] == "django.db.backends.postgresql"
    assert data["db_name"] == "dexagents"
    # No persistent connections under ASGI (see the DATABASES comment in settings).
    assert data["conn_max_age"] == 0
    assert data["channel_backend"] == "channels_redis.core.RedisChannelLayer"
    assert data["broker"] == "redis://cache.internal:6379/0"
    assert data["result_backend"] == "redis://cache.internal:6379/0"
    assert data["broker_transport"] is None
    assert data["cache"] == {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": "redis://cache.internal:6379/0",
        "KEY_PREFIX": "dexagents",
    }
    assert (data["web_processes"], data["workers"]) == (4, 64)
    # The filesystem broker's folders are made only when it is the broker.
    assert not (tmp_path / "var" / "celery").exists()
    assert data["dex"] == "dex.internal:7233"
    assert data["embedded_engine"] is False
    assert data["demo_api_base"] == "http://127.0.0.1:9911/v1"


def test_dex_port_moves_the_default_engine_address(tmp_path: Path) -> None:
    data = loaded(tmp_path, DEX_PORT="9801", PORT="8123")
    assert data["dex"] == "127.0.0.1:9801"
    assert data["embedded_engine"] is True
    assert data["web_port"] == 8123


def test_a_sqlite_database_url_keeps_wal_mode(tmp_path: Path) -> None:
    data = loaded(tmp_path, DATABASE_URL=f"sqlite:///{tmp_path / 'other.sqlite3'}")
    assert data["db_name"] == str(tmp_path / "other.sqlite3")
    options = data["db_options"]
    assert isinstance(options, dict)
    assert "journal_mode=WAL" in options["init_command"]
    assert options["transaction_mode"] == "IMMEDIATE"


def test_without_secret_key_a_random_one_is_kept_under_var(tmp_path: Path) -> None:
    first = loaded(tmp_path)
    key_file = tmp_path / "var" / "secret_key"
    assert key_file.stat().st_mode & 0o777 == 0o600
    key = key_file.read_text().strip()
    assert len(key) >= 50
    assert first["secret_key_digest"] == hashlib.sha256(key.encode()).hexdigest()
    # Every later process (web, worker, Celery) reads the same key.
    assert loaded(tmp_path)["secret_key_digest"] == first["secret_key_digest"]
    # Another var dir is another installation, with a key of its own.
    other = loaded(tmp_path / "other")
    assert other["secret_key_digest"] != first["secret_key_digest"]
    # A key from the environment wins, and no file is needed for it.
    given = loaded(tmp_path / "given", SECRET_KEY="y" * 60)
    assert given["secret_key_digest"] == hashlib.sha256(b"y" * 60).hexdigest()
    assert not (tmp_path / "given" / "var" / "secret_key").exists()


def test_processes_starting_together_agree_on_one_secret_key(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in CONTROLLED}
    env["DEXAGENTS_VAR_DIR"] = str(tmp_path / "var")
    started = [
        subprocess.Popen([sys.executable, "-c", PROBE], cwd=REPO_ROOT, env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    digests = set()
    for process in started:
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        digests.add(json.loads(out)["secret_key_digest"])
    assert len(digests) == 1
    assert not [path.name for path in (tmp_path / "var").iterdir()
                if path.name.startswith(".secret_key.")]


def test_the_old_development_secret_key_is_refused(tmp_path: Path) -> None:
    result = load(
        tmp_path,
        SECRET_KEY="django-insecure-dexagents-development-key-never-use-in-production",
    )
    assert result.returncode != 0
    assert "SECRET_KEY" in result.stderr


def test_debug_is_on_only_when_asked(tmp_path: Path) -> None:
    data = loaded(tmp_path, DEBUG="true")
    assert data["debug"] is True


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("DEBUG", "maybe"),
        ("DEX_PORT", "eighty"),
        ("DEX_PORT", "70000"),
        ("DEMO_MODEL_PORT", "-1"),
        ("DEXAGENTS_ENGINE_TIMEOUT", "0"),
        ("DEXAGENTS_WEB_PROCESSES", "0"),
        ("DEXAGENTS_WEB_PROCESSES", "two"),
        ("DEXAGENTS_WORKERS", "65"),
        ("REDIS_URL", "cache.internal:6379"),
    ],
)
def test_bad_values_fail_loudly(tmp_path: Path, name: str, value: str) -> None:
    result = load(tmp_path, **{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert name in result.stderr


def test_celery_app_is_configured_from_settings() -> None:
    from dexagents_site import celery_app

    assert celery_app.main == "dexagents"
    assert celery_app.conf.broker_url == "filesystem://localhost//"
    from agents_app.dev.kombu_filesystem import Transport

    with celery_app.connection_for_write() as connection:
        assert type(connection.transport) is Transport
    celery_app.loader.import_default_modules()
    assert "mcp_registry.discover_server_tools" in celery_app.tasks


async def test_asgi_routes_http_to_django(engine_down: str, heartbeat_file: Path) -> None:
    from asgiref.testing import ApplicationCommunicator

    from dexagents_site.asgi import application

    communicator = ApplicationCommunicator(
        application,
        {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "GET",
            "scheme": "http",
            "path": "/healthz",
            "raw_path": b"/healthz",
            "query_string": b"",
            "root_path": "",
            "headers": [(b"host", b"localhost")],
            "client": ("127.0.0.1", 50000),
            "server": ("127.0.0.1", 8000),
        },
    )
    await communicator.send_input({"type": "http.request", "body": b"", "more_body": False})
    start = await communicator.receive_output(timeout=30)
    body = await communicator.receive_output(timeout=30)
    assert start["status"] == 503
    assert json.loads(body["body"]) == {
        "web": "up",
        "engine": "down",
        "worker": "down",
        "detail": "The Dex engine and the Dex worker are down.",
        "unavailable": "engine",
    }
    await communicator.wait()


async def test_asgi_websocket_routing_is_wired() -> None:
    from channels.routing import ProtocolTypeRouter

    from dexagents_site.asgi import application

    assert isinstance(application, ProtocolTypeRouter)
    # lifespan: the start-up warm-up (agents_app.live.lifespan)
    assert set(application.application_mapping) == {"http", "websocket", "lifespan"}
