"""A session whose stored state outgrows what the embedded engine can hand a worker in one
message (4 MiB) fails on its own, with a clear answer, while every other session goes on: its
approval can still be decided, and index reconciliation still serves the other sessions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

LONG = "y" * 99_000  # under the API's 100,000-character limit per message
TOO_LARGE = {"detail": "This session's stored conversation is too large for the engine to load "
                       "at once (more than 4 MiB); start a new session.",
             "unavailable": "engine"}
POST = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "big one"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The queue limit would refuse the 21st message: this test needs a queue past 4 MiB.
    extra = {"DEXAGENTS_MAX_QUEUED_MESSAGES": "100"}
    with running_stack(tmp_path_factory.mktemp("large"), extra_env=extra) as platform:
        yield platform


def test_an_oversized_session_fails_alone_and_says_why(stack: Stack) -> None:
    owner, staff = stack.api("owner"), stack.api("staff")
    big = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": POST}).json()["id"]
    pending = wait_until(
        "the write to wait for approval",
        lambda: [item for item in staff.get("/api/v1/approvals/").json()
                 if item["session"] == big],
        timeout=30,
    )
    for _ in range(45):  # about 4.5 MB of queued text behind the waiting turn
        answer = owner.post(f"/api/v1/sessions/{big}/messages/", json={"text": LONG})
        assert answer.status_code == 202, answer.text

    refused = owner.get(f"/api/v1/sessions/{big}/")
    assert (refused.status_code, refused.json()) == (503, TOO_LARGE)

    # Every other session is served as usual, the first turn included.
    small = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "still here?"})
    assert small.status_code == 201, small.text
    small_id = small.json()["id"]

    def answered() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = owner.get(f"/api/v1/sessions/{small_id}/").json()
        messages = snapshot.get("messages", [])
        return snapshot if messages and messages[-1]["role"] == "assistant" else None

    snapshot = wait_until("another session to answer", answered, timeout=60)
    assert snapshot["messages"][-1]["text"] == "You said: still here?"
    assert owner.get("/healthz").status_code == 200

    # Reconciliation skips what it cannot read and still repairs the others.
    stack.django_shell("import json; from agents_app.models import AgentSession as S; "
                  f"S.objects.filter(pk={small_id!r}).update(status='running_model'); "
                  "print(json.dumps(1))")
    result = stack.django_shell("import json; from agents_app.tasks import reconcile_session_index "
                           "as r; print(json.dumps(r()))")
    assert result["unreadable"] == 1 and result["statuses"] >= 1, result
    listed = owner.get("/api/v1/sessions/", params={"status": "waiting_for_user_message"})
    assert small_id in [row["id"] for row in listed.json()["results"]]

    # Its approval can still be decided (the index has the call; no snapshot is needed).
    interrupt_id = pending[0]["interrupt_id"]
    decided = staff.post(f"/api/v1/sessions/{big}/interrupts/{interrupt_id}/",
                         json={"approved": False, "rejection_message": "too big anyway"})
    assert decided.status_code == 200, decided.text
    stopped = owner.post(f"/api/v1/sessions/{big}/stop/")
    assert stopped.status_code == 202, stopped.text


BIG_KB = 1024  # the demo model's largest /big


def test_a_session_past_4_mib_is_read_in_pages(stack: Stack) -> None:
    """Four answers of 1 MiB each (over 8 MB with their stored items): the snapshot answers
    with the newest message cut to fit (text_length says how long it is), and the message
    pages, each under 3 MiB, hold every message, the 1 MiB answers whole."""
    owner = stack.api("owner")
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": f"/big {BIG_KB}"})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    for _ in range(3):
        queued = owner.post(f"/api/v1/sessions/{session}/messages/",
                            json={"text": f"/big {BIG_KB}"})
        assert queued.status_code == 202, queued.text

    def all_answered() -> dict[str, Any] | None:
        response = owner.get(f"/api/v1/sessions/{session}/")
        assert response.status_code == 200, response.text[:500]
        body: dict[str, Any] = response.json()
        last = body["messages"][-1] if body["messages"] else None
        done = (body["status"] == "waiting_for_user_message" and not body["queued_messages"]
                and last is not None and last["role"] == "assistant"
                and last["sequence"] >= 8)
        return body if done else None

    snapshot = wait_until("four large answers", all_answered, timeout=240, interval=1)
    newest = snapshot["messages"][-1]
    assert newest["text_length"] == BIG_KB * 1024
    assert newest["text"].endswith("more characters not shown here]")
    assert snapshot["has_older_messages"] is True

    texts: dict[int, str] = {}
    before: int | None = None
    for _ in range(20):
        params = {"limit": 50, **({"before": before} if before is not None else {})}
        page = owner.get(f"/api/v1/sessions/{session}/messages/", params=params)
        assert page.status_code == 200, page.text[:500]
        assert len(page.content) < 3.5 * 1024 * 1024
        body = page.json()
        for item in body["messages"]:
            assert "text_length" not in item, item["sequence"]
            texts[item["sequence"]] = item["text"]
        before = body["next_before"]
        if before is None:
            break
    assert sorted(texts) == list(range(1, newest["sequence"] + 1))
    answers = [text for text in texts.values() if len(text) == BIG_KB * 1024]
    assert len(answers) == 4
