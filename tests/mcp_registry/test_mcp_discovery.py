"""``mcp_registry._mcp_discovery``: a tool list the SDK refuses because of one entry is read
entry by entry (issue 25), from ``stub_server.py`` run as a real subprocess and from raw pages."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mcp_registry._mcp_discovery import lenient_tools
from mcp_registry.client import McpClientPool, list_tools
from tests.mcp_registry.conftest import ECHO_SCHEMA, echo, methods, stub_spec


async def test_a_server_listing_an_invalid_tool_still_lists_and_calls_the_others(
    tmp_path: Path,
) -> None:
    """Issue 25: ``tools/list`` with one entry the MCP schema refuses is read entry by entry
    (the rest as usual, the bad one with its reason), and the server's tools still answer."""
    journal = tmp_path / "journal"
    spec = stub_spec(journal, "--odd-schemas")
    tools = {tool.name: tool for tool in await list_tools(spec)}
    assert set(tools) == {"echo", "pid", "anything", "either", "broken"}
    assert tools["echo"].input_schema == ECHO_SCHEMA and tools["echo"].invalid_reason is None
    assert tools["anything"].input_schema == {"type": "object", "properties": {}}
    assert tools["broken"].invalid_reason is not None
    assert methods(journal).count("tools/list") == 2  # the SDK's refused read, then ours
    async with McpClientPool() as pool:
        output = await echo(pool, spec)
        assert output.text == "hi"


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
    page = {**envelope, "tools": [
        {"name": "ok", "inputSchema": ECHO_SCHEMA},
        {"name": "anything", "inputSchema": {}},
        {"name": "broken", "inputSchema": "not a schema"},
        {"inputSchema": ECHO_SCHEMA},  # no name: skipped
    ]}
    spec = stub_spec(Path("unused"))
    tools = {tool.name: tool for tool in lenient_tools(spec, page, version)}
    assert set(tools) == {"ok", "anything", "broken"}
    assert tools["ok"].invalid_reason is None and tools["ok"].input_schema == ECHO_SCHEMA
    assert tools["anything"].invalid_reason is None
    assert tools["broken"].invalid_reason is not None
