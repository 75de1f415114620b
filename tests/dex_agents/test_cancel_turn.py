"""``cancel_turn`` (platform addition) against the real engine and Worker child processes."""

from __future__ import annotations

import json
from pathlib import Path

from dex_agents import (
    CANCELLED_BY_USER_OUTPUT,
    EXECUTE_COMPLETED_EVENT,
    TURN_CANCELLED_EMPTY_NOTE,
    TURN_CANCELLED_NOTE_HEADER,
    WAIT_FOR_COMPLETED_EVENT,
    AgentEventType,
    AgentSessionClient,
    AgentSnapshot,
    AgentStatus,
    MessageNotice,
    MessageRole,
    ToolCallStatus,
)
from dex_agents._builtin_tools import WAIT_CANCELLED_OUTPUT
from dex_agents.testing import FileGate, wait_for_agent_snapshot, wait_until
from tests.dex_agents.scripted_agent import (
    COMPACTING_FLOW_TYPE,
    FLOW_TYPE,
    STREAMED_PART,
    WORKER_SLOTS_ENV,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    closed_interrupts,
    events_of,
    flow_of,
    running_session,
    scripted_stack,
    session_at_gate,
    wait_for_idle,
    wait_for_interrupt,
    wait_for_step_waiting,
)


async def test_cancel_mid_answer_keeps_the_streamed_text_marked_and_the_queue(
    tmp_path: Path,
) -> None:
    async with session_at_gate(tmp_path, "model_stream", "stream") as (stack, sessions, _, gate):
        assert await sessions.send_user_message("session-1", "next one")

        # A cancel meant for another turn (delivered late) leaves this one alone.
        stale = await sessions.cancel_turn("session-1", turn_id="turn-0")
        assert (stale.accepted, stale.reason, stale.turn_id) == (False, "turn_ended", "turn-1")
        result = await sessions.cancel_turn("session-1", turn_id="turn-1")
        assert (result.accepted, result.turn_id) == (True, "turn-1")
        # The queued message was not touched: it starts the next turn, which runs normally.
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)
        roles_texts = [(m.role, m.text, m.interrupted) for m in snapshot.messages]
        assert roles_texts == [
            (MessageRole.USER, "stream", False),
            (MessageRole.ASSISTANT, STREAMED_PART, True),
            (MessageRole.USER, "next one", False),
            (MessageRole.ASSISTANT, "echo: next one", False),
        ]
        # The streamed text is the turn's mark: no note besides it.
        assert [m.notice for m in snapshot.messages] == [None] * 4
        assert snapshot.last_turn_error is None
        # The model call was abandoned, not retried, and never finished.
        assert invocation_log(tmp_path).count("model", "turn-1") == 1
        events = await events_of(stack, "session-1", FLOW_TYPE)
        ends = [(e.type, e.turn_id) for e in events if e.type in (
            AgentEventType.TURN_CANCELLED, AgentEventType.TURN_COMPLETED, AgentEventType.TURN_FAILED
        )]
        assert ends == [
            (AgentEventType.TURN_CANCELLED, "turn-1"),
            (AgentEventType.TURN_COMPLETED, "turn-2"),
        ]
        # The abandoned call counts: the runner's abandoned_call_usage, then the next call.
        recorded = [e.payload["recorded"] for e in events
                    if e.type == AgentEventType.USAGE_RECORDED]
        assert recorded[0]["output_tokens"] == len(STREAMED_PART.split())
        assert (recorded[0]["requests"], recorded[0]["cost_usd"]) == (1, "0.0001")
        # The stopped answer carries what its call cost, as an answered call's reply does.
        assert snapshot.messages[1].framework_item["usage"] == recorded[0]
        assert snapshot.usage.requests == 2
        assert snapshot.usage.output_tokens == len(STREAMED_PART.split()) + 5
        cancelled = next(e for e in events if e.type == AgentEventType.TURN_CANCELLED)
        assert cancelled.payload == {
            "message_count": 2,
            "interrupted_sequence": 2,
            "cancelled_tool_call_ids": [],
        }
        # Nothing runs now: a cancel is refused with a reason.
        again = await sessions.cancel_turn("session-1")
        assert (again.accepted, again.reason) == (False, "no_turn")
        gate.release()


async def test_cancel_before_any_text_or_tool_stores_a_cancelled_notice(tmp_path: Path) -> None:
    """A turn cancelled before its model streamed anything and before any tool call still
    leaves its mark: a note the model reads and pages show as a notice, not as the user's."""
    async with session_at_gate(tmp_path, "model_hold", "hold") as (stack, sessions, _, gate):
        assert (await sessions.cancel_turn("session-1", turn_id="turn-1")).accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        note = snapshot.messages[-1]
        assert (note.role, note.text, note.notice, note.interrupted) == (
            MessageRole.USER, TURN_CANCELLED_EMPTY_NOTE, MessageNotice.TURN_CANCELLED, False
        )
        assert snapshot.messages[0].notice is None
        events = await events_of(stack, "session-1", FLOW_TYPE)
        cancelled = next(e for e in events if e.type == AgentEventType.TURN_CANCELLED)
        assert cancelled.payload["message_count"] == 2
        gate.release()


async def test_cancel_during_a_tool_batch(tmp_path: Path) -> None:
    """Not-started calls end cancelled, the running one finishes and keeps its record, the
    pending approval is withdrawn, and no model call follows."""
    # One Step slot: two gated reads, and whichever runs first holds it, so the other's Step
    # cannot start.
    async with scripted_stack(tmp_path, worker_env={WORKER_SLOTS_ENV: "2"}) as stack:
        sessions = stack.sessions(flow_of(stack, FLOW_TYPE))
        await stack.start_worker()
        gates = {name: FileGate(tmp_path, name) for name in ("gated_read", "parallel_a")}
        await sessions.start_session("session-1", "tools: gated_read, parallel_a, refund")
        running = await wait_until(
            "a gated read to run",
            lambda: next((name for name, gate in gates.items() if gate.is_reached()), None),
        )
        waiting = next(name for name in gates if name != running)
        interrupt = await wait_for_interrupt(sessions, "session-1")

        result = await sessions.cancel_turn("session-1")
        assert result.accepted
        for gate in gates.values():
            gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)

        assert snapshot.tool_calls == []
        assert snapshot.pending_interrupts == []
        note = snapshot.messages[-1]
        assert note.role is MessageRole.USER
        assert note.notice is MessageNotice.TURN_CANCELLED
        lines = note.text.splitlines()
        assert lines[0] == TURN_CANCELLED_NOTE_HEADER
        outcomes = {line.split(" ", 2)[1]: line for line in lines[1:4]}
        assert outcomes[running].endswith(f"-> succeeded: {running} ok")
        for name in (waiting, "refund"):
            assert outcomes[name].endswith(f"-> cancelled: {CANCELLED_BY_USER_OUTPUT}")
        log = invocation_log(tmp_path)
        assert log.count("tool", running) == 1
        assert log.count("tool", waiting) == 0
        assert log.count("tool", "refund") == 0
        assert log.count("model", "turn-1") == 1
        assert closed_interrupts(tmp_path) == [[interrupt.interrupt_id, "withdrawn"]]
        # The history says what the Steps' endings meant (the Timeline shows it).
        history = await stack.read_step_history("session-1")
        step_outcomes = {
            (entry.step_execution_id, entry.event_type): (entry.outcome, entry.tool_name)
            for entry in history
            if entry.outcome or entry.tool_name
        }
        assert step_outcomes[("AwaitToolApproval-1", WAIT_FOR_COMPLETED_EVENT)] == (None, "refund")
        assert step_outcomes[("AwaitToolApproval-1", EXECUTE_COMPLETED_EVENT)] == (
            "withdrawn", None
        )
        assert [outcome for outcome, _ in step_outcomes.values()].count("cancelled") == 1
        assert not await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True
        )
        events = await events_of(stack, "session-1", FLOW_TYPE)
        cancelled = next(e for e in events if e.type == AgentEventType.TURN_CANCELLED)
        ids = {"gated_read": "call-1", "parallel_a": "call-2"}
        assert cancelled.payload["cancelled_tool_call_ids"] == sorted([ids[waiting], "call-3"])
        assert cancelled.payload["interrupted_sequence"] is None
        finished = {
            e.payload["tool_call_id"]: e.payload["status"]
            for e in events
            if e.type == AgentEventType.TOOL_CALL_FINISHED
        }
        assert finished == {ids[running]: "succeeded", ids[waiting]: "cancelled",
                            "call-3": "cancelled"}

        # The next message starts a normal turn.
        assert await sessions.send_user_message("session-1", "hello")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)
        assert snapshot.messages[-1].text == "echo: hello"


async def test_cancel_withdraws_a_pending_approval(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "tools: refund", flow_type=COMPACTING_FLOW_TYPE
    ) as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")

        assert (await sessions.cancel_turn("session-1")).accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert snapshot.pending_interrupts == []
        assert f"-> cancelled: {CANCELLED_BY_USER_OUTPUT}\n" in snapshot.messages[-1].text
        assert invocation_log(tmp_path).count("tool", "refund") == 0
        assert closed_interrupts(tmp_path) == [[interrupt.interrupt_id, "withdrawn"]]


async def test_cancel_ends_a_running_durable_wait_with_the_cancel_as_its_reason(
    tmp_path: Path,
) -> None:
    """The wait ends at once, ``interrupted`` by the cancel: its result names the cancel, not
    a steered message (none was sent), for the model and for the notice people read."""
    async with running_session(
        tmp_path, "wait: 3600", flow_type=COMPACTING_FLOW_TYPE
    ) as (stack, sessions, _):
        await wait_for_agent_snapshot(
            sessions, "session-1", lambda snapshot: snapshot.pending_timer,
            description="a timer",
        )
        await wait_for_step_waiting(stack, "session-1", "DurableWait-1")

        assert (await sessions.cancel_turn("session-1")).accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert snapshot.pending_timer is None
        note = snapshot.messages[-1]
        assert note.notice is MessageNotice.TURN_CANCELLED
        assert f"-> succeeded: {WAIT_CANCELLED_OUTPUT}\n" in note.text
        assert "superseded_by_steered_user_message" not in note.text
        assert json.loads(WAIT_CANCELLED_OUTPUT) == {
            "status": "interrupted", "reason": "turn_cancelled_by_user"
        }
        events = await events_of(stack, "session-1", COMPACTING_FLOW_TYPE)
        finished = [
            (e.payload["tool_name"], e.payload["status"], e.payload.get("outcome"))
            for e in events if e.type == AgentEventType.TOOL_CALL_FINISHED
        ]
        assert finished == [("durable_wait", "succeeded", "interrupted")]
        assert invocation_log(tmp_path).count("model", "turn-1") == 1


async def wait_for_cancel_recorded(sessions: AgentSessionClient, session_id: str) -> None:
    def busy(snapshot: AgentSnapshot) -> bool | None:
        state = snapshot.state
        return True if state and state.status is AgentStatus.RUNNING_TOOLS else None

    await wait_for_agent_snapshot(sessions, session_id, busy, description="running tools")


async def test_a_cancel_accepted_before_a_worker_kill_is_applied_after_the_restart(
    tmp_path: Path,
) -> None:
    async with session_at_gate(tmp_path) as (stack, sessions, worker, gate):
        await wait_for_cancel_recorded(sessions, "session-1")

        assert (await sessions.cancel_turn("session-1")).accepted
        # The engine holds the cancel; the Worker that took it dies before any Step applied it.
        worker.kill()
        gate.release()
        await stack.start_worker()

        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert snapshot.messages[-1].text.startswith(TURN_CANCELLED_NOTE_HEADER)
        # The read had started, so its retry ran it again; the model was not called again.
        assert invocation_log(tmp_path).count("tool", "gated_read") == 2
        assert invocation_log(tmp_path).count("model", "turn-1") == 1
        events = await events_of(stack, "session-1", FLOW_TYPE)
        assert [e.type for e in events].count(AgentEventType.TURN_CANCELLED) == 1
        assert snapshot.state is not None
        assert snapshot.state.status is AgentStatus.WAITING_FOR_USER_MESSAGE
        assert all(
            record.status is not ToolCallStatus.PENDING for record in snapshot.tool_calls
        )
