"""Cancelling the running turn through the REST API (``POST .../turn/cancel/``), against the
real platform: engine, dexworker, web and demo model as processes
(``tests/e2e/relay_stack.py``). The demo model streams slowly (``/slow``) so the cancel lands
mid-answer. Personas: owner, another user, staff, anonymous.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

WORDS = " ".join(f"word{n}" for n in range(60))
#: A reply of 60 words streamed a few words every 0.3 s: about five seconds in all.
SLOW_MESSAGE = f"/slow 0.3\n{WORDS}"
FULL_REPLY = f"You said: {WORDS}"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("turn-cancel")) as platform:
        yield platform


async def first_text(stack: Stack, session_id: str) -> str:
    """Wait, through the websocket relay, for the first streamed text of the session."""
    async with connect(
        stack.events_url(session_id, ""), additional_headers=stack.personas["owner"].bearer()
    ) as ws:
        async with asyncio.timeout(60):
            while True:
                frame = json.loads(await ws.recv())
                if frame["type"] == "event" and frame["event"]["type"] == "text_delta":
                    return str(frame["event"]["data"]["text"])


def idle_snapshot(api: httpx.Client, session_id: str, message_count: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()
        done = (
            snapshot["status"] == "waiting_for_user_message"
            and len(snapshot["messages"]) >= message_count
        )
        return snapshot if done else None

    return wait_until("the session to be idle", probe, timeout=60)


def test_cancel_mid_answer_keeps_the_streamed_text_and_the_session(stack: Stack) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": SLOW_MESSAGE})
        assert created.status_code == 201, created.text
        session_id = str(created.json()["id"])
        cancel = f"/api/v1/sessions/{session_id}/turn/cancel/"
        asyncio.run(first_text(stack, session_id))
        queued = owner.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "next"})
        assert queued.status_code == 202, queued.text

        bad = owner.post(cancel, json={"turn_id": 1})
        assert bad.status_code == 400, bad.text
        assert "turn_id" in bad.json()
        other_turn = owner.post(cancel, json={"turn_id": "turn-9"})
        assert other_turn.status_code == 409, other_turn.text
        assert other_turn.json()["reason"] == "turn_ended"
        # It says which turn runs and that the named one is not it.
        assert other_turn.json()["running_turn_id"] == "turn-1"
        assert "turn-9 is not the running turn: turn-1 is running now" in (
            other_turn.json()["detail"]
        )
        answer = owner.post(cancel, json={"turn_id": "turn-1"})
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert (body["cancelled"], body["turn_id"], body["delivery"]) == (
            True, "turn-1", "delivered"
        )
        assert isinstance(body["status"], str)

        # The queued message was left alone: it starts the next turn, which answers normally.
        snapshot = idle_snapshot(owner, session_id, 4)
        messages = snapshot["messages"]
        assert [message["role"] for message in messages] == [
            "user", "assistant", "user", "assistant"
        ]
        partial = messages[1]
        assert partial["interrupted"] is True
        assert partial["text"] and FULL_REPLY.startswith(partial["text"])
        assert len(partial["text"]) < len(FULL_REPLY)
        assert messages[3]["text"] == "You said: next"
        assert "interrupted" not in messages[3]
        assert not snapshot.get("last_turn_error")
        # The abandoned call is counted (estimated: the demo model sends its usage last):
        # in the session's totals, in the Django rows behind the list, and in /usage/.
        assert snapshot["usage"]["requests"] == 2
        answered = messages[3]["usage"]
        assert snapshot["usage"]["output_tokens"] > answered["output_tokens"]
        assert snapshot["usage"]["input_tokens"] > answered["input_tokens"]
        # The stopped answer carries its call's usage (hover shows it), the rest of the total.
        stopped = partial["usage"]
        assert stopped["requests"] == 1
        for key in ("input_tokens", "output_tokens"):
            assert stopped[key] == snapshot["usage"][key] - answered[key] > 0

        def listed() -> dict[str, Any] | None:
            rows = owner.get("/api/v1/sessions/", params={"limit": "200"}).json()["results"]
            row = next(row for row in rows if row["id"] == session_id)
            return row if row["usage"]["requests"] == 2 else None

        row = wait_until("the list to count both calls", listed, timeout=30)
        assert row["usage"]["cost_usd"] == snapshot["usage"]["cost_usd"]
        assert owner.get("/api/v1/usage/").json()["totals"]["requests"] >= 2

        again = owner.post(cancel)
        assert again.status_code == 409, again.text
        assert again.json()["reason"] == "no_turn"
        assert "nothing to cancel" in again.json()["detail"]
        assert "running_turn_id" not in again.json()
        named = owner.post(cancel, json={"turn_id": "turn-7"})
        assert named.status_code == 409, named.text
        assert named.json()["reason"] == "no_turn"
        assert "No turn is running" in named.json()["detail"]
        assert "turn-7 is not running" in named.json()["detail"]


def test_cancel_permissions_owner_other_user_staff_anonymous(stack: Stack) -> None:
    with stack.persona_clients() as (owner, other, staff, anonymous):
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": SLOW_MESSAGE})
        session_id = str(created.json()["id"])
        cancel = f"/api/v1/sessions/{session_id}/turn/cancel/"
        asyncio.run(first_text(stack, session_id))
        assert anonymous.post(cancel).status_code == 401
        # Another user cannot tell the session exists; staff read it but do not cancel it.
        assert other.post(cancel).status_code == 404
        assert staff.post(cancel).status_code == 403
        assert owner.post("/api/v1/sessions/ses_nope/turn/cancel/").status_code == 404
        assert owner.post(cancel).status_code == 202
        idle_snapshot(owner, session_id, 2)
        assert owner.post(f"/api/v1/sessions/{session_id}/stop/").status_code == 202
        stopped = owner.post(cancel)
        assert stopped.status_code == 409
        assert stopped.json()["reason"] == "session_stopped"
