"""The Worker child of the image session test: the LiteLLM runner in a real Dex Worker, its
tools on ``@modelcontextprotocol/server-everything`` (a stdio subprocess of the Worker)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from agents_app.worker.model_calls import model_calls_warm
from agents_app.worker.runner import LiteLLMRunner
from dex_agents import AgentSessionFlow, AgentSessionOptions, ToolEffect
from dex_agents.testing import run_agent_worker
from mcp_registry.client import McpServerSpec

FLOW_TYPE = "RunnerImagesAgent"
EVERYTHING_JS = (
    Path(__file__).resolve().parents[3]
    / "tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)
IMAGE_TOOL: dict[str, Any] = {
    "name": "everything__get-tiny-image",
    "server": "everything",
    "tool": "get-tiny-image",
    "description": "Returns a tiny MCP logo image.",
    "parameters": {"type": "object", "properties": {}},
    "effect": "read",
    "requires_approval": False,
}
WRITE_TOOL: dict[str, Any] = {
    **IMAGE_TOOL,
    "name": "everything__echo",
    "tool": "echo",
    "description": "Echoes back the input.",
    "parameters": {"type": "object", "properties": {"message": {"type": "string"}}},
    # Not read: the session waits for approval before it runs.
    "effect": "non_idempotent_write",
}


def everything_spec() -> McpServerSpec:
    """server-everything over stdio, run by ``node``."""
    return McpServerSpec(
        name="everything",
        transport="stdio",
        command=shutil.which("node") or "node",
        args=(str(EVERYTHING_JS), "stdio"),
        startup_timeout=30.0,
        call_timeout=30.0,
    )


async def _resolve(name: str) -> McpServerSpec:
    if name != "everything":
        raise LookupError(f"the image test enables only server-everything ({name})")
    return everything_spec()


def build_flow() -> AgentSessionFlow:
    """The Flow the test process and the Worker child both build."""
    return AgentSessionFlow(
        LiteLLMRunner(_resolve),
        flow_type=FLOW_TYPE,
        options=AgentSessionOptions(default_tool_effect=ToolEffect.UNCLASSIFIED),
    )


if __name__ == "__main__":
    run_agent_worker([build_flow()], warm_up=model_calls_warm)
