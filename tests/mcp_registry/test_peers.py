"""The client and discovery against third-party MCP servers from the registries, run as real
subprocesses: ``mcp-server-time`` (PyPI) and ``@modelcontextprotocol/server-everything`` (npm),
the latter over stdio and over Streamable HTTP."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from mcp_registry.builtin_tools import builtin_tool_execute
from mcp_registry.client import (
    McpClientPool,
    McpServerSpec,
    McpToolError,
    list_tools,
)
from mcp_registry.models import McpServer, McpTool
from mcp_registry.services import TASK_REQUIRED_REASON, server_discover_tools
from tests.factories import AgentDefinitionFactory, McpServerFactory
from tests.mcp_registry.conftest import wait_until


def _server_row(spec: McpServerSpec, **overrides: Any) -> McpServer:
    values: dict[str, Any] = {
        "name": spec.name.replace("_", "-"),
        "transport": spec.transport,
        "command": spec.command,
        "args": list(spec.args),
        "url": spec.url,
        "trust_annotations": True,
        "startup_timeout": 30,
    }
    values.update(overrides)
    return McpServerFactory.create(**values)


@pytest.mark.django_db
def test_time_server_discovery_maps_annotations_to_read(time_spec: McpServerSpec) -> None:
    server = _server_row(time_spec)
    tools = {tool.name: tool for tool in server_discover_tools(server=server)}
    assert set(tools) == {"get_current_time", "convert_time"}
    for tool in tools.values():
        assert tool.exposed_name == f"time__{tool.name}"
        assert (tool.effective_effect, tool.effective_requires_approval) == ("read", False)
        assert tool.effect_decision.reason == "trusted annotations: readOnlyHint is true"
        assert tool.parameters["type"] == "object"
        assert tool.quarantine_reason == ""


@pytest.mark.django_db
def test_everything_discovery_maps_each_annotation_pattern(
    everything_spec: McpServerSpec,
) -> None:
    server = _server_row(everything_spec)
    tools = {tool.name: tool for tool in server_discover_tools(server=server)}
    # readOnlyHint true
    assert tools["echo"].effective_effect == "read"
    # idempotentHint true, destructiveHint false, readOnlyHint false
    assert tools["gzip-file-as-resource"].effective_effect == "idempotent_write"
    assert tools["gzip-file-as-resource"].effective_requires_approval is True
    # neither read-only nor idempotent
    assert tools["toggle-simulated-logging"].effective_effect == "non_idempotent_write"
    # Hyphens are valid in function names and stay; "$schema" is dropped from parameters.
    assert tools["get-sum"].exposed_name == "everything__get-sum"
    assert "$schema" in tools["get-sum"].input_schema
    assert "$schema" not in tools["get-sum"].parameters
    untrusted = _server_row(everything_spec, name="untrusted", trust_annotations=False)
    assert {
        tool.effective_effect for tool in server_discover_tools(server=untrusted)
    } == {"unclassified"}


@pytest.mark.django_db
def test_a_tool_that_requires_task_augmentation_is_kept_from_models(
    everything_spec: McpServerSpec, superuser: Any
) -> None:
    """server-everything's ``simulate-research-query`` is listed with ``execution.taskSupport:
    "required"``: a plain ``tools/call`` of it fails with -32601, so no model is offered it."""
    server = _server_row(everything_spec)
    available = {tool.name for tool in server_discover_tools(server=server)}
    assert "simulate-research-query" not in available
    assert {"echo", "get-sum", "trigger-long-running-operation"} <= available
    assert len(available) == McpTool.objects.filter(server=server).count() - 1
    research = McpTool.objects.get(server=server, name="simulate-research-query")
    assert research.available is False
    assert research.quarantine_reason == TASK_REQUIRED_REASON
    assert "execution.taskSupport: required" in research.quarantine_reason
    # Its schema is fine: the row keeps its parameters for the day the client can run it.
    assert research.parameters["type"] == "object"

    agent = AgentDefinitionFactory.create(slug="researcher")
    agent.tools.set(McpTool.objects.filter(server=server))
    offered = [tool["name"] for tool in agent.agent_config()["tools"]]
    assert "everything__simulate-research-query" not in offered
    assert "everything__echo" in offered
    assert len(offered) == len(available)

    client = Client()
    client.force_login(superuser)
    page = client.get(reverse("admin:mcp_registry_mcptool_change", args=[research.pk]))
    assert TASK_REQUIRED_REASON in page.content.decode()
    listing = client.get(reverse("admin:mcp_registry_mcptool_changelist"))
    assert TASK_REQUIRED_REASON in listing.content.decode()
    discovered = io.StringIO()
    call_command("mcp_discover", "everything", stdout=discovered)
    assert (f"everything__simulate-research-query  QUARANTINED: {TASK_REQUIRED_REASON}"
            in discovered.getvalue())


async def test_time_call_and_error_result(pool: McpClientPool, time_spec: McpServerSpec) -> None:
    output = await pool.call_tool(
        time_spec, "get_current_time", {"timezone": "Europe/Paris"},
        idempotency_key="s/1/c1", timeout=None,
    )
    assert output.structured_content["timezone"] == "Europe/Paris"
    assert json.loads(output.text)["timezone"] == "Europe/Paris"
    # The text already is the structured content, so the model sees it once.
    assert output.for_model() == output.text
    with pytest.raises(McpToolError) as raised:
        await pool.call_tool(
            time_spec, "get_current_time", {"timezone": "Mars/Olympus"},
            idempotency_key=None, timeout=None,
        )
    assert "Mars/Olympus" in raised.value.message


@pytest.fixture(params=["stdio", "streamable_http"])
def everything(
    request: pytest.FixtureRequest,
) -> McpServerSpec:
    name = "everything_spec" if request.param == "stdio" else "everything_http_spec"
    spec: McpServerSpec = request.getfixturevalue(name)
    return spec


async def test_everything_lists_tools(everything: McpServerSpec) -> None:
    tools = {tool.name: tool for tool in await list_tools(everything)}
    assert {"echo", "get-sum", "trigger-long-running-operation"} <= set(tools)
    assert tools["echo"].annotations["readOnlyHint"] is True
    # execution.taskSupport: the TypeScript SDK lists every plain tool as "forbidden".
    assert tools["simulate-research-query"].task_support == "required"
    assert tools["echo"].task_support == "forbidden"


async def test_everything_call_reports_progress(
    pool: McpClientPool, everything: McpServerSpec
) -> None:
    events: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        events.append((progress, total, message))

    output = await pool.call_tool(
        everything,
        "trigger-long-running-operation",
        {"duration": 0.3, "steps": 3},
        idempotency_key="k",
        timeout=None,
        on_progress=on_progress,
    )
    assert "completed" in output.text
    assert [(progress, total) for progress, total, _ in events] == [(1, 3), (2, 3), (3, 3)]


async def test_everything_error_result_and_structured_content(
    pool: McpClientPool, everything: McpServerSpec
) -> None:
    output = await pool.call_tool(
        everything, "get-structured-content", {"location": "Chicago"},
        idempotency_key=None, timeout=None,
    )
    assert set(output.structured_content) >= {"temperature", "conditions", "humidity"}
    with pytest.raises(McpToolError) as raised:
        await pool.call_tool(
            everything, "get-sum", {"a": "one", "b": 2}, idempotency_key=None, timeout=None
        )
    assert "a" in raised.value.message


async def test_everything_resource_links_resource_read_and_prompt(
    pool: McpClientPool, everything: McpServerSpec
) -> None:
    output = await pool.call_tool(
        everything, "get-resource-links", {"count": 2}, idempotency_key=None, timeout=None
    )
    assert len(output.resource_links) == 2
    link = output.resource_links[0]
    assert f"<{link.uri}>" in output.for_model()

    async def resolve(name: str) -> McpServerSpec:
        assert name == everything.name
        return everything

    common: dict[str, Any] = {
        "pool": pool, "server_names": [everything.name], "resolve_server": resolve
    }
    text_uri = "demo://resource/dynamic/text/1"
    read = await builtin_tool_execute(
        name="mcp_read_resource", arguments={"server": everything.name, "uri": text_uri},
        **common,
    )
    assert "Resource 1" in read
    listed = json.loads(
        await builtin_tool_execute(
            name="mcp_list_resources", arguments={"server": everything.name}, **common
        )
    )
    assert any(resource["uri"].startswith("demo://") for resource in listed["resources"])
    templates = json.loads(
        await builtin_tool_execute(
            name="mcp_list_resource_templates", arguments={"server": everything.name}, **common
        )
    )
    assert "demo://resource/dynamic/text/{resourceId}" in [
        template["uriTemplate"] for template in templates["resource_templates"]
    ]
    prompts = json.loads(
        await builtin_tool_execute(
            name="mcp_list_prompts", arguments={"server": everything.name}, **common
        )
    )
    assert "args-prompt" in [prompt["name"] for prompt in prompts["prompts"]]
    prompt = await builtin_tool_execute(
        name="mcp_get_prompt",
        arguments={"server": everything.name, "name": "args-prompt",
                   "arguments": {"city": "Lisbon"}},
        **common,
    )
    assert prompt.startswith("user: ") and "Lisbon" in prompt


async def test_everything_log_messages_and_tools_list_changed(
    everything_spec: McpServerSpec,
) -> None:
    logs: list[tuple[str, str, Any]] = []
    changed: list[str] = []

    async def on_log(server: str, level: str, data: Any) -> None:
        logs.append((server, level, data))

    async with McpClientPool(on_log=on_log, on_tools_list_changed=changed.append) as pool:
        output = await pool.call_tool(
            everything_spec, "toggle-simulated-logging", {}, idempotency_key=None, timeout=None
        )
        assert output.text.startswith("Started")
        # The simulated log message arrives after the call returned: the pool's sink gets it.
        await wait_until("a log message", lambda: bool(logs))
        # server-everything announces its tool list once it is connected, once for each tool
        # it adds for the client's capabilities (elicitation among them).
        await wait_until("tools/list_changed", lambda: bool(changed))
        assert set(changed) == {"everything"}
        assert pool.stale_catalogues == {"everything"}
    assert logs[0][0] == "everything"
    assert "message" in str(logs[0][2])
