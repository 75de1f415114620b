"""``manage.py dev`` (what ``make run`` runs): ready line, health, and a clean stop."""

from __future__ import annotations

import os
import signal
import sqlite3
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import PYTHON, Ports, Proc, Processes, wait_until
from tests.production_services import redis_url  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def _descendants(pid: int) -> set[int]:
    """Every process below ``pid``, read from /proc (Linux)."""
    found: set[int] = set()
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                children = {int(child) for child in task.read_text().split()}
            except OSError:
                continue
            pending.extend(children - found)
            found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _command(pid: int) -> set[str]:
    """The words of a process's command line (empty for one that is gone)."""
    try:
        return set(Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0"))
    except OSError:
        return set()


def _celery_worker_queues(pid: int) -> list[str]:
    """The ``-Q`` queue of every Celery worker below ``pid``, sorted (``""`` for a worker that
    consumes every queue)."""
    queues: list[str] = []
    for child in _descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if argv[1:3] == ["-m", "celery"] and "worker" in argv:
            queues.append(argv[argv.index("-Q") + 1] if "-Q" in argv else "")
    return sorted(queues)


def _discovery_runs_on_its_own_worker(dev: Proc) -> None:
    """Wait until the stack's ``discovery`` child ran an MCP tool discovery (``manage.py dev``
    queues one per enabled server at start), and check that the ``celery`` child ran none."""

    def ran(child: str) -> list[str]:
        return [line for line in list(dev.lines) if line.strip().startswith(f"{child} |")
                and "Task mcp_registry.discover_server_tools[" in line]

    wait_until("the discovery worker to run a tool discovery",
               lambda: any("succeeded" in line for line in ran("discovery")), timeout=90)
    assert ran("celery") == [], ran("celery")
    assert "Celery: a worker on queue celery (outbox deliveries, housekeeping), a worker on " \
        "queue discovery (MCP tool discovery), beat" in dev.output()


def _discovered_servers(database: Path) -> dict[str, tuple[str | None, str]]:
    """``{server name: (last_discovered_at, last_error)}`` read straight from the database file."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            "SELECT name, last_discovered_at, last_error FROM mcp_registry_mcpserver"
        ).fetchall()
    return {name: (discovered, error) for name, discovered, error in rows}


def test_dev_prints_ready_serves_health_and_stops_every_child(
    processes: Processes, ports: Ports, stack_env: dict[str, str]
) -> None:
    dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(ports.web)])
    ready = dev.wait_for_line("dexagents is ready at", timeout=180)
    assert ready.strip() == f"dexagents is ready at http://127.0.0.1:{ports.web}"
    token_line = dev.wait_for_line("API token for the demo user:")
    token = token_line.rsplit(":", 1)[1].strip()
    assert len(token) >= 20

    health = httpx.get(f"http://127.0.0.1:{ports.web}/healthz", timeout=10)
    assert health.status_code == 200, health.text
    agents = httpx.get(f"http://127.0.0.1:{ports.web}/api/v1/agents/",
                       headers={"Authorization": f"Token {token}"}, timeout=10)
    assert agents.status_code == 200
    assert "demo" in agents.text

    # Production-safe by default: DEBUG is off, with a generated key kept out of the output,
    # and everything the stack serves still works (static files, admin, the login page).
    base = f"http://127.0.0.1:{ports.web}"
    key_file = Path(stack_env["DEXAGENTS_VAR_DIR"]) / "secret_key"
    assert key_file.read_text().strip() not in dev.output()
    missing_page = httpx.get(f"{base}/no-such-page/", timeout=10)
    assert missing_page.status_code == 404
    assert "URLconf" not in missing_page.text  # Django's DEBUG page lists the URL patterns
    missing_api = httpx.get(f"{base}/api/v1/no-such-endpoint/", timeout=10)
    assert (missing_api.status_code, missing_api.headers["content-type"]) == (
        404, "application/json")
    assert set(missing_api.json()) == {"detail"}
    for path in ("/static/agents_app/chat.mjs", "/static/admin/css/base.css", "/admin/login/",
                 "/accounts/login/"):
        assert httpx.get(f"{base}{path}", timeout=10).status_code == 200, path

    # The Celery worker ran the demo server's tool discovery (a real MCP subprocess).
    database = Path(stack_env["DEXAGENTS_VAR_DIR"]) / "db.sqlite3"
    discovered = wait_until(
        "the Celery worker to discover the search server's tools",
        lambda: _discovered_servers(database).get("search", (None, ""))[0], timeout=60)
    assert discovered
    assert _discovered_servers(database)["search"][1] == ""
    # On a Celery worker of its own: one consumes the default queue, the other discovery.
    assert _celery_worker_queues(dev.popen.pid) == ["celery", "discovery"]
    _discovery_runs_on_its_own_worker(dev)

    children = _descendants(dev.popen.pid)
    assert len(children) >= 7, children  # engine, model, worker, celery, discovery, beat, web

    # The web process and the Dex worker die together: the supervisor restarts them side by
    # side, so the worker's restart does not wait for the web's start-up (or the other way).
    killed = [pid for pid in children if _command(pid).intersection({"dexworker", "uvicorn"})]
    assert len(killed) == 2, [_command(pid) for pid in children]
    mark = len(dev.lines)
    for pid in killed:
        os.kill(pid, signal.SIGKILL)

    def back(name: str, ready: str) -> tuple[int, int] | None:
        """Line numbers of ``name``'s restart notice and of its ready line after the kill."""
        lines = dev.lines[mark:]
        notice = next((i for i, line in enumerate(lines)
                       if line.strip().startswith(f"{name} | exited with code -9")), None)
        if notice is None:
            return None
        done = next((i for i, line in enumerate(lines[notice:], notice)
                     if line.strip().startswith(f"{name} |") and ready in line), None)
        return None if done is None else (notice, done)

    def both_back() -> tuple[tuple[int, int], tuple[int, int]] | None:
        worker = back("worker-1", "dexworker ready")
        web = back("web-1", "Application startup complete")
        return (worker, web) if worker and web else None

    worker, web = wait_until("the killed worker and web to be restarted", both_back, timeout=240)
    # Each one's restart began before the other was ready again.
    assert worker[0] < web[1] and web[0] < worker[1], dev.lines[mark:]
    wait_until("/healthz to report every part up again",
               lambda: httpx.get(f"{base}/healthz", timeout=10).status_code == 200, timeout=60)
    children = _descendants(dev.popen.pid)

    os.kill(dev.popen.pid, signal.SIGTERM)
    assert dev.popen.wait(timeout=60) == 0, dev.output()[-3000:]
    wait_until("every child of the stack to exit",
               lambda: not any(_alive(pid) for pid in children), timeout=20)


def test_healthz_names_what_is_down(processes: Processes, ports: Ports) -> None:
    processes.migrate()
    processes.start("web", [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                            "--host", "127.0.0.1", "--port", str(ports.web)]
                    ).wait_for_line("Application startup complete")
    health = httpx.get(f"http://127.0.0.1:{ports.web}/healthz", timeout=30)
    assert health.status_code == 503
    body = health.json()
    assert body["web"] == "up"
    assert body["engine"] == "down"
    assert body["worker"] == "down"


def test_healthz_sees_a_sigkilled_worker_down_within_5_seconds(
    processes: Processes, ports: Ports
) -> None:
    processes.migrate()
    processes.start_engine(ports.engine)
    worker = processes.start("worker", [PYTHON, "manage.py", "dexworker"])
    web = processes.start("web", [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                                  "--host", "127.0.0.1", "--port", str(ports.web)])
    worker.wait_for_line("dexworker ready")
    web.wait_for_line("Application startup complete")
    url = f"http://127.0.0.1:{ports.web}/healthz"
    wait_until("/healthz to report every part up",
               lambda: httpx.get(url, timeout=10).status_code == 200, timeout=30)

    # SIGKILL: no clean stop deletes the heartbeat file; only its age can tell.
    worker.signal_group(signal.SIGKILL)
    worker.popen.wait(timeout=10)
    body = wait_until(
        "/healthz to report the killed worker down",
        lambda: (answer := httpx.get(url, timeout=2)).json()["worker"] == "down" and answer.json(),
        timeout=5.0,
    )
    assert body["unavailable"] == "worker"
    assert body["engine"] == "up"


def test_dev_with_redis_runs_discovery_on_its_own_worker(
    processes: Processes, ports: Ports, stack_env: dict[str, str],
    redis_url: str,  # noqa: F811
) -> None:
    stack_env["REDIS_URL"] = redis_url
    dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(ports.web)])
    dev.wait_for_line("dexagents is ready at", timeout=180)
    # The topology lines follow the ready line, before the token line.
    dev.wait_for_line("API token for the demo user:")
    assert f"Redis: {redis_url} (channel layer" in dev.output()
    assert _celery_worker_queues(dev.popen.pid) == ["celery", "discovery"]
    _discovery_runs_on_its_own_worker(dev)
    assert not (Path(stack_env["DEXAGENTS_VAR_DIR"]) / "celery").exists()
