"""Platform additions of AgentSessionFlow, against the real engine and real Worker children:
the session observer, per-policy approval deadlines and the queued messages in the snapshot."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from dex_agents import (
    TURN_STOPPED_NOTE_HEADER,
    AgentEventType,
    MessageNotice,
    MessageRole,
)
from dex_agents.testing import FileGate, wait_for_agent_snapshot, wait_until
from tests.dex_agents.scripted_agent import (
    COMPACTING_FLOW_TYPE,
    changes_path,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    events_of,
    flow_of,
    last_text,
    running_session,
    scripted_stack,
    wait_for_idle,
    wait_for_interrupt,
)


def changes(tmp_path: Path, session_id: str) -> list[dict[str, Any]]:
    path = changes_path(tmp_path)
    if not path.exists():
        return []
    lines = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [line for line in lines if line["flow_id"] == session_id]


async def test_the_observer_hears_every_status_and_approval_change(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools: refund") as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True
        )
        await wait_for_idle(sessions, "session-1", message_count=4)

        seen = await wait_until(
            "the last change to be logged",
            lambda: (lambda log: log if log and log[-1]["status"] == "waiting_for_user_message"
                     else None)(changes(tmp_path, "session-1")),
        )
    assert [(change["status"], change["raised"], change["closed"]) for change in seen] == [
        ("running_model", [], []),
        ("running_tools", [[interrupt.interrupt_id, None]], []),
        (None, [], [[interrupt.interrupt_id, "approved"]]),
        ("running_model", [], []),
        ("waiting_for_user_message", [], []),
    ]
    assert all(change["turn_id"] == "turn-1" for change in seen)
    # Each RunModel Step reports its model call's usage, keyed by its own Step execution.
    calls = [change for change in seen if change["usage"] is not None]
    assert [change["status"] for change in calls] == ["running_tools", "waiting_for_user_message"]
    assert all(change["usage"]["requests"] == 1 for change in calls)
    assert len({change["model_call_id"] for change in calls}) == 2
    assert all(change["model_call_id"] for change in calls)
    times = [datetime.fromisoformat(change["observed_at"]) for change in seen]
    assert times == sorted(times)


async def test_a_policy_deadline_expires_an_approval_on_a_flow_without_one(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, "tools: quick_refund") as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert interrupt.deadline is not None
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot).startswith(
            "quick_refund=rejected: Tool call was rejected and did not run: "
            "No approval before the deadline"
        )
        closed = [change["closed"] for change in changes(tmp_path, "session-1")
                  if change["closed"]]
        assert closed == [[[interrupt.interrupt_id, "expired"]]]
        raised_deadline = next(
            change["raised"][0][1] for change in changes(tmp_path, "session-1")
            if change["raised"]
        )
        requested = datetime.fromisoformat(raised_deadline)
        assert requested == interrupt.deadline


async def test_the_snapshot_lists_queued_messages_in_order(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools: gated_read") as (_, sessions, _):
        gate = FileGate(tmp_path, "gated_read")
        await wait_until("the tool to run", gate.is_reached)
        assert await sessions.send_user_message("session-1", "first")
        assert await sessions.send_user_message("session-1", "second")

        snapshot = await wait_for_agent_snapshot(
            sessions,
            "session-1",
            lambda snap: snap if snap.queued_message_count == 2 else None,
            description="two queued messages",
        )
        assert [item.text for item in snapshot.queued_messages] == ["first", "second"]
        assert all(item.message_id for item in snapshot.queued_messages)
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=8)
        assert snapshot.queued_messages == []


async def test_a_turn_guard_stops_the_turn_before_the_crossing_calls_tools_run(
    tmp_path: Path,
) -> None:
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, COMPACTING_FLOW_TYPE))
        await stack.start_worker()
        await sessions.start_session(
            "session-1", "tools: lookup, charge", agent_config={"stop_after_calls": 1}
        )
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)

        # The call that crossed the limit was made and counted; none of its tools ran.
        log = invocation_log(tmp_path)
        assert log.count("model", "turn-1") == 1
        assert log.count("guard", "turn-1") == 1
        assert log.count("tool", "lookup") == 0 and log.count("tool", "charge") == 0
        assert snapshot.usage.requests == 1
        assert snapshot.state is not None
        assert snapshot.state.last_turn_error == "Budget reached: 1 calls"
        assert snapshot.tool_calls == []
        # The note the user sees starts with the reason; the model reads each call cancelled.
        note = snapshot.messages[-1]
        assert (note.role, note.notice) == (MessageRole.USER, MessageNotice.TURN_FAILED)
        lines = note.text.splitlines()
        assert lines[:2] == ["[Dex] Budget reached: 1 calls", TURN_STOPPED_NOTE_HEADER]
        assert lines[2].startswith("- lookup ") and lines[3].startswith("- charge ")
        assert all(" -> cancelled: " in line and '"turn_stopped"' in line for line in lines[2:4])

        events = await events_of(stack, "session-1", COMPACTING_FLOW_TYPE)
        finished = [e.payload for e in events if e.type is AgentEventType.TOOL_CALL_FINISHED]
        assert [(p["tool_name"], p["status"]) for p in finished] == [
            ("lookup", "cancelled"), ("charge", "cancelled")]
        assert events[-1].type is AgentEventType.TURN_FAILED
        assert events[-1].payload == {"error": "Budget reached: 1 calls"}
        # The observer heard the call's usage before the guard was asked (its one ID), and the
        # turn's end as a failure.
        seen = changes(tmp_path, "session-1")
        calls = {change["model_call_id"] for change in seen if change["usage"]}
        assert len(calls) == 1
        assert seen[-1]["status"] == "waiting_for_user_message"

        # The guard is asked only before tools run: the next message's answer completes.
        assert await sessions.send_user_message("session-1", "again")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)
        assert snapshot.messages[-1].text == "echo: again"
        assert snapshot.state is not None and snapshot.state.last_turn_error is None
        assert snapshot.usage.requests == 2
