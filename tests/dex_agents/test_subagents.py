"""Subagents (issue 29): an ``agent__<slug>`` call runs a child session as a Dex sub-flow.

Real engine and Worker processes with the scripted runner; the subagent Flow's directory
(``ScriptedSubagents``) starts children of the same Flow type and logs each start, stop and
result.
"""

from __future__ import annotations

from pathlib import Path

from dex import FlowStatus

from dex_agents import AgentSnapshot, AgentStatus
from dex_agents.testing import (
    EXECUTE_COMPLETED_EVENT,
    FileGate,
    wait_for_agent_snapshot,
    wait_until,
)
from tests.dex_agents.scripted_agent import (
    SUBAGENT_FLOW_TYPE,
    SUBAGENT_MAX_CHILDREN,
    SUBAGENT_MAX_DEPTH,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    SESSION_ID,
    TURN_TIMEOUT,
    flow_of,
    last_text,
    running_session,
    scripted_stack,
    wait_for_idle,
    wait_for_interrupt,
)


def child_id_of(snapshot: AgentSnapshot, tool_call_id: str) -> str | None:
    record = next(
        (item for item in snapshot.tool_calls if item.tool_call_id == tool_call_id), None
    )
    return record.child_session_id if record is not None else None


async def test_a_subagent_call_answers_with_the_childs_final_answer(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "sub: look it up", flow_type=SUBAGENT_FLOW_TYPE
    ) as (stack, sessions, _):
        snapshot = await wait_for_idle(sessions, SESSION_ID, message_count=4)
        assert last_text(snapshot) == "agent__helper=succeeded: echo: look it up"
        child_id = f"SubFlow:{SESSION_ID}-CallSubagent-1-0"
        child = await sessions.get_agent_snapshot(child_id)
        assert [message.text for message in child.messages] == [
            "look it up",
            "echo: look it up",
        ]
        summary = await stack.client.describe_flow(child_id)
        assert summary.status is FlowStatus.COMPLETED
        log = invocation_log(tmp_path)
        assert log.count("child_finished", f"{child_id} completed") == 1


async def test_a_refused_or_malformed_call_is_a_tool_error(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "sub-missing: anything", flow_type=SUBAGENT_FLOW_TYPE
    ) as (_, sessions, _):
        snapshot = await wait_for_idle(sessions, SESSION_ID, message_count=4)
        assert last_text(snapshot) == (
            "agent__missing=failed: Tool call failed: no agent named 'missing' is available"
        )
        assert invocation_log(tmp_path).count("child_finished") == 0


async def test_the_per_turn_limit_starts_no_child_past_it(tmp_path: Path) -> None:
    tasks = [f"task {n}" for n in range(1, SUBAGENT_MAX_CHILDREN + 2)]
    async with running_session(
        tmp_path, f"subs: {', '.join(tasks)}", flow_type=SUBAGENT_FLOW_TYPE
    ) as (_, sessions, _):
        snapshot = await wait_for_idle(sessions, SESSION_ID, message_count=4)
        answer = last_text(snapshot)
        for task in tasks[:SUBAGENT_MAX_CHILDREN]:
            assert f"agent__helper=succeeded: echo: {task}" in answer
        assert "agent__helper=failed: Tool call failed: subagent_limit: at most 2" in answer
        assert invocation_log(tmp_path).count("child_start") == SUBAGENT_MAX_CHILDREN


async def test_the_depth_limit_stops_nesting_with_a_clear_error(tmp_path: Path) -> None:
    nested = "sub: " * (SUBAGENT_MAX_DEPTH + 1) + "deep"
    async with running_session(tmp_path, nested, flow_type=SUBAGENT_FLOW_TYPE) as (
        _,
        sessions,
        _,
    ):
        snapshot = await wait_for_idle(sessions, SESSION_ID, message_count=4)
        answer = last_text(snapshot)
        # Depth 1 and 2 started; the session at depth 2 got the error as its tool result.
        assert answer.count("agent__helper=succeeded") == SUBAGENT_MAX_DEPTH
        assert "subagent_depth_limit: subagents may nest at most 2 deep" in answer
        assert invocation_log(tmp_path).count("child_start") == SUBAGENT_MAX_DEPTH


async def test_a_child_approval_survives_a_worker_kill_and_runs_once(tmp_path: Path) -> None:
    """The child waits for an approval; the Worker is SIGKILLed; a new one serves both. The
    child runs its write once and the parent gets one result."""
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, SUBAGENT_FLOW_TYPE))
        worker = await stack.start_worker()
        await sessions.start_session(SESSION_ID, "sub: tools: refund")
        child_id = await wait_for_agent_snapshot(
            sessions,
            SESSION_ID,
            lambda snapshot: child_id_of(snapshot, "sub-1"),
            description="the child started",
        )
        interrupt = await wait_for_interrupt(sessions, child_id)
        worker.kill()
        await stack.start_worker()
        assert await sessions.resolve_interrupt(child_id, interrupt.interrupt_id, approved=True)
        snapshot = await wait_for_idle(sessions, SESSION_ID, message_count=4)
        assert last_text(snapshot) == (
            "agent__helper=succeeded: refund=succeeded: refund ok"
        )
        log = invocation_log(tmp_path)
        assert log.count("tool", "refund") == 1
        assert log.count("child_finished") == 1
        parent = await stack.read_step_history(SESSION_ID)
        calls = [
            entry
            for entry in parent
            if entry.step_type == "CallSubagent" and entry.event_type == EXECUTE_COMPLETED_EVENT
        ]
        assert len(calls) == 1
        child = await stack.read_step_history(child_id)
        starts = [entry for entry in child if entry.step_type == "StartAgentSession"]
        assert len(starts) == 1


async def test_cancelling_the_parents_turn_stops_the_running_child(tmp_path: Path) -> None:
    async with running_session(tmp_path, "sub: hold", flow_type=SUBAGENT_FLOW_TYPE) as (
        stack,
        sessions,
        _,
    ):
        held = FileGate(tmp_path, "model_hold")
        await held.wait_until_reached()
        snapshot = await sessions.get_agent_snapshot(SESSION_ID)
        child_id = child_id_of(snapshot, "sub-1")
        assert child_id is not None
        assert snapshot.state is not None and snapshot.state.turn_id is not None
        result = await sessions.cancel_turn(SESSION_ID, snapshot.state.turn_id)
        assert result.accepted

        async def child_stopped() -> bool | None:
            summary = await stack.client.describe_flow(child_id)
            return True if summary.status is FlowStatus.CANCELED else None

        stopped: bool = await wait_until("the child stopped", child_stopped, timeout=TURN_TIMEOUT)
        assert stopped

        def ended(snapshot: AgentSnapshot) -> AgentSnapshot | None:
            state = snapshot.state
            done = state is not None and state.status is AgentStatus.WAITING_FOR_USER_MESSAGE
            return snapshot if done else None

        await wait_for_agent_snapshot(sessions, SESSION_ID, ended, description="turn ended")
        log = invocation_log(tmp_path)
        assert log.count("child_cancel", child_id) >= 1
        assert log.count("child_finished", f"{child_id} cancelled") >= 1
        final = await sessions.get_agent_snapshot(SESSION_ID)
        assert final.state is not None and final.state.last_turn_error is None
        held.release()
