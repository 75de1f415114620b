"""The shipped demo servers ``slack`` and ``docs`` as stdio children: writes land in var/ files
(so they can be counted), and a call forwards the server's progress and log messages."""

from __future__ import annotations

import asyncio
import fcntl
import json
from pathlib import Path
from typing import Any

import pytest

from mcp_registry.builtin_tools import BuiltinToolError, builtin_tool_execute
from mcp_registry.client import McpClientPool, McpScope, McpServerSpec, McpToolError, list_tools
from mcp_registry.effects import effect_from_annotations
from tests.mcp_registry.conftest import demo_spec, wait_until


def _stored(var_dir: Path, name: str) -> Any:
    return json.loads((var_dir / "demo_mcp" / name).read_text())


@pytest.mark.parametrize(
    ("server", "expected"),
    [
        ("slack", {"search_messages": "read", "post_message": "non_idempotent_write"}),
        ("docs", {"search_documents": "read", "create_document": "idempotent_write"}),
    ],
)
async def test_demo_tools_are_annotated_with_their_effects(
    server: str, expected: dict[str, str], var_dir: Path
) -> None:
    tools = await list_tools(demo_spec(server))
    assert {
        tool.name: effect_from_annotations(annotations=tool.annotations, trusted=True).value
        for tool in tools
    } == expected


async def test_post_message_writes_every_call_and_reports_progress_and_logs(
    pool: McpClientPool, var_dir: Path
) -> None:
    spec = demo_spec("slack")
    events: list[tuple[Any, ...]] = []

    def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append(("progress", progress, total, message))

    async def on_log(level: str, data: Any) -> None:
        events.append(("log", level, data))

    arguments = {"channel": "#engineering", "text": "Release notes are out"}
    first = await pool.call_tool(
        spec, "post_message", arguments, idempotency_key="k1", timeout=None,
        on_progress=on_progress, on_log=on_log, scope=McpScope("ses_1", "7"),
    )
    await pool.call_tool(spec, "post_message", arguments, idempotency_key="k2", timeout=None)
    assert [message["id"] for message in _stored(var_dir, "slack_messages.json")] == [
        "p-1", "p-2"
    ]
    assert first.structured_content["channel"] == "engineering"
    assert ("progress", 1, 2, "posting to #engineering") in events
    assert ("progress", 2, 2, "posted") in events
    assert ("log", "info", "posted p-1 to #engineering") in events

    found = await pool.call_tool(
        spec, "search_messages", {"query": "release notes"}, idempotency_key=None, timeout=None
    )
    assert len(found.structured_content["messages"]) == 2
    with pytest.raises(McpToolError, match="Unknown channel"):
        await pool.call_tool(
            spec, "post_message", {"channel": "nope", "text": "x"},
            idempotency_key=None, timeout=None,
        )


async def test_create_document_is_idempotent_by_title_and_readable_as_a_resource(
    pool: McpClientPool, var_dir: Path
) -> None:
    spec = demo_spec("docs")
    first = await pool.call_tool(
        spec, "create_document", {"title": "Q3 plan", "body": "Ship the registry."},
        idempotency_key="k", timeout=None,
    )
    again = await pool.call_tool(
        spec, "create_document", {"title": "Q3 plan", "body": "Something else."},
        idempotency_key="k", timeout=None,
    )
    assert (first.structured_content["created"], again.structured_content["created"]) == (
        True, False
    )
    stored = _stored(var_dir, "docs_documents.json")
    assert list(stored) == ["Q3 plan"]
    assert stored["Q3 plan"]["body"] == "Ship the registry."

    async def resolve(name: str) -> McpServerSpec:
        return spec

    common: dict[str, Any] = {"pool": pool, "server_names": ["docs"], "resolve_server": resolve}
    text = await builtin_tool_execute(
        name="mcp_read_resource",
        arguments={"server": "docs", "uri": first.structured_content["uri"]},
        **common,
    )
    assert text == "# Q3 plan\n\nShip the registry."
    prompt = await builtin_tool_execute(
        name="mcp_get_prompt",
        arguments={"server": "docs", "name": "summarize_document",
                   "arguments": {"title": "Q3 plan"}},
        **common,
    )
    assert "Q3 plan" in prompt
    with pytest.raises(BuiltinToolError, match="No document"):
        await builtin_tool_execute(
            name="mcp_read_resource",
            arguments={"server": "docs", "uri": "docs://documents/missing"},
            **common,
        )
    with pytest.raises(BuiltinToolError, match="may not use MCP server 'slack'"):
        await builtin_tool_execute(
            name="mcp_list_prompts", arguments={"server": "slack"}, **common
        )


async def test_a_log_message_reaches_only_the_call_that_is_alone_in_flight(
    var_dir: Path,
) -> None:
    """MCP log messages name no request, and a ``user``-isolated connection carries the calls
    of several sessions: a message written while two calls are in flight goes to the pool's
    sink, never to the other call (it once reached every call in flight)."""
    spec = demo_spec("slack", isolation="user")
    unowned: list[Any] = []
    logs: dict[str, list[Any]] = {"first": [], "second": []}

    async def pool_log(server: str, level: str, data: Any) -> None:
        unowned.append(data)

    def call(pool: McpClientPool, name: str) -> Any:
        async def on_log(level: str, data: Any) -> None:
            logs[name].append(data)

        return pool.call_tool(
            spec, "post_message", {"channel": "general", "text": name}, idempotency_key=None,
            timeout=None, on_log=on_log, scope=McpScope(f"ses_{name}", "7"),
        )

    async with McpClientPool(on_log=pool_log) as pool:
        await pool.call_tool(spec, "search_messages", {"query": "x"}, idempotency_key=None,
                             timeout=None, scope=McpScope("ses_first", "7"))
        connection = pool._connections[("slack", "user 7")]
        # Hold the server's state lock: neither call can write (and log) before both are in
        # flight.
        lock_path = var_dir / "demo_mcp" / "slack_messages.json.lock"
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            first = asyncio.ensure_future(call(pool, "first"))
            await wait_until("the first call in flight", lambda: connection.requests_in_flight == 1)
            second = asyncio.ensure_future(call(pool, "second"))
            await wait_until("both calls in flight", lambda: connection.requests_in_flight == 2)
            fcntl.flock(lock, fcntl.LOCK_UN)
        await asyncio.gather(first, second)
        await wait_until("both log messages", lambda: len(
            unowned + logs["first"] + logs["second"]) >= 2)

    posted = {post["text"]: post["id"] for post in _stored(var_dir, "slack_messages.json")}
    first_log = f"posted {posted['first']} to #general"
    second_log = f"posted {posted['second']} to #general"
    # The call that wrote first logged while the other was in flight: no call gets that one.
    assert "posted p-1 to #general" in unowned
    assert first_log not in logs["second"] and second_log not in logs["first"]
    assert sorted(unowned + logs["first"] + logs["second"]) == sorted([first_log, second_log])


async def test_after_a_call_times_out_its_log_messages_reach_no_later_call(
    var_dir: Path,
) -> None:
    """A call this side gave up on may still run in the server and log afterwards, while the
    next call is alone in flight: on a connection every user shares, that message goes to the
    pool's sink, never to a call (the timed-out call's message once reached the next
    session's, of another user)."""
    from mcp_registry.client import McpTransportError

    spec = demo_spec("slack", isolation="shared")
    first, nxt = McpScope("ses_first", "7"), McpScope("ses_next", "8")
    unowned: list[Any] = []
    later: list[Any] = []

    async def pool_log(server: str, level: str, data: Any) -> None:
        unowned.append(data)

    async def on_log(level: str, data: Any) -> None:
        later.append(data)

    async with McpClientPool(on_log=pool_log) as pool:
        await pool.call_tool(spec, "search_messages", {"query": "x"}, idempotency_key=None,
                             timeout=None, scope=first)
        lock_path = var_dir / "demo_mcp" / "slack_messages.json.lock"
        with lock_path.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            with pytest.raises((McpTransportError, McpToolError)):
                await pool.call_tool(spec, "post_message", {"channel": "general", "text": "gone"},
                                     idempotency_key=None, timeout=0.5, scope=first)
            second = asyncio.ensure_future(pool.call_tool(
                spec, "post_message", {"channel": "general", "text": "next"},
                idempotency_key=None, timeout=None, on_log=on_log, scope=nxt))
            connection = pool._connections[("slack", "shared")]
            await wait_until("the next call in flight", lambda: connection.requests_in_flight == 1)
            fcntl.flock(lock, fcntl.LOCK_UN)
        await second
        await wait_until("both log messages", lambda: len(unowned + later) >= 2)

    assert later == []
    assert sorted(unowned) == ["posted p-1 to #general", "posted p-2 to #general"]
