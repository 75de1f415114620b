"""Issue 23 through the whole platform: sessions' MCP calls as real processes.

- An answered call is recorded once, succeeded, although its server exits right after
  answering (the client used to ask it for its tool list and fail the call, then Dex ran the
  tool again).
- A crash during a call tells the model the exit code and the last lines of stderr, in prose.
- Each agent session gets its own server state: a resource one session of the owner created
  is not listed in the owner's next session, nor in another user's; a ``user``-isolated
  server lets the owner's sessions share it and still keeps the other user out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PYTHON, wait_until
from tests.e2e.relay_stack import Stack, running_stack
from tests.mcp_registry.conftest import everything_command

pytestmark = pytest.mark.e2e

STUB = Path(__file__).resolve().parents[1] / "mcp_registry" / "stub_server.py"
GZIP_ARGUMENTS = {"data": "data:text/plain;base64,aGVsbG8=", "outputType": "resourceLink"}


def _servers_yaml(journal: Path) -> str:
    node, script = everything_command()
    stub = (
        f"    transport: stdio\n    command: {PYTHON}\n    trust_annotations: true\n"
    )
    everything = (
        f"    transport: stdio\n    command: {json.dumps(node)}\n"
        f"    args: [{json.dumps(script)}, stdio]\n    trust_annotations: true\n"
        "    tools:\n      gzip-file-as-resource: {requires_approval: false}\n"
    )
    return (
        "servers:\n"
        f"  - name: answers\n{stub}"
        f"    args: [{json.dumps(str(STUB))}, --journal, {json.dumps(str(journal))},"
        " --exit-after-call]\n"
        f"  - name: crashes\n{stub}"
        f"    args: [{json.dumps(str(STUB))}, --crash-in-call, '3']\n"
        f"  - name: apart\n{everything}"
        f"  - name: peruser\n{everything}    isolation: user\n"
    )


ATTACH_CODE = """
import json
from agents_app.models import AgentDefinition
from mcp_registry.models import McpTool
tools = McpTool.objects.filter(available=True, exposed_name__in=[
    "answers__echo", "crashes__echo", "apart__gzip-file-as-resource",
    "peruser__gzip-file-as-resource"])
AgentDefinition.objects.get(slug="demo").tools.add(*tools)
print(json.dumps(sorted(tool.exposed_name for tool in tools)))
"""
PROCESS_CODE = """
import json
from mcp_registry.models import McpServerProcess
print(json.dumps([[row.state, row.exit_code, row.error, row.scope.split()[0]]
                  for row in McpServerProcess.objects.filter(server__name="crashes")]))
"""


def _turn(stack: Stack, persona: str, session_id: str | None, message: str) -> tuple[str, str]:
    """Send ``message`` (in a new demo session when ``session_id`` is None); the session's ID
    and the text of the turn's last tool result once the turn has ended."""
    with stack.api(persona) as api:
        if session_id is None:
            created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
            assert created.status_code == 201, created.text
            session_id = str(created.json()["id"])
            turns_before = 0
        else:
            before = api.get(f"/api/v1/sessions/{session_id}/").json()
            turns_before = sum(1 for item in before["messages"] if item["role"] == "tool")
            sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": message})
            assert sent.status_code == 202, sent.text

        def probe() -> str | None:
            snapshot: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()
            results = [item for item in snapshot["messages"] if item["role"] == "tool"]
            if snapshot["status"] != "waiting_for_user_message" or len(results) <= turns_before:
                return None
            return str(results[-1]["text"])

        text: str = wait_until(f"{session_id}'s tool result", probe, timeout=120)
    return session_id, text


def test_sessions_call_mcp_servers_exactly_and_apart(tmp_path: Path) -> None:
    journal = tmp_path / "answers.journal"
    config = tmp_path / "servers.yaml"
    config.write_text(_servers_yaml(journal))
    with running_stack(tmp_path / "stack") as stack:
        stack.processes.run([PYTHON, "manage.py", "mcp_import", "--no-discover", str(config)])
        for server in ("answers", "crashes", "apart", "peruser"):
            stack.processes.run([PYTHON, "manage.py", "mcp_discover", server])
        assert stack.django_shell(ATTACH_CODE) == [
            "answers__echo", "apart__gzip-file-as-resource", "crashes__echo",
            "peruser__gzip-file-as-resource",
        ]

        # Point 1: answered, then the server exited; recorded once, as the answer.
        _, text = _turn(stack, "owner", None, '/tool answers__echo {"text": "once"}')
        assert text == "once"
        calls = [line for line in journal.read_text().splitlines() if '"tools/call"' in line]
        assert len(calls) == 1

        # Points 8 and 13: the model reads how the server ended, in prose.
        _, text = _turn(stack, "owner", None, '/tool crashes__echo {"text": "x"}')
        assert text.startswith(
            "Tool call failed: MCP server 'crashes' exited with code 3 during the call to tool "
            "'echo'. Last lines of its stderr:\nstub: about to fail\nstub: disk is on fire"
        ), text
        assert "mcp_registry" not in text and "Error" not in text
        rows = wait_until("the crash rows", lambda: [
            row for row in stack.django_shell(PROCESS_CODE) if row[0] == "exited"
        ] or None)
        # Three attempts (a read retries), each its own process of the session, each exited 3.
        assert len(rows) == 3
        assert all(row == ["exited", 3, "the server process exited with code 3", "session"]
                   for row in rows)

        # Point 4: server state stays in its session ("apart") or with its user ("peruser").
        for server, owner_again_sees in (("apart", False), ("peruser", True)):
            create = json.dumps({"name": f"{server}.gz", **GZIP_ARGUMENTS})
            first, text = _turn(stack, "owner", None,
                                f"/tool {server}__gzip-file-as-resource {create}")
            uri = f"demo://resource/session/{server}.gz"
            assert uri in text
            listing = f'/tool mcp_list_resources {{"server": "{server}"}}'
            assert uri in _turn(stack, "owner", first, listing)[1]
            assert (uri in _turn(stack, "owner", None, listing)[1]) is owner_again_sees
            assert uri not in _turn(stack, "other", None, listing)[1]
