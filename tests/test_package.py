"""The ``dexagents`` distribution, installed into a Django project that is not this one.

Builds the wheel from this checkout, checks what it ships (the apps with their templates,
static files and migrations; no tests, no benchmarks, no development tools among its
unconditional requirements), installs it into a fresh virtualenv (dependencies from the
package index, held to the versions of ``requirements.txt`` with ``-c``), copies the minimal
host project of ``tests/package_host`` next to it, migrates, and runs one demo turn: the
embedded engine, the demo model, the host's ``manage.py dexworker`` and the host's ASGI app
under uvicorn, all from the virtualenv, with the session started over the host's REST API.

Run time: about 70 s of CPU once pip's cache holds the dependencies, most of it pip installing
about 100 distributions into the new virtualenv (on this 2-core machine, 2.5 min of wall time
when idle, more when other tests share it; the very first run also downloads the dependencies).
Select it with ``pytest -m package``.
"""

from __future__ import annotations

import asyncio
import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from dex_agents.testing import free_port
from tests.e2e.conftest import Processes, wait_until

pytestmark = [pytest.mark.package, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parent.parent
HOST_PROJECT = Path(__file__).resolve().parent / "package_host"

#: Distributions that must never be unconditional requirements of the wheel.
DEV_ONLY = ("mypy", "hypothesis", "dbos", "langgraph", "pytest", "ruff", "schemathesis",
            "playwright", "django-stubs", "factory-boy", "types-")


def _requirement_name(requirement: str) -> str:
    """``"Django<6,>=5.2"`` → ``"django"`` (PEP 503 normalised)."""
    name = re.split(r"[\s;<>=!~\[(]", requirement.strip(), maxsplit=1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float) -> str:
    done = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this checkout with its declared backend (pip's build isolation)."""
    out = tmp_path_factory.mktemp("wheel")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(out), str(ROOT)],
         cwd=ROOT, env=dict(os.environ), timeout=600)
    (built,) = out.glob("dexagents-*.whl")
    return built


def test_the_wheel_ships_the_apps_and_not_the_project_around_them(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata_name = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"agents_app", "mcp_registry", "dex_agents", "dex_dev_server",
                    next(t for t in tops if t.endswith(".dist-info"))}, tops
    for expected in ("agents_app/templates/agents_app/base.html",
                     "agents_app/templates/agents_app/403.html",
                     "agents_app/static/agents_app/site.css",
                     "agents_app/static/agents_app/chat.mjs",
                     "agents_app/migrations/0001_initial.py",
                     "mcp_registry/migrations/0001_initial.py",
                     "agents_app/management/commands/dexworker.py",
                     "agents_app/demo/model_server.py",
                     "mcp_registry/demo_servers/search.py",
                     "dex_dev_server/__main__.py"):
        assert expected in names, expected
    # The site-wide 404/403 pages stay the dexagents project's (templates/ at the repository
    # root): an installed app must not replace its host's.
    assert not [n for n in names if n.endswith(("templates/404.html", "templates/403.html"))]
    # `manage.py dev` runs this repository's project, not a host's.
    assert "agents_app/management/commands/dev.py" not in names
    assert "agents_app/dev/devstack.py" not in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "dexagents_site/"))
                or "__pycache__" in n or n.endswith(".pyc")]

    requires = metadata.get_all("Requires-Dist") or []
    unconditional = [_requirement_name(r) for r in requires if "extra ==" not in r]
    assert "django" in unconditional and "dex-python-sdk" in unconditional, unconditional
    leaked = [name for name in unconditional if name.startswith(DEV_ONLY)]
    assert not leaked, f"development tools among the runtime requirements: {leaked}"
    by_extra: dict[str, set[str]] = {}
    for requirement in requires:
        marker = re.search(r"extra == ['\"]([\w-]+)['\"]", requirement)
        if marker:
            by_extra.setdefault(marker.group(1), set()).add(_requirement_name(requirement))
    assert {"mypy", "hypothesis", "pytest"} <= by_extra["dev"], by_extra
    assert {"dbos", "langgraph", "langgraph-checkpoint-sqlite"} <= by_extra["bench"], by_extra


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv (never this checkout's ``.venv``) with the wheel installed; returns
    its ``python``."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    venv.EnvBuilder(with_pip=True, clear=True).create(root)
    python = root / "bin" / "python"
    assert Path(sys.prefix).resolve() not in python.resolve().parents
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    # --no-compile: the processes compile only the modules they import, not all of LiteLLM.
    _run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
          "--no-compile", str(wheel), "-c", str(ROOT / "requirements.txt")],
         cwd=root, env=env, timeout=1200)
    return python


@pytest.fixture
def host(installed: Path, tmp_path: Path) -> Iterator[tuple[Processes, Path]]:
    """The host project copied into ``tmp_path/host``, with processes started from there."""
    project = tmp_path / "host"
    shutil.copytree(HOST_PROJECT, project, ignore=shutil.ignore_patterns("__pycache__"))
    (project / "__init__.py").unlink()  # a project folder, not a package
    engine_port, model_port, web_port = free_port(), free_port(), free_port()
    keep = {"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "SSL_CERT_FILE", "PIP_CONFIG_FILE"}
    env = {k: v for k, v in os.environ.items() if k in keep}
    env.update({
        "DJANGO_SETTINGS_MODULE": "hostsite.settings",
        "DEX_SERVER_ADDRESS": f"127.0.0.1:{engine_port}",
        "DEMO_MODEL_PORT": str(model_port),
        "WEB_PORT": str(web_port),
        "ENGINE_PORT": str(engine_port),
        "PYTHONUNBUFFERED": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MODE": "PRODUCTION",
    })
    processes = Processes(env, cwd=project)
    try:
        yield processes, installed
    finally:
        processes.stop_all()


async def _first_frames(url: str, token: str, *, count: int) -> list[dict[str, Any]]:
    """The first ``count`` frames of a session events socket opened with ``token``."""
    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"}) as socket:
        return [json.loads(await asyncio.wait_for(socket.recv(), 30)) for _ in range(count)]


def _installed_location(python: Path, cwd: Path, env: dict[str, str]) -> str:
    return _run([str(python), "-c", "import agents_app; print(agents_app.__file__)"],
                cwd=cwd, env=env, timeout=60).strip()


def test_a_host_project_migrates_and_runs_a_demo_turn(
    host: tuple[Processes, Path],
) -> None:
    processes, python = host
    project, env = processes.cwd, processes.env
    py = str(python)

    # The apps come from the virtualenv, not from this checkout.
    location = _installed_location(python, project, env)
    assert "site-packages" in location and str(ROOT) not in location, location

    _run([py, "manage.py", "check", "--fail-level", "ERROR"], cwd=project, env=env, timeout=120)
    found = _run([py, "manage.py", "findstatic", "agents_app/urls.mjs", "agents_app/site.css"],
                 cwd=project, env=env, timeout=60)
    assert found.count("site-packages/agents_app/static/agents_app/") == 2, found
    _run([py, "manage.py", "migrate", "--noinput"], cwd=project, env=env, timeout=300)
    _run([py, "manage.py", "seed_demo"], cwd=project, env=env, timeout=120)
    token = _run([py, "manage.py", "createtoken", "host-user"],
                 cwd=project, env=env, timeout=60).strip().splitlines()[-1]

    processes.start("engine", [py, "-m", "dex_dev_server", "--host", "127.0.0.1",
                               "--port", env["ENGINE_PORT"],
                               "--db", str(project / "var" / "dex.sqlite3")]
                    ).wait_for_line("dex_dev_server ready on")
    processes.start("model", [py, "-m", "agents_app.demo.model_server", "--host", "127.0.0.1",
                              "--port", env["DEMO_MODEL_PORT"]]
                    ).wait_for_line("demo model ready on")
    processes.start("worker", [py, "manage.py", "dexworker"]).wait_for_line("dexworker ready")
    processes.start("web", [py, "-m", "uvicorn", "hostsite.asgi:application",
                            "--host", "127.0.0.1", "--port", env["WEB_PORT"]]
                    ).wait_for_line("Application startup complete")

    base = f"http://127.0.0.1:{env['WEB_PORT']}"
    api = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert api.get("/").text == "host project home"
    missing = api.get("/agents/api/v1/no-such-thing/")
    assert missing.status_code == 404, missing.text
    assert missing.json()["detail"].startswith("Not found"), missing.text
    created = api.post("/agents/api/v1/sessions/",
                       json={"agent": "demo", "message": "hello from the host project"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]

    def answered() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = api.get(f"/agents/api/v1/sessions/{session_id}/").json()
        assert snapshot.get("last_turn_error") in (None, ""), snapshot
        if snapshot["status"] != "waiting_for_user_message":
            return None
        replies = [m for m in snapshot["messages"] if m["role"] == "assistant"]
        return snapshot if replies else None

    snapshot = wait_until("the demo agent's answer", answered, timeout=90)
    reply = [m for m in snapshot["messages"] if m["role"] == "assistant"][-1]
    assert "hello from the host project" in reply["text"], snapshot

    # The host's ASGI app routes the websockets: the relay replays the turn's AgentEvents.
    frames = asyncio.run(_first_frames(
        f"ws://127.0.0.1:{env['WEB_PORT']}/ws/sessions/{session_id}/events/", token, count=3))
    assert [frame["type"] for frame in frames] == ["event"] * 3, frames
    assert all(frame["token"] for frame in frames), frames

    # The pages render from the installed templates, at the prefix the host chose, and their
    # links are reversed against the host's URLconf.
    browser = httpx.Client(base_url=base, timeout=30)
    login = browser.get("/agents/")
    assert login.status_code == 302 and login.headers["location"].startswith(
        "/accounts/login/?next=/agents/"), login.headers
    _run([py, "manage.py", "shell", "-c",
          "from django.contrib.auth import get_user_model as m; "
          "u = m().objects.get(username='host-user'); u.set_password('pw-host-1'); u.save()"],
         cwd=project, env=env, timeout=60)
    form = browser.get("/accounts/login/")
    assert form.status_code == 200 and "<form" in form.text
    signed_in = browser.post("/accounts/login/?next=/agents/sessions/", data={
        "username": "host-user", "password": "pw-host-1",
        "csrfmiddlewaretoken": browser.cookies["csrftoken"],
    })
    assert signed_in.status_code == 302, signed_in.text[:2000]
    listing = browser.get("/agents/sessions/")
    assert listing.status_code == 200, listing.text[:2000]
    assert f'href="/agents/sessions/{session_id}/"' in listing.text
    assert 'href="/static/agents_app/site.css"' in listing.text
    # The page modules read the mounts from these (agents_app/static/agents_app/urls.mjs).
    assert '<meta name="dexagents-sessions-page" content="/agents/sessions/">' in listing.text
    assert '<meta name="dexagents-sessions-api" content="/agents/api/v1/sessions/">' in listing.text
    chat = browser.get(f"/agents/sessions/{session_id}/")
    assert chat.status_code == 200 and 'id="chat-title"' in chat.text, chat.text[:2000]
