"""Questions (``request_user_input``), durable waits and plans through the REST API, against
the real platform: engine, dexworker, web and demo model as processes
(``tests/e2e/relay_stack.py``).

The demo model asks with ``/ask <prompt> | <choice> | <choice>``, waits with
``/wait <seconds> <reason>``, writes a plan from a plan-mode message (one task per line) and
completes one task per model call when the plan executes. Personas: owner, another user,
staff, anonymous.
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_queue import events_until, queue_of, send, snapshot_when

pytestmark = pytest.mark.e2e

ASK = "/ask Which colour? | red | blue"
LONG_WAIT = "/wait 3600 cooling off"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("input")) as platform:
        yield platform


def start(api: httpx.Client, message: str = "") -> str:
    body = {"agent": "demo", "message": message} if message else {"agent": "demo"}
    created = api.post("/api/v1/sessions/", json=body)
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def idle(api: httpx.Client, session_id: str, last_text: str | None = None) -> dict[str, Any]:
    """The snapshot once the session waits for a message (after an answer ``last_text``)."""

    def ready(snapshot: dict[str, Any]) -> bool:
        if snapshot["status"] != "waiting_for_user_message":
            return False
        if last_text is None:
            return True
        messages = snapshot["messages"]
        return bool(messages) and messages[-1]["text"] == last_text

    return snapshot_when(api, session_id, ready, f"the session to answer {last_text!r}")


def answered_elsewhere(api: httpx.Client) -> None:
    """A message to an idle session of the same worker, answered: a peer that shows the
    worker had time to act on everything sent before it."""
    peer = start(api)
    idle(api, peer)
    send(api, peer, "are you keeping up?")
    idle(api, peer, "You said: are you keeping up?")


def test_a_question_with_choices_waits_for_the_owners_answer(stack: Stack) -> None:
    with stack.persona_clients() as (owner, other, staff, anonymous):
        session_id = start(owner, ASK)
        snapshot = snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["pending_input"] is not None,
            "the question",
        )
        question = snapshot["pending_input"]
        assert question["prompt"] == "Which colour?"
        assert question["choices"] == ["red", "blue"]
        assert question["call_id"]
        assert snapshot["status"] == "waiting_for_user_input"
        assert snapshot["turn_id"]
        # The sessions list (the Django index) says so too.
        listed = wait_until(
            "the index to say the session waits for an answer",
            lambda: [
                row
                for row in owner.get(
                    "/api/v1/sessions/", params={"status": "waiting_for_user_input"}
                ).json()["results"]
                if row["id"] == session_id
            ],
        )
        assert listed[0]["status"] == "waiting_for_user_input"

        path = f"/api/v1/sessions/{session_id}/input/"
        right = {"call_id": question["call_id"], "answer": "blue"}
        wrong = owner.post(path, json={"call_id": "call_99", "answer": "blue"})
        assert wrong.status_code == 409, wrong.text
        assert set(wrong.json()) == {"detail"}
        for body, fields in (
            ({"call_id": question["call_id"], "answer": "   "}, {"answer"}),
            ({"answer": "blue"}, {"call_id"}),
            ({}, {"call_id", "answer"}),
        ):
            refused = owner.post(path, json=body)
            assert refused.status_code == 400, refused.text
            assert set(refused.json()) == fields
        # Only the owner answers: staff read the question, others cannot tell it exists.
        assert anonymous.post(path, json=right).status_code == 401
        assert other.post(path, json=right).status_code == 404
        assert other.get(f"/api/v1/sessions/{session_id}/").status_code == 404
        assert staff.get(f"/api/v1/sessions/{session_id}/").json()["pending_input"] == question
        refused = staff.post(path, json=right)
        assert refused.status_code == 403, refused.text

        answer = owner.post(path, json=right)
        assert answer.status_code == 202, answer.text
        assert answer.json() == {"answered": True}
        again = owner.post(path, json=right)
        assert again.status_code == 409, again.text

        snapshot = idle(owner, session_id, "You said: blue")
        assert snapshot["pending_input"] is None
        turn = [(message["role"], message["text"]) for message in snapshot["messages"]]
        assert turn[0] == ("user", ASK)
        assert turn[1][0] == "assistant"
        assert [call["name"] for call in snapshot["messages"][1]["tool_calls"]] == [
            "request_user_input"
        ]
        assert turn[2][0] == "tool" and "Which colour?" in turn[2][1]
        assert turn[3:] == [("user", "blue"), ("assistant", "You said: blue")]
        assert owner.post(path, json=right).status_code == 409

    events = asyncio.run(
        events_until(
            stack,
            session_id,
            lambda events: any(event["type"] == "turn_completed" for event in events),
        )
    )
    requested = next(event for event in events if event["type"] == "user_input_requested")
    assert requested["data"] == {
        "tool_call_id": question["call_id"],
        "prompt": "Which colour?",
        "choices": ["red", "blue"],
    }
    answered = next(event for event in events if event["type"] == "user_input_answered")
    assert answered["data"] == {"tool_call_id": question["call_id"]}


def test_a_free_text_question_takes_any_answer(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner, "/ask What should I call you?")
        snapshot = snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["pending_input"] is not None,
            "the question",
        )
        assert snapshot["pending_input"]["choices"] == []
        answer = owner.post(
            f"/api/v1/sessions/{session_id}/input/",
            json={"call_id": snapshot["pending_input"]["call_id"], "answer": "Ada, please"},
        )
        assert answer.status_code == 202, answer.text
        idle(owner, session_id, "You said: Ada, please")


def test_a_durable_wait_ends_early_only_when_a_message_is_steered(stack: Stack) -> None:
    with stack.api("owner") as owner:
        before = datetime.datetime.now(datetime.UTC)
        session_id = start(owner, LONG_WAIT)
        snapshot = snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["pending_timer"] is not None,
            "the durable wait",
        )
        timer = snapshot["pending_timer"]
        assert timer["reason"] == "cooling off"
        assert timer["duration_seconds"] == 3600
        assert timer["call_id"]
        fires_at = datetime.datetime.fromisoformat(timer["fires_at"])
        assert before + datetime.timedelta(seconds=3590) <= fires_at
        assert fires_at <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=3600)

        # A queued message waits for the turn; it does not end the wait.
        message_id = send(owner, session_id, "are you still there?")
        answered_elsewhere(owner)
        snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot["pending_timer"] == timer
        assert [entry["id"] for entry in snapshot["queued_messages"]] == [message_id]
        assert snapshot["status"] not in ("waiting_for_user_message", "stopped")

        steered = owner.post(f"/api/v1/sessions/{session_id}/queue/{message_id}/steer/")
        assert steered.status_code == 202, steered.text
        snapshot = idle(owner, session_id, "You said: are you still there?")
        assert snapshot["pending_timer"] is None
        assert queue_of(owner, session_id) == {"queued": [], "steered": [], "partial": False}
        roles = [message["role"] for message in snapshot["messages"]]
        assert roles == ["user", "assistant", "tool", "user", "assistant"]
        assert "interrupted" in snapshot["messages"][2]["text"]

    events = asyncio.run(
        events_until(
            stack,
            session_id,
            lambda events: any(event["type"] == "turn_completed" for event in events),
        )
    )
    started = next(event for event in events if event["type"] == "durable_wait_started")
    assert started["data"]["tool_call_id"] == timer["call_id"]
    assert started["data"]["duration_seconds"] == 3600
    assert started["data"]["reason"] == "cooling off"
    assert "steer_applied" in [event["type"] for event in events]


def test_a_durable_wait_and_a_question_leave_a_stopped_session(stack: Stack) -> None:
    with stack.api("owner") as owner:
        waiting = start(owner, LONG_WAIT)
        asking = start(owner, ASK)
        snapshot_when(
            owner, waiting, lambda snapshot: snapshot["pending_timer"] is not None, "the wait"
        )
        question = snapshot_when(
            owner, asking, lambda snapshot: snapshot["pending_input"] is not None, "the question"
        )["pending_input"]
        for session_id in (waiting, asking):
            assert owner.post(f"/api/v1/sessions/{session_id}/stop/").status_code == 202
            snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
            assert snapshot["status"] == "stopped"
            assert snapshot["pending_timer"] is None and snapshot["pending_input"] is None
        late = owner.post(
            f"/api/v1/sessions/{asking}/input/",
            json={"call_id": question["call_id"], "answer": "red"},
        )
        assert late.status_code == 409, late.text
        assert "stopped" in late.json()["detail"]


def execute(api: httpx.Client, session_id: str, revision: int) -> httpx.Response:
    return api.post(f"/api/v1/sessions/{session_id}/plan/execute/", json={"revision": revision})


def test_a_plan_is_drafted_in_plan_mode_and_executed_on_request(stack: Stack) -> None:
    with stack.api("owner") as owner, stack.api("staff") as staff:
        session_id = start(owner)
        idle(owner, session_id)
        send(owner, session_id, "step one\nstep two", plan_mode=True)
        snapshot = idle(
            owner, session_id, "Plan ready for review: 2 task(s). Execute it when you are ready."
        )
        assert snapshot["plan"] == {
            "revision": 1,
            "status": "draft",
            "tasks": [
                {"content": "step one", "status": "pending"},
                {"content": "step two", "status": "pending"},
            ],
        }
        assert snapshot["turn_mode"] == "planning"
        assert snapshot["plan_execution_requested"] is False

        stale = execute(owner, session_id, 2)
        assert stale.status_code == 409, stale.text
        assert stale.json()["reason"] == "stale_revision"
        assert stale.json()["detail"]
        assert execute(staff, session_id, 1).status_code == 403

        accepted = execute(owner, session_id, 1)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"requested": True, "revision": 1}
        snapshot = idle(owner, session_id, "Plan complete: all 2 task(s) are done.")
        assert snapshot["plan"]["status"] == "completed"
        assert [task["status"] for task in snapshot["plan"]["tasks"]] == ["completed"] * 2
        assert snapshot["turn_mode"] == "executing"
        assert snapshot["plan_execution_requested"] is False
        # The execution turn has no user message of its own.
        assert [message["role"] for message in snapshot["messages"]].count("user") == 1

        # Every write_todos of the execution (one per task) made a new revision.
        assert snapshot["plan"]["revision"] == 3
        done = execute(owner, session_id, 3)
        assert done.status_code == 409, done.text
        assert done.json()["reason"] == "not_executable"
        assert execute(owner, session_id, 1).json()["reason"] == "stale_revision"

    events = asyncio.run(
        events_until(
            stack,
            session_id,
            lambda events: [event["type"] for event in events].count("turn_completed") == 2,
        )
    )
    updates = [event["data"] for event in events if event["type"] == "plan_updated"]
    assert updates[0] == {"revision": 1, "status": "draft", "task_count": 2}
    assert updates[-1]["status"] == "completed"
    started = next(event for event in events if event["type"] == "plan_started")
    assert started["data"] == {"revision": 1}
    execution_turn = [
        event
        for event in events
        if event["type"] == "turn_started" and event["turn_id"] == started["turn_id"]
    ]
    assert execution_turn[0]["data"]["sequence"] is None
    assert execution_turn[0]["data"]["plan_revision"] == 1


def test_the_first_message_of_a_session_may_ask_for_a_plan(stack: Stack) -> None:
    with stack.api("owner") as owner:
        created = owner.post(
            "/api/v1/sessions/",
            json={"agent": "demo", "message": "draft it\nship it", "plan_mode": True},
        )
        assert created.status_code == 201, created.text
        snapshot = idle(
            owner,
            created.json()["id"],
            "Plan ready for review: 2 task(s). Execute it when you are ready.",
        )
        assert snapshot["turn_mode"] == "planning"
        assert snapshot["plan"]["status"] == "draft"
        assert [task["content"] for task in snapshot["plan"]["tasks"]] == ["draft it", "ship it"]

        # Without plan_mode the same first message is an ordinary chat turn.
        plain = start(owner, "draft it")
        snapshot = idle(owner, plain, "You said: draft it")
        assert snapshot["turn_mode"] == "chat" and snapshot["plan"] is None


def test_a_plan_that_stopped_with_unfinished_tasks_is_continued(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner)
        idle(owner, session_id)
        # The demo model stops at a task with /stop, leaving it in progress.
        send(owner, session_id, "look around\ncheck the logs /stop\nship it", plan_mode=True)
        revision = idle(
            owner, session_id, "Plan ready for review: 3 task(s). Execute it when you are ready."
        )["plan"]["revision"]
        assert execute(owner, session_id, revision).status_code == 202
        snapshot = idle(owner, session_id, "Stopped at: check the logs /stop")
        plan = snapshot["plan"]
        assert plan["status"] == "active"
        assert [task["status"] for task in plan["tasks"]] == ["completed", "in_progress", "pending"]
        stale = execute(owner, session_id, revision)
        assert stale.status_code == 409 and stale.json()["reason"] == "stale_revision"

        continued = execute(owner, session_id, plan["revision"])
        assert continued.status_code == 202, continued.text
        snapshot = idle(owner, session_id, "Plan complete: all 3 task(s) are done.")
        assert snapshot["plan"]["status"] == "completed"
        # Two execution turns, no user message between them.
        assert [message["role"] for message in snapshot["messages"]].count("user") == 1


def tool_names(snapshot: dict[str, Any]) -> list[str]:
    """The tools the stored assistant messages called, in order."""
    return [
        call["name"] for message in snapshot["messages"] for call in message.get("tool_calls", [])
    ]


def test_a_plan_task_with_a_tool_directive_runs_that_tool(stack: Stack) -> None:
    search = '/tool search__web_search {"query": "durable plans"}'
    with stack.api("owner") as owner:
        session_id = start(owner)
        idle(owner, session_id)
        send(owner, session_id, f"look it up {search}\nsum it up", plan_mode=True)
        snapshot = idle(
            owner, session_id, "Plan ready for review: 2 task(s). Execute it when you are ready."
        )
        # Planning runs no tool but write_todos.
        assert tool_names(snapshot) == ["write_todos"]
        assert execute(owner, session_id, snapshot["plan"]["revision"]).status_code == 202
        snapshot = idle(owner, session_id, "Plan complete: all 2 task(s) are done.")
        calls = tool_names(snapshot)
        assert calls.count("search__web_search") == 1, calls
        results = [message["text"] for message in snapshot["messages"] if message["role"] == "tool"]
        assert any("durable plans" in text for text in results), results


def test_a_plan_is_not_executed_while_the_session_is_busy(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner)
        idle(owner, session_id)
        send(owner, session_id, "only step", plan_mode=True)
        revision = idle(
            owner, session_id, "Plan ready for review: 1 task(s). Execute it when you are ready."
        )["plan"]["revision"]
        # An ordinary message that asks a question keeps the turn open.
        send(owner, session_id, ASK)
        snapshot_when(
            owner,
            session_id,
            lambda snapshot: snapshot["pending_input"] is not None,
            "the question",
        )
        busy = execute(owner, session_id, revision)
        assert busy.status_code == 409, busy.text
        assert busy.json()["reason"] == "busy"
        snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot["plan"]["status"] == "draft"
        assert snapshot["plan_execution_requested"] is False
        assert json.dumps(snapshot["plan"]["tasks"]) == json.dumps(
            [{"content": "only step", "status": "pending"}]
        )
