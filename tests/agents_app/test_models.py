"""AgentDefinition's agent_config snapshot and the session index."""

import pytest

from agents_app.models import AgentSession
from tests.factories import (
    AgentDefinitionFactory,
    AgentSessionFactory,
    McpServerFactory,
    McpToolFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def test_agent_config_snapshots_model_prompt_and_exposable_tools() -> None:
    search = McpServerFactory.create(name="search", trust_annotations=True)
    files = McpServerFactory.create(name="files", trust_annotations=True)
    off = McpServerFactory.create(name="off", enabled=False)
    web_search = McpToolFactory.create(
        server=search,
        name="web_search",
        description="Search the web.",
        input_schema={"type": "object", "properties": {"query": {"type": "string"}}},
        annotations={"readOnlyHint": True},
    )
    write = McpToolFactory.create(
        server=files,
        name="write_file",
        description="Write a file.",
        annotations={"idempotentHint": True, "destructiveHint": False},
    )
    disabled = McpToolFactory.create(server=search, name="disabled", enabled=False)
    gone = McpToolFactory.create(server=search, name="gone", available=False)
    on_disabled_server = McpToolFactory.create(server=off, name="anything")
    agent = AgentDefinitionFactory.create(
        slug="helper",
        model="openai/gpt-4o-mini",
        api_base="",
        api_key_env="OPENAI_API_KEY",
        system_prompt="Be brief.",
        approval_deadline_seconds=600,
    )
    write.approval_deadline_override = 30
    write.timeout_override = 5
    write.retries_override = 0
    write.save()
    agent.tools.add(web_search, write, disabled, gone, on_disabled_server)

    assert agent.agent_config() == {
        "agent": "helper",
        "model": "openai/gpt-4o-mini",
        "api_base": None,
        "api_key_env": "OPENAI_API_KEY",
        "system_prompt": "Be brief.",
        "tools": [
            {
                "name": "files__write_file",
                "server": "files",
                "tool": "write_file",
                "description": "Write a file.",
                "parameters": write.input_schema,
                "effect": "idempotent_write",
                "requires_approval": True,
                "approval_deadline_seconds": 30,
                "timeout_seconds": 5,
                "retries": 0,
                "step_timeout_seconds": 5 + 30 + 10,  # + startup timeout + margin
            },
            {
                "name": "search__web_search",
                "server": "search",
                "tool": "web_search",
                "description": "Search the web.",
                "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
                "effect": "read",
                "requires_approval": False,
                "approval_deadline_seconds": 600,
                "timeout_seconds": 60,  # the server's defaults
                "retries": 2,
                "step_timeout_seconds": 60 + 30 + 10,
            },
        ],
        "elicitation_timeout_seconds": 600,
    }
    narrowed = agent.agent_config(tool_names=["search__web_search", "off__anything"])
    assert [tool["name"] for tool in narrowed["tools"]] == ["search__web_search"]
    # MCP servers' questions wait the agent's own time when it sets one.
    agent.elicitation_timeout_seconds = 90
    assert agent.agent_config()["elicitation_timeout_seconds"] == 90


def test_agent_config_keeps_api_base_and_blank_key_env_as_none() -> None:
    agent = AgentDefinitionFactory.create(api_base="http://127.0.0.1:8811/v1", api_key_env="")
    config = agent.agent_config()
    assert config["api_base"] == "http://127.0.0.1:8811/v1"
    assert config["api_key_env"] is None
    assert config["tools"] == []
    assert "supports_images" not in config  # unset: LiteLLM's model information decides


def test_agent_config_carries_whether_the_model_accepts_images() -> None:
    assert AgentDefinitionFactory.create(supports_images=True).agent_config()[
        "supports_images"] is True
    assert AgentDefinitionFactory.create(supports_images=False).agent_config()[
        "supports_images"] is False


def test_sessions_are_listed_newest_first_per_owner() -> None:
    owner = UserFactory.create(username="owner")
    first = AgentSessionFactory.create(owner=owner)
    second = AgentSessionFactory.create(owner=owner)
    AgentSessionFactory.create()
    assert list(AgentSession.objects.filter(owner=owner)) == [second, first]
    assert first.status == "starting"
    assert str(first) == first.id
