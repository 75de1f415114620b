"""A tool's timeout and retries, declared in YAML, decide its calls' attempts (issue 23).

Real engine, worker, web, demo model and stub stdio MCP servers
(``tests/agents_app/failing_mcp_server.py``), which log every call they receive: one line per
Step attempt that reached a server.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.agents_app.failing_mcp_server import LOG_ENV, calls_count
from tests.e2e.conftest import PYTHON, ROOT, Ports, Processes, wait_until
from tests.e2e.test_turn import _start_engine

pytestmark = pytest.mark.e2e

FAILING_SERVER = ROOT / "tests" / "agents_app" / "failing_mcp_server.py"


def _servers_yaml(log: Path) -> str:
    """``crashy`` (its ``crash`` tool retries 0 times) and ``hangy`` (the server allows 600 s,
    its ``hang`` tool 2 s and no retry); both trusted, so their read-only tools are ``read``."""
    common = (
        f"    transport: stdio\n    command: {PYTHON}\n"
        f"    args: [{json.dumps(str(FAILING_SERVER))}]\n"
        f"    env_values: {{{LOG_ENV}: {json.dumps(str(log))}}}\n    trust_annotations: true\n"
    )
    return (
        "servers:\n"
        f"  - name: crashy\n{common}    tools:\n      crash: {{retries: 0}}\n"
        f"  - name: hangy\n{common}    call_timeout: 600\n"
        "    tools:\n      hang: {timeout: 2, retries: 0}\n"
    )


def _shell(processes: Processes, code: str) -> str:
    return processes.run([PYTHON, "manage.py", "shell", "-c", code])


def _tool_result(api: httpx.Client, session_id: str) -> dict[str, Any]:
    """The session's one tool result message, once its turn has ended."""

    def probe() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()
        if snapshot["status"] != "waiting_for_user_message":
            return None
        results = [item for item in snapshot["messages"] if item["role"] == "tool"]
        assert snapshot.get("last_turn_error") in (None, ""), snapshot
        return results[0] if len(results) == 1 else None

    # The deadline is generous; without the tool's own timeout the call would take 600 s.
    result: dict[str, Any] = wait_until(f"{session_id}'s tool result", probe, timeout=120)
    return result


def test_tool_timeout_and_retries_from_yaml_set_the_attempts_of_its_calls(
    processes: Processes, ports: Ports, stack_env: dict[str, str], tmp_path: Path
) -> None:
    log = tmp_path / "mcp-calls.log"
    config = tmp_path / "servers.yaml"
    config.write_text(_servers_yaml(log))
    processes.migrate()
    processes.run([PYTHON, "manage.py", "seed_demo"])
    processes.run([PYTHON, "manage.py", "mcp_import", "--no-discover", str(config)])
    processes.run([PYTHON, "manage.py", "mcp_discover", "crashy"])
    processes.run([PYTHON, "manage.py", "mcp_discover", "hangy"])
    _shell(processes, (
        "from agents_app.models import AgentDefinition\n"
        "from mcp_registry.models import McpTool\n"
        "tools = McpTool.objects.filter(\n"
        "    exposed_name__in=['crashy__crash', 'hangy__hang'], available=True)\n"
        "assert tools.count() == 2, list(tools)\n"
        "AgentDefinition.objects.get(slug='demo').tools.add(*tools)\n"
    ))
    token = processes.run([PYTHON, "manage.py", "createtoken", "e2e-user"]).strip().splitlines()[-1]

    _start_engine(processes, ports, stack_env)
    processes.start("model", [PYTHON, "-m", "agents_app.demo_model", "--host", "127.0.0.1",
                              "--port", str(ports.model)]).wait_for_line("demo model ready on")
    processes.start("worker", [PYTHON, "manage.py", "dexworker"]).wait_for_line("dexworker ready")
    processes.start("web", [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                            "--host", "127.0.0.1", "--port", str(ports.web)]
                    ).wait_for_line("Application startup complete")
    api = httpx.Client(base_url=f"http://127.0.0.1:{ports.web}",
                       headers={"Authorization": f"Token {token}"}, timeout=30)
    wait_until("healthz to report every part up",
               lambda: api.get("/healthz").status_code == 200, timeout=60)

    def start(tool: str) -> str:
        message = f"/tool {tool} {{}}"
        created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
        assert created.status_code == 201, created.text
        session_id: str = created.json()["id"]
        return session_id

    # retries 0: one attempt, then the read is recorded failed.
    result = _tool_result(api, start("crashy__crash"))
    assert result["text"].startswith("Tool call failed: ")
    assert "MCP server 'crashy'" in result["text"]
    assert calls_count(log, "crash") == 1

    # Without the tool's override, the server's retries (2): three attempts.
    _shell(processes, (
        "from mcp_registry.models import McpTool\n"
        "McpTool.objects.filter(server__name='crashy', name='crash')"
        ".update(retries_override=None)\n"
    ))
    result = _tool_result(api, start("crashy__crash"))
    assert result["text"].startswith("Tool call failed: ")
    assert calls_count(log, "crash") == 1 + 3

    # The tool's 2 s, not the server's 600 s, ends the hanging call, once.
    result = _tool_result(api, start("hangy__hang"))
    assert result["text"] == (
        "Tool call failed: mcp_registry.client.McpTransportError: MCP server 'hangy' did not "
        "answer the call to tool 'hang' in time"
    )
    assert calls_count(log, "hang") == 1
