"""MCP tool discovery runs on a Celery queue of its own (``CELERY_TASK_ROUTES``), consumed by a
worker of its own, so a discovery that hangs on a server does not delay an outbox delivery.

Real Celery workers, started with the argv ``manage.py dev`` gives them, on the filesystem
broker (no ``REDIS_URL``) and on Redis; a real stdio MCP server process that never answers the
handshake, with a start-up timeout far longer than the test's deadlines.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents_app.management.commands.dev import celery_queues, celery_worker_argv
from tests.e2e.conftest import PYTHON, Processes, wait_until
from tests.production_services import redis_url  # noqa: F401 (fixture)

DEADLINE_SECONDS = 60.0
# Far past every deadline of this test: a worker that ran this discovery could run nothing
# else until the test failed.
HANG_SECONDS = 600

# Writes its PID to argv[1] (whole, by a rename), then reads requests and never answers.
HANGING_SERVER = """\
import os, sys
with open(sys.argv[1] + ".part", "w") as marker:
    marker.write(str(os.getpid()))
os.replace(sys.argv[1] + ".part", sys.argv[1])
for line in sys.stdin:
    pass
"""


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


@pytest.fixture(params=["filesystem", "redis"])
def processes(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Processes]:
    """Processes on a migrated SQLite database under ``tmp_path``, with the filesystem broker
    or (``redis``) a Redis logical database of their own."""
    env = {key: value for key, value in os.environ.items()
           if key not in {"REDIS_URL", "DATABASE_URL", "DEX_SERVER_ADDRESS"}}
    env.update({
        "DEXAGENTS_VAR_DIR": str(tmp_path / "var"),
        "DATABASE_URL": f"sqlite:///{tmp_path / 'var' / 'db.sqlite3'}",
        "PYTHONUNBUFFERED": "1",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_MODE": "PRODUCTION",
    })
    if request.param == "redis":
        env["REDIS_URL"] = request.getfixturevalue("redis_url")
    started = Processes(env)
    started.migrate()
    try:
        yield started
    finally:
        started.stop_all()


def test_a_hanging_discovery_does_not_delay_an_outbox_delivery(
    processes: Processes, tmp_path: Path
) -> None:
    default_queue, discovery_queue = celery_queues()
    assert default_queue != discovery_queue
    worker = processes.start("celery", celery_worker_argv(
        queue=default_queue, node="default-queue@%h", python=PYTHON))
    discovery = processes.start("discovery", celery_worker_argv(
        queue=discovery_queue, node="discovery-queue@%h", python=PYTHON))
    worker.wait_for_line(" ready.", timeout=DEADLINE_SECONDS * 2)
    discovery.wait_for_line(" ready.", timeout=DEADLINE_SECONDS * 2)

    script = tmp_path / "hanging_server.py"
    script.write_text(HANGING_SERVER)
    marker = tmp_path / "hanging_server.pid"
    processes.run([PYTHON, "manage.py", "shell", "-c", (
        "from mcp_registry.models import McpServer; "
        "from mcp_registry.services import server_discovery_enqueue; "
        f"server = McpServer.objects.create(name='hangs', transport='stdio', "
        f"command={sys.executable!r}, args=[{str(script)!r}, {str(marker)!r}], "
        f"startup_timeout={HANG_SECONDS}); "
        "server_discovery_enqueue(server=server)"
    )], timeout=DEADLINE_SECONDS * 2)
    server_pid = int(wait_until("the hanging MCP server to start",
                                lambda: marker.read_text() if marker.exists() else None,
                                timeout=DEADLINE_SECONDS))

    # An outbox delivery (the periodic sweep), queued while the discovery hangs, is done.
    task_id = processes.run([PYTHON, "-c", (
        "from dexagents_site import celery_app; "
        "print(celery_app.send_task('agents_app.deliver_outbox').id)"
    )], timeout=DEADLINE_SECONDS * 2).strip().splitlines()[-1]
    worker.wait_for_line(f"Task agents_app.deliver_outbox[{task_id}] succeeded",
                         timeout=DEADLINE_SECONDS)

    # ... while the discovery still waits on the server, in the other worker only.
    assert _alive(server_pid)
    ran_discovery = [line for line in list(discovery.lines) if "Task mcp_registry." in line]
    assert len(ran_discovery) == 1 and " received" in ran_discovery[0], discovery.output()
    assert not any("Task mcp_registry." in line for line in list(worker.lines)), worker.output()
    assert not any("Task agents_app." in line for line in list(discovery.lines)), (
        discovery.output())

    # Its worker killed, the server's guard stops the server (no orphan left by this test).
    discovery.signal_group(signal.SIGKILL)
    wait_until("the hanging MCP server to be stopped", lambda: not _alive(server_pid),
               timeout=DEADLINE_SECONDS)
