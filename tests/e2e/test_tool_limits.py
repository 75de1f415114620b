"""A tool's timeout and retries, declared in YAML, decide its calls' attempts (issue 23).

The platform as real processes (``tests/e2e/relay_stack.py``) and two stub stdio MCP servers
(``tests/agents_app/failing_mcp_server.py``), which log every call they receive: one line per
Step attempt that reached a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.agents_app.failing_mcp_server import LOG_ENV, SCRIPT, calls_count
from tests.e2e.conftest import PYTHON, wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e


def _servers_yaml(log: Path) -> str:
    """``crashy`` (its ``crash`` tool retries 0 times) and ``hangy`` (the server allows 600 s,
    its ``hang`` tool 2 s and no retry); both trusted, so their read-only tools are ``read``."""
    common = (
        f"    transport: stdio\n    command: {PYTHON}\n    args: [{json.dumps(str(SCRIPT))}]\n"
        f"    env_values: {{{LOG_ENV}: {json.dumps(str(log))}}}\n    trust_annotations: true\n"
    )
    return (
        "servers:\n"
        f"  - name: crashy\n{common}    tools:\n      crash: {{retries: 0}}\n"
        f"  - name: hangy\n{common}    call_timeout: 600\n"
        "    tools:\n      hang: {timeout: 2, retries: 0}\n"
    )


# Gives the demo agent the two stub tools, once discovery made them available.
ATTACH_CODE = """
import json
from agents_app.models import AgentDefinition
from mcp_registry.models import McpTool
tools = McpTool.objects.filter(
    exposed_name__in=["crashy__crash", "hangy__hang"], available=True
)
AgentDefinition.objects.get(slug="demo").tools.add(*tools)
print(json.dumps(sorted(tool.exposed_name for tool in tools)))
"""
CLEAR_RETRIES_CODE = """
import json
from mcp_registry.models import McpTool
print(json.dumps(McpTool.objects.filter(exposed_name="crashy__crash").update(retries_override=None)))
"""


def _tool_result(stack: Stack, message: str) -> dict[str, Any]:
    """Start a demo session with ``message``; its one tool result once the turn has ended."""
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]

        def probe() -> dict[str, Any] | None:
            snapshot: dict[str, Any] = owner.get(f"/api/v1/sessions/{session_id}/").json()
            if snapshot["status"] != "waiting_for_user_message":
                return None
            assert snapshot.get("last_turn_error") in (None, ""), snapshot
            results = [item for item in snapshot["messages"] if item["role"] == "tool"]
            return results[0] if len(results) == 1 else None

        # Generous; without the tool's own 2 s, the hanging call would take the server's 600 s.
        result: dict[str, Any] = wait_until(f"{session_id}'s tool result", probe, timeout=120)
    return result


def test_tool_timeout_and_retries_from_yaml_set_the_attempts_of_its_calls(
    tmp_path: Path,
) -> None:
    log = tmp_path / "mcp-calls.log"
    config = tmp_path / "servers.yaml"
    config.write_text(_servers_yaml(log))
    with running_stack(tmp_path / "stack") as stack:
        stack.processes.run([PYTHON, "manage.py", "mcp_import", "--no-discover", str(config)])
        for server in ("crashy", "hangy"):
            stack.processes.run([PYTHON, "manage.py", "mcp_discover", server])
        assert stack.django_shell(ATTACH_CODE) == ["crashy__crash", "hangy__hang"]

        # retries 0: one attempt, then the read is recorded failed.
        result = _tool_result(stack, "/tool crashy__crash {}")
        assert result["text"].startswith("Tool call failed: ")
        assert "MCP server 'crashy'" in result["text"]
        assert calls_count(log, "crash") == 1

        # Without the tool's override, the server's retries (2): three attempts.
        assert stack.django_shell(CLEAR_RETRIES_CODE) == 1
        result = _tool_result(stack, "/tool crashy__crash {}")
        assert result["text"].startswith("Tool call failed: ")
        assert calls_count(log, "crash") == 1 + 3

        # The tool's 2 s, not the server's 600 s, ends the hanging call, once.
        result = _tool_result(stack, "/tool hangy__hang {}")
        # Plain prose for the model: no Python class, and how long it waited.
        assert result["text"] == (
            "Tool call failed: MCP server 'hangy' did not answer the call to tool 'hang' "
            "within 2 s; the request was cancelled"
        )
        assert calls_count(log, "hang") == 1
