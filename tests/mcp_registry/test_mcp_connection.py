"""``mcp_registry._mcp_connection`` (issue 23): a connection starts with ``initialize``, with no
``server/discover`` probe to wait on, and says how its server ended: the error of the call it
crashed during, and process reports with the exit code or signal and the last stderr lines.

Each test runs ``stub_server.py`` (a hand-written stdio MCP server that misbehaves on request)
as a real subprocess and reads its journal of received requests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mcp_registry.client import (
    McpClientPool,
    McpProcessStatus,
    McpScope,
    McpTransportError,
    exit_status_text,
)
from tests.mcp_registry.conftest import echo, methods, stub_spec, wait_until


async def test_a_server_that_ignores_the_discover_probe_starts_at_once(tmp_path: Path) -> None:
    """Point 7: the stub, like most released servers, never answers server/discover; the SDK's
    probe held every start for 10 s (and a 5 s startup timeout never let it start)."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, startup_timeout=5.0)
    async with McpClientPool() as pool:
        assert (await echo(pool, spec)).text == "hi"
    assert methods(journal)[:3] == ["initialize", "notifications/initialized", "tools/call"]


async def test_a_crash_during_a_call_names_its_exit_code_and_stderr(tmp_path: Path) -> None:
    """Point 8: the call's error and the process report say how the server ended."""
    statuses: list[McpProcessStatus] = []
    spec = stub_spec(tmp_path / "journal", "--crash-in-call", "3")
    async with McpClientPool(on_process_status=statuses.append) as pool:
        with pytest.raises(McpTransportError) as raised:
            await echo(pool, spec, scope=McpScope("ses_1", "7"))
        await wait_until("the exit report", lambda: any(s.state == "exited" for s in statuses))
    assert raised.value.message == (
        "MCP server 'stub' exited with code 3 during the call to tool 'echo'. Last lines of "
        "its stderr:\nstub: about to fail\nstub: disk is on fire"
    )
    exited = next(status for status in statuses if status.state == "exited")
    assert (exited.exit_code, exited.scope) == (3, "session ses_1")
    assert exited.error == "the server process exited with code 3"
    assert exited.stderr_tail[-1] == "stub: disk is on fire"
    # The pool's own close afterwards does not overwrite how it ended.
    assert statuses[-1].state == "exited"


async def test_an_idle_crash_is_reported_with_its_signal(tmp_path: Path) -> None:
    statuses: list[McpProcessStatus] = []
    spec = stub_spec(tmp_path / "journal")
    async with McpClientPool(on_process_status=statuses.append) as pool:
        pid = int((await pool.call_tool(spec, "pid", {}, idempotency_key=None,
                                        timeout=None)).text)
        os.kill(pid, 9)
        await wait_until("the exit report", lambda: any(s.state == "exited" for s in statuses))
    exited = next(status for status in statuses if status.state == "exited")
    assert exited.exit_code == -9
    assert exited.error == "the server process was killed by signal 9 (SIGKILL)"


def test_exit_status_text() -> None:
    assert exit_status_text(0) == "exited with code 0"
    assert exit_status_text(-15) == "was killed by signal 15 (SIGTERM)"
    assert exit_status_text(None) == "exited"
