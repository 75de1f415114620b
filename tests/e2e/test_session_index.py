"""The Django session and approvals index against the real platform: engine, dexworker, web and
demo model as processes. The worker keeps statuses and approvals current without anyone reading
a session's detail; reconciliation repairs an index that lost writes; staff read (but do not
write to) other users' sessions; messages page backwards; a session can narrow its tools."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

POST = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "hi"})
NEVER_POSTED = "/tool slack__post_message " + json.dumps({"channel": "random", "text": "never"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("index")) as platform:
        yield platform


def _listed(client: httpx.Client, session_id: str, **params: str) -> dict[str, Any] | None:
    answer = client.get("/api/v1/sessions/", params={"limit": "200", **params})
    assert answer.status_code == 200, answer.text
    return next((row for row in answer.json()["results"] if row["id"] == session_id), None)


def _held_write(stack: Stack, message: str) -> tuple[str, list[dict[str, Any]]]:
    """Start an ``owner`` session of the demo agent with ``message`` (a ``/tool`` call of a
    write) and wait until its approval is both in the index and held by Dex.

    Returns:
        The session ID and ``Stack.held_approvals`` of it (at least one row).

    Raises:
        AssertionError: the session was not created (201), or no approval was held within
            30 s.
    """
    owner = stack.api("owner")
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
    assert created.status_code == 201, created.text
    session_id = str(created.json()["id"])
    pending = wait_until(
        "the approval in the index and in Dex",
        lambda: stack.held_approvals(session_id),
        timeout=30,
    )
    return session_id, pending


def test_the_index_follows_the_worker_and_reconciles_from_dex(stack: Stack) -> None:
    owner, staff = stack.api("owner"), stack.api("staff")

    # A slow turn is listed as running and then as waiting, read from the list alone.
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "/slow 0.4\nhi"})
    assert created.status_code == 201, created.text
    slow_id = created.json()["id"]
    wait_until("the list to show the turn running",
               lambda: _listed(owner, slow_id, status="running_model"), timeout=30)
    wait_until("the list to show the turn finished",
               lambda: _listed(owner, slow_id, status="waiting_for_user_message"), timeout=60)

    # A write: the approval is indexed by the worker, and the list says the session waits.
    # Reconciliation below reads Dex: the helper waits until Dex holds the approval too.
    session_id, pending = _held_write(stack, POST)
    assert [item["state"] for item in pending] == ["pending"]
    assert _listed(owner, session_id, status="awaiting_approval")

    # Staff read the owner's session, but only the owner writes to it.
    for path in ("", "history/", "messages/"):
        answer = staff.get(f"/api/v1/sessions/{session_id}/{path}")
        assert answer.status_code == 200, (path, answer.text)
    detail = staff.get(f"/api/v1/sessions/{session_id}/").json()
    assert (detail["can_send"], detail["can_approve"], detail["owner"]) == (
        False, True, "owner")
    assert owner.get(f"/api/v1/sessions/{session_id}/").json()["can_send"] is True
    refused = staff.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "hello"})
    assert refused.status_code == 403, refused.text

    # The index loses both writes (as if a worker died before them) and gains a phantom.
    interrupt_id = pending[0]["interrupt_id"]
    stack.django_shell(
        "import json, datetime; from django.utils import timezone; "
        "from agents_app.models import AgentSession as S, ApprovalRequest as R; "
        f"R.objects.filter(session_id={session_id!r}).delete(); "
        f"S.objects.filter(pk={session_id!r}).update(status='running_model'); "
        f"R.objects.create(session_id={session_id!r}, interrupt_id='turn-9.call_9', "
        "tool_call_id='call_9', tool_name='slack__post_message', arguments='{}', "
        "requested_at=timezone.now() - datetime.timedelta(minutes=5)); print(json.dumps(1))"
    )
    result = stack.django_shell(
        "import json; from agents_app.tasks import reconcile_session_index as r; "
        "print(json.dumps(r()))"
    )
    assert result["opened"] == 1 and result["closed"] == 1, result
    listed = [item for item in staff.get("/api/v1/approvals/").json()
              if item["session"] == session_id]
    assert [item["interrupt_id"] for item in listed] == [interrupt_id]
    assert _listed(owner, session_id, status="running_tools")
    phantom = [row for row in staff.get("/api/v1/approvals/decisions/").json()["results"]
               if row["interrupt_id"] == "turn-9.call_9"]
    assert [row["decision"] for row in phantom] == ["withdrawn"]

    # Deciding closes the row at once; the audit trail names the decider.
    decided = staff.post(f"/api/v1/sessions/{session_id}/interrupts/{interrupt_id}/",
                         json={"approved": True})
    assert decided.status_code == 200, decided.text
    assert not [item for item in staff.get("/api/v1/approvals/").json()
                if item["session"] == session_id]
    wait_until("the turn to finish",
               lambda: _listed(owner, session_id, status="waiting_for_user_message"), timeout=30)
    trail = [row for row in staff.get("/api/v1/approvals/decisions/").json()["results"]
             if row["interrupt_id"] == interrupt_id]
    assert [(row["decision"], row["decided_by"]) for row in trail] == [
        ("approved", "staff")]


def test_messages_page_backwards_and_sessions_narrow_their_tools(stack: Stack) -> None:
    var_dir = Path(stack.env["DEXAGENTS_VAR_DIR"])
    owner = stack.api("owner")

    narrowed = owner.post("/api/v1/sessions/", json={
        "agent": "demo", "message": NEVER_POSTED, "tools": ["search__web_search"]})
    assert narrowed.status_code == 201, narrowed.text
    session_id = narrowed.json()["id"]
    bad = owner.post("/api/v1/sessions/", json={"agent": "demo", "tools": ["nope__nothing"]})
    assert bad.status_code == 400 and "tools" in bad.json(), bad.text

    def idle_with(count: int) -> dict[str, Any] | None:
        snapshot: dict[str, Any] = owner.get(f"/api/v1/sessions/{session_id}/").json()
        if snapshot["status"] == "waiting_for_user_message" and len(
                snapshot["messages"]) >= count:
            return snapshot
        return None

    # Without slack in the session, the call is an unknown tool the model hears about: no
    # approval waits and nothing is posted.
    snapshot = wait_until("the first turn", lambda: idle_with(4), timeout=30)
    assert snapshot["pending_interrupts"] == []
    posts = var_dir / "demo_mcp" / "slack_messages.json"
    assert not posts.exists() or "never" not in posts.read_text()
    for text in ("two", "three"):
        assert owner.post(f"/api/v1/sessions/{session_id}/messages/",
                          json={"text": text}).status_code == 202
        expected = len(snapshot["messages"]) + 2
        snapshot = wait_until("the turn", functools.partial(idle_with, expected), timeout=30)

    pages: list[list[dict[str, Any]]] = []
    before: int | None = None
    while True:
        params = {"limit": "3", **({"before": str(before)} if before else {})}
        answer = owner.get(f"/api/v1/sessions/{session_id}/messages/", params=params)
        assert answer.status_code == 200, answer.text
        page = answer.json()
        assert 1 <= len(page["messages"]) <= 3
        pages.append(page["messages"])
        before = page["next_before"]
        if before is None:
            break
    stitched = [message for page in reversed(pages) for message in page]
    assert stitched == snapshot["messages"]
    assert [message["sequence"] for message in stitched] == list(range(1, len(stitched) + 1))
    bad_page = owner.get(f"/api/v1/sessions/{session_id}/messages/", params={"limit": "0"})
    assert bad_page.status_code == 400 and "limit" in bad_page.json()


def _stop_in_dex_only(stack: Stack, session_id: str) -> None:
    """Stop the Flow in Dex without telling the index: what a web process killed between the
    stop RPC and its index write, or a stop from outside the platform, leaves behind."""
    stack.django_shell(
        "import json; from agents_app.gateway import dex_gateway as g; "
        f"g.run(g.session_stop(session_id={session_id!r}, reason='outside')); print(1)"
    )


def _waiting_write(stack: Stack) -> tuple[str, str]:
    """Start a session whose first tool call waits for approval: (session ID, interrupt ID)."""
    session_id, pending = _held_write(stack, NEVER_POSTED)
    return session_id, pending[0]["interrupt_id"]


def _assert_stopped_everywhere(stack: Stack, session_id: str, interrupt_id: str) -> None:
    owner, staff = stack.api("owner"), stack.api("staff")
    detail = owner.get(f"/api/v1/sessions/{session_id}/").json()
    assert (detail["status"], detail["pending_interrupts"], detail["awaiting_approval"],
            detail["can_send"]) == ("stopped", [], False, False), detail
    assert _listed(owner, session_id, status="stopped")
    assert not _listed(owner, session_id, status="awaiting_approval")
    assert not _listed(owner, session_id, status="running_tools")
    assert not [item for item in staff.get("/api/v1/approvals/").json()
                if item["session"] == session_id]
    decided = staff.post(f"/api/v1/sessions/{session_id}/interrupts/{interrupt_id}/",
                         json={"approved": True})
    assert decided.status_code == 409, decided.text
    assert decided.json()["detail"] == "This session is stopped; start a new one."
    sent = owner.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "more"})
    assert sent.status_code == 409, sent.text
    var_dir = Path(stack.env["DEXAGENTS_VAR_DIR"])
    posts = var_dir / "demo_mcp" / "slack_messages.json"
    assert not posts.exists() or "never" not in posts.read_text()


def test_stop_is_final_everywhere(stack: Stack) -> None:
    owner, staff = stack.api("owner"), stack.api("staff")

    # Stopped through the API: the index knows at once.
    session_id, interrupt_id = _waiting_write(stack)
    stopped = owner.post(f"/api/v1/sessions/{session_id}/stop/")
    assert stopped.status_code == 202, stopped.text
    _assert_stopped_everywhere(stack, session_id, interrupt_id)

    # Stopped in Dex only, then decided before anyone read it: the decision finds out.
    session_id, interrupt_id = _waiting_write(stack)
    _stop_in_dex_only(stack, session_id)
    decided = staff.post(f"/api/v1/sessions/{session_id}/interrupts/{interrupt_id}/",
                         json={"approved": True})
    assert decided.status_code == 409, decided.text
    assert decided.json()["detail"] == "This session is stopped; start a new one."
    _assert_stopped_everywhere(stack, session_id, interrupt_id)

    # Stopped in Dex only, then read: the detail finds out.
    session_id, interrupt_id = _waiting_write(stack)
    _stop_in_dex_only(stack, session_id)
    _assert_stopped_everywhere(stack, session_id, interrupt_id)

    # Stopped in Dex only, and nobody reads it: reconciliation finds out.
    session_id, interrupt_id = _waiting_write(stack)
    _stop_in_dex_only(stack, session_id)
    result = stack.django_shell(
        "import json; from agents_app.tasks import reconcile_session_index as r; "
        "print(json.dumps(r()))"
    )
    assert result["missing"] >= 0
    assert _listed(owner, session_id, status="stopped"), result
    assert not [item for item in staff.get("/api/v1/approvals/").json()
                if item["session"] == session_id]
    _assert_stopped_everywhere(stack, session_id, interrupt_id)


TITLED_AGENT_CODE = """
from agents_app.models import AgentDefinition
agent = AgentDefinition.objects.get(slug="demo")
agent.pk, agent.slug, agent.name, agent.generate_titles = None, "titled", "Titled", True
agent.save()
print('"ok"')
"""


def test_titles_skip_directives_and_a_real_model_writes_one_after_the_first_turn(
    stack: Stack,
) -> None:
    """The demo agents keep their first line; an agent with ``generate_titles`` (here the
    demo model standing in for a real one, which answers a title request) gets a title
    written after its first turn, by the Celery worker."""
    stack.django_shell(TITLED_AGENT_CODE)
    with stack.api("owner") as owner:
        kept = owner.post("/api/v1/sessions/", json={
            "agent": "demo", "message": "/think\nplan a trip to lisbon in may please",
        }).json()["id"]
        titled = owner.post("/api/v1/sessions/", json={
            "agent": "titled", "message": "/think\nplan a trip to lisbon in may please",
        })
        assert titled.status_code == 201, titled.text
        assert titled.json()["title"] == "plan a trip to lisbon in may please"
        later = owner.post("/api/v1/sessions/", json={"agent": "titled"}).json()
        assert later["title"] == "Titled"  # the agent's name until a message comes
        # A heading's marks are not part of the title; all directives: the agent and time.
        headed = owner.post("/api/v1/sessions/", json={
            "agent": "demo", "message": "# Trip to **Lisbon**\nbook it",
        }).json()
        assert headed["title"] == "Trip to Lisbon"
        directives = owner.post("/api/v1/sessions/", json={
            "agent": "demo", "message": "/slow 0\n/think",
        }).json()
        assert re.fullmatch(r"Demo agent · \d{4}-\d\d-\d\d \d\d:\d\d UTC", directives["title"])

        row = wait_until(
            "the generated title",
            lambda: (row := _listed(owner, titled.json()["id"]))
            and row["title"] != "plan a trip to lisbon in may please" and row,
            timeout=60,
        )
        assert row["title"] == "Plan a trip to lisbon in"

        answer = owner.post(f"/api/v1/sessions/{later['id']}/messages/", json={
            "text": "/slow 0\nhow long is a piece of string",
        })
        assert answer.status_code == 202, answer.text
        row = wait_until(
            "the second session's generated title",
            lambda: (row := _listed(owner, later["id"]))
            and row["title"] == "How long is a piece of" and row,
            timeout=60,
        )
        # The demo agent's session was answered long ago and keeps its first line.
        row = _listed(owner, kept)
        assert row is not None and row["title"] == "plan a trip to lisbon in may please"
