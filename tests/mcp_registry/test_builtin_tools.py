"""The built-in resource and prompt tools: definitions and argument checks (the calls
themselves run against real servers in test_peers.py and test_demo_servers.py)."""

from __future__ import annotations

from typing import Any

import pytest

from mcp_registry.builtin_tools import (
    BUILTIN_TOOL_EFFECT,
    BUILTIN_TOOL_NAMES,
    BuiltinToolError,
    builtin_tool_definitions,
    builtin_tool_execute,
    builtin_tool_is,
)
from mcp_registry.client import McpClientPool, McpServerSpec
from mcp_registry.function_specs import function_parameters_build


def test_definitions_are_valid_functions_limited_to_the_agents_servers() -> None:
    definitions = builtin_tool_definitions(server_names=["slack", "docs", "docs"])
    assert [d["function"]["name"] for d in definitions] == list(BUILTIN_TOOL_NAMES)
    for definition in definitions:
        assert definition["type"] == "function"
        parameters = definition["function"]["parameters"]
        assert function_parameters_build(parameters) == parameters
        assert parameters["properties"]["server"]["enum"] == ["docs", "slack"]
        assert "__" not in definition["function"]["name"]
        assert builtin_tool_is(definition["function"]["name"])
    assert builtin_tool_definitions(server_names=[]) == []
    assert not builtin_tool_is("docs__create_document")
    assert BUILTIN_TOOL_EFFECT == "read"


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("mcp_delete_everything", {"server": "docs"}, "not a built-in"),
        ("mcp_list_prompts", {}, "'server' must be a non-empty string"),
        ("mcp_list_prompts", {"server": "slack"}, "may not use MCP server 'slack'"),
    ],
)
async def test_bad_calls_fail_before_any_server_is_contacted(
    name: str, arguments: dict[str, Any], message: str
) -> None:
    async def resolve(server: str) -> McpServerSpec:
        raise AssertionError("no server may be contacted")

    async with McpClientPool() as pool:
        with pytest.raises(BuiltinToolError, match=message):
            await builtin_tool_execute(
                name=name,
                arguments=arguments,
                pool=pool,
                server_names=["docs"],
                resolve_server=resolve,
            )
