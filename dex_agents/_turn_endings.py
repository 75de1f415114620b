"""How a turn ends: completed, failed, stopped by the turn guard, or cancelled.

This module owns the bookkeeping of a turn's end, without the decision that follows (the Step
that calls it moves to AwaitUserMessage or RecordTurnFailure itself): storing a completed
turn's messages, the note of a turn that ended early, clearing the turn's records, run state,
timers and questions, the failure a model call brings about at once, the turn guard's stop,
``cancel_turn``'s end with the streamed text kept, and what the observer hears of each. It
names no Step: it imports ``_step_base``, ``_turn_interruptions`` and ``_tool_deferral`` (the
contract checks of a stopped turn's calls) below it, and the turn-loop Steps (``_steps``)
import it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from dex import AsyncContext

from dex_agents._contract import (
    TURN_CANCELLED_EMPTY_NOTE,
    TURN_CANCELLED_NOTE_HEADER,
    TURN_FAILURE_NOTE_HEADER,
    TURN_STOPPED_NOTE_HEADER,
    TURN_STOPPED_OUTPUT_REASON,
    AgentContractError,
    AgentTurnContext,
    FrameworkMessage,
    ToolCallsRequested,
    TurnCompleted,
    build_turn_failure_note,
    describe_tool_call_outcome,
    require_user_message,
)
from dex_agents._elicitation import clear_questions
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._observer import ClosedInterrupt, InterruptOutcome, TurnEnd, TurnGuardCheck
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    AGENT_MESSAGES,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    FRAMEWORK_RUN_STATE,
    PENDING_INTERRUPTS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentMessage,
    AgentSessionConfig,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    MessageNotice,
    MessageRole,
    TextParts,
    ToolCallStatus,
    ToolEffect,
    message_sequence_key,
)
from dex_agents._step_base import (
    add_usage,
    interrupt_id_for,
    load_tool_calls,
    observe,
    record_step_outcome,
    recovery_detail,
    utc_now,
)
from dex_agents._text_parts import delete_text_parts, index_message_parts
from dex_agents._tool_deferral import validate_tool_calls
from dex_agents._turn_interruptions import (
    CANCELLED_TURN_MESSAGE,
    forget_stale_cancel,
    steer_back_taken,
    withdraw_turn_interrupts,
)

#: The longest ``last_turn_error`` a turn that failed at once or was stopped keeps
#: (characters).
TURN_ERROR_MAX_CHARS = 2000

_LOG = logging.getLogger("dex_agents")


def clip_turn_error(message: str) -> str:
    """``message`` cut to ``TURN_ERROR_MAX_CHARS`` characters, an ellipsis marking the cut."""
    if len(message) > TURN_ERROR_MAX_CHARS:
        return message[: TURN_ERROR_MAX_CHARS - 1] + "…"
    return message


def fail_turn_now(context: AsyncContext, state: AgentState, message: str) -> None:
    """Prepare RunModel's move to RecordTurnFailure for a model call no retry can fix (issue
    25: a provider's 400, 401, 403 or 404, or an input still too long after compaction): the
    turn fails after this one attempt. The message goes through ``AgentState.last_turn_error``,
    which RecordTurnFailure reads when no Step failure brought it there."""
    message = clip_turn_error(message)
    record_step_outcome(context, "failed", detail=message)
    AGENT_STATE.set(context, replace(state, last_turn_error=message))


def _whole_result(
    recorded: dict[str, AgentToolCall], message: FrameworkMessage, taken_over: set[str]
) -> TextParts | None:
    """Where the whole result answered by ``message`` is stored, when its call stored one in
    parts and no earlier message of the turn took it over (``taken_over`` grows)."""
    tool_call_id = message.tool_call_id
    if tool_call_id is None or tool_call_id in taken_over:
        return None
    record = recorded.get(tool_call_id)
    if record is None or record.output_parts is None:
        return None
    taken_over.add(tool_call_id)
    return record.output_parts


def complete_turn(
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    recorded: dict[str, AgentToolCall],
    outcome: TurnCompleted,
) -> None:
    """End the turn RunModel's ``TurnCompleted`` answered (seed "Flow shape": RunModel): store
    its new messages after the turn's (a tool message takes over the whole result its call
    stored in parts), add the usage, clear the run state and the turn's records and MCP
    questions, and write ``turn_completed``; the session then waits for a user message.

    Raises:
        AgentContractError: A new message is not a ``FrameworkMessage``, or the usage is bad.
    """
    assert state.turn_id is not None
    sequence = state.message_count
    taken_over: set[str] = set()
    stored_at = utc_now()
    for message in outcome.new_messages:
        if not isinstance(message, FrameworkMessage):
            raise AgentContractError("TurnCompleted.new_messages must hold FrameworkMessage")
        sequence += 1
        key = message_sequence_key(sequence)
        parts = _whole_result(recorded, message, taken_over)
        AGENT_MESSAGES.set(
            context,
            key,
            AgentMessage(
                sequence,
                MessageRole(message.role),
                message.text,
                message.framework_item,
                state.turn_id,
                parts,
                created_at=stored_at,
            ),
        )
        if parts is not None:
            index_message_parts(context, key, parts)
    add_usage(context, events, outcome.usage)
    if FRAMEWORK_RUN_STATE.get(context) is not None:
        FRAMEWORK_RUN_STATE.delete(context)
    for tool_call_id, record in recorded.items():
        AGENT_TOOL_CALLS.delete(context, tool_call_id)
        if record.output_parts is not None and tool_call_id not in taken_over:
            delete_text_parts(context, record.output_parts)
    clear_questions(context)
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.WAITING_FOR_USER_MESSAGE,
            turn_id=None,
            message_count=sequence,
            last_turn_error=None,
        ),
    )
    events.write_event(AgentEventType.TURN_COMPLETED, {"message_count": sequence})


async def record_turn_failure(flow: SessionFlow, context: AsyncContext) -> None:
    """RecordTurnFailure's work (seed "Flow shape"): the turn's error (the Step failure that
    routed here, else the message RunModel left in ``last_turn_error``), the turn-failure note
    when the turn has final tool call records, its records and run state cleared, the steered
    messages and the question's answer it held steered again, its interrupts withdrawn, and
    the common end of a failed turn (``end_failed_turn``). The Step must have loaded
    ``AGENT_TOOL_CALLS``."""
    state = AGENT_STATE.get(context) or AgentState(AgentStatus.WAITING_FOR_USER_MESSAGE)
    if context.recovery_error is None and state.last_turn_error:
        # Reached from RunModel for a ModelCallError, which left its message here.
        error = state.last_turn_error
    else:
        error = recovery_detail(context)
    records = load_tool_calls(context)
    final = [record for record in records.values() if record.status.is_final]
    sequence = state.message_count
    if final and state.turn_id is not None:
        sequence = store_turn_note(flow, context, final, state.turn_id, sequence)
    clear_turn_state(context, records)
    steer_back_taken(context, answer_too=True)
    turn_interrupts = {interrupt_id_for(record) for record in records.values()}
    interrupts = PENDING_INTERRUPTS.get(context) or []
    withdrawn = [item for item in interrupts if item.interrupt_id in turn_interrupts]
    if withdrawn:
        PENDING_INTERRUPTS.set(
            context, [item for item in interrupts if item.interrupt_id not in turn_interrupts]
        )
    events = AgentEventWriter(flow.agent_events, context, state.turn_id)
    try:
        await end_failed_turn(
            flow, context, events, state, sequence=sequence, error=error,
            withdrawn=withdrawn,
        )
    finally:
        events.close()


async def ask_turn_guard(
    flow: SessionFlow,
    context: AsyncContext,
    turn_id: str,
    config: AgentSessionConfig,
    outcome: ToolCallsRequested,
) -> str | None:
    """``AgentSessionOptions.turn_guard``'s reason to stop the turn after this call, or
    ``None``. The observer hears of the call's usage first (an index the guard reads counts
    it; keyed by the Step execution, so hearing it again when the Step commits counts it
    once). A guard that raises is logged: the turn goes on."""
    guard = flow.options.turn_guard
    if guard is None or not isinstance(outcome.usage, AgentUsage):
        return None  # a bad usage fails the Step in add_usage
    await observe(flow, context, status=None, turn_id=turn_id, usage=outcome.usage)
    try:
        reason = await guard(
            TurnGuardCheck(context.flow_id, turn_id, config.agent_config, outcome.usage)
        )
    except Exception:
        _LOG.exception("turn guard failed for %s", context.flow_id)
        return None
    return reason.strip() if isinstance(reason, str) and reason.strip() else None


async def stop_turn(
    flow: SessionFlow,
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    recorded: dict[str, AgentToolCall],
    outcome: ToolCallsRequested,
    reason: str,
) -> None:
    """End the turn right after the model call ``turn_guard`` stopped (platform addition).

    The calls it requested end ``cancelled`` without running (``tool_call_finished`` events;
    their result for the model: ``{"status": "cancelled", "reason": "turn_stopped",
    "detail": reason}``); the call's usage is added; the note (``MessageNotice.TURN_FAILED``)
    is ``[Dex] <reason>``, ``TURN_STOPPED_NOTE_HEADER`` and one line per tool call of the
    turn. Then as RecordTurnFailure: the turn's state is cleared, steered messages go back
    to start the next turn (the run state that held them is dropped), its interrupts are
    withdrawn, ``last_turn_error`` is the reason, ``turn_failed`` is written and the
    observer hears ``TurnEnd.FAILED``.
    """
    assert state.turn_id is not None
    turn_id = state.turn_id
    validate_tool_calls(outcome, recorded)
    output = json.dumps(
        {"status": "cancelled", "reason": TURN_STOPPED_OUTPUT_REASON, "detail": reason}
    )
    records = dict(recorded)
    for order, call in enumerate(outcome.tool_calls, start=len(recorded)):
        record = AgentToolCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments=call.arguments,
            effect=ToolEffect(call.policy.effect),
            requires_approval=False,
            status=ToolCallStatus.CANCELLED,
            output=output,
            deferral_order=order,
            turn_id=turn_id,
        )
        records[record.tool_call_id] = record
        events.write_tool_call_finished(
            record.tool_call_id, record.tool_name, record.status, "not run: the turn stopped"
        )
    add_usage(context, events, outcome.usage)
    final = [record for record in records.values() if record.status.is_final]
    sequence = store_turn_note(
        flow,
        context,
        final,
        turn_id,
        state.message_count,
        header=f"[Dex] {reason}\n{TURN_STOPPED_NOTE_HEADER}",
        notice=MessageNotice.TURN_FAILED,
    )
    clear_turn_state(context, recorded)
    steer_back_taken(context, answer_too=True)
    withdrawn = withdraw_turn_interrupts(context, turn_id)
    forget_stale_cancel(context)
    error = clip_turn_error(reason)
    await end_failed_turn(
        flow, context, events, state, sequence=sequence, error=error, withdrawn=withdrawn,
        usage=outcome.usage,
    )


async def end_failed_turn(
    flow: SessionFlow,
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    *,
    sequence: int,
    error: str,
    withdrawn: Sequence[AgentInterrupt],
    usage: AgentUsage | None = None,
) -> None:
    """The common end of a failed turn (RecordTurnFailure, a turn the guard stopped): the
    session waits for a message with ``last_turn_error`` ``error`` and ``sequence`` messages,
    ``turn_failed`` is written, and the observer hears the status, the ``withdrawn``
    interrupts, ``usage`` and ``TurnEnd.FAILED`` (when ``state`` had a turn)."""
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.WAITING_FOR_USER_MESSAGE,
            turn_id=None,
            message_count=sequence,
            last_turn_error=error,
        ),
    )
    events.write_event(AgentEventType.TURN_FAILED, {"error": error})
    turn_id = state.turn_id
    await observe(
        flow,
        context,
        status=AgentStatus.WAITING_FOR_USER_MESSAGE,
        turn_id=turn_id,
        closed=[
            ClosedInterrupt(
                item.interrupt_id,
                InterruptOutcome.WITHDRAWN,
                f"The turn failed before a decision: {error}",
            )
            for item in withdrawn
        ],
        usage=usage,
        turn_ended=TurnEnd.FAILED if turn_id is not None else None,
        turn_error=error if turn_id is not None else None,
    )


def store_turn_note(
    flow: SessionFlow,
    context: AsyncContext,
    final: Sequence[AgentToolCall],
    turn_id: str,
    sequence: int,
    *,
    header: str = TURN_FAILURE_NOTE_HEADER,
    notice: MessageNotice = MessageNotice.TURN_FAILED,
    text: str | None = None,
) -> int:
    """Store the note of a turn that ended early (failed, or cancelled with ``header``
    ``TURN_CANCELLED_NOTE_HEADER`` and ``notice`` ``TURN_CANCELLED``) naming what its
    ``final`` tool calls did, or ``text`` instead when given, as the message after
    ``sequence``: the runner's user item (the model reads it as the seed says), marked with
    ``notice`` so that pages show it as the session's notice, not as the user's message.
    Returns the new message count."""
    if text is None:
        describe = getattr(flow.runner, "describe_outcome_for_note", None)
        describe = describe or describe_tool_call_outcome
        text = build_turn_failure_note(final, describe, header=header)
    message = require_user_message(flow.runner.build_user_message(text))
    sequence += 1
    AGENT_MESSAGES.set(
        context,
        message_sequence_key(sequence),
        AgentMessage(
            sequence,
            MessageRole.USER,
            message.text,
            message.framework_item,
            turn_id,
            created_at=utc_now(),
            notice=notice,
        ),
    )
    return sequence


def clear_turn_state(context: AsyncContext, records: Mapping[str, AgentToolCall]) -> None:
    """What a turn that ended early leaves behind: its tool call records (and their stored
    text parts), the runner's run state, a durable wait or question of the turn, and the MCP
    servers' open questions."""
    for tool_call_id, record in records.items():
        AGENT_TOOL_CALLS.delete(context, tool_call_id)
        if record.output_parts is not None:
            delete_text_parts(context, record.output_parts)
    if FRAMEWORK_RUN_STATE.get(context) is not None:
        FRAMEWORK_RUN_STATE.delete(context)
    for pending in (PENDING_TIMER, PENDING_USER_INPUT):
        if pending.get(context) is not None:
            pending.delete(context)
    clear_questions(context)


def _interrupted_message(
    flow: SessionFlow,
    text: str,
    sequence: int,
    turn_id: str,
    usage: AgentUsage | None = None,
) -> AgentMessage | None:
    """The stored message for the text an abandoned model call streamed, marked
    ``interrupted``; ``None`` without text or when the runner has no
    ``build_assistant_message(text, usage) -> FrameworkMessage`` (an optional platform
    addition to the runner contract: only the runner knows its items' shape). ``usage``: the
    abandoned call's (``abandoned_call_usage``), or ``None`` when it is not known; the runner
    keeps it with the message as it keeps every answered call's, so people see what the
    stopped answer cost."""
    build = getattr(flow.runner, "build_assistant_message", None)
    if not text.strip() or build is None:
        return None
    message = build(text, usage)
    if not isinstance(message, FrameworkMessage) or message.role != MessageRole.ASSISTANT:
        raise AgentContractError("build_assistant_message must return an assistant message")
    return AgentMessage(
        sequence,
        MessageRole.ASSISTANT,
        message.text,
        message.framework_item,
        turn_id,
        created_at=utc_now(),
        interrupted=True,
    )


def abandoned_call_usage(
    flow: SessionFlow, turn: AgentTurnContext, streamed_text: str
) -> AgentUsage | None:
    """The usage of the model call ``cancel_turn`` abandoned, from the runner's optional
    ``abandoned_call_usage(turn, streamed_text) -> AgentUsage | None`` (a platform addition to
    the runner contract: only the runner knows what its provider reported, or how to estimate
    what it did not); ``None`` when the runner has no such method or cannot tell."""
    estimate = getattr(flow.runner, "abandoned_call_usage", None)
    if estimate is None:
        return None
    usage = estimate(turn, streamed_text)
    if usage is not None and not isinstance(usage, AgentUsage):
        raise AgentContractError("abandoned_call_usage must return an AgentUsage or None")
    return usage


async def end_cancelled_turn(
    flow: SessionFlow,
    context: AsyncContext,
    state: AgentState,
    *,
    partial_text: str,
    usage: AgentUsage | None = None,
) -> None:
    """End the turn ``cancel_turn`` cancelled (platform addition), from RunModel or ResumeTurn.

    Stores, after the turn's messages: a note naming the tool calls the turn ran
    (``TURN_CANCELLED_NOTE_HEADER``, as a failed turn's note), then ``partial_text`` (what the
    abandoned model call had streamed) as an assistant message marked ``interrupted``; when
    the turn left neither, the note ``TURN_CANCELLED_EMPTY_NOTE``. Notes are marked
    ``MessageNotice.TURN_CANCELLED``. Clears
    the turn's records, run state, timers and questions as RecordTurnFailure does (steered
    messages no model call saw start the next turn), deletes ``TURN_CANCEL``, writes
    ``turn_cancelled``; the caller goes back to AwaitUserMessage. The queue is not touched. The Step
    must have loaded ``AGENT_TOOL_CALLS``. ``usage``: the abandoned model call's, already added
    to ``AGENT_USAGE``, for the observer (usage and cost indexes count a cancelled call too).
    """
    assert state.turn_id is not None
    turn_id = state.turn_id
    record_step_outcome(context, "cancelled")
    records = load_tool_calls(context)
    final = [record for record in records.values() if record.status.is_final]
    sequence = state.message_count
    if final:
        sequence = store_turn_note(
            flow,
            context,
            final,
            turn_id,
            sequence,
            header=TURN_CANCELLED_NOTE_HEADER,
            notice=MessageNotice.TURN_CANCELLED,
        )
    interrupted = _interrupted_message(flow, partial_text, sequence + 1, turn_id, usage)
    if interrupted is not None:
        sequence += 1
        AGENT_MESSAGES.set(context, message_sequence_key(sequence), interrupted)
    elif not final:
        sequence = store_turn_note(
            flow,
            context,
            final,
            turn_id,
            sequence,
            notice=MessageNotice.TURN_CANCELLED,
            text=TURN_CANCELLED_EMPTY_NOTE,
        )
    clear_turn_state(context, records)
    # The answer's turn is over; nothing will read it.
    steer_back_taken(context, answer_too=False)
    withdrawn = withdraw_turn_interrupts(context, turn_id)
    forget_stale_cancel(context)
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.WAITING_FOR_USER_MESSAGE,
            turn_id=None,
            message_count=sequence,
            last_turn_error=None,
        ),
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    events.write_event(
        AgentEventType.TURN_CANCELLED,
        {
            "message_count": sequence,
            "interrupted_sequence": interrupted.sequence if interrupted is not None else None,
            "cancelled_tool_call_ids": [
                record.tool_call_id
                for record in sorted(final, key=lambda item: item.deferral_order)
                if record.status is ToolCallStatus.CANCELLED
            ],
        },
    )
    events.close()
    await observe(
        flow,
        context,
        status=AgentStatus.WAITING_FOR_USER_MESSAGE,
        turn_id=turn_id,
        closed=[
            ClosedInterrupt(item.interrupt_id, InterruptOutcome.WITHDRAWN, CANCELLED_TURN_MESSAGE)
            for item in withdrawn
        ],
        turn_ended=TurnEnd.CANCELLED,
        usage=usage,
    )
