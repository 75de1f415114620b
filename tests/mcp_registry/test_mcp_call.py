"""``mcp_registry._mcp_call``, one ``tools/call`` (issue 23): an answered call is its outcome,
sent once, whatever the connection does next; an error the server sends is its answer;
structured content is checked against the schema stored at discovery; a timed-out call is
cancelled and says how long it waited.

Each test runs ``stub_server.py`` (a hand-written stdio MCP server that misbehaves on request) or
its HTTP twin ``stub_http_server.py`` as a real subprocess and reads its journal of received
requests.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from mcp_registry.client import McpClientPool, McpScope, McpToolError, McpTransportError, list_tools
from tests.mcp_registry.conftest import (
    ECHO_SCHEMA,
    echo,
    http_stub,
    methods,
    received,
    stub_spec,
    wait_until,
)


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
    assert discovered["echo"].output_schema == ECHO_SCHEMA
    good = stub_spec(journal, "--output-schema", tool_output_schemas={"echo": ECHO_SCHEMA})
    bad = stub_spec(journal, "--bad-structured", tool_output_schemas={"echo": ECHO_SCHEMA})
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
