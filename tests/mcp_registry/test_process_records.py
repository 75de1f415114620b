"""Issue 23 points 4, 8 and 10 on the Django side: per-scope process rows with how a process
ended, bounded; the HTTP sessions a worker holds, ended by the next worker after a kill; the
admin page says what each isolation level lets cross and shows crashes."""

from __future__ import annotations

import asyncio
import html
import os
import socket
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from agents_app.selectors.session_reads import sessions_stopped
from mcp_registry.client import McpHttpSession as McpHttpSessionEvent
from mcp_registry.client import McpProcessStatus
from mcp_registry.models import ISOLATION_CROSSES, McpHttpSession, McpServer, McpServerProcess
from mcp_registry.services import (
    PROCESS_ENDED_ROWS_KEPT,
    http_session_record,
    http_sessions_orphaned,
    process_status_record,
)
from tests.factories import McpServerFactory

pytestmark = pytest.mark.django_db

HOST = socket.gethostname()
LIVE_WORKER = f"{HOST}:{os.getpid()}"


def dead_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def status(scope: str, *, state: str = "running", minutes: int = 0, **extra: Any) -> Any:
    started = datetime(2026, 12, 1, tzinfo=UTC) + timedelta(minutes=minutes)
    values: dict[str, Any] = {
        "server": "files", "state": state, "guard_pid": 10, "server_pid": 11, "restarts": 0,
        "started_at": started, "ended_at": None if state == "running" else started,
        "stderr_tail": ("line",), "scope": scope,
    }
    values.update(extra)
    return McpProcessStatus(**values)


def test_each_process_start_of_each_scope_has_its_row() -> None:
    McpServerFactory.create(name="files")
    process_status_record(status=status("session ses_1"), worker=LIVE_WORKER)
    process_status_record(status=status("session ses_2"), worker=LIVE_WORKER)
    process_status_record(
        status=status("session ses_1", state="exited", exit_code=3,
                      error="the server process exited with code 3"),
        worker=LIVE_WORKER,
    )
    process_status_record(status=status("session ses_1", minutes=1), worker=LIVE_WORKER)
    rows = list(McpServerProcess.objects.order_by("scope", "started_at").values_list(
        "scope", "state", "exit_code"))
    assert rows == [
        ("session ses_1", "exited", 3),
        ("session ses_1", "running", None),
        ("session ses_2", "running", None),
    ]


def test_ended_rows_are_bounded_per_server_and_kind() -> None:
    McpServerFactory.create(name="files")
    for minute in range(PROCESS_ENDED_ROWS_KEPT + 5):
        process_status_record(status=status(f"session ses_{minute}", state="stopped",
                                            minutes=minute), worker=LIVE_WORKER)
    process_status_record(status=status("session crash", state="exited", exit_code=1),
                          worker=LIVE_WORKER)
    assert McpServerProcess.objects.filter(state="stopped").count() == PROCESS_ENDED_ROWS_KEPT
    assert McpServerProcess.objects.filter(state="exited").count() == 1


def test_http_sessions_are_kept_while_open_and_orphans_are_the_dead_workers() -> None:
    server = McpServerFactory.create(name="remote", transport="streamable_http",
                              url="http://127.0.0.1:9/mcp")
    dead_worker = f"{HOST}:{dead_pid()}"

    def event(session_id: str, *, open: bool) -> McpHttpSessionEvent:
        return McpHttpSessionEvent(server="remote", session_id=session_id,
                                   scope="session ses_1", protocol_version="2025-11-25",
                                   open=open)

    http_session_record(session=event("live", open=True), worker=LIVE_WORKER)
    http_session_record(session=event("orphan", open=True), worker=dead_worker)
    http_session_record(session=event("closed", open=True), worker=LIVE_WORKER)
    http_session_record(session=event("closed", open=False), worker=LIVE_WORKER)
    McpHttpSession.objects.create(server=server, worker="elsewhere:1", scope="shared",
                                  session_id="other-host")
    assert sorted(McpHttpSession.objects.values_list("session_id", flat=True)) == [
        "live", "orphan", "other-host"
    ]
    assert [row.session_id for row in http_sessions_orphaned(host=HOST)] == ["orphan"]


@pytest.mark.django_db(transaction=True)
def test_orphaned_http_sessions_are_ended_and_forgotten(tmp_path: Any) -> None:
    from mcp_registry.services import http_sessions_orphaned_close
    from tests.mcp_registry.test_isolation import HttpEverything

    everything = HttpEverything(tmp_path / "log")
    try:
        server = McpServerFactory.create(name="everything", transport="streamable_http",
                                  url=everything.spec.url)

        async def open_and_abandon() -> str:
            from asgiref.sync import sync_to_async

            from mcp_registry.client import McpClientPool, McpScope
            from mcp_registry.selectors import server_spec_build

            spec = await sync_to_async(server_spec_build)(server=server)
            ids: list[str] = []
            pool = McpClientPool(on_http_session=lambda s: ids.append(s.session_id))
            await pool.call_tool(spec, "echo", {"message": "x"}, idempotency_key=None,
                                 timeout=None, scope=McpScope("ses_1"))
            # Forget the pool without closing it, as a SIGKILL would: no DELETE is sent.
            pool._connections.clear()
            return ids[0]

        session_id = asyncio.run(open_and_abandon())
        McpHttpSession.objects.create(server=server, worker=f"{HOST}:{dead_pid()}",
                                      scope="session ses_1", session_id=session_id,
                                      protocol_version="2025-11-25")
        assert asyncio.run(http_sessions_orphaned_close(host=HOST)) == 1
        assert everything.terminated(session_id)
        assert not McpHttpSession.objects.exists()
    finally:
        everything.stop()


def test_sessions_stopped_names_stopped_and_unknown_sessions() -> None:
    from tests.factories import AgentSessionFactory

    AgentSessionFactory(id="ses_running", status="running_tools")
    AgentSessionFactory(id="ses_stopped", status="stopped")
    assert sessions_stopped(session_ids={"ses_running", "ses_stopped", "ses_gone"}) == {
        "ses_stopped", "ses_gone"
    }


def test_admin_shows_isolation_and_crashes(superuser: Any) -> None:
    server = McpServerFactory.create(name="files", isolation=McpServer.Isolation.USER)
    process_status_record(
        status=status("session ses_1", state="exited", exit_code=3,
                      error="the server process exited with code 3",
                      stderr_tail=("stub: disk is on fire",)),
        worker=LIVE_WORKER,
    )
    client = Client()
    client.force_login(superuser)
    page = client.get(reverse("admin:mcp_registry_mcpserver_change", args=[server.pk]))
    text = page.content.decode()
    for level in ("session", "user", "shared"):
        assert html.escape(ISOLATION_CROSSES[level]) in text
    assert "\u2192 <strong>user</strong>" in text
    assert "exited with code 3, PID 11 (guard 10), 0 restarts, for session ses_1" in text
    assert "stub: disk is on fire" in text
    listing = client.get(reverse("admin:mcp_registry_mcpserver_changelist")).content.decode()
    assert "0 running; last crash: exited with code 3 at" in listing
