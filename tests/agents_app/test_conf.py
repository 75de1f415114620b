"""``agents_app.conf``: the apps' knobs from ``settings.DEXAGENTS``, with defaults for what a
host project leaves out."""

import re
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from agents_app.conf import KNOWN_KEYS, dexagents_setting, dexagents_settings


def test_a_host_without_dexagents_gets_the_zero_setup_defaults(tmp_path: Path) -> None:
    with override_settings(BASE_DIR=tmp_path):
        from django.conf import settings

        del settings.DEXAGENTS
        knobs = dexagents_settings()
    assert set(knobs) == KNOWN_KEYS
    assert knobs["DEX_SERVER_ADDRESS"] == "127.0.0.1:8801"
    assert knobs["ENGINE_TIMEOUT"] == 5
    assert knobs["VAR_DIR"] == tmp_path / "var"
    assert knobs["WORKER_HEARTBEAT_DIR"] == tmp_path / "var" / "run" / "workers"
    assert knobs["DEMO_MODEL_API_BASE"] == "http://127.0.0.1:8811/v1"
    assert knobs["API_PATH_PREFIX"] == "/api/"


def test_given_keys_win_and_derived_defaults_follow_them(tmp_path: Path) -> None:
    given = {"VAR_DIR": tmp_path / "state", "DEMO_MODEL_PORT": 9123, "ENGINE_TIMEOUT": 9,
             "PROJECT_ONLY_KNOB": "kept"}
    with override_settings(DEXAGENTS=given):
        assert dexagents_setting("ENGINE_TIMEOUT") == 9
        assert dexagents_setting("DEMO_MODEL_API_BASE") == "http://127.0.0.1:9123/v1"
        assert dexagents_setting("DEX_DB_PATH") == tmp_path / "state" / "dex_dev_server.sqlite3"
        assert dexagents_setting("BLOB_CACHE_DIR") == tmp_path / "state" / "dex-cache" / "web"
        # Keys the apps do not know stay readable (the project keeps its own there).
        assert dexagents_setting("PROJECT_ONLY_KNOB") == "kept"
        with pytest.raises(ImproperlyConfigured, match="NO_SUCH_KNOB"):
            dexagents_setting("NO_SUCH_KNOB")


def test_dexagents_must_be_a_dict() -> None:
    with override_settings(DEXAGENTS=["DEX_SERVER_ADDRESS"]), pytest.raises(
        ImproperlyConfigured, match="must be a dict"
    ):
        dexagents_settings()


def test_the_project_settings_set_every_key_the_apps_read() -> None:
    from django.conf import settings

    assert KNOWN_KEYS - {"API_PATH_PREFIX"} <= set(settings.DEXAGENTS)


#: Modules of the wheel that only this repository's own project runs (left out of the wheel).
_PROJECT_ONLY = {"agents_app/dev/devstack.py", "agents_app/management/commands/dev.py"}


def test_the_shipped_apps_neither_read_dexagents_directly_nor_import_the_project() -> None:
    """A host project has no ``dexagents_site`` and may leave keys out of ``DEXAGENTS``: the
    apps go through ``agents_app.conf`` (which has the defaults) and import nothing from the
    project, or an installed app fails where this repository's tests pass."""
    root = Path(__file__).resolve().parents[2]
    offenders = []
    for package in ("agents_app", "mcp_registry", "dex_agents", "dex_dev_server"):
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            # conf.py is the one module that reads the dict.
            if relative in _PROJECT_ONLY or relative == "agents_app/conf.py" or (
                "/migrations/" in relative
            ):
                continue
            for number, line in enumerate(path.read_text().splitlines(), start=1):
                code = line.split("#", 1)[0]
                if "settings.DEXAGENTS" in code or re.search(
                    r"^\s*(from|import)\s+dexagents_site\b", code
                ):
                    offenders.append(f"{relative}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
