"""Real-process fixtures for end-to-end tests: each part of the platform as its own process."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from dex_agents.testing import free_port

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
T = TypeVar("T")

# The line each platform process prints once it serves (``Proc.wait_for_line`` markers).
ENGINE_READY = "dex_dev_server ready on"
DEMO_MODEL_READY = "demo model ready on"
WORKER_READY = "dexworker ready"
WEB_READY = "Application startup complete"


def wait_until(description: str, probe: Callable[[], T | None], *, timeout: float = 60.0,
               interval: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy, failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            result = probe()
        except Exception as error:  # the probe's target may still be starting
            last_error = error
        else:
            if result:
                return result
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {description}"
                         + (f" (last error: {last_error!r})" if last_error else ""))


def wait_for_reply(api: httpx.Client, session_id: str, message_count: int, *,
                   timeout: float) -> dict[str, Any]:
    """Poll the session's snapshot (``GET /api/v1/sessions/<id>/`` through ``api``) until the
    session waits for the next user message with at least ``message_count`` messages, and
    return that snapshot (the decoded JSON body).

    Raises:
        AssertionError: a snapshot reports a ``last_turn_error``, or the session did not wait
            with that many messages within ``timeout`` seconds.
    """

    def probe() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot.get("last_turn_error") in (None, ""), snapshot
        if (snapshot["status"] == "waiting_for_user_message"
                and len(snapshot["messages"]) >= message_count):
            return snapshot
        return None

    return wait_until("the session to wait for the next message", probe, timeout=timeout)


@dataclass
class Proc:
    """A child process whose output is collected line by line."""

    name: str
    popen: subprocess.Popen[bytes]
    lines: list[str] = field(default_factory=list)

    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for_line(self, marker: str, timeout: float = 90.0) -> str:
        def probe() -> str | None:
            for line in self.lines:
                if marker in line:
                    return line
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited ({self.popen.returncode}):\n"
                                     + self.output()[-4000:])
            return None

        try:
            return wait_until(f"{self.name} to print {marker!r}", probe, timeout=timeout)
        except AssertionError as error:
            raise AssertionError(f"{error}\n--- {self.name} output ---\n"
                                 + self.output()[-4000:]) from None

    def signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signum)

    def stop(self, timeout: float = 15.0, *, signalled: bool = False) -> int:
        """SIGTERM the group (unless ``signalled``: the caller sent it already; a second
        SIGTERM may mean "hurry" to some programs), wait up to ``timeout`` s, then SIGKILL."""
        if self.popen.poll() is None:
            if not signalled:
                self.signal_group(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                self.popen.wait()
        self.signal_group(signal.SIGKILL)  # leftovers of the group, if any
        return self.popen.returncode


@dataclass
class PlatformProcs:
    """The four processes of a platform that runs turns (``Processes.start_platform``)."""

    engine: Proc
    model: Proc
    worker: Proc
    web: Proc


class Processes:
    """Starts processes in their own groups and stops every one at teardown.

    ``cwd`` is where every child runs (this checkout unless given: a host project's folder
    for the package test, since ``python -m`` puts the working directory on ``sys.path``).
    """

    def __init__(self, env: dict[str, str], *, cwd: Path = ROOT) -> None:
        self.env = env
        self.cwd = cwd
        self.started: list[Proc] = []

    def start(self, name: str, argv: list[str]) -> Proc:
        popen = subprocess.Popen(
            argv, cwd=self.cwd, env=self.env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
        proc = Proc(name, popen)

        def relay() -> None:
            assert popen.stdout is not None
            for raw in popen.stdout:
                proc.lines.append(raw.decode(errors="replace").rstrip("\n"))

        threading.Thread(target=relay, daemon=True).start()
        self.started.append(proc)
        return proc

    def start_engine(self, port: int, *, wait: bool = True) -> Proc:
        """Start the embedded engine (``python -m dex_dev_server``, named ``engine``) on
        127.0.0.1:``port`` with its database ``dex.sqlite3`` in ``env``'s
        ``DEXAGENTS_VAR_DIR``; with ``wait``, return once it prints its ready line.

        Raises:
            AssertionError: with ``wait``, it exited or was not ready within 90 s.
        """
        engine = self.start("engine", [
            PYTHON, "-m", "dex_dev_server", "--host", "127.0.0.1", "--port", str(port),
            "--db", f"{self.env['DEXAGENTS_VAR_DIR']}/dex.sqlite3",
        ])
        if wait:
            engine.wait_for_line(ENGINE_READY)
        return engine

    def start_demo_model(self, port: int, *, wait: bool = True) -> Proc:
        """Start the demo model (``python -m agents_app.demo.model_server``, named ``model``)
        on 127.0.0.1:``port``; with ``wait``, return once it prints its ready line.

        Raises:
            AssertionError: with ``wait``, it exited or was not ready within 90 s.
        """
        model = self.start("model", [PYTHON, "-m", "agents_app.demo.model_server",
                                     "--host", "127.0.0.1", "--port", str(port)])
        if wait:
            model.wait_for_line(DEMO_MODEL_READY)
        return model

    def start_platform(self, ports: Ports) -> PlatformProcs:
        """Give this stack a migrated database with the demo seeded (``migrate``, then
        ``manage.py seed_demo``), start the engine, the demo model, ``manage.py dexworker``
        and uvicorn serving ``dexagents_site.asgi`` on ``ports``, each once the one before it
        is ready, and return them when the web process is ready too.

        Raises:
            AssertionError: ``seed_demo`` failed, or a process exited or was not ready
                within 90 s.
        """
        self.migrate()
        self.run([PYTHON, "manage.py", "seed_demo"])
        engine = self.start_engine(ports.engine)
        model = self.start_demo_model(ports.model)
        worker = self.start("worker", [PYTHON, "manage.py", "dexworker"])
        worker.wait_for_line(WORKER_READY)
        web = self.start("web", [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                                 "--host", "127.0.0.1", "--port", str(ports.web)])
        web.wait_for_line(WEB_READY)
        return PlatformProcs(engine=engine, model=model, worker=worker, web=web)

    def migrate(self) -> None:
        """Give this stack a migrated database: a copy of ``migrated_template()`` at the
        SQLite path of ``DATABASE_URL`` (what ``manage.py migrate`` would make there)."""
        url = self.env["DATABASE_URL"]
        assert url.startswith("sqlite:///"), url
        target = Path(url.removeprefix("sqlite:///"))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(migrated_template(self.env), target)

    def run(self, argv: list[str], timeout: float = 180.0) -> str:
        done = subprocess.run(argv, cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=False)
        assert done.returncode == 0, f"{argv} failed:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    def create_token(self, username: str, *, staff: bool = False) -> str:
        """``manage.py createtoken`` for ``username`` (created if missing; made staff with
        ``staff``) on this stack's database; returns the new API token's key.

        Raises:
            AssertionError: the command failed.
        """
        argv = [PYTHON, "manage.py", "createtoken", username, *(["--staff"] if staff else [])]
        return self.run(argv).strip().splitlines()[-1]

    def stop_all(self, timeout: float = 15.0) -> None:
        """Stop every process: SIGTERM to all but the engine at once, then the engine.

        One after the other, a stack's teardown took the sum of its processes' clean stops
        (Celery ~7 s and the Dex worker ~3 s on a loaded machine); together it takes the
        longest. The engine goes last so the Dex worker can still leave it cleanly. A process
        still running ``timeout`` seconds after its SIGTERM gets SIGKILL, as ``Proc.stop``.
        """
        running = list(reversed(self.started))
        first = [proc for proc in running if proc.name != "engine"]
        last = [proc for proc in running if proc.name == "engine"]
        for batch in (first, last):
            signalled = [proc.popen.poll() is None for proc in batch]
            for proc, alive in zip(batch, signalled, strict=True):
                if alive:
                    proc.signal_group(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for proc, alive in zip(batch, signalled, strict=True):
                proc.stop(timeout=max(0.0, deadline - time.monotonic()), signalled=alive)


_TEMPLATE_DIR: Path | None = None


def migrated_template(env: dict[str, str]) -> Path:
    """A SQLite database that ``manage.py migrate`` made, once per test process.

    Every stack used to run ``migrate`` on its own empty file: a Django start plus every
    migration, 5-10 s each on a loaded 2-core CI machine, for the same result each time. The
    stacks copy this file instead (``Processes.migrate``); ``test_dev_stack`` still runs the
    real ``migrate`` through ``manage.py dev``. ``env`` is a stack's environment (only its
    database and var dir are replaced). The directory is removed when the process exits.
    """
    global _TEMPLATE_DIR
    if _TEMPLATE_DIR is not None:
        return _TEMPLATE_DIR / "db.sqlite3"
    root = Path(tempfile.mkdtemp(prefix="dexagents-migrated-"))
    database = root / "db.sqlite3"
    done = subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput"], cwd=ROOT,
        env={**env, "DATABASE_URL": f"sqlite:///{database}", "DEXAGENTS_VAR_DIR": str(root)},
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr}"
    # The database runs in WAL mode: fold the log into the file so one file is the database.
    with contextlib.closing(sqlite3.connect(database)) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    _TEMPLATE_DIR = root
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return database


@dataclass
class Ports:
    web: int
    engine: int
    model: int


def platform_env(var_dir: Path, ports: Ports, *, leave_out: Collection[str] = (),
                 extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of an isolated platform, as ``{name: value}``: this process's environment
    without what would join it to shared services (``DEX_SERVER_ADDRESS``, ``DATABASE_URL``,
    ``REDIS_URL``) and without the names in ``leave_out``; its own var dir ``var_dir`` and
    SQLite database in it; the web, engine and demo model ``ports``; LiteLLM kept offline
    (its bundled cost map); then ``extra`` on top. Creates nothing on disk."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"DEX_SERVER_ADDRESS", "DATABASE_URL", "REDIS_URL", *leave_out}}
    env.update({
        "DEXAGENTS_VAR_DIR": str(var_dir),
        "DATABASE_URL": f"sqlite:///{var_dir / 'db.sqlite3'}",
        "PORT": str(ports.web),
        "DEX_PORT": str(ports.engine),
        "DEMO_MODEL_PORT": str(ports.model),
        "PYTHONUNBUFFERED": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MODE": "PRODUCTION",
    })
    env.update(extra or {})
    return env


@pytest.fixture
def ports() -> Ports:
    return Ports(web=free_port(), engine=free_port(), model=free_port())


@pytest.fixture
def stack_env(tmp_path: Path, ports: Ports) -> dict[str, str]:
    """Environment for an isolated platform: its own var dir, database and ports."""
    (tmp_path / "var").mkdir()
    return platform_env(tmp_path / "var", ports)


@pytest.fixture
def processes(stack_env: dict[str, str]) -> Iterator[Processes]:
    procs = Processes(stack_env)
    try:
        yield procs
    finally:
        procs.stop_all()


# Fixtures of the page tests, taken by name in every e2e module: Chromium (``playwright`` and
# ``browser``, module scope), the one shared ``manage.py dev`` stack (``page_stack``, session
# scope; ``stack``, its module-scoped name) and browser contexts on it (``contexts``). A module
# with its own platform defines its own ``stack``, which wins over this one.
from tests.e2e.browser import browser, playwright  # noqa: E402, F401
from tests.e2e.page_stack import contexts, page_stack, stack  # noqa: E402, F401
