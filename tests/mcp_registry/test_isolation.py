"""Issue 23 points 3, 4 and 10: what crosses between agent sessions and users at each
isolation level, on both transports, with ``@modelcontextprotocol/server-everything`` (npm) as
a real subprocess; and the Streamable-HTTP sessions a pool opens are ended with ``DELETE``,
also after the worker that opened them was killed.

Two users: alice with two sessions (``A1``, ``A2``) and bob (``B``).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dex_agents.testing import free_port
from mcp_registry.client import (
    McpClientPool,
    McpHttpSession,
    McpScope,
    McpServerSpec,
    http_session_end,
)
from tests.mcp_registry.conftest import DEADLINE_SECONDS, REPO_ROOT, everything_command, wait_until

A1 = McpScope("ses_a1", "alice")
A2 = McpScope("ses_a2", "alice")
B = McpScope("ses_b", "bob")
#: Whether a resource A1's call created is listed for (A2, B) at each level.
SEEN_BY = {"session": (False, False), "user": (True, False), "shared": (True, True)}


class HttpEverything:
    """server-everything serving Streamable HTTP, its console output kept in a file."""

    def __init__(self, log: Path) -> None:
        node, script = everything_command()
        self.log = log
        self.port = free_port()
        self.process = subprocess.Popen(
            [node, script, "streamableHttp"],
            env={**os.environ, "PORT": str(self.port)},
            stdout=log.open("w"),
            stderr=subprocess.STDOUT,
        )
        self.spec = McpServerSpec(
            name="everything",
            transport="streamable_http",
            url=f"http://127.0.0.1:{self.port}/mcp",
            startup_timeout=30.0,
            call_timeout=30.0,
        )
        deadline = time.monotonic() + DEADLINE_SECONDS
        while "listening on port" not in self.output():
            assert self.process.poll() is None, self.output()
            assert time.monotonic() < deadline, "server-everything never listened"
            time.sleep(0.05)

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def terminated(self, session_id: str) -> bool:
        """Whether the server logged the DELETE of ``session_id``."""
        return f"Received session termination request for session {session_id}" in self.output()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture
def http_everything(tmp_path: Path) -> Iterator[HttpEverything]:
    server = HttpEverything(tmp_path / "everything-http.log")
    try:
        yield server
    finally:
        server.stop()


def spec_for(transport: str, request: pytest.FixtureRequest) -> McpServerSpec:
    if transport == "stdio":
        spec: McpServerSpec = request.getfixturevalue("everything_spec")
        return spec
    server: HttpEverything = request.getfixturevalue("http_everything")
    return server.spec


async def resource_uris(pool: McpClientPool, spec: McpServerSpec, scope: McpScope) -> set[str]:
    listing = await pool.list_resources(spec, scope=scope)
    return {str(resource.uri) for resource in listing.resources}


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
@pytest.mark.parametrize("isolation", ["session", "user", "shared"])
async def test_server_state_crosses_only_what_the_isolation_level_lets(
    isolation: str, transport: str, request: pytest.FixtureRequest
) -> None:
    """Point 4: user B once read, through ``mcp_read_resource``, a resource user A's call had
    created on the server; now only ``shared`` lets that happen, and ``user`` lets alice's
    sessions share."""
    spec = replace(spec_for(transport, request), isolation=isolation)  # type: ignore[arg-type]
    name = f"{isolation}-{transport}.gz"
    uri = f"demo://resource/session/{name}"
    async with McpClientPool() as pool:
        created = await pool.call_tool(
            spec, "gzip-file-as-resource",
            {"name": name, "data": "data:text/plain;base64,aGVsbG8=", "outputType": "resourceLink"},
            idempotency_key=None, timeout=None, scope=A1,
        )
        assert uri in created.text
        assert uri in await resource_uris(pool, spec, A1)
        seen = (
            uri in await resource_uris(pool, spec, A2), uri in await resource_uris(pool, spec, B)
        )
        assert seen == SEEN_BY[isolation]
        if SEEN_BY[isolation][1]:
            read = await pool.read_resource(spec, uri, scope=B)
            assert read.contents and str(read.contents[0].uri) == uri
        expected_connections = {"session": 3, "user": 2, "shared": 1}[isolation]
        assert len(pool.open_connections("everything")) == expected_connections


@pytest.mark.parametrize("transport", ["stdio", "streamable_http"])
@pytest.mark.parametrize("isolation", ["session", "shared"])
async def test_one_users_server_logs_never_reach_another_users_call(
    isolation: str, transport: str, request: pytest.FixtureRequest
) -> None:
    """Point 3: with alice's call having switched server-everything's simulated logging on,
    bob's later call (alone in flight, for six seconds) received those messages as its own."""
    spec = replace(spec_for(transport, request), isolation=isolation)  # type: ignore[arg-type]
    worker_log: list[Any] = []
    bobs: list[Any] = []

    async def sink(server: str, level: str, data: Any) -> None:
        worker_log.append(data)

    async def bobs_log(level: str, data: Any) -> None:
        bobs.append(data)

    async with McpClientPool(on_log=sink) as pool:
        started = await pool.call_tool(spec, "toggle-simulated-logging", {},
                                       idempotency_key=None, timeout=None, scope=A1)
        assert started.text.startswith("Started")
        before = len(worker_log)
        done = await pool.call_tool(
            spec, "trigger-long-running-operation", {"duration": 6, "steps": 2},
            idempotency_key=None, timeout=None, scope=B, on_log=bobs_log,
        )
        assert done.text.startswith("Long running operation completed")
        # Alice's connection kept logging meanwhile (so the test could fail), to the worker log.
        await wait_until("alice's log messages", lambda: len(worker_log) > before)
    assert bobs == []


async def test_a_session_gets_its_own_log_messages(everything_spec: McpServerSpec) -> None:
    """The other side of point 3: on the session's own connection its call gets them."""
    mine: list[Any] = []

    async def on_log(level: str, data: Any) -> None:
        mine.append(data)

    async with McpClientPool() as pool:
        await pool.call_tool(everything_spec, "toggle-simulated-logging", {},
                             idempotency_key=None, timeout=None, scope=A1)
        await pool.call_tool(
            everything_spec, "trigger-long-running-operation", {"duration": 6, "steps": 2},
            idempotency_key=None, timeout=None, scope=A1, on_log=on_log,
        )
    assert mine, "no log message reached the session's own call"


async def test_http_sessions_are_recorded_and_ended_with_delete(
    http_everything: HttpEverything,
) -> None:
    """Point 10: a clean close sends DELETE for every session the pool opened, and reports
    each opened and closed session (the worker keeps them in McpHttpSession)."""
    events: list[McpHttpSession] = []
    async with McpClientPool(on_http_session=events.append) as pool:
        for scope in (A1, B):
            await pool.call_tool(http_everything.spec, "echo", {"message": "x"},
                                 idempotency_key=None, timeout=None, scope=scope)
        opened = [event for event in events if event.open]
        assert sorted(event.scope for event in opened) == ["session ses_a1", "session ses_b"]
        assert all(event.protocol_version for event in opened)
    closed = {event.session_id for event in events if not event.open}
    assert closed == {event.session_id for event in opened}
    for session_id in closed:
        await wait_until(f"DELETE of {session_id}",
                         functools.partial(http_everything.terminated, session_id))


# Opens an HTTP session in a process of its own, prints its Mcp-Session-Id, then waits to be
# killed: a worker that dies by SIGKILL and cannot send DELETE.
HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from mcp_registry.client import McpClientPool, McpScope, McpServerSpec

    async def main():
        spec = McpServerSpec(name="everything", transport="streamable_http", url=sys.argv[1])
        opened = asyncio.Event()
        ids = []
        def record(session):
            if session.open:
                ids.append(session.session_id)
                opened.set()
        pool = McpClientPool(on_http_session=record)
        await pool.call_tool(spec, "echo", {"message": "x"}, idempotency_key=None,
                             timeout=None, scope=McpScope("ses_killed"))
        await opened.wait()
        print(ids[0], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


async def test_a_killed_workers_http_session_is_ended_by_the_next(
    http_everything: HttpEverything,
) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, http_everything.spec.url,
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=DEADLINE_SECONDS)
        session_id = line.decode().strip()
        holder.kill()
        await holder.wait()
        assert not http_everything.terminated(session_id)
        assert await http_session_end(http_everything.spec, session_id=session_id,
                                      protocol_version="2025-11-25")
        await wait_until("the DELETE", lambda: http_everything.terminated(session_id))
        # Ending it again: server-everything no longer knows it (400), which is no error here.
        assert not await http_session_end(http_everything.spec, session_id=session_id)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()
