"""The built-in ``durable_wait`` and ``request_user_input`` tools (platform additions) against the
real engine and Worker children."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dex import StepExecutionId, TimerId

from dex_agents import (
    CANCELLED_BY_STEER_OUTPUT,
    EXECUTE_COMPLETED_EVENT,
    WAIT_FOR_COMPLETED_EVENT,
    AgentEventType,
    AgentSessionClient,
    AgentStatus,
    PendingTimer,
    PendingUserInput,
    ToolCallStatus,
)
from dex_agents._builtin_steps import DURABLE_WAIT_TIMER_ID
from dex_agents.testing import AgentTestStack, wait_for_agent_snapshot
from tests.dex_agents.scripted_agent import STEERING_FLOW_TYPE, invocation_log
from tests.dex_agents.scripted_sessions import (
    flow_of,
    last_text,
    running_session,
    scripted_stack,
    user_texts,
    wait_for_idle,
    wait_for_step_waiting,
)


async def wait_for_timer(sessions: AgentSessionClient, session_id: str) -> PendingTimer:
    return await wait_for_agent_snapshot(
        sessions, session_id, lambda snapshot: snapshot.pending_timer, description="a timer"
    )


async def wait_for_question(sessions: AgentSessionClient, session_id: str) -> PendingUserInput:
    return await wait_for_agent_snapshot(
        sessions, session_id, lambda snapshot: snapshot.pending_input, description="a question"
    )


async def fire_wait(stack: AgentTestStack, session_id: str) -> None:
    await stack.client.skip_timer(
        session_id, StepExecutionId("DurableWait", 1), TimerId(condition_id=DURABLE_WAIT_TIMER_ID)
    )


async def completed_steps(stack: AgentTestStack, session_id: str, step_type: str) -> int:
    return sum(
        1
        for entry in await stack.read_step_history(session_id)
        if entry.event_type == EXECUTE_COMPLETED_EVENT and entry.step_type == step_type
    )



async def test_a_durable_wait_fires_once_across_a_worker_kill(tmp_path: Path) -> None:
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, STEERING_FLOW_TYPE))
        worker = await stack.start_worker()
        before = datetime.now(UTC)
        await sessions.start_session("session-1", "wait: 3600")
        timer = await wait_for_timer(sessions, "session-1")
        assert timer.reason == "scripted wait"
        assert timer.duration_seconds == 3600
        assert before + timedelta(seconds=3590) < timer.fires_at
        assert timer.fires_at < datetime.now(UTC) + timedelta(seconds=3601)

        # The snapshot lists the wait once the Step that raised it commits; the engine's Timer
        # exists only once DurableWait's wait_for committed too. Kill only then, so the kill
        # lands on the wait itself.
        waiting = await wait_for_step_waiting(stack, "session-1", "DurableWait-1")
        assert [t.condition_id for t in waiting.timers] == [DURABLE_WAIT_TIMER_ID]
        # Whole seconds from the Worker's clock, rounded up, added to the engine's.
        firing = waiting.timers[0].firing_unix_timestamp_seconds
        assert timer.fires_at.timestamp() - 1 <= firing <= timer.fires_at.timestamp() + 10

        # A plain queued message never interrupts the wait.
        assert await sessions.send_user_message("session-1", "later")
        worker.kill()
        await stack.start_worker()
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert snapshot.pending_timer == timer
        assert snapshot.queued_message_count == 1
        assert (await wait_for_step_waiting(stack, "session-1", "DurableWait-1")) == waiting

        await fire_wait(stack, "session-1")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        result = json.loads(snapshot.messages[2].text)
        assert result == {
            "status": "completed",
            "duration_seconds": 3600,
            "reason": "scripted wait",
        }
        assert snapshot.pending_timer is None
        assert last_text(snapshot) == "echo: later"
        assert await completed_steps(stack, "session-1", "DurableWait") == 1


async def test_steer_ends_a_durable_wait_early(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "wait: 3600", flow_type=STEERING_FLOW_TYPE
    ) as (stack, sessions, _):
        await wait_for_timer(sessions, "session-1")
        # A steer before DurableWait's wait_for commits skips the wait instead of ending it.
        await wait_for_step_waiting(stack, "session-1", "DurableWait-1")
        assert await sessions.send_user_message("session-1", "go now", client_id="g")
        assert await sessions.steer_queued_message("session-1", "g")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=5)
        assert snapshot.pending_timer is None
        assert json.loads(snapshot.messages[2].text)["status"] == "interrupted"
        assert last_text(snapshot).endswith("steered=['go now']")
        # Viewers read "interrupted" from the event, not only "succeeded".
        flow = flow_of(stack, STEERING_FLOW_TYPE)
        events = await stack.client.list_stream_messages("session-1", flow.agent_events, 200)
        finished = [
            message.value.payload for message in events.messages
            if message.value.type is AgentEventType.TOOL_CALL_FINISHED
        ]
        assert [(item["tool_name"], item["status"], item.get("outcome")) for item in finished] == [
            ("durable_wait", "succeeded", "interrupted")
        ]
        # The history names the wait's tool call and times its methods.
        waits = [
            entry for entry in await stack.read_step_history("session-1")
            if entry.step_execution_id == "DurableWait-1"
        ]
        assert [entry.event_type for entry in waits] == [
            WAIT_FOR_COMPLETED_EVENT, EXECUTE_COMPLETED_EVENT
        ]
        assert {entry.input_text for entry in waits} == {"call-1"}
        for entry in waits:
            assert entry.started_at is not None and entry.duration_seconds >= 0
            assert entry.failed_attempt is None and entry.failure is None


async def test_a_question_is_answered_once_and_cancels_the_other_calls(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "ask: Which colour? | red | blue", flow_type=STEERING_FLOW_TYPE
    ) as (stack, sessions, worker):
        question = await wait_for_question(sessions, "session-1")
        assert (question.tool_call_id, question.prompt, question.choices) == (
            "call-1",
            "Which colour?",
            ["red", "blue"],
        )
        snapshot = await sessions.get_agent_snapshot("session-1")
        statuses = {call.tool_name: call.status for call in snapshot.tool_calls}
        assert statuses["lookup"] is ToolCallStatus.CANCELLED
        assert snapshot.state is not None
        assert snapshot.state.status is AgentStatus.WAITING_FOR_USER_INPUT

        # A question survives a Worker kill; bad answers change nothing. The kill lands once
        # AwaitUserInput waits, not while its wait_for is being set up.
        await wait_for_step_waiting(stack, "session-1", "AwaitUserInput-1")
        worker.kill()
        await stack.start_worker()
        assert not await sessions.answer_user_input("session-1", "call-2", "red")
        assert not await sessions.answer_user_input("session-1", "call-1", "  ")
        assert await sessions.answer_user_input("session-1", "call-1", "red")
        assert not await sessions.answer_user_input("session-1", "call-1", "blue")

        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert snapshot.pending_input is None
        assert json.loads(snapshot.messages[2].text) == {
            "status": "waiting_for_user",
            "prompt": "Which colour?",
            "choices": ["red", "blue"],
        }
        assert json.loads(snapshot.messages[3].text)["reason"] == "superseded_by_user_input"
        assert user_texts(snapshot) == ["ask: Which colour? | red | blue", "red"]
        assert last_text(snapshot).endswith("steered=['red']")
        assert invocation_log(tmp_path).count("tool", "lookup") == 0


async def test_steer_withdraws_an_open_question(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "ask: Free text?", flow_type=STEERING_FLOW_TYPE
    ) as (_, sessions, _):
        question = await wait_for_question(sessions, "session-1")
        assert question.choices == []
        assert await sessions.send_user_message("session-1", "never mind", client_id="n")
        assert await sessions.steer_queued_message("session-1", "n")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert snapshot.pending_input is None
        assert snapshot.messages[2].text == CANCELLED_BY_STEER_OUTPUT
        assert last_text(snapshot).endswith("steered=['never mind']")
        assert not await sessions.answer_user_input("session-1", "call-1", "late")


async def test_bad_built_in_arguments_are_failures_the_model_reads(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "wait: 0", flow_type=STEERING_FLOW_TYPE
    ) as (_, sessions, _):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)
        assert "duration_seconds must be between 1 and" in last_text(snapshot)
        assert snapshot.pending_timer is None

        assert await sessions.send_user_message("session-1", "ask: Pick | only-one")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=9)
        assert "choices must hold 2 to 8 options" in last_text(snapshot)
        assert "lookup=succeeded" in last_text(snapshot)
        assert snapshot.pending_input is None
