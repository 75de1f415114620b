"""The Worker child of the runner kill test: the LiteLLM runner in a real Dex Worker."""

from __future__ import annotations

from agents_app.worker.model_calls import model_calls_warm
from agents_app.worker.runner import LiteLLMRunner
from dex_agents import AgentSessionFlow, AgentSessionOptions, ToolEffect
from dex_agents.testing import run_agent_worker
from mcp_registry.client import McpServerSpec

FLOW_TYPE = "RunnerKillAgent"


async def _no_servers(name: str) -> McpServerSpec:
    raise LookupError(f"the kill test enables no MCP server ({name})")


def build_flow() -> AgentSessionFlow:
    """The Flow the test process and the Worker child both build."""
    return AgentSessionFlow(
        LiteLLMRunner(_no_servers),
        flow_type=FLOW_TYPE,
        options=AgentSessionOptions(default_tool_effect=ToolEffect.UNCLASSIFIED),
    )


if __name__ == "__main__":
    run_agent_worker([build_flow()], warm_up=model_calls_warm)
