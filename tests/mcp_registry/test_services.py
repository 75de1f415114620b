"""Tool discovery against real MCP servers (the demo search server as a stdio child)."""

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from mcp_registry.models import McpServer, McpTool
from mcp_registry.services import ToolDiscoveryError, server_discover_tools, server_tools_replace
from mcp_registry.tasks import discover_server_tools
from tests.factories import McpServerFactory, McpToolFactory

pytestmark = pytest.mark.django_db

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Found:
    """The shape of ``mcp_registry.client.DiscoveredTool`` for upsert tests."""

    name: str
    title: str | None = None
    description: str = ""
    input_schema: dict[str, Any] = field(default_factory=dict)
    annotations: dict[str, Any] = field(default_factory=dict)


def demo_search_server(**overrides: Any) -> McpServer:
    values: dict[str, Any] = {
        "name": "search",
        "command": sys.executable,
        "args": ["-m", "mcp_registry.demo_servers.search"],
        "cwd": str(REPO_ROOT),
        "trust_annotations": True,
        "startup_timeout": 30,
    }
    values.update(overrides)
    return McpServerFactory.create(**values)


def test_discovery_lists_the_demo_search_tool() -> None:
    server = demo_search_server()
    tools = server_discover_tools(server=server)
    assert [tool.exposed_name for tool in tools] == ["search__web_search"]
    tool = tools[0]
    assert tool.annotations.get("readOnlyHint") is True
    assert tool.input_schema["properties"]["query"]["type"] == "string"
    assert tool.effective_effect == "read"
    assert tool.effective_requires_approval is False
    server.refresh_from_db()
    assert server.last_discovered_at is not None
    assert (server.last_error, server.last_error_at) == ("", None)


def test_discovery_keeps_admin_overrides() -> None:
    server = demo_search_server()
    McpToolFactory.create(
        server=server,
        name="web_search",
        description="old",
        annotations={},
        enabled=False,
        effect_override="non_idempotent_write",
        requires_approval_override=False,
        timeout_override=9,
    )
    (tool,) = server_discover_tools(server=server)
    assert tool.description.startswith("Search the web")
    assert tool.annotations.get("readOnlyHint") is True
    assert tool.enabled is False
    assert tool.effect_override == "non_idempotent_write"
    assert tool.requires_approval_override is False
    assert tool.timeout_override == 9


def test_failed_discovery_keeps_the_last_good_catalogue() -> None:
    server = demo_search_server(command=str(REPO_ROOT / "no-such-program"), startup_timeout=5)
    kept = McpToolFactory.create(server=server, name="web_search")
    with pytest.raises(ToolDiscoveryError):
        server_discover_tools(server=server)
    server.refresh_from_db()
    assert server.last_error
    assert server.last_error_at is not None
    assert server.last_discovered_at is None
    kept.refresh_from_db()
    assert kept.available is True


def test_task_records_failure_on_the_row_and_does_not_raise() -> None:
    server = demo_search_server(command=str(REPO_ROOT / "no-such-program"), startup_timeout=5)
    assert discover_server_tools.apply(args=(server.pk,)).get() is None
    server.refresh_from_db()
    assert server.last_error


def test_task_discovers_and_skips_missing_servers() -> None:
    server = demo_search_server()
    assert discover_server_tools.apply(args=(server.pk,)).get() == 1
    assert discover_server_tools.apply(args=(server.pk + 1000,)).get() is None


def test_tools_no_longer_listed_become_unavailable_and_come_back() -> None:
    server = McpServerFactory.create()
    server_tools_replace(server=server, discovered=[Found("a"), Found("b")])
    assert [tool.name for tool in server_tools_replace(server=server, discovered=[Found("a")])] == [
        "a"
    ]
    assert McpTool.objects.get(server=server, name="b").available is False
    server_tools_replace(server=server, discovered=[Found("a"), Found("b", title="Bee")])
    b = McpTool.objects.get(server=server, name="b")
    assert (b.available, b.title) == (True, "Bee")
