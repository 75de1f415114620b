"""McpServer / McpTool fields, validation and the worker-facing spec."""

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from mcp_registry.models import McpServer, McpTool
from mcp_registry.selectors import server_spec_get, tool_get_by_exposed_name, tool_list_exposable
from tests.factories import McpServerFactory, McpToolFactory

pytestmark = pytest.mark.django_db


def test_exposed_name_joins_server_and_tool() -> None:
    tool = McpToolFactory.create(server=McpServerFactory.create(name="search"), name="web_search")
    assert tool.exposed_name == "search__web_search"
    assert str(tool) == "search__web_search"
    assert tool_get_by_exposed_name(exposed_name="search__web_search") == tool


def test_tool_names_are_unique_per_server() -> None:
    tool = McpToolFactory.create(name="lookup")
    McpToolFactory.create(name="lookup")  # same name on another server is fine
    with pytest.raises(IntegrityError):
        McpTool.objects.create(server=tool.server, name="lookup")


@pytest.mark.parametrize("name", ["search", "web-search", "a1_b2", "x"])
def test_server_name_accepts_slug_like_names(name: str) -> None:
    McpServerFactory.build(name=name).full_clean()


@pytest.mark.parametrize("name", ["Search", "web__search", "-x", "x-", "a b", "a.b", ""])
def test_server_name_rejects_names_that_break_exposed_names(name: str) -> None:
    with pytest.raises(ValidationError) as caught:
        McpServerFactory.build(name=name).full_clean()
    assert "name" in caught.value.message_dict


def test_env_names_must_be_names_not_values() -> None:
    server = McpServerFactory.build(name="good", env_names=["SEARCH_TOKEN", "sk-live-123"])
    with pytest.raises(ValidationError) as caught:
        server.full_clean()
    assert "env_names" in caught.value.message_dict


@pytest.mark.parametrize(
    "header_env",
    [{"Authorization": "Bearer abc"}, {"bad header": "TOKEN"}, ["TOKEN"], {"X-Key": 3}],
)
def test_header_env_maps_header_names_to_env_names(header_env: object) -> None:
    server = McpServerFactory.build(
        name="http",
        transport=McpServer.Transport.STREAMABLE_HTTP,
        command="",
        url="https://mcp.example.com/mcp",
        header_env=header_env,
    )
    with pytest.raises(ValidationError) as caught:
        server.full_clean()
    assert "header_env" in caught.value.message_dict


def test_args_must_be_a_list_of_strings() -> None:
    with pytest.raises(ValidationError) as caught:
        McpServerFactory.build(name="s", args="-m server").full_clean()
    assert "args" in caught.value.message_dict


def test_transport_requires_its_fields() -> None:
    with pytest.raises(ValidationError) as caught:
        McpServerFactory.build(name="s", command="").full_clean()
    assert "command" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        McpServerFactory.build(
            name="h", transport=McpServer.Transport.STREAMABLE_HTTP, command="", url=""
        ).full_clean()
    assert "url" in caught.value.message_dict


def test_timeouts_and_retries_fall_back_to_the_server() -> None:
    server = McpServerFactory.create(call_timeout=42, retries=4, startup_timeout=20)
    tool = McpToolFactory.create(server=server, annotations={"readOnlyHint": True})
    assert (tool.effective_timeout, tool.effective_retries) == (42, 4)
    assert (tool.attempts_decision.value, tool.step_timeout) == (5, 42 + 20 + 10)
    tool.timeout_override, tool.retries_override = 7, 0
    assert (tool.effective_timeout, tool.effective_retries) == (7, 0)
    assert (tool.attempts_decision.value, tool.step_timeout) == (1, 7 + 20 + 10)
    tool.effect_override, tool.retries_override = "non_idempotent_write", 3
    assert (tool.effective_retries, tool.attempts_decision.value) == (3, 1)


def test_server_spec_get_builds_the_client_spec_without_values() -> None:
    McpServerFactory.create(
        name="search",
        command="/usr/bin/python3",
        args=["-m", "demo"],
        cwd="/srv",
        env_names=["SEARCH_TOKEN"],
        startup_timeout=12,
        call_timeout=34,
    )
    spec = server_spec_get(name="search")
    assert spec.name == "search"
    assert spec.transport == "stdio"
    assert spec.command == "/usr/bin/python3"
    assert list(spec.args) == ["-m", "demo"]
    assert spec.cwd == "/srv"
    assert list(spec.env_names) == ["SEARCH_TOKEN"]
    assert (spec.startup_timeout, spec.call_timeout) == (12, 34)


def test_server_spec_get_refuses_disabled_and_unknown_servers() -> None:
    McpServerFactory.create(name="off", enabled=False)
    with pytest.raises(McpServer.DoesNotExist):
        server_spec_get(name="off")
    with pytest.raises(McpServer.DoesNotExist):
        server_spec_get(name="missing")


def test_exposable_tools_are_enabled_available_and_on_enabled_servers() -> None:
    shown = McpToolFactory.create(name="shown")
    McpToolFactory.create(name="disabled", enabled=False)
    McpToolFactory.create(name="gone", available=False)
    McpToolFactory.create(name="server_off", server=McpServerFactory.create(enabled=False))
    assert list(tool_list_exposable()) == [shown]
