"""The message queue and Steer through the REST API, against the real platform: engine,
dexworker, web and demo model as processes (``tests/e2e/relay_stack.py``).

A session is kept busy by a write that waits for approval (``slack__post_message``): while it
waits, messages sent to the session stay queued, so list, delete, edit and steer act on
messages no turn can take from under the test. Personas: owner, another user, staff,
anonymous.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, busy_session, running_stack

pytestmark = pytest.mark.e2e

GATED = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "held"})
#: A message's ID: its outbox row's ID (uuid4 hex), also its Dex client_id.
MESSAGE_ID = re.compile(r"^[0-9a-f]{32}$")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("queue")) as platform:
        yield platform


def send(api: httpx.Client, session_id: str, text: str, **extra: Any) -> str:
    answer = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": text, **extra})
    assert answer.status_code == 202, answer.text
    body = answer.json()
    assert body["queued"] is True
    return str(body["id"])


def queue_of(api: httpx.Client, session_id: str) -> dict[str, list[dict[str, Any]]]:
    answer = api.get(f"/api/v1/sessions/{session_id}/queue/")
    assert answer.status_code == 200, answer.text
    queue: dict[str, list[dict[str, Any]]] = answer.json()
    return queue


def texts(entries: list[dict[str, Any]]) -> list[str]:
    return [entry["text"] for entry in entries]


def snapshot_when(
    api: httpx.Client, session_id: str, ready: Callable[[dict[str, Any]], bool], description: str
) -> dict[str, Any]:
    last: dict[str, Any] = {}

    def probe() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()
        last.update(snapshot=snapshot)
        assert not snapshot.get("last_turn_error"), snapshot
        return snapshot if ready(snapshot) else None

    try:
        return wait_until(description, probe, timeout=60)
    except AssertionError as error:
        raise AssertionError(f"{error}; last snapshot: {last.get('snapshot')}") from None


async def events_until(
    stack: Stack, session_id: str, stop: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The session's events from the oldest retained, through the websocket relay, until
    ``stop`` accepts the events read so far."""
    events: list[dict[str, Any]] = []
    async with connect(
        stack.events_url(session_id, ""), additional_headers=stack.personas["owner"].bearer()
    ) as ws:
        async with asyncio.timeout(60):
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] != "event":
                    continue
                events.append(frame["event"])
                if stop(events):
                    return events


def test_list_delete_and_edit_queued_messages(stack: Stack) -> None:
    session_id, _ = busy_session(stack, GATED)
    base = f"/api/v1/sessions/{session_id}/queue/"
    with stack.api("owner") as owner:
        first = send(owner, session_id, "first", plan_mode=True)
        second = send(owner, session_id, "second")
        third = send(owner, session_id, "third")
        # The answer's ID is the one the queue lists it under (the same before and after
        # delivery: a fresh-clone trial saw it change on delivery).
        assert all(MESSAGE_ID.match(item) for item in (first, second, third)), (
            first, second, third)
        queue = queue_of(owner, session_id)
        assert queue["steered"] == []
        assert [(entry["id"], entry["text"], entry["plan_mode"]) for entry in queue["queued"]] == [
            (first, "first", True),
            (second, "second", False),
            (third, "third", False),
        ]
        assert all(
            set(entry) == {"id", "text", "plan_mode", "created_at", "delivery"}
            and entry["delivery"] == "delivered"
            for entry in queue["queued"]
        )
        assert all(entry["created_at"] for entry in queue["queued"])
        # The snapshot lists the same entries.
        snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot["queued_messages"] == queue["queued"]
        assert snapshot["steered_messages"] == []

        deleted = owner.delete(f"{base}{second}/")
        assert deleted.status_code == 204, deleted.text
        assert deleted.content == b""
        again = owner.delete(f"{base}{second}/")
        assert again.status_code == 404, again.text
        assert "detail" in again.json()
        assert texts(queue_of(owner, session_id)["queued"]) == ["first", "third"]

        # Edit: the old message leaves and the new one joins at the tail (an edit that leaves
        # out plan_mode keeps the old message's).
        edited = owner.put(f"{base}{first}/", json={"text": "first, edited"})
        assert edited.status_code == 201, edited.text
        new_id = edited.json()["id"]
        assert MESSAGE_ID.match(new_id) and new_id != first
        queue = queue_of(owner, session_id)
        assert [(entry["id"], entry["text"], entry["plan_mode"]) for entry in queue["queued"]] == [
            (third, "third", False),
            (new_id, "first, edited", True),
        ]
        stale = owner.put(f"{base}{first}/", json={"text": "lost edit"})
        assert stale.status_code == 404, stale.text
        assert owner.delete(f"{base}{first}/").status_code == 404
        assert texts(queue_of(owner, session_id)["queued"]) == ["third", "first, edited"]

        # Blank or missing text is refused with a field message, and nothing changes.
        for body in ({"text": "   "}, {"plan_mode": True}):
            refused = owner.put(f"{base}{third}/", json=body)
            assert refused.status_code == 400, refused.text
            assert refused.json()["text"], refused.text
        assert owner.post(f"{base}not-a-message/steer/").status_code == 404
        assert owner.delete(f"{base}{'x' * 100}/").status_code == 404
        assert texts(queue_of(owner, session_id)["queued"]) == ["third", "first, edited"]

        # Queue operations also accept nothing once the session stopped.
        stopped = owner.post(f"/api/v1/sessions/{session_id}/stop/")
        assert stopped.status_code == 202, stopped.text
        assert queue_of(owner, session_id) == {"queued": [], "steered": [], "partial": False}
        for answer in (
            owner.delete(f"{base}{third}/"),
            owner.put(f"{base}{third}/", json={"text": "late"}),
            owner.post(f"{base}{third}/steer/"),
        ):
            assert answer.status_code == 409, answer.text
            assert "stopped" in answer.json()["detail"]


def test_queue_permissions_owner_other_user_staff_anonymous(stack: Stack) -> None:
    session_id, _ = busy_session(stack, GATED)
    base = f"/api/v1/sessions/{session_id}/queue/"
    with stack.persona_clients() as (owner, other, staff, anonymous):
        message_id = send(owner, session_id, "mine")
        calls: list[tuple[str, str, dict[str, Any] | None]] = [
            ("GET", base, None),
            ("DELETE", f"{base}{message_id}/", None),
            ("PUT", f"{base}{message_id}/", {"text": "theirs"}),
            ("POST", f"{base}{message_id}/steer/", None),
        ]
        for method, path, body in calls:
            assert anonymous.request(method, path, json=body).status_code == 401, (method, path)
            # Another user cannot tell the session exists.
            answer = other.request(method, path, json=body)
            assert answer.status_code == 404, (method, path, answer.text)
        # Staff read the queue but do not change it.
        assert texts(queue_of(staff, session_id)["queued"]) == ["mine"]
        for method, path, body in calls[1:]:
            answer = staff.request(method, path, json=body)
            assert answer.status_code == 403, (method, path, answer.text)
        assert (
            staff.post(
                f"/api/v1/sessions/{session_id}/messages/", json={"text": "staff"}
            ).status_code
            == 403
        )
        assert [
            (entry["id"], entry["text"]) for entry in queue_of(owner, session_id)["queued"]
        ] == [(message_id, "mine")]
        assert owner.post(f"/api/v1/sessions/{session_id}/stop/").status_code == 202


def test_steer_reaches_the_model_and_withdraws_the_pending_approval(stack: Stack) -> None:
    session_id, pending = busy_session(stack, GATED)
    base = f"/api/v1/sessions/{session_id}/queue/"
    with stack.api("owner") as owner, stack.api("staff") as staff:
        later = send(owner, session_id, "after the steer")
        steer = send(owner, session_id, "change of plan")
        answer = owner.post(f"{base}{steer}/steer/")
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"steered": True}

        # The steered message reaches the model in the running turn: the gated call ends
        # cancelled without running, its approval is withdrawn, and the turn answers it.
        def steered_and_done(events: list[dict[str, Any]]) -> bool:
            return any(event["type"] == "turn_completed" for event in events) and any(
                event["data"].get("change") == "steered" for event in events
            )

        events = asyncio.run(events_until(stack, session_id, steered_and_done))
        types = [event["type"] for event in events]
        assert "steer_applied" in types, types
        applied = next(event for event in events if event["type"] == "steer_applied")
        assert applied["data"] == {
            "message_count": 1,
            "withdrawn_interrupt_ids": [pending["interrupt_id"]],
            "client_ids": [steer],
        }
        finished = [event["data"] for event in events if event["type"] == "tool_call_finished"]
        assert [(item["tool_name"], item["status"]) for item in finished] == [
            ("slack__post_message", "cancelled")
        ]
        # The web side announced the steer too (steered_and_done waited for it).
        announced = next(event for event in events if event["data"].get("change") == "steered")
        assert announced["type"] in ("queue_changed", "message_queued"), announced

        snapshot = snapshot_when(
            owner,
            session_id,
            lambda snapshot: (
                snapshot["status"] == "waiting_for_user_message"
                and snapshot["messages"][-1]["text"] == "You said: after the steer"
            ),
            "the steered turn and the queued one to end",
        )
        turn = [(message["role"], message["text"]) for message in snapshot["messages"]]
        assert turn[0] == ("user", GATED)
        assert turn[1][0] == "assistant"
        assert turn[2][0] == "tool" and "cancelled" in turn[2][1]
        assert turn[3:] == [
            ("user", "change of plan"),
            ("assistant", "You said: change of plan"),
            ("user", "after the steer"),
            ("assistant", "You said: after the steer"),
        ]
        assert snapshot["queued_messages"] == snapshot["steered_messages"] == []

        # Both messages were consumed: the queue knows neither any more.
        assert owner.post(f"{base}{steer}/steer/").status_code == 404
        assert owner.post(f"{base}{later}/steer/").status_code == 404
        assert owner.delete(f"{base}{later}/").status_code == 404

        decided = staff.post(
            f"/api/v1/sessions/{session_id}/interrupts/{pending['interrupt_id']}/",
            json={"approved": True},
        )
        assert decided.status_code == 409, decided.text
        rows = stack.django_shell(
            "import json; from agents_app.models import ApprovalRequest as R; "
            f"print(json.dumps(list(R.objects.filter(session_id={session_id!r})"
            ".values_list('interrupt_id', 'state'))))"
        )
        assert rows == [[pending["interrupt_id"], "withdrawn"]]
    posted = Path(stack.env["DEXAGENTS_VAR_DIR"]) / "demo_mcp" / "slack_messages.json"
    assert not posted.exists() or "held" not in posted.read_text()


def test_a_message_an_idle_session_takes_at_once_is_not_in_the_queue(stack: Stack) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["status"] == "waiting_for_user_message",
            "the session to wait for a message",
        )
        message_id = send(owner, session_id, "hello")
        snapshot_when(
            owner,
            session_id,
            lambda snapshot: (
                snapshot["messages"][-1:] != []
                and snapshot["messages"][-1]["text"] == "You said: hello"
            ),
            "the answer",
        )
        assert queue_of(owner, session_id) == {"queued": [], "steered": [], "partial": False}
        base = f"/api/v1/sessions/{session_id}/queue/{message_id}/"
        assert owner.delete(base).status_code == 404
        assert owner.put(base, json={"text": "too late"}).status_code == 404
        assert owner.post(f"{base}steer/").status_code == 404


def test_an_edit_without_plan_mode_keeps_it_and_a_full_queue_refuses_more(stack: Stack) -> None:
    session_id, _pending = busy_session(stack, GATED)
    with stack.api("owner") as owner:
        planned = send(owner, session_id, "a plan", plan_mode=True)
        edited = owner.put(
            f"/api/v1/sessions/{session_id}/queue/{planned}/", json={"text": "a plan, edited"}
        )
        assert edited.status_code == 201, edited.text
        assert [
            (item["text"], item["plan_mode"]) for item in queue_of(owner, session_id)["queued"]
        ] == [("a plan, edited", True)]
        # 20 messages may wait at once (DEXAGENTS_MAX_QUEUED_MESSAGES); the 21st is refused
        # and nothing already queued is lost.
        for number in range(19):
            send(owner, session_id, f"filler {number}")
        refused = owner.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "one more"})
        assert refused.status_code == 409, refused.text
        assert "queue is full (at most 20 messages" in refused.json()["detail"]
        assert len(queue_of(owner, session_id)["queued"]) == 20


def test_every_stored_message_says_when_it_was_written(stack: Stack) -> None:
    """``created_at`` on each message: a user message keeps the time it was accepted, even
    when it waited in the queue while an earlier turn ran."""
    session_id, pending = busy_session(stack, GATED)
    with stack.api("owner") as owner, stack.api("staff") as staff:
        send(owner, session_id, "sent while busy")
        [queued] = queue_of(owner, session_id)["queued"]
        approved = staff.post(
            f"/api/v1/sessions/{session_id}/interrupts/{pending['interrupt_id']}/",
            json={"approved": True},
        )
        assert approved.status_code == 200, approved.text
        snapshot = snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["status"] == "waiting_for_user_message"
            and snapshot["messages"][-1]["text"] == "You said: sent while busy",
            "the queued message to be answered",
        )
        page = owner.get(f"/api/v1/sessions/{session_id}/messages/").json()["messages"]
    messages = snapshot["messages"]
    assert [message["created_at"] for message in page] == [
        message["created_at"] for message in messages
    ]
    times = [datetime.datetime.fromisoformat(message["created_at"]) for message in messages]
    assert all(time.utcoffset() == datetime.timedelta(0) for time in times)
    assert times[0] <= times[1]  # the first message, then the model's answer to it
    later = next(message for message in messages if message["text"] == "sent while busy")
    assert later["created_at"] == queued["created_at"]
    # It was accepted before the turn it waited for ended.
    answer_before = messages[messages.index(later) - 1]
    assert answer_before["role"] in ("assistant", "tool")
    assert later["created_at"] < answer_before["created_at"]
