"""What ``agents_app.gateway.dex_gateway`` builds before it calls Dex (no engine needed)."""

from typing import Any

from agents_app.gateway import dex_gateway
from dex_agents import ToolEffect, ToolPolicy


def test_tool_policies_follow_the_agent_config() -> None:
    config: dict[str, Any] = {
        "tools": [
            {"name": "search__web_search", "effect": "read", "requires_approval": False},
            {"name": "files__write", "effect": "idempotent_write", "requires_approval": False},
            {
                "name": "slack__post",
                "effect": "non_idempotent_write",
                "requires_approval": True,
                "approval_deadline_seconds": 90,
            },
            {
                "name": "docs__fetch",
                "effect": "read",
                "requires_approval": False,
                "timeout_seconds": 5,
                "retries": 0,
                "step_timeout_seconds": 45,
            },
        ]
    }
    assert dex_gateway.tool_policies_build(agent_config=config) == {
        # Snapshots without limits (sessions started before issue 23): the seed's defaults.
        "search__web_search": ToolPolicy(ToolEffect.READ, False),
        "files__write": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE, False),
        "slack__post": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE, True, 90),
        # The Step gets the backstop limit; the runner enforces the MCP request's 5 s itself.
        "docs__fetch": ToolPolicy(ToolEffect.READ, False, timeout_seconds=45, retries=0),
    }
    # A user answering the server's question stops the request's clock, not the Step's.
    with_questions = dex_gateway.tool_policies_build(
        agent_config={**config, "elicitation_timeout_seconds": 600}
    )
    assert with_questions["docs__fetch"].timeout_seconds == 645
    assert with_questions["search__web_search"].timeout_seconds is None
