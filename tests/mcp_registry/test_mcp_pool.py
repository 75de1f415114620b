"""``mcp_registry._mcp_pool`` (issue 23): which connection a request travels on (the server's
isolation, a spec's fingerprint), the bound on live stdio processes, idle connections and those
of ended agent sessions closed, and an ended session's calls cancelled.

Each test runs ``stub_server.py`` (a hand-written stdio MCP server that misbehaves on request)
as a real subprocess and reads its journal of received requests.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from mcp_registry.client import (
    McpClientPool,
    McpPoolFullError,
    McpScope,
    McpServerSpec,
    McpTransportError,
)
from tests.mcp_registry.conftest import (
    ECHO_SCHEMA,
    echo,
    methods,
    process_gone,
    received,
    stub_spec,
    wait_until,
)


def test_a_specs_fingerprint_names_its_connection_identity_only() -> None:
    """The fingerprint (a connection is replaced when it changes) is the spec without its
    stored output schemas and idle timeout, as JSON with sorted keys, and a spec computes it
    once (the pool asks twice per call)."""
    spec = McpServerSpec(
        name="stub", transport="stdio", command="python", args=("-m", "stub"),
        env_names=["TOKEN"], env={"MODE": "a"}, call_timeout=5.0,
        tool_output_schemas={"echo": ECHO_SCHEMA},
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
