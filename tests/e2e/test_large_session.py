"""Sessions larger than one 4 MiB gRPC message stay readable (issue 26): the snapshot and the
message pages hold what fits their byte budgets and the client pages through the rest, and a
queue refuses a message that would outgrow what a snapshot can carry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

LONG = "y" * 99_000  # under the API's 100,000-character limit per message
POST = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "big one"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The count limit (20) would refuse first: these tests reach the queue's byte limit.
    extra = {"DEXAGENTS_MAX_QUEUED_MESSAGES": "100"}
    with running_stack(tmp_path_factory.mktemp("large"), extra_env=extra) as platform:
        yield platform


def test_a_full_queue_refuses_instead_of_outgrowing_the_session(stack: Stack) -> None:
    """Behind a turn waiting for approval, 99,000-character messages are queued until the
    queue's texts would pass 1.5 MiB: the next one is refused with 409 and nothing changes
    (before, 45 of them made the session unreadable: every read answered 503). The session
    stays readable, other sessions are served, and its approval is decided."""
    owner, staff = stack.api("owner"), stack.api("staff")
    big = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": POST}).json()["id"]
    pending = wait_until(
        "the write to wait for approval",
        lambda: [item for item in staff.get("/api/v1/approvals/").json()
                 if item["session"] == big],
        timeout=30,
    )
    accepted = 0
    for _ in range(45):
        answer = owner.post(f"/api/v1/sessions/{big}/messages/", json={"text": LONG})
        if answer.status_code == 409:
            assert "queue is full" in answer.json()["detail"]
            break
        assert answer.status_code == 202, answer.text
        accepted += 1
    assert accepted == 15  # 15 x 99,002 bytes fit 1.5 MiB; a 16th would not

    snapshot = owner.get(f"/api/v1/sessions/{big}/")
    assert snapshot.status_code == 200, snapshot.text[:300]
    assert len(snapshot.json()["queued_messages"]) == accepted
    assert len(snapshot.content) < 4 * 1024 * 1024

    # Every other session is served as usual, the first turn included.
    small = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "still here?"})
    assert small.status_code == 201, small.text
    small_id = small.json()["id"]

    def answered() -> dict[str, Any] | None:
        body: dict[str, Any] = owner.get(f"/api/v1/sessions/{small_id}/").json()
        messages = body.get("messages", [])
        return body if messages and messages[-1]["role"] == "assistant" else None

    assert wait_until("another session to answer", answered, timeout=60)["messages"][-1][
        "text"] == "You said: still here?"

    interrupt_id = pending[0]["interrupt_id"]
    decided = staff.post(f"/api/v1/sessions/{big}/interrupts/{interrupt_id}/",
                         json={"approved": False, "rejection_message": "too big anyway"})
    assert decided.status_code == 200, decided.text
    stopped = owner.post(f"/api/v1/sessions/{big}/stop/")
    assert stopped.status_code == 202, stopped.text
    assert owner.get(f"/api/v1/sessions/{big}/").status_code == 200


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


def test_a_queue_never_outgrows_the_snapshot(stack: Stack) -> None:
    """Queued texts may take 1.5 MiB of JSON together, whatever their characters (an emoji
    is 12 bytes): a message past that is refused with 409 and nothing changes, so the
    snapshot answers, before and after the session is stopped (it answered 503 for good)."""
    owner = stack.api("owner")
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "/wait 300 hold"})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    wait_until("the durable wait", lambda: owner.get(
        f"/api/v1/sessions/{session}/").json().get("pending_timer"), timeout=60)
    emoji = "\U0001f642" * 90_000  # 1,080,002 bytes of JSON
    first = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": emoji})
    assert first.status_code == 202, first.text
    refused = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": emoji})
    assert refused.status_code == 409, refused.text
    assert "queue is full" in refused.json()["detail"]
    edited = owner.put(f"/api/v1/sessions/{session}/queue/{first.json()['id']}/",
                       json={"text": emoji[:-1] + "!"})
    assert edited.status_code == 201, edited.text
    snapshot = owner.get(f"/api/v1/sessions/{session}/")
    assert snapshot.status_code == 200, snapshot.text[:300]
    assert [len(item["text"]) for item in snapshot.json()["queued_messages"]] == [90_000]
    assert owner.post(f"/api/v1/sessions/{session}/stop/").status_code == 202
    assert owner.get(f"/api/v1/sessions/{session}/").status_code == 200
