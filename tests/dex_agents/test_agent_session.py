"""AgentSessionFlow against the real engine process and real Worker child processes."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace
from pathlib import Path

from dex_agents import (
    AgentEventType,
    AgentStatus,
    AgentToolCall,
    MessageNotice,
    MessageRole,
    TextParts,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
    tool_call_edit_note,
)
from dex_agents._text_parts import split_text
from dex_agents.testing import (
    EXECUTE_COMPLETED_EVENT,
    AgentTestStack,
    FileGate,
    wait_for_agent_snapshot,
    wait_until,
)
from tests.dex_agents.scripted_agent import (
    DEADLINE_FLOW_TYPE,
    FLOW_TYPE,
    WHOLE_RESULT,
    WHOLE_SHOWN,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    TURN_TIMEOUT,
    events_of,
    flow_of,
    last_text,
    read_whole,
    running_session,
    scripted_stack,
    session_at_gate,
    stored_part_keys,
    wait_for_idle,
    wait_for_interrupt,
    wait_for_step_waiting,
)


async def executed_steps(stack: AgentTestStack, session_id: str) -> list[tuple[str, int]]:
    history = await stack.read_step_history(session_id)
    return [
        (entry.step_type, entry.final_attempt)
        for entry in history
        if entry.event_type == EXECUTE_COMPLETED_EVENT
    ]


async def test_write_survives_a_worker_kill_while_approval_waits(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools: refund") as (stack, sessions, worker):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert interrupt.tool_name == "refund"
        assert interrupt.deadline is None
        # The kill lands while the approval waits, not while its wait_for is being set up.
        await wait_for_step_waiting(stack, "session-1", "AwaitToolApproval-1")
        worker.kill()
        await stack.start_worker()

        assert await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True, rejection_message="ignored"
        )
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot) == "refund=succeeded: refund ok"
        assert invocation_log(tmp_path).count("tool", "refund") == 1
        steps = await executed_steps(stack, "session-1")
        assert [step for step, _ in steps].count("CallSingleAttemptTool") == 1
        assert ("AwaitToolApproval", 1) in steps
        assert not await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True
        )


async def test_rejection_is_what_the_model_sees(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools: refund") as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=False, rejection_message="not today"
        )
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot) == (
            "refund=rejected: Tool call was rejected and did not run: not today"
        )
        assert invocation_log(tmp_path).count("tool", "refund") == 0


async def test_an_approval_with_edited_arguments_runs_the_call_with_them(
    tmp_path: Path,
) -> None:
    """Platform addition (approve with edits): the tool Step runs the reviewer's arguments, the
    record keeps the model's, and a rejection drops an edit."""
    async with running_session(tmp_path, "tools: refund") as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True, edited_arguments='{"amount":5}'
        )
        await wait_for_idle(sessions, "session-1", message_count=4)
        assert ("arguments", 'refund {"amount":5}') in invocation_log(tmp_path).entries()

        await sessions.send_user_message("session-1", "tools: refund")
        second = await wait_for_interrupt(sessions, "session-1")
        seen = await sessions.get_agent_snapshot("session-1")
        [record] = [call for call in seen.tool_calls if call.tool_call_id == second.tool_call_id]
        assert record.original_arguments is None
        assert await sessions.resolve_interrupt(
            "session-1", second.interrupt_id, approved=False, rejection_message="no",
            edited_arguments='{"amount":6}',
        )
        await wait_for_idle(sessions, "session-1", message_count=8)
        assert invocation_log(tmp_path).count("tool", "refund") == 1


def test_the_edit_note_names_both_arguments() -> None:
    record = AgentToolCall(
        tool_call_id="call-1", tool_name="refund", arguments='{"amount":5}',
        effect=ToolEffect.NON_IDEMPOTENT_WRITE, requires_approval=True,
        status=ToolCallStatus.SUCCEEDED, deferral_order=0, turn_id="turn-1",
        output="refund ok", original_arguments='{"amount":500}',
    )
    assert tool_call_edit_note(record) == (
        "Note: a reviewer edited the arguments of this call before approving it; it ran with "
        '{"amount":5} instead of {"amount":500}.'
    )
    assert tool_call_edit_note(replace(record, original_arguments=None)) is None


async def test_read_tool_killed_mid_call_runs_again(tmp_path: Path) -> None:
    async with session_at_gate(tmp_path) as (stack, sessions, worker, gate):
        worker.kill()
        await stack.start_worker()
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot) == "gated_read=succeeded: gated_read ok"
        assert invocation_log(tmp_path).count("tool", "gated_read") == 2
        assert ("CallTool", 2) in await executed_steps(stack, "session-1")


async def test_idempotent_write_killed_mid_call_runs_again_with_the_same_key(
    tmp_path: Path,
) -> None:
    async with session_at_gate(tmp_path, "idem_write") as (stack, sessions, worker, gate):
        worker.kill()
        await stack.start_worker()
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot) == "idem_write=succeeded: idem_write ok"
        keys = [name for kind, name in invocation_log(tmp_path).entries() if kind == "key"]
        assert keys == [
            "idem_write session-1/turn-1/call-1 attempt=1",
            "idem_write session-1/turn-1/call-1 attempt=2",
        ]


async def test_non_idempotent_write_killed_mid_call_is_outcome_unknown(tmp_path: Path) -> None:
    async with session_at_gate(tmp_path, "charge") as (stack, sessions, worker, gate):
        worker.kill()
        await stack.start_worker()
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot).startswith(
            "charge=outcome_unknown: Tool call outcome is unknown"
        )
        assert invocation_log(tmp_path).count("tool", "charge") == 1
        steps = [step for step, _ in await executed_steps(stack, "session-1")]
        assert "RecordToolOutcomeUnknown" in steps
        assert "CallSingleAttemptTool" not in steps


async def test_tool_calls_of_one_response_run_in_parallel(tmp_path: Path) -> None:
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack))
        await stack.start_worker()
        first, second = FileGate(tmp_path, "parallel_a"), FileGate(tmp_path, "parallel_b")
        await sessions.start_session("session-1", "tools: parallel_a, parallel_b")
        # Neither gate is released yet, so both tools are inside their Steps at the same time.
        await first.wait_until_reached()
        await second.wait_until_reached()
        # A message sent while the turn runs waits in the queue for the next turn.
        assert await sessions.send_user_message("session-1", "next")
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert snapshot.queued_message_count == 1
        assert snapshot.state is not None
        assert snapshot.state.status is AgentStatus.RUNNING_TOOLS
        assert [call.tool_name for call in snapshot.tool_calls] == ["parallel_a", "parallel_b"]
        assert [call.deferral_order for call in snapshot.tool_calls] == [0, 1]
        first.release()
        second.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=7)

        assert [message.text for message in snapshot.messages[-3:]] == [
            "parallel_a=succeeded: parallel_a ok; parallel_b=succeeded: parallel_b ok",
            "next",
            "echo: next",
        ]
        assert snapshot.queued_message_count == 0


async def test_failed_model_step_records_the_error_and_the_note(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools-then-fail: lookup") as (_, sessions, _):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)

        assert snapshot.state is not None
        assert "scripted model failure after tools" in (snapshot.state.last_turn_error or "")
        assert snapshot.last_turn_error == snapshot.state.last_turn_error
        assert snapshot.tool_calls == []
        note = snapshot.messages[-1]
        assert note.role is MessageRole.USER
        # The model reads it as a user item; pages show it as the session's notice.
        assert note.notice is MessageNotice.TURN_FAILED
        assert snapshot.messages[0].notice is None
        assert note.text == (
            "[Dex] The previous turn failed after these tool calls ran:\n"
            f"- lookup {json.dumps({'n': 1})} -> succeeded: lookup ok\n"
            "Do not repeat these tool calls unless the user asks again."
        )
        assert invocation_log(tmp_path).count("model", "turn-1") == 4

        assert await sessions.send_user_message("session-1", "fail-model")
        snapshot = await wait_for_agent_snapshot(
            sessions,
            "session-1",
            lambda s: (
                s if s.state and s.state.turn_number == 2 and s.state.turn_id is None else None
            ),
            description="turn 2 failed",
            timeout=TURN_TIMEOUT,
        )
        assert snapshot.state is not None
        assert snapshot.state.message_count == 3, "a failed turn without tools appends nothing"
        assert "scripted model failure" in (snapshot.last_turn_error or "")

        assert await sessions.send_user_message("session-1", "hello")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=5)
        assert last_text(snapshot) == "echo: hello"
        assert snapshot.last_turn_error is None


async def test_a_model_call_error_fails_the_turn_without_a_retry(tmp_path: Path) -> None:
    """A ``ModelCallError`` (the provider refused the request: a retry sends the same request and
    gets the same answer, issue 25) ends the turn after its one attempt, with its message as
    ``last_turn_error`` and in ``turn_failed``; the session takes the next message."""
    async with running_session(
        tmp_path, "refuse-model: invalid request: bad field"
    ) as (stack, sessions, _):
        snapshot = await wait_for_agent_snapshot(
            sessions,
            "session-1",
            lambda s: s if s.state and s.state.turn_id is None and s.last_turn_error else None,
            description="turn 1 failed",
            timeout=TURN_TIMEOUT,
        )
        assert snapshot.last_turn_error == "invalid request: bad field"
        assert invocation_log(tmp_path).count("model", "turn-1") == 1
        events = await events_of(stack, "session-1", FLOW_TYPE)
        turn_one = [event for event in events if event.turn_id == "turn-1"]
        deltas = [e for e in turn_one if e.type is AgentEventType.TEXT_DELTA]
        assert [(e.payload["text"], e.attempt) for e in deltas] == [("partial attempt 1", 1)]
        failed = [e for e in turn_one if e.type is AgentEventType.TURN_FAILED]
        assert [e.payload["error"] for e in failed] == ["invalid request: bad field"]

        assert await sessions.send_user_message("session-1", "hello")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=3)
        assert last_text(snapshot) == "echo: hello"
        assert snapshot.last_turn_error is None


async def test_a_rate_limited_model_call_waits_the_retry_after(tmp_path: Path) -> None:
    """``ModelRateLimitError`` (HTTP 429 with ``Retry-After``, issue 25): the attempt fails and
    the next one starts after the provider's seconds, not RunModel's 1 s backoff."""
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, FLOW_TYPE))
        await stack.start_worker()
        began = time.monotonic()
        await sessions.start_session("session-1", "rate-limited: 3")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert time.monotonic() - began >= 3.0
        assert last_text(snapshot) == "echo: rate-limited: 3"
        assert snapshot.last_turn_error is None
        assert invocation_log(tmp_path).count("model", "turn-1") == 2


async def test_an_overflow_the_next_attempt_may_fit_is_retried(tmp_path: Path) -> None:
    """A ``ContextWindowExceededError`` with ``retry_may_fit`` (the runner learned a smaller
    window from the refusal) fails only the attempt, even with nothing to compact."""
    async with running_session(tmp_path, "overflow-once") as (_, sessions, _):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert last_text(snapshot) == "echo: overflow-once"
        assert snapshot.last_turn_error is None
        assert invocation_log(tmp_path).count("model", "turn-1") == 2


async def test_approval_deadline_expiry_is_a_rejection_the_model_sees(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "tools: refund", flow_type=DEADLINE_FLOW_TYPE
    ) as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert interrupt.deadline is not None
        snapshot = await wait_for_idle(sessions, "session-1", message_count=4)

        assert last_text(snapshot).startswith(
            "refund=rejected: Tool call was rejected and did not run: "
            "No approval before the deadline"
        )
        assert invocation_log(tmp_path).count("tool", "refund") == 0
        assert not await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True
        )


async def test_blank_messages_start_nothing(tmp_path: Path) -> None:
    async with running_session(tmp_path, "   ") as (_, sessions, worker):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=0)
        assert snapshot.state is not None
        assert snapshot.state.turn_number == 0
        assert snapshot.messages == []

        assert not await sessions.send_user_message("session-1", " \n\t")
        assert await sessions.send_user_message("session-1", "hello")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=2)
        assert [message.sequence for message in snapshot.messages] == [1, 2]
        assert snapshot.usage.requests == 1
        assert invocation_log(tmp_path).count("model") == 1
        assert await asyncio.to_thread(worker.terminate) == 0, worker.log()


async def test_bad_tool_call_id_fails_the_turn(tmp_path: Path) -> None:
    async with running_session(tmp_path, "bad-id") as (_, sessions, _):
        snapshot = await wait_for_agent_snapshot(
            sessions,
            "session-1",
            lambda s: s if s.last_turn_error else None,
            description="the turn failed",
            timeout=TURN_TIMEOUT,
        )
        assert "must not contain '/'" in (snapshot.last_turn_error or "")
        assert [message.text for message in snapshot.messages] == ["bad-id"]
        assert invocation_log(tmp_path).count("tool") == 0


async def test_snapshot_and_messages_of_a_stopped_session(tmp_path: Path) -> None:
    async with running_session(tmp_path, "tools: lookup, broken") as (stack, sessions, _):
        await wait_for_idle(sessions, "session-1", message_count=5)
        await sessions.stop_session("session-1")

        snapshot = await sessions.get_agent_snapshot("session-1")
        assert [message.sequence for message in snapshot.messages] == [1, 2, 3, 4, 5]
        assert snapshot.usage.requests == 2
        assert snapshot.usage.input_tokens == 20
        page = await sessions.list_agent_messages("session-1", after_sequence=1, limit=0)
        assert [message.sequence for message in page.messages] == [2]
        assert page.has_more
        page = await sessions.list_agent_messages("session-1", after_sequence=2)
        assert [message.sequence for message in page.messages] == [3, 4, 5]
        assert not page.has_more

        by_type: dict[str, list[dict[str, object]]] = {}
        for event in await events_of(stack, "session-1", FLOW_TYPE):
            assert event.turn_id == "turn-1"
            assert event.step_execution_id
            assert event.attempt == 1
            by_type.setdefault(event.type, []).append(event.payload)
        assert by_type[AgentEventType.TURN_STARTED] == [{"sequence": 1}]
        assert by_type[AgentEventType.TURN_COMPLETED] == [{"message_count": 5}]
        assert [p["tool_name"] for p in by_type[AgentEventType.TOOL_CALL_DEFERRED]] == [
            "lookup",
            "broken",
        ]
        finished = {p["tool_name"]: p["status"] for p in by_type[AgentEventType.TOOL_CALL_FINISHED]}
        assert finished == {"lookup": "succeeded", "broken": "failed"}
        assert len(by_type[AgentEventType.TOOL_CALL_STARTED]) == 2
        assert len(by_type[AgentEventType.USAGE_RECORDED]) == 2
        assert by_type[AgentEventType.USAGE_RECORDED][-1]["session"] == {
            "input_tokens": 20,
            "output_tokens": 10,
            "reasoning_tokens": 0,
            "cached_input_tokens": 0,
            "requests": 2,
            "cost_usd": "0",
        }
        assert AgentEventType.TEXT_DELTA in by_type


async def test_text_deltas_from_threads_and_after_return(tmp_path: Path) -> None:
    async with running_session(tmp_path, "threaded") as (stack, sessions, _):
        await wait_for_idle(sessions, "session-1", message_count=2)
        FileGate(tmp_path, "late_write").release()
        log = invocation_log(tmp_path)
        await wait_until("the late write", lambda: log.count("late", "written") == 1)

        deltas = [
            event.payload["text"]
            for event in await events_of(stack, "session-1", FLOW_TYPE)
            if event.type is AgentEventType.TEXT_DELTA
        ]
        assert deltas == ["from a thread"]


async def test_session_config_and_policies_come_before_the_flow_policies(tmp_path: Path) -> None:
    async with running_session(
        tmp_path,
        "tools: lookup",
        agent_config={"model": "demo", "prompt": "be brief"},
        tool_policies={"lookup": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE, True)},
    ) as (stack, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert snapshot.tool_calls[0].effect is ToolEffect.IDEMPOTENT_WRITE
        assert await sessions.resolve_interrupt("session-1", interrupt.interrupt_id, approved=True)
        await wait_for_idle(sessions, "session-1", message_count=4)
        steps = [step for step, _ in await executed_steps(stack, "session-1")]
        assert "CallTool" in steps

        assert await sessions.send_user_message("session-1", "config")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert json.loads(last_text(snapshot)) == {"model": "demo", "prompt": "be brief"}


async def test_tool_retries_end_in_record_tool_failure_and_ids_repeat_in_a_later_turn(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, "tools: crash_read, crash_write") as (stack, sessions, _):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=5)
        read_outcome, _, write_outcome = last_text(snapshot).partition("; crash_write=")
        write_outcome = "crash_write=" + write_outcome
        assert read_outcome.startswith("crash_read=failed: Tool call failed: ")
        assert "crash_read crashed on attempt 3" in read_outcome
        assert write_outcome.startswith("crash_write=outcome_unknown: ")
        assert "crash_write crashed on attempt 3" in write_outcome
        log = invocation_log(tmp_path)
        assert log.count("tool", "crash_read") == 3
        assert log.count("tool", "crash_write") == 3
        steps = await executed_steps(stack, "session-1")
        assert [step for step, _ in steps].count("RecordToolFailure") == 2

        assert await sessions.send_user_message("session-1", "tools: lookup")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=9)
        assert last_text(snapshot) == "lookup=succeeded: lookup ok"
        keys = [name for kind, name in log.entries() if kind == "key" and "lookup" in name]
        assert keys == ["lookup session-1/turn-2/call-1 attempt=1"]


async def test_a_sessions_tool_limits_set_the_attempts_and_timeout_of_its_tool_steps(
    tmp_path: Path,
) -> None:
    """Issue 23: ``ToolPolicy.retries`` and ``timeout_seconds`` reach the tool Steps, on the
    RunModel fan-out and after an approval alike; the engine enforces them."""
    async with running_session(
        tmp_path,
        "tools: crash_read, crash_write, hang_read",
        tool_policies={
            "crash_read": ToolPolicy(ToolEffect.READ, retries=0),
            "crash_write": ToolPolicy(
                ToolEffect.IDEMPOTENT_WRITE, requires_approval=True, retries=1
            ),
            "hang_read": ToolPolicy(ToolEffect.READ, timeout_seconds=1, retries=1),
        },
    ) as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        snapshot = await sessions.get_agent_snapshot("session-1")
        limits = {
            call.tool_name: (call.retries, call.timeout_seconds) for call in snapshot.tool_calls
        }
        assert limits == {"crash_read": (0, None), "crash_write": (1, None), "hang_read": (1, 1)}
        assert await sessions.resolve_interrupt("session-1", interrupt.interrupt_id, approved=True)
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)

        outcomes = {
            message.framework_item["tool_call_id"]: (message.framework_item["status"], message.text)
            for message in snapshot.messages
            if message.role is MessageRole.TOOL
        }
        status, text = outcomes["call-1"]  # crash_read, no retry
        assert status == "failed" and text.endswith("crash_read crashed on attempt 1")
        status, text = outcomes["call-2"]  # crash_write, approved, one retry
        assert status == "outcome_unknown" and "crash_write crashed on attempt 2" in text
        status, text = outcomes["call-3"]  # hang_read, a one-second limit per attempt
        assert (status, text) == ("failed", "Tool call failed: execute method timeout after 1s")
        log = invocation_log(tmp_path)
        assert log.count("tool", "crash_read") == 1
        assert log.count("tool", "crash_write") == 2
        assert log.count("tool", "hang_read") == 2


async def test_snapshot_keeps_the_last_200_messages_and_pages_clamp_to_200(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, "many: 250") as (stack, sessions, _):
        snapshot = await wait_for_idle(sessions, "session-1", message_count=251)
        assert [m.sequence for m in snapshot.messages] == list(range(52, 252))
        page = await sessions.list_agent_messages("session-1", limit=1000)
        assert [m.sequence for m in page.messages] == list(range(1, 201))
        assert page.has_more

        # RunModel attempts share one step_execution_id; each event carries its attempt.
        assert await sessions.send_user_message("session-1", "fail-model")
        await wait_for_agent_snapshot(
            sessions,
            "session-1",
            lambda s: s if s.state and s.state.turn_id is None and s.last_turn_error else None,
            description="turn 2 failed",
            timeout=TURN_TIMEOUT,
        )
        events = await events_of(stack, "session-1", FLOW_TYPE)
        turn_two = [event for event in events if event.turn_id == "turn-2"]
        deltas = [e for e in turn_two if e.type is AgentEventType.TEXT_DELTA]
        assert [(e.payload["text"], e.attempt) for e in deltas] == [
            (f"partial attempt {n}", n) for n in (1, 2, 3)
        ]
        assert len({e.step_execution_id for e in deltas}) == 1
        failed = [e for e in turn_two if e.type is AgentEventType.TURN_FAILED]
        assert len(failed) == 1
        assert "scripted model failure" in failed[0].payload["error"]


async def test_a_tool_result_too_large_for_one_value_is_stored_whole_in_parts(
    tmp_path: Path,
) -> None:
    """A 3 MB result of one- to four-byte characters: the model sees the record's 2,000
    characters, the session keeps the whole text in parts of at most 512 KiB, the tool
    message points at them, and ``read_message_text`` reads it back whole, part by part; any
    message reads whole the same way. A failed turn's parts are deleted with its records."""
    async with running_session(tmp_path, "tools: whole", session_id="s") as (stack, sessions, _):
        snapshot = await wait_for_idle(sessions, "s", message_count=4)
        tool = next(m for m in snapshot.messages if m.role is MessageRole.TOOL)
        assert tool.text == WHOLE_RESULT[:WHOLE_SHOWN]
        parts = tool.text_parts
        assert isinstance(parts, TextParts)
        # About 3.3 MB at 512 KiB each.
        assert parts.count == len(split_text(WHOLE_RESULT)) >= 6
        assert parts.length == len(WHOLE_RESULT) and parts.key == "turn-1:call-1"
        assert len(stored_part_keys(stack)) == parts.count

        assert await read_whole(sessions, "s", tool.sequence) == WHOLE_RESULT
        for part in range(parts.count):
            answer = await sessions.read_message_text("s", tool.sequence, part)
            assert answer.text is not None and len(answer.text.encode()) <= 512 * 1024
        past = await sessions.read_message_text("s", tool.sequence, parts.count)
        assert past.found and past.text is None and past.parts == parts.count
        final = snapshot.messages[-1]
        plain = await sessions.read_message_text("s", final.sequence)
        assert (plain.parts, plain.text, plain.text_length) == (1, final.text, len(final.text))
        missing = await sessions.read_message_text("s", 99)
        assert not missing.found

        # A turn that fails after the call: its parts go with its records.
        assert await sessions.send_user_message("s", "tools-then-fail: whole")
        await wait_for_agent_snapshot(
            sessions, "s",
            lambda s: s if s.state and s.state.turn_id is None and s.last_turn_error else None,
            description="turn 2 failed", timeout=TURN_TIMEOUT,
        )
        assert invocation_log(tmp_path).count("tool", "whole") == 2  # turn 2 stored parts too
        assert stored_part_keys(stack) == [
            f"TEXT_PARTS/turn-1%3Acall-1%3A{index:05d}" for index in range(parts.count)
        ]
        assert await read_whole(sessions, "s", tool.sequence) == WHOLE_RESULT
