"""The cap on running turns per user (``DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER``) on the real
stack: a message that would start one turn too many is kept (202 ``pending``,
``pending_reason`` ``active_session_limit``; a new session's first message likewise), and it
runs once the user's running turn ends. Nothing is lost; other users are not held."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_events_relay import answered, slow_message, snapshot_when

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    extra = {"DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER": "1"}
    with running_stack(tmp_path_factory.mktemp("active-limit"), extra_env=extra) as platform:
        yield platform


def test_a_turn_over_the_cap_waits_for_the_running_one_and_is_never_lost(stack: Stack) -> None:
    with stack.api() as api:
        running = api.post("/api/v1/sessions/",
                           json={"agent": "demo", "message": slow_message(0.4, words=45)})
        assert running.status_code == 201, running.text
        assert running.json()["first_message"] is None
        first_id = running.json()["id"]
        snapshot_when(stack, first_id, lambda s: s["status"] == "running_model",
                      "the first turn to run")

        # A second session's first message waits, and says why.
        second = api.post("/api/v1/sessions/", json={"agent": "demo", "message": "second"})
        assert second.status_code == 201, second.text
        held = second.json()["first_message"]
        assert held["delivery"] == "pending"
        assert held["pending_reason"] == "active_session_limit"
        second_id = second.json()["id"]

        # So does a message to an idle session; it is listed in that session's queue.
        idle = api.post("/api/v1/sessions/", json={"agent": "demo"}).json()["id"]
        sent = api.post(f"/api/v1/sessions/{idle}/messages/", json={"text": "third"})
        assert sent.status_code == 202, sent.text
        assert sent.json()["delivery"] == "pending"
        assert sent.json()["pending_reason"] == "active_session_limit"
        queue = api.get(f"/api/v1/sessions/{idle}/queue/").json()
        assert [item["id"] for item in queue["queued"]] == [sent.json()["id"]]
        # Held while the first turn runs: neither held session has a user message yet.
        assert not api.get(f"/api/v1/sessions/{idle}/").json()["messages"]

    # Another user is not held by the owner's cap.
    with stack.api("other") as other:
        theirs = other.post("/api/v1/sessions/", json={"agent": "demo", "message": "mine"})
        assert theirs.status_code == 201
        assert theirs.json()["first_message"] is None

    # The first turn ends; the held messages run, one at a time, and each is answered once.
    answered(stack, first_id, 1)
    for session_id, text in ((second_id, "second"), (idle, "third")):
        # One after the other, each through the Celery worker once the turn before it ended:
        # minutes on a loaded machine.
        snapshot = snapshot_when(
            stack, session_id,
            lambda s: s["status"] == "waiting_for_user_message"
            and any(m["role"] == "assistant" for m in s["messages"]),
            f"the held message of {session_id} to be answered", timeout=240,
        )
        users = [m["text"] for m in snapshot["messages"] if m["role"] == "user"]
        assert users == [text]


def no_turn_runs(stack: Stack) -> None:
    """Wait until the index (which the cap counts) shows none of the user's sessions running
    a turn: an earlier test's last turn may still be ending there."""
    with stack.api() as api:
        def idle() -> bool | None:
            listed = api.get("/api/v1/sessions/", params={"limit": 200}).json()["results"]
            return all(
                item["status"] not in ("starting", "running_model", "running_tools")
                for item in listed
            ) or None

        wait_until("no running turn in the session index", idle, timeout=120)


def test_a_held_first_message_is_waited_for_by_send_and_wait(stack: Stack) -> None:
    no_turn_runs(stack)
    with stack.api() as api:
        running = api.post("/api/v1/sessions/",
                           json={"agent": "demo", "message": slow_message(0.2, words=30)})
        assert running.status_code == 201 and running.json()["first_message"] is None
        waited = api.post("/api/v1/sessions/?wait=90",
                          json={"agent": "demo", "message": "held then answered"}, timeout=120)
    assert waited.status_code == 201, waited.text
    body = waited.json()
    # It was held, and the answer says where it stands after the wait: delivered.
    assert body["first_message"]["delivery"] == "delivered"
    assert body["first_message"]["pending_reason"] == ""
    assert body["turn"] == {"finished": True, "turn_id": "turn-1", "status": "completed"}
    assert [m["role"] for m in body["session"]["messages"]] == ["user", "assistant"]
    answered(stack, running.json()["id"], 1)
