"""Approving and rejecting a tool write end to end: real engine, worker, web, demo model and MCP.

The demo agent's ``slack__post_message`` is a non-idempotent write, so it waits for approval
(ARCHITECTURE.md "Approvals"); every post is appended to ``slack_messages.json`` in the demo
state directory, which counts how often the tool really ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import PYTHON, Ports, Processes, wait_for_reply, wait_until

pytestmark = pytest.mark.e2e

REJECTION = "Not in general, please use random."
# A message whose turn calls the demo Slack write (the demo model's ``/tool`` directive).
POST_HI = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "hi"})


def _pending_for(staff: httpx.Client, session_id: str, *, seen: set[str]) -> dict[str, Any]:
    """Poll the staff approvals list until ``session_id`` has an interrupt not in ``seen``
    that Dex holds too.

    The worker indexes an approval just before the Step that raises it commits (the observer
    hears of it first), so the list can show it while Dex does not hold it yet; a decision
    posted in that window is kept for later delivery (202), not delivered (200).
    """

    def probe() -> dict[str, Any] | None:
        answer = staff.get("/api/v1/approvals/")
        assert answer.status_code == 200, answer.text
        for item in answer.json():
            if item["session"] == session_id and item["interrupt_id"] not in seen:
                detail = staff.get(f"/api/v1/sessions/{session_id}/").json()
                held = {pending["interrupt_id"] for pending in detail["pending_interrupts"]}
                return dict(item) if item["interrupt_id"] in held else None
        return None

    return wait_until("a pending approval", probe, timeout=30)


def _posted(var_dir: Path) -> list[dict[str, Any]]:
    path = var_dir / "demo_mcp" / "slack_messages.json"
    return json.loads(path.read_text()) if path.exists() else []


def _decisions(processes: Processes) -> list[dict[str, Any]]:
    """The ApprovalDecision rows of the stack's own database, oldest first."""
    code = (
        "import json; from agents_app.models import ApprovalDecision as D; "
        "print(json.dumps([dict(interrupt_id=d.interrupt_id, tool_call_id=d.tool_call_id, "
        "tool_name=d.tool_name, arguments=d.arguments, approved=d.approved, "
        "rejection_message=d.rejection_message, decided_by=d.decided_by.username, "
        "decided_at=d.decided_at.isoformat()) for d in D.objects.order_by('decided_at')]))"
    )
    out = processes.run([PYTHON, "manage.py", "shell", "-c", code])
    return list(json.loads(out.strip().splitlines()[-1]))


def _start_stack(processes: Processes, ports: Ports) -> tuple[httpx.Client, httpx.Client]:
    """Seed the demo, start engine, demo model, worker and web; the owner's and the staff
    reviewer's API clients once every part is up."""
    processes.start_platform(ports)
    owner_token = processes.create_token("e2e-owner")
    staff_token = processes.create_token("e2e-reviewer", staff=True)

    base = f"http://127.0.0.1:{ports.web}"
    owner = httpx.Client(base_url=base, headers={"Authorization": f"Token {owner_token}"},
                         timeout=30)
    staff = httpx.Client(base_url=base, headers={"Authorization": f"Token {staff_token}"},
                         timeout=30)
    wait_until("healthz to report every part up",
               lambda: owner.get("/healthz").status_code == 200, timeout=60)
    return owner, staff


def _start_session(owner: httpx.Client, message: str) -> str:
    """Start a session of the ``demo`` agent with ``message`` as ``owner``; its ID.

    Raises:
        AssertionError: the API did not answer 201.
    """
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def test_staff_approve_with_edits_runs_the_edited_call(
    processes: Processes, ports: Ports, stack_env: dict[str, str]
) -> None:
    """The reviewer changes the arguments before approving: the real MCP tool runs with the
    edited ones, the audit keeps both, and the model reads the result with a note."""
    var_dir = Path(stack_env["DEXAGENTS_VAR_DIR"])
    owner, staff = _start_stack(processes, ports)
    session_id = _start_session(owner, POST_HI)
    pending = _pending_for(staff, session_id, seen=set())
    interrupt_url = f"/api/v1/sessions/{session_id}/interrupts/{pending['interrupt_id']}/"

    # The tool's input schema requires both fields: an edit without one is refused.
    refused = staff.post(interrupt_url, json={
        "approved": True, "edited_arguments": {"channel": "random"}})
    assert refused.status_code == 400, refused.text
    assert refused.json() == {"edited_arguments": ["'text' is a required property"]}

    edited = {"channel": "random", "text": "hello from the reviewer"}
    approved = staff.post(interrupt_url, json={"approved": True, "edited_arguments": edited})
    assert approved.status_code == 200, approved.text
    snapshot = wait_for_reply(owner, session_id, message_count=2, timeout=30)
    # The MCP server received the edited arguments, and only those.
    assert [(post["channel"], post["text"]) for post in _posted(var_dir)] == [
        ("random", "hello from the reviewer")]
    final = snapshot["messages"][-1]
    assert final["role"] == "assistant"
    assert "a reviewer edited the arguments of this call before approving it" in final["text"]
    assert "hello from the reviewer" in final["text"]

    decisions = staff.get("/api/v1/approvals/decisions/", params={"session": session_id})
    assert decisions.status_code == 200, decisions.text
    [row] = decisions.json()["results"]
    assert (row["decision"], row["decided_by"], row["tool_name"]) == (
        "approved", "e2e-reviewer", "slack__post_message")
    assert json.loads(row["arguments"]) == {"channel": "general", "text": "hi"}
    assert json.loads(row["edited_arguments"]) == edited


def test_staff_approve_and_reject_a_write(
    processes: Processes, ports: Ports, stack_env: dict[str, str]
) -> None:
    var_dir = Path(stack_env["DEXAGENTS_VAR_DIR"])
    owner, staff = _start_stack(processes, ports)
    session_id = _start_session(owner, POST_HI)

    # The write waits for a decision; the tool has not run.
    pending = _pending_for(staff, session_id, seen=set())
    assert pending["agent"] == "demo"
    assert pending["owner"] == "e2e-owner"
    assert pending["tool_name"] == "slack__post_message"
    assert json.loads(pending["arguments"]) == {"channel": "general", "text": "hi"}
    interrupt_url = f"/api/v1/sessions/{session_id}/interrupts/{pending['interrupt_id']}/"
    assert _posted(var_dir) == []

    # Staff read every session they may decide on; only the owner writes to it.
    base_path = f"/api/v1/sessions/{session_id}/"
    detail = staff.get(base_path)
    assert detail.status_code == 200, detail.text
    assert detail.json()["owner"] == "e2e-owner"
    assert detail.json()["can_approve"] is True and detail.json()["can_send"] is False
    assert detail.json()["awaiting_approval"] is True
    for path in ("history/", "messages/", "queue/"):
        read = staff.get(base_path + path)
        assert read.status_code == 200, (path, read.text)
    assert staff.get(base_path + "messages/").json() == owner.get(base_path + "messages/").json()
    written = staff.post(base_path + "messages/", json={"text": "from staff"})
    assert written.status_code == 403
    assert "Only the session's owner may write to it" in written.json()["detail"]

    # The owner may neither list nor decide approvals, not even on their own session.
    assert owner.get("/api/v1/approvals/").status_code == 403
    assert owner.post(interrupt_url, json={"approved": True}).status_code == 403

    approved = staff.post(interrupt_url, json={"approved": True, "rejection_message": "ignored"})
    assert approved.status_code == 200, approved.text
    assert (approved.json()["resolved"], approved.json()["delivery"]) == (True, "delivered")
    assert approved.json()["decision"]["decided_by"] == "e2e-reviewer"
    snapshot = wait_for_reply(owner, session_id, message_count=2, timeout=30)
    assert snapshot["pending_interrupts"] == []
    posts = _posted(var_dir)
    assert [(post["channel"], post["text"]) for post in posts] == [("general", "hi")]

    again = staff.post(interrupt_url, json={"approved": True})
    assert again.status_code == 409, again.text
    assert "detail" in again.json()

    # A second write in the next turn is rejected; the model hears why and nothing is posted.
    assert owner.post(f"/api/v1/sessions/{session_id}/messages/", json={
        "text": POST_HI}).status_code == 202
    second = _pending_for(staff, session_id, seen={pending["interrupt_id"]})
    rejected = staff.post(
        f"/api/v1/sessions/{session_id}/interrupts/{second['interrupt_id']}/",
        json={"approved": False, "rejection_message": REJECTION})
    assert rejected.status_code == 200, rejected.text
    snapshot = wait_for_reply(owner, session_id, message_count=4, timeout=30)
    final = snapshot["messages"][-1]
    assert final["role"] == "assistant"
    assert REJECTION in final["text"]
    assert len(_posted(var_dir)) == 1

    decisions = _decisions(processes)
    assert [(d["interrupt_id"], d["approved"], d["rejection_message"], d["decided_by"])
            for d in decisions] == [
        (pending["interrupt_id"], True, "", "e2e-reviewer"),
        (second["interrupt_id"], False, REJECTION, "e2e-reviewer"),
    ]
    assert decisions[0]["tool_call_id"] == pending["tool_call_id"]
    assert decisions[0]["tool_name"] == "slack__post_message"
    assert decisions[0]["arguments"] == pending["arguments"]

    # An approval the index lists but Dex does not hold (its worker died after indexing it and
    # before its Step committed; another worker runs the Step again) is kept, not refused...
    ghost = f"{pending['interrupt_id'].split('.')[0]}.call_not_recorded_yet"
    processes.run([PYTHON, "manage.py", "shell", "-c", (
        "from django.utils import timezone; from agents_app.models import ApprovalRequest; "
        f"ApprovalRequest.objects.create(session_id='{session_id}', interrupt_id='{ghost}', "
        "tool_call_id='call_not_recorded_yet', tool_name='slack__post_message', "
        "arguments='{}', requested_at=timezone.now())")])
    kept = staff.post(f"/api/v1/sessions/{session_id}/interrupts/{ghost}/",
                      json={"approved": True})
    assert kept.status_code == 202, kept.text
    assert (kept.json()["resolved"], kept.json()["delivery"]) == (False, "pending")
    # ...until the index closes it: then the kept decision is refused, and nothing ran.
    refused = processes.run([PYTHON, "manage.py", "shell", "-c", (
        "from agents_app.models import ApprovalRequest, ApprovalDecision; "
        "from agents_app.sessions.outbox import approval_decision_deliver; "
        f"ApprovalRequest.objects.filter(interrupt_id='{ghost}').update(state='expired'); "
        f"print(approval_decision_deliver(decision=ApprovalDecision.objects.get("
        f"interrupt_id='{ghost}')))")])
    assert refused.strip().splitlines()[-1] == "refused"
    assert len(_posted(var_dir)) == 1

    # The owner stops the session; its snapshot still answers and it leaves the approvals scan.
    stopped = owner.post(f"/api/v1/sessions/{session_id}/stop/")
    assert stopped.status_code == 202, stopped.text
    after = owner.get(f"/api/v1/sessions/{session_id}/")
    assert after.status_code == 200, after.text
    assert after.json()["messages"] == snapshot["messages"]
    listed = owner.get("/api/v1/sessions/", params={"status": "stopped"}).json()["results"]
    assert [item["id"] for item in listed] == [session_id]
