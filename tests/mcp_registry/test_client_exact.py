"""Issue 23: an answered call is recorded once, starts do not wait on a probe, crashes and
timeouts say what happened, abandoned calls are cancelled, and the pool is bounded.

Each test runs ``tests/mcp_registry/stub_server.py`` (a hand-written stdio MCP server that
misbehaves on request) or its HTTP twin ``stub_http_server.py`` as a real subprocess and reads
its journal of received requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mcp_registry.client import (
    McpClientPool,
    McpPoolFullError,
    McpProcessStatus,
    McpScope,
    McpServerSpec,
    McpToolError,
    McpTransportError,
    exit_status_text,
    list_tools,
)
from tests.mcp_registry.conftest import wait_until

STUB = Path(__file__).with_name("stub_server.py")
SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def stub_spec(journal: Path, *flags: str, **overrides: Any) -> McpServerSpec:
    values: dict[str, Any] = {
        "name": "stub",
        "transport": "stdio",
        "command": sys.executable,
        "args": (str(STUB), "--journal", str(journal), *flags),
        "startup_timeout": 20.0,
        "call_timeout": 20.0,
    }
    values.update(overrides)
    return McpServerSpec(**values)


def received(journal: Path) -> list[dict[str, Any]]:
    """Every request the stub received, in order (across its restarts)."""
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line]


def methods(journal: Path) -> list[str]:
    return [message["method"] for message in received(journal)]


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    try:
        return "\tZ" in status.read_text()
    except (FileNotFoundError, ProcessLookupError):
        return True


async def echo(pool: McpClientPool, spec: McpServerSpec, **kwargs: Any) -> Any:
    return await pool.call_tool(
        spec, "echo", {"text": "hi"}, idempotency_key=None, timeout=kwargs.pop("timeout", None),
        **kwargs,
    )


async def test_a_server_listing_an_invalid_tool_still_lists_and_calls_the_others(
    tmp_path: Path,
) -> None:
    """Issue 25: ``tools/list`` with one entry the MCP schema refuses is read entry by entry
    (the rest as usual, the bad one with its reason), and the server's tools still answer."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--odd-schemas")
    tools = {tool.name: tool for tool in await list_tools(spec)}
    assert set(tools) == {"echo", "pid", "anything", "either", "broken"}
    assert tools["echo"].input_schema == SCHEMA and tools["echo"].invalid_reason is None
    assert tools["anything"].input_schema == {"type": "object", "properties": {}}
    assert tools["broken"].invalid_reason is not None
    assert methods(journal).count("tools/list") == 2  # the SDK's refused read, then ours
    async with McpClientPool() as pool:
        output = await echo(pool, spec)
        assert output.text == "hi"


@pytest.mark.parametrize(
    "flag", ["--exit-after-call", "--ignore-list"], ids=["server exits", "tools/list ignored"]
)
async def test_an_answered_call_is_its_outcome_whatever_the_connection_does_next(
    tmp_path: Path, flag: str
) -> None:
    """Point 1: the SDK used to send tools/list after the result to check it; a server that
    exited or never answered that request turned an answered call into a failure, retried."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, flag, call_timeout=5.0)
    async with McpClientPool() as pool:
        # Waiting on a request that never answers would end in the 5 s timeout's error.
        output = await echo(pool, spec)
        assert output.text == "hi"
    assert methods(journal).count("tools/call") == 1
    assert "tools/list" not in methods(journal)


async def test_an_answer_is_read_although_the_servers_exit_is_seen_first(
    tmp_path: Path,
) -> None:
    """The server answers and exits while the worker's event loop is busy: when the loop runs
    again, the end of the server's stderr (it exited) is handled before its answer on stdout.
    That end used to close the connection under the call, which then failed and ran again."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--exit-after-call", "--delay", "0.5")
    async with McpClientPool() as pool:
        call = asyncio.ensure_future(echo(pool, spec, scope=McpScope("ses_1")))
        await wait_until("the call to reach the server", lambda: "tools/call" in methods(journal))
        # Keep the loop busy (blocked on purpose, not waiting for something) until the server
        # has answered and exited, and a little longer for its guard to end its stderr.
        deadline = time.monotonic() + 20
        while "exit" not in methods(journal) and time.monotonic() < deadline:
            time.sleep(0.01)  # noqa: ASYNC251
        time.sleep(0.5)  # noqa: ASYNC251
        assert (await call).text == "hi"
    assert methods(journal).count("tools/call") == 1


@pytest.mark.parametrize("code", [-32000, -32001, -32603])
async def test_an_error_the_server_sends_is_its_answer_whatever_its_code(
    tmp_path: Path, code: int
) -> None:
    """-32000 and -32001 are also the codes the SDK uses for "connection closed" and "timed
    out"; a server may send them too (implementation-defined range), and that is an answer:
    one call, the connection kept, and an error the model reads."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--error-code", str(code))
    async with McpClientPool() as pool:
        with pytest.raises(McpToolError) as raised:
            await echo(pool, spec, scope=McpScope("ses_1"))
        assert pool.open_connections("stub") == ["session ses_1"]
    assert raised.value.message == (
        f"MCP server 'stub' rejected the call to tool 'echo': the stub refuses (error code "
        f"{code})"
    )
    assert methods(journal).count("tools/call") == 1


async def test_structured_content_is_checked_against_the_schema_stored_at_discovery(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    discovered = {tool.name: tool for tool in await list_tools(
        stub_spec(journal, "--output-schema")
    )}
    assert discovered["echo"].output_schema == SCHEMA
    good = stub_spec(journal, "--output-schema", tool_output_schemas={"echo": SCHEMA})
    bad = stub_spec(journal, "--bad-structured", tool_output_schemas={"echo": SCHEMA})
    async with McpClientPool() as pool:
        assert (await echo(pool, good)).structured_content == {"text": "hi"}
        with pytest.raises(McpToolError) as raised:
            await echo(pool, bad)
    # A tool error the model reads once (not a transport failure to retry), with the text.
    assert raised.value.message == (
        "MCP server 'stub' answered the call to tool 'echo', but its structured content does "
        "not match the output schema at text: 42 is not of type 'string'. Its text content "
        "was:\nhi"
    )
    calls_after_discovery = methods(journal)[methods(journal).index("tools/list") + 1:]
    assert "tools/list" not in calls_after_discovery


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


def test_a_specs_fingerprint_names_its_connection_identity_only() -> None:
    """The fingerprint (a connection is replaced when it changes) is the spec without its
    stored output schemas and idle timeout, as JSON with sorted keys, and a spec computes it
    once (the pool asks twice per call)."""
    spec = McpServerSpec(
        name="stub", transport="stdio", command="python", args=("-m", "stub"),
        env_names=["TOKEN"], env={"MODE": "a"}, call_timeout=5.0,
        tool_output_schemas={"echo": SCHEMA},
    )
    assert json.loads(spec.fingerprint()) == {
        "name": "stub", "transport": "stdio", "command": "python", "args": ["-m", "stub"],
        "cwd": None, "env_names": ["TOKEN"], "env": {"MODE": "a"}, "url": "",
        "header_env": {}, "startup_timeout": 30.0, "call_timeout": 5.0, "isolation": "session",
    }
    assert spec.fingerprint() is spec.fingerprint()
    same = McpServerSpec(
        name="stub", transport="stdio", command="python", args=["-m", "stub"],
        env_names=("TOKEN",), env={"MODE": "a"}, call_timeout=5.0, idle_timeout=1.0,
    )
    assert same.fingerprint() == spec.fingerprint()
    assert replace(spec, tool_output_schemas={}) == spec  # the cached value is no field
    for changed in (
        McpServerSpec(name="stub", transport="stdio", command="python", args=("-m", "stub"),
                      env_names=["TOKEN"], env={"MODE": "b"}, call_timeout=5.0),
        McpServerSpec(name="stub", transport="stdio", command="python", args=("-m", "stub"),
                      env_names=["TOKEN"], env={"MODE": "a"}, call_timeout=6.0),
    ):
        assert changed.fingerprint() != spec.fingerprint()


async def test_a_timed_out_call_is_cancelled_and_says_how_long_it_waited(tmp_path: Path) -> None:
    """Points 10 and 13: notifications/cancelled names the abandoned request; the message a
    model reads is prose with the wait, without a Python class."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--hang-call")
    async with McpClientPool() as pool:
        with pytest.raises(McpTransportError) as raised:
            await echo(pool, spec, timeout=1.5)
        assert raised.value.message == (
            "MCP server 'stub' did not answer the call to tool 'echo' within 1.5 s; the request "
            "was cancelled"
        )
        await wait_until("the cancellation", lambda: "notifications/cancelled" in methods(journal))
    call = next(message for message in received(journal) if message["method"] == "tools/call")
    cancel = next(m for m in received(journal) if m["method"] == "notifications/cancelled")
    assert cancel["params"]["requestId"] == call["id"]


async def test_a_call_of_a_session_that_ended_is_cancelled(tmp_path: Path) -> None:
    """Point 10: the worker learns that a session stopped (sessions_ended) and cancels its
    calls in flight, then closes the session's connection."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--hang-call")
    ended: set[str] = set()

    async def sessions_ended(session_ids: set[str]) -> set[str]:
        return session_ids & ended

    async with McpClientPool(
        sessions_ended=sessions_ended, reap_interval=0.05, ended_check_interval=0.1
    ) as pool:
        call = asyncio.ensure_future(echo(pool, spec, scope=McpScope("ses_gone", "7")))
        await wait_until("the call", lambda: "tools/call" in methods(journal))
        ended.add("ses_gone")
        with pytest.raises(McpTransportError, match="cancelled because its agent session ended"):
            await asyncio.wait_for(call, timeout=20)
        await wait_until("the cancellation", lambda: "notifications/cancelled" in methods(journal))
        await wait_until("the connection closed", lambda: not pool.open_connections("stub"))


async def test_requests_of_different_sessions_use_different_connections(tmp_path: Path) -> None:
    """Point 4 at the pool: the key follows the server's isolation."""
    one, two, other = McpScope("ses_1", "7"), McpScope("ses_2", "7"), McpScope("ses_3", "8")

    async def pids(pool: McpClientPool, spec: McpServerSpec) -> list[int]:
        return [
            int((await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=None,
                                      scope=scope)).text)
            for scope in (one, two, other)
        ]

    async with McpClientPool() as pool:
        session = await pids(pool, stub_spec(tmp_path / "j1", isolation="session"))
        user = await pids(pool, stub_spec(tmp_path / "j2", isolation="user"))
        shared = await pids(pool, stub_spec(tmp_path / "j3", isolation="shared"))
    assert len(set(session)) == 3
    assert user[0] == user[1] != user[2]
    assert len(set(shared)) == 1


async def test_the_pool_closes_the_least_recently_used_idle_process_when_full(
    tmp_path: Path,
) -> None:
    spec = stub_spec(tmp_path / "journal")
    async with McpClientPool(max_processes=2) as pool:
        first, second, third = [
            int((await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=None,
                                      scope=McpScope(name))).text)
            for name in ("ses_1", "ses_2", "ses_3")
        ]
        await wait_until("the first process to stop", lambda: process_gone(first))
        assert not process_gone(second) and not process_gone(third)
        assert pool.open_connections("stub") == ["session ses_2", "session ses_3"]


async def test_a_full_pool_of_busy_processes_sends_nothing_and_says_so(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    busy = stub_spec(journal, "--hang-call", call_timeout=60.0)
    waiting = stub_spec(tmp_path / "other", startup_timeout=1.0)
    async with McpClientPool(max_processes=1) as pool:
        hanging = asyncio.ensure_future(echo(pool, busy, scope=McpScope("ses_1")))
        await wait_until("the busy call", lambda: "tools/call" in methods(journal))
        with pytest.raises(McpPoolFullError) as raised:
            await echo(pool, waiting, scope=McpScope("ses_2"))
        hanging.cancel()
    assert raised.value.message == (
        "MCP server 'stub' was not called: this worker already runs 1 MCP server processes "
        "(its limit) and none became free within 1 s. Nothing was sent; try again later."
    )
    assert received(tmp_path / "other") == []


async def test_an_idle_connection_closes_after_the_servers_idle_timeout(tmp_path: Path) -> None:
    spec = stub_spec(tmp_path / "journal", idle_timeout=0.5)
    async with McpClientPool(reap_interval=0.05) as pool:
        pid = int((await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=None,
                                        scope=McpScope("ses_1"))).text)
        assert pool.open_connections("stub") == ["session ses_1"]
        await wait_until("the idle process to stop", lambda: process_gone(pid))
        assert pool.open_connections("stub") == []
        # The next call of the session opens a new one.
        again = int((await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=None,
                                          scope=McpScope("ses_1"))).text)
        assert again != pid


# --- the same over Streamable HTTP --------------------------------------------------------

HTTP_STUB = Path(__file__).with_name("stub_http_server.py")


@contextlib.asynccontextmanager
async def http_stub(journal: Path, *flags: str, **overrides: Any) -> AsyncIterator[McpServerSpec]:
    """``stub_http_server.py`` as a real process, and the spec that reaches it."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(HTTP_STUB), "--journal", str(journal), *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        port = int(await asyncio.wait_for(server.stdout.readline(), timeout=20))
        values: dict[str, Any] = {
            "name": "stub", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp",
            "startup_timeout": 20.0, "call_timeout": 20.0,
        }
        values.update(overrides)
        yield McpServerSpec(**values)
    finally:
        server.kill()
        await server.wait()


async def test_over_http_an_answered_call_does_not_wait_on_tools_list(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    async with http_stub(journal, "--ignore-list", "--ignore-discover", call_timeout=5.0,
                         startup_timeout=5.0) as spec, McpClientPool() as pool:
        assert (await echo(pool, spec, scope=McpScope("ses_1"))).text == "hi"
    assert methods(journal)[:3] == ["initialize", "notifications/initialized", "tools/call"]
    assert "tools/list" not in methods(journal) and "server/discover" not in methods(journal)


async def test_over_http_a_timed_out_call_is_cancelled_and_the_session_deleted(
    tmp_path: Path,
) -> None:
    journal = tmp_path / "journal"
    async with http_stub(journal, "--hang-call") as spec:
        async with McpClientPool() as pool:
            with pytest.raises(McpTransportError, match="within 1 s; the request was cancelled"):
                await echo(pool, spec, timeout=1.0, scope=McpScope("ses_1"))
            await wait_until("the cancellation",
                             lambda: "notifications/cancelled" in methods(journal))
        await wait_until("the DELETE", lambda: "DELETE" in methods(journal))
    entries = received(journal)
    call = next(entry for entry in entries if entry["method"] == "tools/call")
    cancel = next(entry for entry in entries if entry["method"] == "notifications/cancelled")
    delete = next(entry for entry in entries if entry["method"] == "DELETE")
    assert cancel["params"]["requestId"] == call["id"]
    assert delete["session"] == call["session"] is not None


@pytest.mark.parametrize(
    ("version", "envelope"),
    [
        ("2025-11-25", {}),
        ("2026-07-28", {"cacheScope": "public", "ttlMs": 0, "resultType": "complete"}),
        ("2026-07-28", {}),  # a 2026 server whose envelope is itself incomplete
    ],
)
def test_a_raw_tool_page_is_checked_entry_by_entry_in_every_protocol_version(
    version: str, envelope: dict[str, Any]
) -> None:
    """A 2026-07-28 ``tools/list`` result carries ``cacheScope``, ``ttlMs`` and ``resultType``
    beside ``tools``: each entry is checked inside that envelope, so valid entries stay valid
    (checked alone they all failed for the envelope's missing fields)."""
    from mcp_registry._mcp_discovery import lenient_tools

    page = {**envelope, "tools": [
        {"name": "ok", "inputSchema": SCHEMA},
        {"name": "anything", "inputSchema": {}},
        {"name": "broken", "inputSchema": "not a schema"},
        {"inputSchema": SCHEMA},  # no name: skipped
    ]}
    spec = stub_spec(Path("unused"))
    tools = {tool.name: tool for tool in lenient_tools(spec, page, version)}
    assert set(tools) == {"ok", "anything", "broken"}
    assert tools["ok"].invalid_reason is None and tools["ok"].input_schema == SCHEMA
    assert tools["anything"].invalid_reason is None
    assert tools["broken"].invalid_reason is not None
