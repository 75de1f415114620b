"""Discovery: quarantine, a hung server, ``tools/list_changed``, and ``manage.py mcp_discover``."""

from __future__ import annotations

import io
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from mcp_registry.client import DiscoveredTool
from mcp_registry.models import McpServer, McpTool
from mcp_registry.selectors import tool_list_exposable
from mcp_registry.services import (
    TASK_REQUIRED_REASON,
    ToolDiscoveryError,
    server_discover_tools,
    server_tools_replace,
)
from tests.factories import McpServerFactory, McpToolFactory
from tests.mcp_registry.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db

# A server whose second tool has a schema no model can be given.
MIXED_SERVER = textwrap.dedent(
    """
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    TOOLS = [
        types.Tool(name="good", input_schema={"type": "object", "properties": {}},
                   annotations=types.ToolAnnotations(read_only_hint=True)),
        types.Tool(name="bad", input_schema={"type": "object",
                                             "properties": {"a": {"$ref": "https://x/y"}}}),
    ]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=TOOLS)

    server = Server("mixed", on_list_tools=list_tools)

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
    """
)

# Reads requests and never answers: stuck in initialize.
HUNG_SERVER = "import sys, time\nfor line in sys.stdin:\n    time.sleep(3600)\n"


def script_server(tmp_path: Path, source: str, **fields: Any) -> McpServer:
    script = tmp_path / "server.py"
    script.write_text(source)
    values: dict[str, Any] = {
        "name": "probe",
        "command": sys.executable,
        "args": [str(script)],
        "trust_annotations": True,
        "startup_timeout": 20,
    }
    values.update(fields)
    return McpServerFactory.create(**values)


def test_a_tool_with_an_unusable_schema_is_quarantined_and_the_rest_stay_usable(
    tmp_path: Path, superuser: Any
) -> None:
    server = script_server(tmp_path, MIXED_SERVER)
    available = server_discover_tools(server=server)
    assert [tool.name for tool in available] == ["good"]
    bad = McpTool.objects.get(server=server, name="bad")
    assert bad.available is False
    assert "points outside the schema" in bad.quarantine_reason
    assert bad.parameters == {}
    assert [tool.exposed_name for tool in tool_list_exposable()] == ["probe__good"]

    client = Client()
    client.force_login(superuser)
    page = client.get(reverse("admin:mcp_registry_mcptool_change", args=[bad.pk]))
    assert "points outside the schema" in page.content.decode()


def test_one_invalid_tool_entry_does_not_empty_the_server(tmp_path: Path) -> None:
    """Issue 25: a tool whose ``inputSchema`` the MCP schema refuses made the client refuse the
    whole ``tools/list`` ("returned an invalid tool list", no tool named), so none of the
    server's tools could be used. Now each entry is read on its own: a schema without a
    top-level ``type`` is read as an object schema, and only an entry that cannot be read is
    quarantined, with the reason."""
    stub = REPO_ROOT / "tests" / "mcp_registry" / "stub_server.py"
    server = McpServerFactory.create(
        name="odd", command=sys.executable, args=[str(stub), "--odd-schemas"],
        trust_annotations=True, startup_timeout=20,
    )
    available = server_discover_tools(server=server)
    assert {tool.name for tool in available} >= {"echo", "pid", "anything"}
    anything = McpTool.objects.get(server=server, name="anything")
    assert anything.available and anything.input_schema == {"type": "object", "properties": {}}
    assert anything.parameters["type"] == "object"
    either = McpTool.objects.get(server=server, name="either")
    assert either.input_schema["type"] == "object" and len(either.input_schema["oneOf"]) == 2
    broken = McpTool.objects.get(server=server, name="broken")
    assert broken.available is False
    assert "not a valid MCP tool" in broken.quarantine_reason
    assert "inputSchema" in broken.quarantine_reason
    server.refresh_from_db()
    assert server.last_error == ""
    assert "odd__broken" not in {tool.exposed_name for tool in tool_list_exposable()}
    assert "odd__echo" in {tool.exposed_name for tool in tool_list_exposable()}


def test_only_tools_that_require_task_augmentation_are_quarantined() -> None:
    server = McpServerFactory.create(name="tasks")
    schema = {"type": "object", "properties": {}}

    def listing(**task_support: str | None) -> list[DiscoveredTool]:
        return [DiscoveredTool(name=name, title=None, description="", input_schema=schema,
                               annotations={}, task_support=support)
                for name, support in task_support.items()]

    available = server_tools_replace(server=server, discovered=listing(
        plain=None, forbidden="forbidden", optional="optional", required="required"))
    assert [tool.name for tool in available] == ["forbidden", "optional", "plain"]
    required = McpTool.objects.get(server=server, name="required")
    assert (required.available, required.quarantine_reason) == (False, TASK_REQUIRED_REASON)
    assert [tool.exposed_name for tool in tool_list_exposable()] == [
        "tasks__forbidden", "tasks__optional", "tasks__plain"]

    # The server stops requiring tasks: the tool is offered again, with its overrides.
    McpTool.objects.filter(pk=required.pk).update(requires_approval_override=False)
    server_tools_replace(server=server, discovered=listing(required="optional"))
    required.refresh_from_db()
    assert (required.available, required.quarantine_reason) == (True, "")
    assert required.requires_approval_override is False

    # Both reasons are kept when the schema cannot be offered either.
    server_tools_replace(server=server, discovered=[DiscoveredTool(
        name="required", title=None, description="", annotations={}, task_support="required",
        input_schema={"type": "object", "properties": {"a": {"$ref": "https://x/y"}}})])
    required.refresh_from_db()
    assert required.available is False
    assert "points outside the schema" in required.quarantine_reason
    assert required.quarantine_reason.endswith(f"; {TASK_REQUIRED_REASON}")


def test_a_server_hung_in_initialize_keeps_its_catalogue_and_shows_the_error(
    tmp_path: Path, superuser: Any
) -> None:
    server = script_server(tmp_path, HUNG_SERVER, startup_timeout=1)
    kept = McpToolFactory.create(server=server, name="kept")
    started = time.monotonic()
    with pytest.raises(ToolDiscoveryError, match="did not finish starting within 1 s"):
        server_discover_tools(server=server)
    # Bounded by the start-up timeout plus the SDK's bounded shutdown of the child.
    assert time.monotonic() - started < 10
    server.refresh_from_db()
    kept.refresh_from_db()
    assert kept.available is True
    assert server.last_error_at is not None

    client = Client()
    client.force_login(superuser)
    page = client.get(reverse("admin:mcp_registry_mcpserver_changelist")).content.decode()
    assert "did not finish starting" in page
    detail = client.get(reverse("admin:mcp_registry_mcpserver_change", args=[server.pk]))
    assert "did not finish starting within 1 s" in detail.content.decode()


def test_a_server_that_exits_at_once_records_the_error(tmp_path: Path) -> None:
    server = script_server(tmp_path, "import sys\nsys.exit(3)\n", startup_timeout=10)
    with pytest.raises(ToolDiscoveryError):
        server_discover_tools(server=server)
    server.refresh_from_db()
    assert "could not be started" in server.last_error or "did not finish" in server.last_error


def _discover(*args: str) -> str:
    out = io.StringIO()
    call_command("mcp_discover", *args, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def demo_server(name: str) -> McpServer:
    return McpServerFactory.create(
        name=name,
        command=sys.executable,
        args=["-m", f"mcp_registry.demo_servers.{name}"],
        cwd=str(REPO_ROOT),
        env_names=["DEXAGENTS_VAR_DIR"],
    )


def test_mcp_discover_prints_name_effect_and_approval(var_dir: Path) -> None:
    demo_server("docs")
    text = _discover("docs")
    assert "docs: ok" in text
    assert "docs__create_document  idempotent_write" in text
    assert "approval (platform rule: idempotent_write tools wait for approval)" in text
    assert "docs__search_documents  read" in text
    report = json.loads(_discover("docs", "--json"))
    tools = report[0]["tools"]
    assert [(t["exposed_name"], t["effect"], t["requires_approval"]) for t in tools] == [
        ("docs__create_document", "idempotent_write", True),
        ("docs__search_documents", "read", False),
    ]


def test_mcp_discover_reports_a_failing_server_and_exits_non_zero(tmp_path: Path) -> None:
    script_server(tmp_path, HUNG_SERVER, name="hung", startup_timeout=1)
    with pytest.raises(CommandError):
        _discover("hung")
    with pytest.raises(CommandError, match="No MCP server"):
        _discover("nobody")


@pytest.mark.django_db(transaction=True)
def test_tools_list_changed_queues_discovery(queued_discoveries: list[int]) -> None:
    from asgiref.sync import async_to_sync

    from mcp_registry import tasks

    server = McpServerFactory.create(name="everything")
    McpServerFactory.create(name="off", enabled=False)
    async_to_sync(tasks.tools_list_changed_enqueue)("everything")
    async_to_sync(tasks.tools_list_changed_enqueue)("off")
    async_to_sync(tasks.tools_list_changed_enqueue)("unknown")
    assert queued_discoveries == [server.pk]
