"""The Dex worker reports the stdio MCP server processes it runs (``McpServerProcess``, shown in
admin): real engine, worker, web, demo model and the demo ``search`` server."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Ports, Processes, wait_until

pytestmark = pytest.mark.e2e


def _process_row(database: Path) -> dict[str, Any] | None:
    with sqlite3.connect(database) as connection:
        connection.row_factory = sqlite3.Row
        row = connection.execute(
            "SELECT p.* FROM mcp_registry_mcpserverprocess p JOIN mcp_registry_mcpserver s"
            " ON s.id = p.server_id WHERE s.name = 'search'"
        ).fetchone()
    return dict(row) if row is not None else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_the_worker_reports_its_mcp_server_processes(
    processes: Processes, ports: Ports, stack_env: dict[str, str]
) -> None:
    worker = processes.start_platform(ports).worker
    token = processes.create_token("e2e-user")
    api = httpx.Client(base_url=f"http://127.0.0.1:{ports.web}",
                       headers={"Authorization": f"Token {token}"}, timeout=30)
    message = "/tool search__web_search " + json.dumps({"query": "durable agents"})
    created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
    assert created.status_code == 201, created.text

    database = Path(stack_env["DEXAGENTS_VAR_DIR"]) / "db.sqlite3"
    row = wait_until(
        "the worker to report the running search server",
        lambda: (found := _process_row(database)) and found["state"] == "running"
        and found["server_pid"] and found,
        timeout=90,
    )
    assert row["worker"] == f"{socket.gethostname()}:{worker.popen.pid}"
    assert row["restarts"] == 0 and row["error"] == ""
    assert _alive(row["server_pid"]) and _alive(row["guard_pid"])

    worker.stop()
    stopped = wait_until(
        "the stop to be reported",
        lambda: (found := _process_row(database)) and found["state"] == "stopped" and found,
    )
    assert stopped["ended_at"] is not None
    wait_until("the server process to be gone", lambda: not _alive(row["server_pid"]))
