"""The Steps of ``AgentSessionFlow`` (seed "Flow shape").

Every Step sets ``wait_for`` and ``execute`` durability to SYNC explicitly. Tool call Steps and
their failure routes take the tool call ID as input and load only their own ``AGENT_TOOL_CALLS``
instance through per-movement ``StepOptions``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from dex import (
    AsyncContext,
    AttributeMapLoad,
    AttributeMapNotLoadedError,
    Context,
    RetryPolicy,
    Step,
    StepDecision,
    StepDurability,
    StepMovement,
    StepOptions,
    Timer,
    Wait,
    dead_end,
    go_to,
    go_to_many,
    retry_after,
)

from dex_agents._builtin_tools import (
    CANCELLED_BY_USER_INPUT_OUTPUT,
    DURABLE_WAIT_TOOL,
    REQUEST_USER_INPUT_TOOL,
    WAIT_CANCELLED_OUTPUT,
    WAIT_INTERRUPTED_OUTPUT,
    WRITE_TODOS_TOOL,
    BuiltinToolArgumentError,
    parse_durable_wait,
    parse_todos,
    parse_user_input,
    plan_updated_output,
    wait_completed_output,
    waiting_for_user_output,
)
from dex_agents._compaction import (
    CompactingRunner,
    CompactionBudgets,
    CompactionOptions,
    ContextWindowExceededError,
    SummarizeRequest,
    SummaryResult,
    choose_cutoff,
    current_summary,
    delete_before,
    message_loads,
    plan_chunks,
    retained_from,
)
from dex_agents._contract import (
    CANCELLED_BY_STEER_OUTPUT,
    CANCELLED_BY_USER_OUTPUT,
    TURN_CANCELLED_EMPTY_NOTE,
    TURN_CANCELLED_NOTE_HEADER,
    TURN_FAILURE_NOTE_HEADER,
    TURN_STOPPED_NOTE_HEADER,
    TURN_STOPPED_OUTPUT_REASON,
    AgentContractError,
    AgentTurnContext,
    DeferredToolExecution,
    FrameworkMessage,
    ModelCallError,
    ModelRateLimitError,
    ToolCallsRequested,
    ToolExecutionError,
    ToolExecutionResult,
    ToolPolicy,
    ToolPolicyResolver,
    TurnCompleted,
    build_turn_failure_note,
    describe_tool_call_outcome,
    require_user_message,
)
from dex_agents._elicitation import (
    WITHDRAWN_CALL_ENDED,
    WITHDRAWN_STEERED,
    WITHDRAWN_TURN_CANCELLED,
    clear_questions,
    withdraw_questions,
)
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._history import (
    FAILURE_MAX_CHARS,
    OUTCOME_DETAIL_RECORD,
    OUTCOME_RECORD,
    TOOL_NAME_RECORD,
)
from dex_agents._observer import (
    AgentSessionChange,
    ClosedInterrupt,
    InterruptOutcome,
    ObservedMessage,
    TurnEnd,
    TurnGuardCheck,
    notify_observer,
)
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    AGENT_CONFIG,
    AGENT_MESSAGES,
    AGENT_PLAN,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    BUILTIN_WAKEUPS,
    CONTEXT_SUMMARY,
    ELICITATIONS,
    FRAMEWORK_RUN_STATE,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
    PLAN_EXECUTIONS,
    QUEUED_USER_MESSAGES,
    STEERED_FOR_TURN,
    STEERED_USER_MESSAGES,
    TOOL_CALL_RESULTS,
    TURN_CANCEL,
    TURN_CANCELS,
    USER_INPUT_ANSWER,
    USER_INPUT_ANSWERS,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentInterruptResolution,
    AgentMessage,
    AgentPlan,
    AgentSessionConfig,
    AgentSessionStartInput,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    AgentUserMessage,
    CompactionPlan,
    ContextSummary,
    MessageNotice,
    MessageRole,
    PendingTimer,
    PendingUserInput,
    PlanStatus,
    PlanTaskStatus,
    TextParts,
    ToolCallCompleted,
    ToolCallStatus,
    ToolEffect,
    TurnMode,
    idempotency_key,
    message_sequence_key,
    usd_text,
)
from dex_agents._text_parts import (
    delete_text_parts,
    index_message_parts,
    store_text_parts,
    tool_output_key,
)
from dex_agents._turn_cancel import ModelCallCancelled, unless_cancelled
from dex_agents._wire_types import resolve_annotations

#: The background heartbeat period of RunModel and the tool Steps (seed "run_model_step").
HEARTBEAT_INTERVAL = timedelta(seconds=20)

_SYNC = StepDurability.SYNC


def _sync_options(**overrides: Any) -> StepOptions:
    """StepOptions with SYNC ``wait_for`` and ``execute`` durability plus ``overrides``."""
    return replace(StepOptions(wait_for_durability=_SYNC, execute_durability=_SYNC), **overrides)


def interrupt_id_for(record: AgentToolCall) -> str:
    """The interrupt ID of a tool call: ``"<turn_id>.<tool_call_id>"``."""
    return f"{record.turn_id}.{record.tool_call_id}"


def _now() -> datetime:
    return datetime.now(UTC)


async def observe(
    flow: SessionFlow,
    context: AsyncContext,
    *,
    status: AgentStatus | None,
    turn_id: str | None,
    raised: Sequence[AgentInterrupt] = (),
    closed: Sequence[ClosedInterrupt] = (),
    usage: AgentUsage | None = None,
    turn_ended: TurnEnd | None = None,
    turn_error: str | None = None,
    messages: Sequence[ObservedMessage] = (),
) -> None:
    """Tell the Flow's observer (platform addition) what this Step is about to commit;
    ``usage`` is the model call this Step made, keyed by its Step execution ID;
    ``turn_ended`` says how the turn ended when this Step ends it; ``messages`` the user and
    assistant texts it stores."""
    await notify_observer(
        flow.options.observer,
        AgentSessionChange(
            flow_id=context.flow_id,
            observed_at=_now(),
            status=status,
            turn_id=turn_id,
            raised=tuple(raised),
            closed=tuple(closed),
            usage=usage,
            model_call_id=context.step_execution_id if usage is not None else None,
            turn_ended=turn_ended,
            turn_error=turn_error,
            messages=tuple(messages),
        ),
    )


def _approval_deadline(
    flow: SessionFlow, policy: ToolPolicy, now: datetime
) -> datetime | None:
    """The deadline of an approval: the policy's own (platform addition), else the Flow's."""
    if policy.approval_deadline_seconds is not None:
        return now + timedelta(seconds=policy.approval_deadline_seconds)
    after = flow.options.interrupt_deadline
    return now + after if after is not None else None


def _find_interrupt(
    interrupts: Sequence[AgentInterrupt], interrupt_id: str
) -> AgentInterrupt | None:
    return next((item for item in interrupts if item.interrupt_id == interrupt_id), None)


@asynccontextmanager
async def _background_heartbeat(context: AsyncContext) -> AsyncIterator[None]:
    """Heartbeat every ``HEARTBEAT_INTERVAL`` while the runner works."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL.total_seconds())
            await context.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


#: Shared with CompactContext.
background_heartbeat = _background_heartbeat


def _recovery_detail(context: AsyncContext) -> str:
    """The error text a failure route records, which the model reads
    (``describe_tool_call_outcome``): the failure's own message only. The Worker's error
    type is a Python class path (``mcp_registry.client.McpTransportError``), which tells a
    model nothing, so it is left out."""
    error = context.recovery_error
    if error is None:
        return "the Step failed"
    return error.detail or "the Step failed without a message"


def _load_all(context: AsyncContext) -> dict[str, AgentToolCall]:
    return {
        key: AGENT_TOOL_CALLS.get(context, key)
        for key in AGENT_TOOL_CALLS.get_all_instance_keys(context)
    }


def _config(context: AsyncContext) -> AgentSessionConfig:
    return AGENT_CONFIG.get(context) or AgentSessionConfig()


#: Shared with CompactContext.
session_config = _config


#: How many steered messages one Step takes at most (all of them, in practice).
STEER_DRAIN_LIMIT = 1000
#: The rejection message of an approval a steered user message withdrew.
SUPERSEDED_BY_STEER_MESSAGE = "Withdrawn: a steered user message superseded this tool call."
#: The rejection message of an approval withdrawn because the user cancelled the turn.
CANCELLED_TURN_MESSAGE = "Withdrawn: the user cancelled the turn."


def _steer_pending(flow: SessionFlow, context: Context) -> bool:
    """True when the session steers and a steered message waits to reach the model (platform
    addition): one still in ``STEERED_USER_MESSAGES``, or one a Step already took."""
    if not flow.options.steering:
        return False
    return STEERED_USER_MESSAGES.size(context) > 0 or bool(STEERED_FOR_TURN.get(context))


def cancel_pending(context: Context, turn_id: str | None) -> bool:
    """True when ``cancel_turn`` accepted a cancel of ``turn_id`` (platform addition) that the
    Step ending the turn has not applied yet."""
    return turn_id is not None and TURN_CANCEL.get(context) == turn_id


def _stop_pending(flow: SessionFlow, context: Context, turn_id: str | None) -> bool:
    """A safe boundary must stop: a steered message waits, or the turn is being cancelled."""
    return _steer_pending(flow, context) or cancel_pending(context, turn_id)


def _cancelled_output(context: Context, turn_id: str | None) -> str:
    """The model-visible result of a call that ends ``cancelled`` without running."""
    if cancel_pending(context, turn_id):
        return CANCELLED_BY_USER_OUTPUT
    return CANCELLED_BY_STEER_OUTPUT


def _steered_condition() -> Any:
    return STEERED_USER_MESSAGES.for_range(at_least=1, at_most=STEER_DRAIN_LIMIT)


# --- movement options -------------------------------------------------------------------------


def _record_load(tool_call_id: str) -> dict[str, Any]:
    load = (AGENT_TOOL_CALLS.load(tool_call_id),)
    return {
        "wait_for_load_attribute_map_instances": load,
        "execute_load_attribute_map_instances": load,
    }


#: The ``condition_id`` of AwaitToolApproval's deadline Timer (stable, so ``skip_timer`` can
#: name it).
DEADLINE_TIMER_ID = "interrupt-deadline"
#: Heartbeat timeout of RunModel and the tool Steps (seed "Flow shape": RunModel).
STEP_HEARTBEAT_TIMEOUT = timedelta(minutes=2)
#: Per-attempt timeout of RunModel (seed "run_model_step": "Each attempt has a 15 minute timeout").
RUN_MODEL_ATTEMPT_TIMEOUT = timedelta(minutes=15)

_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
_SINGLE_ATTEMPT = RetryPolicy(maximum_attempts=1)


def _approval_step_options(**loads: Any) -> StepOptions:
    return _sync_options(execute_lock_attributes=(PENDING_INTERRUPTS.lock(),), **loads)


def approval_options(tool_call_id: str) -> StepOptions:
    """``AwaitToolApproval``: its own record, and PendingInterrupts locked while it decides."""
    return _approval_step_options(**_record_load(tool_call_id))


def _tool_step_options(
    effect: ToolEffect,
    *,
    retries: int | None = None,
    timeout_seconds: float | None = None,
    **loads: Any,
) -> StepOptions:
    # The failure routes withdraw the call's pending MCP elicitations (platform addition).
    failure_options = _sync_options(execute_lock_attributes=(ELICITATIONS.lock(),), **loads)
    route: type[Step[str]]
    if effect.retries:
        retry = _TOOL_RETRY
        if retries is not None:
            retry = replace(_TOOL_RETRY, maximum_attempts=retries + 1)
        route = RecordToolFailure
    else:
        retry, route = _SINGLE_ATTEMPT, RecordToolOutcomeUnknown
    timeout = None if timeout_seconds is None else timedelta(seconds=math.ceil(timeout_seconds))
    return _sync_options(
        heartbeat_timeout=STEP_HEARTBEAT_TIMEOUT,
        execute_method_timeout=timeout,
        execute_retry=retry,
        **loads,
    ).on_execute_failure_proceed_to(route, failure_options)


def tool_options(
    tool_call_id: str,
    effect: ToolEffect,
    *,
    retries: int | None = None,
    timeout_seconds: float | None = None,
) -> StepOptions:
    """The options of one tool call's Step (seed "Effects and policies"), for its movement.

    ``read`` and ``idempotent_write``: ``CallTool``, ``retries + 1`` attempts (``None``: the
    seed's 3) with backoff from 1 s doubling up to 30 s, then RecordToolFailure.
    ``non_idempotent_write`` and ``unclassified``: ``CallSingleAttemptTool``, always 1 attempt
    (``retries`` is ignored: such a call is never repeated), then RecordToolOutcomeUnknown.
    Both are heartbeat-supervised with a 2 minute timeout; ``timeout_seconds`` (platform
    addition, ``ToolPolicy.timeout_seconds``), rounded up to whole seconds, is each attempt's
    ``execute_method_timeout`` (``None`` sets none). Both, with their failure route, load only
    the call's own ``AGENT_TOOL_CALLS`` instance.
    """
    return _tool_step_options(
        effect, retries=retries, timeout_seconds=timeout_seconds, **_record_load(tool_call_id)
    )


def deadline_timer_seconds(deadline: datetime, now: datetime) -> int:
    """Whole seconds from ``now`` until ``deadline``, rounded up; ``0`` once it has passed.

    The deadline Timer of AwaitToolApproval waits this long (seed "Flow shape": "a Timer at the
    deadline, rounded up to whole seconds"), so it never fires before the deadline on the
    Worker clock; one that fires early anyway (``skip_timer``, clock skew) waits again.
    """
    return max(0, math.ceil((deadline - now).total_seconds()))


def _tool_step(effect: ToolEffect) -> type[Step[str]]:
    return CallTool if effect.retries else CallSingleAttemptTool


def _tool_movement(record: AgentToolCall) -> StepMovement[str]:
    """The call's tool Step with the limits its record kept from the policy."""
    return StepMovement.of(
        _tool_step(record.effect),
        record.tool_call_id,
        options=tool_options(
            record.tool_call_id,
            record.effect,
            retries=record.retries,
            timeout_seconds=record.timeout_seconds,
        ),
    )


def _approval_movement(tool_call_id: str) -> StepMovement[str]:
    return StepMovement.of(AwaitToolApproval, tool_call_id, options=approval_options(tool_call_id))


RECORD_TURN_FAILURE_OPTIONS = _sync_options(execute_load_attribute_maps=(AGENT_TOOL_CALLS,))
RUN_MODEL_OPTIONS = _sync_options(
    execute_method_timeout=RUN_MODEL_ATTEMPT_TIMEOUT,
    heartbeat_timeout=STEP_HEARTBEAT_TIMEOUT,
    execute_retry=RetryPolicy(
        initial_interval=timedelta(seconds=1),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=60),
        maximum_attempts=3,
        total_duration=timedelta(minutes=30),
    ),
    execute_load_attribute_maps=(AGENT_MESSAGES, AGENT_TOOL_CALLS),
)
#: RunModel with ``AgentSessionOptions.compaction``: movements add the unsummarized tail's
#: ``AGENT_MESSAGES`` instances (``run_model_movement``).
COMPACTING_RUN_MODEL_OPTIONS = replace(
    RUN_MODEL_OPTIONS, execute_load_attribute_maps=(AGENT_TOOL_CALLS,)
)
RESUME_TURN_OPTIONS = _sync_options(execute_load_attribute_maps=(AGENT_TOOL_CALLS,))
#: ResumeTurn's movements: for a steered message or a cancelled turn it may withdraw approvals
#: and MCP elicitations, so it locks PendingInterrupts and Elicitations.
STEERING_RESUME_TURN_OPTIONS = _sync_options(
    execute_load_attribute_maps=(AGENT_TOOL_CALLS,),
    execute_lock_attributes=(PENDING_INTERRUPTS.lock(), ELICITATIONS.lock()),
)


def _resume_movement(flow: SessionFlow, count: int) -> StepMovement[int]:
    # Every session can cancel a turn (platform addition, cancel_turn), which withdraws
    # approvals and questions from ResumeTurn as a steered message does.
    return StepMovement.of(ResumeTurn, count, options=STEERING_RESUME_TURN_OPTIONS)


# --- built-in tools (platform addition) --------------------------------------------------------

#: ``condition_id`` of DurableWait's Timer.
DURABLE_WAIT_TIMER_ID = "durable-wait"


def _first_question(outcome: ToolCallsRequested) -> tuple[str, str, list[str]] | None:
    """``(tool_call_id, prompt, choices)`` of the response's first valid ``request_user_input``
    call, or ``None``."""
    for call in outcome.tool_calls:
        if call.tool_name != REQUEST_USER_INPUT_TOOL:
            continue
        try:
            prompt, choices = parse_user_input(call.arguments)
        except BuiltinToolArgumentError:
            continue
        return call.tool_call_id, prompt, choices
    return None


def _builtin_error(parse: Callable[[str], object], arguments: str) -> str:
    try:
        parse(arguments)
    except BuiltinToolArgumentError as error:
        return str(error)
    return "invalid arguments"


def _builtin_options(tool_call_id: str, *locked: Any) -> StepOptions:
    return _sync_options(execute_lock_attributes=locked, **_record_load(tool_call_id))


def _builtin_movement(step: type[Step[str]], tool_call_id: str) -> StepMovement[str]:
    locked = (PENDING_USER_INPUT.lock(),) if step is AwaitUserInput else ()
    return StepMovement.of(step, tool_call_id, options=_builtin_options(tool_call_id, *locked))


# --- shared Step logic ------------------------------------------------------------------------


async def _start_turn(
    flow: SessionFlow,
    context: AsyncContext,
    state: AgentState,
    text: str,
    *,
    plan_mode: bool = False,
    client_ids: Sequence[str] = (),
    created_at: datetime | None = None,
) -> StepDecision:
    """Store the user message as the turn's first message and move to RunModel.

    With ``AgentSessionOptions.plans``, a ``plan_mode`` message starts a ``planning`` turn and
    any other a ``chat`` turn. ``client_ids`` (platform addition): the non-empty
    ``AgentUserMessage.client_id`` of every message the turn takes as it starts; written into
    ``turn_started`` as ``client_ids`` when there is one, so a sender can tell which turn
    answers its message. ``created_at``: when the message was accepted (stored as the
    message's ``created_at``); ``None`` means now.
    """
    message = require_user_message(flow.runner.build_user_message(text))
    _forget_stale_cancel(context)
    number = state.turn_number + 1
    turn_id = f"turn-{number}"
    sequence = state.message_count + 1
    AGENT_MESSAGES.set(
        context,
        message_sequence_key(sequence),
        AgentMessage(
            sequence,
            MessageRole.USER,
            message.text,
            message.framework_item,
            turn_id,
            created_at=created_at or _now(),
        ),
    )
    mode = TurnMode.PLANNING if plan_mode and flow.options.plans else TurnMode.CHAT
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.RUNNING_MODEL,
            turn_number=number,
            turn_id=turn_id,
            message_count=sequence,
            turn_mode=mode,
        ),
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    started: dict[str, Any] = {"sequence": sequence}
    if any(client_ids):
        started["client_ids"] = [client_id for client_id in client_ids if client_id]
    events.write_event(AgentEventType.TURN_STARTED, started)
    events.close()
    await observe(
        flow,
        context,
        status=AgentStatus.RUNNING_MODEL,
        turn_id=turn_id,
        messages=_observed([(sequence, MessageRole.USER.value, message.text)]),
    )
    return next_model_call(flow, context)


def _observed(messages: Sequence[tuple[int, str, str]]) -> list[ObservedMessage]:
    """``ObservedMessage`` values of the ``(sequence, role, text)`` that have text."""
    return [
        ObservedMessage(sequence, role, text)
        for sequence, role, text in messages
        if text and text.strip() and role in ("user", "assistant")
    ]


async def _start_plan_turn(
    flow: SessionFlow, context: AsyncContext, state: AgentState, plan: AgentPlan
) -> StepDecision:
    """Start an ``executing`` turn for ``plan`` without a user message (``execute_plan``); a
    draft becomes active."""
    _forget_stale_cancel(context)
    number = state.turn_number + 1
    turn_id = f"turn-{number}"
    if plan.status is PlanStatus.DRAFT:
        AGENT_PLAN.set(context, replace(plan, status=PlanStatus.ACTIVE))
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.RUNNING_MODEL,
            turn_number=number,
            turn_id=turn_id,
            turn_mode=TurnMode.EXECUTING,
        ),
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    events.write_event(
        AgentEventType.TURN_STARTED, {"sequence": None, "plan_revision": plan.revision}
    )
    events.write_event(AgentEventType.PLAN_STARTED, {"revision": plan.revision})
    events.close()
    await observe(flow, context, status=AgentStatus.RUNNING_MODEL, turn_id=turn_id)
    return next_model_call(flow, context)


def _write_plan(
    context: AsyncContext, mode: TurnMode, arguments: str
) -> tuple[AgentPlan | None, str]:
    """Apply one ``write_todos`` call: ``(new plan, model-visible output)``.

    Raises:
        BuiltinToolArgumentError: Unusable tasks, or a chat turn (no plan mode, no execution).
    """
    if mode is TurnMode.CHAT:
        raise BuiltinToolArgumentError(
            "write_todos is available only in plan mode or while a plan executes"
        )
    tasks = parse_todos(arguments)
    current = AGENT_PLAN.get(context)
    revision = (current.revision if current is not None else 0) + 1
    if mode is TurnMode.PLANNING:
        status = PlanStatus.DRAFT
    elif all(task.status is PlanTaskStatus.COMPLETED for task in tasks):
        status = PlanStatus.COMPLETED
    else:
        status = PlanStatus.ACTIVE
    plan = AgentPlan(revision, status, tasks)
    AGENT_PLAN.set(context, plan)
    output = plan_updated_output(cleared=not tasks, revision=revision, task_count=len(tasks))
    return plan, output


def _publish_final(context: AsyncContext, events: AgentEventWriter, record: AgentToolCall) -> None:
    """Store a final record and publish its one ToolCallResults message."""
    AGENT_TOOL_CALLS.set(context, record.tool_call_id, record)
    TOOL_CALL_RESULTS.publish(context, ToolCallCompleted(record.tool_call_id, record.status))
    events.write_tool_call_finished(
        record.tool_call_id, record.tool_name, record.status, _finished_outcome(record)
    )


def _finished_outcome(record: AgentToolCall) -> str | None:
    """``tool_call_finished``'s ``outcome`` for ``record`` (see ``AgentEventType``): what a
    viewer should read where ``succeeded`` or ``failed`` alone would mislead, else None."""
    if record.status in (ToolCallStatus.FAILED, ToolCallStatus.OUTCOME_UNKNOWN):
        return record.error or None
    if record.status is not ToolCallStatus.SUCCEEDED:
        return None
    if record.tool_name == REQUEST_USER_INPUT_TOOL:
        return "answered"
    if record.tool_name == DURABLE_WAIT_TOOL:
        interrupted = record.output in (WAIT_INTERRUPTED_OUTPUT, WAIT_CANCELLED_OUTPUT)
        return "interrupted" if interrupted else "completed"
    return None


def _finish_tool_call(
    context: AsyncContext, events: AgentEventWriter, record: AgentToolCall
) -> StepDecision:
    """Store a final record, publish its one ToolCallResults message, and end the path."""
    _publish_final(context, events, record)
    return dead_end()


def _open_record(context: AsyncContext, tool_call_id: str) -> AgentToolCall | None:
    """The Step's own record, or ``None`` when it is missing or already final."""
    record = AGENT_TOOL_CALLS.get(context, tool_call_id)
    if record is None or record.status.is_final:
        return None
    return record


async def _run_tool(
    flow: SessionFlow, context: AsyncContext, tool_call_id: str
) -> StepDecision:
    record = _open_record(context, tool_call_id)
    if record is None:
        return dead_end()
    events = AgentEventWriter(flow.agent_events, context, record.turn_id)
    try:
        if context.attempt == 1 and _stop_pending(flow, context, record.turn_id):
            # A safe boundary (platform additions, Steer and cancel_turn): the call has not
            # started, so it ends with a structured cancelled result instead of running.
            cancelled = replace(
                record,
                status=ToolCallStatus.CANCELLED,
                output=_cancelled_output(context, record.turn_id),
            )
            return _finish_tool_call(context, events, cancelled)
        events.write_tool_call_started(record.tool_call_id, record.tool_name)
        await context.heartbeat()
        call = DeferredToolExecution(
            flow_id=context.flow_id,
            tool_call=record,
            idempotency_key=idempotency_key(context.flow_id, record),
            attempt=context.attempt,
            events=events,
            heartbeat_callback=context.heartbeat,
            agent_config=_config(context).agent_config,
        )
        try:
            async with _background_heartbeat(context):
                result = await flow.runner.execute_deferred_tool_call(call)
        except ToolExecutionError as error:
            final = replace(record, status=ToolCallStatus.FAILED, error=error.message)
        else:
            if not isinstance(result, ToolExecutionResult) or not isinstance(result.output, str):
                raise AgentContractError(
                    "execute_deferred_tool_call must return ToolExecutionResult(output: str)"
                )
            final = replace(record, status=ToolCallStatus.SUCCEEDED, output=result.output)
            if isinstance(result.full_text, str) and result.full_text != result.output:
                parts = store_text_parts(context, tool_output_key(record), result.full_text)
                final = replace(final, output_parts=parts)
        return _finish_tool_call(context, events, final)
    finally:
        events.close()


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


def _validate_tool_calls(outcome: ToolCallsRequested, recorded: dict[str, AgentToolCall]) -> None:
    if not isinstance(outcome.framework_run_state, str) or not outcome.framework_run_state:
        raise AgentContractError("ToolCallsRequested.framework_run_state must be non-empty text")
    if not outcome.tool_calls:
        raise AgentContractError("ToolCallsRequested.tool_calls must not be empty")
    seen = set(recorded)
    for call in outcome.tool_calls:
        tool_call_id = call.tool_call_id
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise AgentContractError("tool call IDs must be non-empty")
        if "/" in tool_call_id:
            raise AgentContractError(f"tool call ID {tool_call_id!r} must not contain '/'")
        if tool_call_id in seen:
            raise AgentContractError(f"tool call ID {tool_call_id!r} repeats within the turn")
        if not isinstance(call.policy, ToolPolicy):
            raise AgentContractError(f"tool call {tool_call_id!r} needs a ToolPolicy")
        seen.add(tool_call_id)


def add_usage(context: AsyncContext, events: AgentEventWriter, usage: object) -> None:
    """Add one model call's usage to the session total and write ``usage_recorded``."""
    if not isinstance(usage, AgentUsage):
        raise AgentContractError("outcome usage must be an AgentUsage")
    try:
        valid_cost = (
            usd_text(Decimal(usage.cost_usd)) == usage.cost_usd and usage.cost_usd[0] != "-"
        )
    except (InvalidOperation, TypeError, ValueError):
        valid_cost = False
    if not valid_cost:
        raise AgentContractError(
            f"usage cost_usd must be a plain non-negative decimal string, got {usage.cost_usd!r}"
        )
    session = (AGENT_USAGE.get(context) or AgentUsage()) + usage
    AGENT_USAGE.set(context, session)
    events.write_event(
        AgentEventType.USAGE_RECORDED,
        {"recorded": usage.as_dict(), "session": session.as_dict()},
    )


# --- Steps ------------------------------------------------------------------------------------


class _SessionStep:
    """Gives a Step its Flow (runner, options, AgentEvents Stream)."""

    def __init__(self, flow: SessionFlow) -> None:
        self._flow = flow


class StartAgentSession(_SessionStep, Step[AgentSessionStartInput]):
    """Start Step: initializes state, usage, interrupts and the agent config.

    Next: RunModel for a non-blank ``initial_message``, else AwaitUserMessage.
    """

    def get_step_options(self) -> StepOptions:
        return _sync_options()

    async def execute(self, context: AsyncContext, input: AgentSessionStartInput) -> StepDecision:  # type: ignore[override]
        AGENT_USAGE.set(context, AgentUsage())
        PENDING_INTERRUPTS.set(context, [])
        AGENT_CONFIG.set(
            context,
            AgentSessionConfig(
                agent_config=input.agent_config, tool_policies=dict(input.tool_policies)
            ),
        )
        state = AgentState(status=AgentStatus.WAITING_FOR_USER_MESSAGE)
        if input.initial_message.strip():
            return await _start_turn(
                self._flow,
                context,
                state,
                input.initial_message,
                plan_mode=input.initial_plan_mode,
            )
        AGENT_STATE.set(context, state)
        await observe(self._flow, context, status=state.status, turn_id=None)
        return go_to(AwaitUserMessage, None)


class AwaitUserMessage(_SessionStep, Step[None]):
    """Waits for ``QUEUED_USER_MESSAGES.for_one()``, stores the message, starts the turn."""

    def get_step_options(self) -> StepOptions:
        return _sync_options()

    async def wait_for(self, context: AsyncContext, input: None) -> Wait:  # type: ignore[override]
        options = self._flow.options
        if not (options.steering or options.plans):
            return Wait.until(QUEUED_USER_MESSAGES.for_one())
        # Steered messages first (one that arrives between turns is simply the next turn),
        # then queued ones, then a plan execution.
        conditions = [_steered_condition()] if options.steering else []
        conditions.append(QUEUED_USER_MESSAGES.for_one())
        if options.plans:
            conditions.append(PLAN_EXECUTIONS.for_one())
        return Wait.any_of(*conditions)

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        state = AGENT_STATE.get(context) or AgentState(AgentStatus.WAITING_FOR_USER_MESSAGE)
        if self._flow.options.steering:
            steered = [m for m in STEERED_USER_MESSAGES.results(context) if m.text.strip()]
            if steered:
                # The first starts the turn; the rest reach its first model call after it.
                if len(steered) > 1:
                    STEERED_FOR_TURN.set(context, steered[1:])
                first = steered[0]
                return await _start_turn(
                    self._flow, context, state, first.text, plan_mode=first.plan_mode,
                    client_ids=[message.client_id for message in steered],
                    created_at=first.created_at,
                )
        if self._flow.options.plans:
            requests = PLAN_EXECUTIONS.results(context)
            if requests:
                plan = AGENT_PLAN.get(context)
                if (
                    plan is None
                    or plan.revision != requests[0].revision
                    or not (plan.is_executable)
                ):
                    return go_to(AwaitUserMessage, None)  # stale: the plan changed since
                return await _start_plan_turn(self._flow, context, state, plan)
        messages = QUEUED_USER_MESSAGES.results(context)
        if not messages or not messages[0].text.strip():
            return go_to(AwaitUserMessage, None)
        return await _start_turn(
            self._flow, context, state, messages[0].text, plan_mode=messages[0].plan_mode,
            client_ids=[messages[0].client_id], created_at=messages[0].created_at,
        )


def record_step_outcome(
    context: AsyncContext, outcome: str, *, detail: str | None = None
) -> None:
    """Record in the Step method's history event what its ending meant (platform addition,
    read back as ``StepHistoryEntry.outcome``; ``outcome`` is one of ``STEP_OUTCOMES``): the
    status of a Step that completed says only that it ran, not that the model call it made was
    refused or cancelled, or that the approval it waited for was withdrawn."""
    context.record_event(OUTCOME_RECORD, outcome)
    if detail:
        context.record_event(OUTCOME_DETAIL_RECORD, detail[:FAILURE_MAX_CHARS])


def _fail_turn_now(context: AsyncContext, state: AgentState, message: str) -> StepDecision:
    """RunModel's way to RecordTurnFailure for a model call no retry can fix (issue 25: a
    provider's 400, 401, 403 or 404, or an input still too long after compaction): the turn
    fails after this one attempt. The message goes through ``AgentState.last_turn_error``,
    which RecordTurnFailure reads when no Step failure brought it there."""
    if len(message) > _TURN_ERROR_MAX_CHARS:
        message = message[: _TURN_ERROR_MAX_CHARS - 1] + "…"
    record_step_outcome(context, "failed", detail=message)
    AGENT_STATE.set(context, replace(state, last_turn_error=message))
    return go_to(RecordTurnFailure, None)


#: The longest ``last_turn_error`` RunModel stores for a turn it fails at once (characters).
_TURN_ERROR_MAX_CHARS = 2000


class RunModel(_SessionStep, Step[None]):
    """Calls ``run_model_step`` once.

    15 minute timeout, 2 minute heartbeat timeout, 3 attempts within 30 minutes, failure route
    RecordTurnFailure; a ``ModelCallError``, or a ``ContextWindowExceededError`` that compaction
    cannot help, goes to RecordTurnFailure at once, and after a ``ModelRateLimitError`` the next
    attempt waits its ``retry_after_seconds`` (issue 25). Next: AwaitUserMessage, or one
    Step per tool call plus ResumeTurn.
    """

    def get_step_options(self) -> StepOptions:
        options = RUN_MODEL_OPTIONS
        if self._flow.options.compaction is not None:
            options = COMPACTING_RUN_MODEL_OPTIONS
        return options.on_execute_failure_proceed_to(
            RecordTurnFailure, RECORD_TURN_FAILURE_OPTIONS
        )

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        flow = self._flow
        state = AGENT_STATE.get(context)
        if state is None or state.turn_id is None:
            return go_to(AwaitUserMessage, None)
        turn_id = state.turn_id
        if cancel_pending(context, turn_id):
            # Platform addition (cancel_turn): accepted before this call started, perhaps
            # while the Worker that ran its last attempt was down; no model call is made.
            return await end_cancelled_turn(flow, context, state, partial_text="")
        if flow.options.steering and STEERED_USER_MESSAGES.size(context) > 0:
            # A safe boundary before the model call: ResumeTurn takes the steered messages
            # (durably) and comes straight back here.
            return go_to_many(_resume_movement(flow, 0))
        answer = USER_INPUT_ANSWER.get(context) if flow.options.user_input else None
        steered: list[AgentUserMessage] = [answer] if answer is not None else []
        if flow.options.steering:
            steered.extend(STEERED_FOR_TURN.get(context) or [])
        loaded = load_model_context(flow, context, state)  # compaction: the tail only
        if not isinstance(loaded, ModelContext):
            return loaded
        recorded = _load_all(context)
        config = _config(context)
        events = AgentEventWriter(flow.agent_events, context, turn_id)
        try:
            turn = AgentTurnContext(
                flow_id=context.flow_id,
                turn_id=turn_id,
                attempt=context.attempt,
                messages=loaded.messages,
                framework_run_state=FRAMEWORK_RUN_STATE.get(context) or None,
                tool_calls=dict(recorded),
                events=events,
                policies=ToolPolicyResolver(
                    config.tool_policies,
                    flow.options.tool_policies,
                    flow.options.default_tool_effect,
                ),
                heartbeat_callback=context.heartbeat,
                agent_config=config.agent_config,
                steered_messages=tuple(
                    require_user_message(flow.runner.build_user_message(item.text))
                    for item in steered
                ),
                turn_mode=state.turn_mode,
                plan=AGENT_PLAN.get(context) if flow.options.plans else None,
                summary=loaded.summary,
            )
            # Context compaction: summarize first when the input is too large, and once more
            # when the provider says so.
            compaction = compact_before_model_call(flow, context, state, turn)
            if compaction is not None:
                return compaction
            try:
                async with _background_heartbeat(context):
                    # cancel_turn wakes the call it finds here (platform addition,
                    # dex_agents._turn_cancel); nothing awaits before it is registered.
                    with flow.model_calls.running(context.flow_id, turn_id) as cancelled:
                        outcome = await unless_cancelled(
                            flow.runner.run_model_step(turn), cancelled
                        )
            except ContextWindowExceededError as overflow:
                compaction = compact_after_overflow(flow, context, state, turn)
                if compaction is not None:
                    return compaction
                if overflow.retry_may_fit:
                    raise  # the next attempt builds its input for the window the refusal named
                # Too long even after this call's compaction (or without compaction): the same
                # input would be refused again.
                return _fail_turn_now(context, state, str(overflow) or "the input is longer"
                                      " than the model's context window")
            except ModelCallError as refused:
                return _fail_turn_now(context, state, refused.message)
            except ModelRateLimitError as limited:
                # Raised here, outside the context managers: the SDK's RetryAfterError is a
                # frozen dataclass, which contextlib's re-raise cannot give a traceback.
                raise retry_after(limited.retry_after_seconds, limited) from None
            if isinstance(outcome, ModelCallCancelled):
                usage = _abandoned_call_usage(flow, turn, events.streamed_text)
                if usage is not None:
                    add_usage(context, events, usage)
                return await end_cancelled_turn(
                    flow, context, state, partial_text=events.streamed_text, usage=usage
                )
            if isinstance(outcome, ToolCallsRequested) and flow.options.turn_guard is not None:
                reason = await _ask_turn_guard(flow, context, turn_id, config, outcome)
                if reason:
                    return await _stop_turn(flow, context, events, state, recorded, outcome, reason)
            if steered and isinstance(outcome, TurnCompleted | ToolCallsRequested):
                if answer is not None:
                    USER_INPUT_ANSWER.delete(context)
                if STEERED_FOR_TURN.get(context):
                    STEERED_FOR_TURN.delete(context)
            if isinstance(outcome, TurnCompleted):
                decision = self._complete(context, events, state, recorded, outcome)
                retain_newest(flow, context)  # compaction: retention after the new messages
                await observe(
                    flow,
                    context,
                    status=AgentStatus.WAITING_FOR_USER_MESSAGE,
                    turn_id=turn_id,
                    usage=outcome.usage,
                    turn_ended=TurnEnd.COMPLETED,
                    messages=_observed(
                        [
                            (state.message_count + number, str(message.role), message.text)
                            for number, message in enumerate(outcome.new_messages, start=1)
                        ]
                    ),
                )
                return decision
            if isinstance(outcome, ToolCallsRequested):
                decision, raised, status = self._defer(context, events, state, recorded, outcome)
                await observe(
                    flow,
                    context,
                    status=status,
                    turn_id=turn_id,
                    raised=raised,
                    usage=outcome.usage,
                )
                return decision
            raise AgentContractError(
                "run_model_step must return TurnCompleted or ToolCallsRequested"
            )
        finally:
            events.close()

    def _complete(
        self,
        context: AsyncContext,
        events: AgentEventWriter,
        state: AgentState,
        recorded: dict[str, AgentToolCall],
        outcome: TurnCompleted,
    ) -> StepDecision:
        assert state.turn_id is not None
        sequence = state.message_count
        taken_over: set[str] = set()
        stored_at = _now()
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
        return go_to(AwaitUserMessage, None)

    def _defer(
        self,
        context: AsyncContext,
        events: AgentEventWriter,
        state: AgentState,
        recorded: dict[str, AgentToolCall],
        outcome: ToolCallsRequested,
    ) -> tuple[StepDecision, list[AgentInterrupt], AgentStatus]:
        """Store the calls and their interrupts; return the decision, the raised interrupts and
        the new status."""
        assert state.turn_id is not None
        _validate_tool_calls(outcome, recorded)
        now = _now()
        interrupts = list(PENDING_INTERRUPTS.get(context) or [])
        raised: list[AgentInterrupt] = []
        movements: list[StepMovement[Any]] = []
        options = self._flow.options
        mode = state.turn_mode if options.plans else TurnMode.CHAT
        planning = mode is TurnMode.PLANNING
        question = _first_question(outcome) if options.user_input and not planning else None
        timer_taken = False
        plan_writes = sum(1 for call in outcome.tool_calls if call.tool_name == WRITE_TODOS_TOOL)
        for order, call in enumerate(outcome.tool_calls, start=len(recorded)):
            builtin = AgentToolCall(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                arguments=call.arguments,
                effect=ToolEffect.READ,
                requires_approval=False,
                status=ToolCallStatus.PENDING,
                deferral_order=order,
                turn_id=state.turn_id,
            )
            # write_todos applies at once, so a question in the same response does not cancel it
            # (a task that asks and is marked done in one response is not asked again).
            if options.plans and call.tool_name == WRITE_TODOS_TOOL:
                try:
                    if plan_writes > 1:
                        raise BuiltinToolArgumentError(
                            "multiple_write_todos_calls: call write_todos once per response"
                        )
                    plan, output = _write_plan(context, mode, call.arguments)
                except BuiltinToolArgumentError as error:
                    final = replace(builtin, status=ToolCallStatus.FAILED, error=str(error))
                else:
                    final = replace(builtin, status=ToolCallStatus.SUCCEEDED, output=output)
                    events.write_event(
                        AgentEventType.PLAN_UPDATED,
                        {
                            "revision": plan.revision if plan else None,
                            "status": str(plan.status) if plan else None,
                            "task_count": len(plan.tasks) if plan else 0,
                        },
                    )
                _publish_final(context, events, final)
                continue
            if planning:
                refusal = "only write_todos can run in plan mode; the plan executes after review"
                _publish_final(
                    context, events, replace(builtin, status=ToolCallStatus.FAILED, error=refusal)
                )
                continue
            if question is not None and call.tool_call_id != question[0]:
                # The response asked the user something: none of its other calls run
                # (write_todos, applied above, excepted).
                _publish_final(
                    context,
                    events,
                    replace(
                        builtin,
                        status=ToolCallStatus.CANCELLED,
                        output=CANCELLED_BY_USER_INPUT_OUTPUT,
                    ),
                )
                continue
            if question is not None:
                _, prompt, choices = question
                AGENT_TOOL_CALLS.set(context, call.tool_call_id, builtin)
                PENDING_USER_INPUT.set(
                    context, PendingUserInput(call.tool_call_id, prompt, choices, state.turn_id)
                )
                events.write_event(
                    AgentEventType.USER_INPUT_REQUESTED,
                    {"tool_call_id": call.tool_call_id, "prompt": prompt, "choices": choices},
                )
                movements.append(_builtin_movement(AwaitUserInput, call.tool_call_id))
                continue
            if options.user_input and call.tool_name == REQUEST_USER_INPUT_TOOL:
                refusal = _builtin_error(parse_user_input, call.arguments)
                _publish_final(
                    context, events, replace(builtin, status=ToolCallStatus.FAILED, error=refusal)
                )
                continue
            if options.durable_waits and call.tool_name == DURABLE_WAIT_TOOL:
                try:
                    seconds, reason = parse_durable_wait(call.arguments)
                    if timer_taken:
                        raise BuiltinToolArgumentError("only one durable_wait per model response")
                except BuiltinToolArgumentError as error:
                    _publish_final(
                        context,
                        events,
                        replace(builtin, status=ToolCallStatus.FAILED, error=str(error)),
                    )
                    continue
                timer_taken = True
                fires_at = now + timedelta(seconds=seconds)
                AGENT_TOOL_CALLS.set(context, call.tool_call_id, builtin)
                PENDING_TIMER.set(
                    context,
                    PendingTimer(call.tool_call_id, fires_at, seconds, reason, state.turn_id),
                )
                events.write_event(
                    AgentEventType.DURABLE_WAIT_STARTED,
                    {
                        "tool_call_id": call.tool_call_id,
                        "fires_at": fires_at.isoformat(),
                        "duration_seconds": seconds,
                        "reason": reason,
                    },
                )
                movements.append(_builtin_movement(DurableWait, call.tool_call_id))
                continue
            effect = ToolEffect(call.policy.effect)
            requires_approval = call.policy.is_approval_required
            record = AgentToolCall(
                tool_call_id=call.tool_call_id,
                tool_name=call.tool_name,
                arguments=call.arguments,
                effect=effect,
                requires_approval=requires_approval,
                status=(
                    ToolCallStatus.AWAITING_APPROVAL
                    if requires_approval
                    else ToolCallStatus.PENDING
                ),
                deferral_order=order,
                turn_id=state.turn_id,
                timeout_seconds=call.policy.timeout_seconds,
                retries=call.policy.retries,
            )
            AGENT_TOOL_CALLS.set(context, record.tool_call_id, record)
            events.write_event(
                AgentEventType.TOOL_CALL_DEFERRED,
                {
                    "tool_call_id": record.tool_call_id,
                    "tool_name": record.tool_name,
                    "effect": str(effect),
                    "requires_approval": requires_approval,
                },
            )
            if requires_approval:
                deadline = _approval_deadline(self._flow, call.policy, now)
                interrupt = AgentInterrupt(
                    interrupt_id=interrupt_id_for(record),
                    tool_call_id=record.tool_call_id,
                    tool_name=record.tool_name,
                    arguments=record.arguments,
                    deadline=deadline,
                    turn_id=state.turn_id,
                )
                interrupts.append(interrupt)
                raised.append(interrupt)
                events.write_event(
                    AgentEventType.INTERRUPT_RAISED,
                    {
                        "interrupt_id": interrupt.interrupt_id,
                        "tool_call_id": record.tool_call_id,
                        "tool_name": record.tool_name,
                        "deadline": deadline.isoformat() if deadline is not None else None,
                    },
                )
                movements.append(_approval_movement(record.tool_call_id))
            else:
                movements.append(_tool_movement(record))
        PENDING_INTERRUPTS.set(context, interrupts)
        FRAMEWORK_RUN_STATE.set(context, outcome.framework_run_state)
        add_usage(context, events, outcome.usage)
        # A question cancels every other call of the response: the turn waits for the user.
        status = (
            AgentStatus.WAITING_FOR_USER_INPUT
            if question is not None
            else AgentStatus.RUNNING_TOOLS
        )
        AGENT_STATE.set(context, replace(state, status=status))
        movements.append(_resume_movement(self._flow, len(outcome.tool_calls)))
        return go_to_many(*movements), raised, status


class AwaitToolApproval(_SessionStep, Step[str]):
    """Waits for the interrupt's answer, plus a Timer at its deadline while it is pending.

    Approved: marks the record approved and moves to its tool Step. Rejected or expired: records
    ``rejected`` and publishes ToolCallResults. A Timer that fires early, or races an answer that
    already left PendingInterrupts, waits again.
    """

    def get_step_options(self) -> StepOptions:
        """SYNC, PendingInterrupts locked in ``execute``; movements add the record load."""
        return _approval_step_options()

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = _open_record(context, input)
        if record is None or record.status is ToolCallStatus.APPROVED:
            return Wait.skip_immediately()
        # The history names the call's tool even after the turn ended and took the record.
        context.record_event(TOOL_NAME_RECORD, record.tool_name)
        interrupt_id = interrupt_id_for(record)
        answer = INTERRUPT_RESOLUTIONS.for_one(interrupt_id)
        pending = _find_interrupt(PENDING_INTERRUPTS.get(context) or [], interrupt_id)
        if pending is None or pending.deadline is None:
            return Wait.until(answer)
        seconds = deadline_timer_seconds(pending.deadline, _now())
        timer = Timer.by_duration(timedelta(seconds=seconds), condition_id=DEADLINE_TIMER_ID)
        return Wait.any_of(answer, timer)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = _open_record(context, input)
        if record is None:
            # Its turn ended (failed, cancelled, stopped) and withdrew the approval.
            record_step_outcome(context, "withdrawn")
            return dead_end()
        if record.status is ToolCallStatus.APPROVED:
            return go_to_many(_tool_movement(record))
        interrupt_id = interrupt_id_for(record)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            answers = INTERRUPT_RESOLUTIONS.results(context, interrupt_id)
            if answers and answers[0].superseded:
                record_step_outcome(context, "withdrawn", detail=answers[0].rejection_message)
                # ResumeTurn withdrew the interrupt for a steered message (and told the
                # observer); the call never runs.
                events.write_event(
                    AgentEventType.INTERRUPT_RESOLVED,
                    {
                        "interrupt_id": interrupt_id,
                        "approved": False,
                        "rejection_message": answers[0].rejection_message,
                        "superseded": True,
                    },
                )
                cancelled = replace(
                    record,
                    status=ToolCallStatus.CANCELLED,
                    output=_cancelled_output(context, record.turn_id),
                )
                return _finish_tool_call(context, events, cancelled)
            if answers:
                answer = answers[0]
                resolved: dict[str, Any] = {
                    "interrupt_id": interrupt_id,
                    "approved": answer.approved,
                    "rejection_message": answer.rejection_message,
                }
                if answer.approved and answer.edited_arguments is not None:
                    # Platform addition (approve with edits); absent otherwise, so the seed's
                    # payload is unchanged for every other answer.
                    resolved["edited"] = True
                record_step_outcome(
                    context,
                    "approved" if answer.approved else "rejected",
                    detail=None if answer.approved else answer.rejection_message,
                )
                events.write_event(AgentEventType.INTERRUPT_RESOLVED, resolved)
                await observe(
                    self._flow,
                    context,
                    status=None,
                    turn_id=record.turn_id,
                    closed=[
                        ClosedInterrupt(
                            interrupt_id,
                            InterruptOutcome.APPROVED
                            if answer.approved
                            else InterruptOutcome.REJECTED,
                            None if answer.approved else answer.rejection_message,
                        )
                    ],
                )
                if answer.approved:
                    approved = replace(record, status=ToolCallStatus.APPROVED)
                    if answer.edited_arguments is not None:
                        # The tool Step runs whatever the record holds; the model's own
                        # arguments stay for the audit and the model's note.
                        approved = replace(
                            approved,
                            arguments=answer.edited_arguments,
                            original_arguments=record.arguments,
                        )
                    AGENT_TOOL_CALLS.set(context, record.tool_call_id, approved)
                    return go_to_many(_tool_movement(approved))
                rejected = replace(
                    record,
                    status=ToolCallStatus.REJECTED,
                    rejection_message=answer.rejection_message,
                )
                return _finish_tool_call(context, events, rejected)
            interrupts = PENDING_INTERRUPTS.get(context) or []
            pending = _find_interrupt(interrupts, interrupt_id)
            if pending is None or pending.deadline is None or _now() < pending.deadline:
                return go_to_many(_approval_movement(record.tool_call_id))
            PENDING_INTERRUPTS.set(
                context, [item for item in interrupts if item.interrupt_id != interrupt_id]
            )
            message = f"No approval before the deadline {pending.deadline.isoformat()}."
            record_step_outcome(context, "expired", detail=message)
            events.write_event(
                AgentEventType.INTERRUPT_RESOLVED,
                {"interrupt_id": interrupt_id, "approved": False, "rejection_message": message},
            )
            expired = replace(record, status=ToolCallStatus.REJECTED, rejection_message=message)
            await observe(
                self._flow,
                context,
                status=None,
                turn_id=record.turn_id,
                closed=[ClosedInterrupt(interrupt_id, InterruptOutcome.EXPIRED, message)],
            )
            return _finish_tool_call(context, events, expired)
        finally:
            events.close()


class CallTool(_SessionStep, Step[str]):
    """Runs one read or idempotent_write call: 3 attempts (``ToolPolicy.retries`` + 1 when
    set), failure route RecordToolFailure."""

    def get_step_options(self) -> StepOptions:
        """SYNC, 2 minute heartbeat timeout, 3 attempts, failure route RecordToolFailure;
        movements (``tool_options``) add the call's own record load and its policy's limits."""
        return _tool_step_options(ToolEffect.READ)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return await _run_tool(self._flow, context, input)


class CallSingleAttemptTool(_SessionStep, Step[str]):
    """Runs one non_idempotent_write or unclassified call: 1 attempt, failure route
    RecordToolOutcomeUnknown."""

    def get_step_options(self) -> StepOptions:
        """SYNC, 2 minute heartbeat timeout, 1 attempt, failure route RecordToolOutcomeUnknown;
        movements (``tool_options``) add the call's own record load."""
        return _tool_step_options(ToolEffect.UNCLASSIFIED)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return await _run_tool(self._flow, context, input)


class RecordToolFailure(_SessionStep, Step[str]):
    """Failure route of CallTool: ``failed`` for a read, ``outcome_unknown`` for a write."""

    def get_step_options(self) -> StepOptions:
        return _sync_options()

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return _record_recovery(
            self._flow,
            context,
            input,
            lambda record: (
                ToolCallStatus.FAILED
                if record.effect is ToolEffect.READ
                else ToolCallStatus.OUTCOME_UNKNOWN
            ),
        )


class RecordToolOutcomeUnknown(_SessionStep, Step[str]):
    """Failure route of CallSingleAttemptTool: ``outcome_unknown`` with the recovery detail."""

    def get_step_options(self) -> StepOptions:
        return _sync_options()

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return _record_recovery(
            self._flow, context, input, lambda _record: ToolCallStatus.OUTCOME_UNKNOWN
        )


def _record_recovery(
    flow: SessionFlow,
    context: AsyncContext,
    tool_call_id: str,
    status_for: Callable[[AgentToolCall], ToolCallStatus],
) -> StepDecision:
    """Make a tool call's open record final after its Step failed (seed "Effects and
    policies"): ``status_for(record)`` with the recovery detail in ``error``, then publish.
    A record that is already final ends the Step without publishing again. Questions of MCP
    servers the call left pending (a Worker killed while one waited) are withdrawn."""
    record = _open_record(context, tool_call_id)
    if record is None:
        return dead_end()
    withdraw_questions(
        context,
        lambda item: item.turn_id == record.turn_id and item.tool_call_id == tool_call_id,
        WITHDRAWN_CALL_ENDED,
    )
    events = AgentEventWriter(flow.agent_events, context, record.turn_id)
    try:
        final = replace(record, status=status_for(record), error=_recovery_detail(context))
        return _finish_tool_call(context, events, final)
    finally:
        events.close()


class ResumeTurn(_SessionStep, Step[int]):
    """Waits for ``TOOL_CALL_RESULTS.for_n(count)``, then RunModel; waits again while a record of
    the turn is still open.

    With ``AgentSessionOptions.steering`` (platform addition) it also wakes on a steered message:
    it takes every steered message into ``STEERED_FOR_TURN``, withdraws the turn's pending
    approvals (their AwaitToolApproval Steps end the calls ``cancelled``), and waits for the
    results still due; tool Steps that have not started cancel themselves, running ones finish.
    """

    def get_step_options(self) -> StepOptions:
        return RESUME_TURN_OPTIONS

    async def wait_for(self, context: AsyncContext, input: int) -> Wait:  # type: ignore[override]
        state = AGENT_STATE.get(context)
        conditions = [_steered_condition()] if self._flow.options.steering else []
        if state is not None and state.turn_id is not None:
            conditions.append(TURN_CANCELS.for_one(state.turn_id))
        conditions.append(TOOL_CALL_RESULTS.for_n(input))
        return Wait.any_of(*conditions) if len(conditions) > 1 else Wait.until(conditions[0])

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        state = AGENT_STATE.get(context)
        turn_id = state.turn_id if state is not None else None
        cancelled = turn_id is not None and bool(TURN_CANCELS.results(context, turn_id))
        if cancelled:
            await self._withdraw_waits(
                context, turn_id, WITHDRAWN_TURN_CANCELLED, CANCELLED_TURN_MESSAGE
            )
        if self._flow.options.steering or cancelled:
            steered = (
                list(STEERED_USER_MESSAGES.results(context)) if self._flow.options.steering else []
            )
            if steered:
                await self._take_steered(context, state, steered)
            remaining = input - len(TOOL_CALL_RESULTS.results(context))
            if remaining > 0:
                return go_to_many(_resume_movement(self._flow, remaining))
        open_records = [
            record for record in _load_all(context).values() if not record.status.is_final
        ]
        if open_records:
            return go_to_many(_resume_movement(self._flow, len(open_records)))
        if state is not None and cancel_pending(context, turn_id):
            # Every call has its result: the cancelled turn ends instead of calling the model.
            return await end_cancelled_turn(self._flow, context, state, partial_text="")
        if state is not None:
            AGENT_STATE.set(context, replace(state, status=AgentStatus.RUNNING_MODEL))
            await observe(
                self._flow, context, status=AgentStatus.RUNNING_MODEL, turn_id=state.turn_id
            )
        return next_model_call(self._flow, context)

    async def _take_steered(
        self,
        context: AsyncContext,
        state: AgentState | None,
        steered: list[AgentUserMessage],
    ) -> None:
        """Keep ``steered`` for the next model call and withdraw the turn's pending approvals."""
        STEERED_FOR_TURN.set(context, list(STEERED_FOR_TURN.get(context) or []) + steered)
        turn_id = state.turn_id if state is not None else None
        withdrawn = await self._withdraw_waits(
            context, turn_id, WITHDRAWN_STEERED, SUPERSEDED_BY_STEER_MESSAGE
        )
        events = AgentEventWriter(self._flow.agent_events, context, turn_id)
        applied: dict[str, Any] = {
            "message_count": len(steered),
            "withdrawn_interrupt_ids": [item.interrupt_id for item in withdrawn],
        }
        if any(message.client_id for message in steered):
            applied["client_ids"] = [message.client_id for message in steered if message.client_id]
        events.write_event(AgentEventType.STEER_APPLIED, applied)
        events.close()

    async def _withdraw_waits(
        self,
        context: AsyncContext,
        turn_id: str | None,
        question_reason: str,
        rejection_message: str,
    ) -> list[AgentInterrupt]:
        """Withdraw the turn's pending approvals (their AwaitToolApproval Steps end the calls
        ``cancelled``), end its MCP questions and wake its durable waits and open questions;
        tells the observer and returns the withdrawn approvals."""
        # Questions of MCP servers the turn's running calls wait on end cancelled; their
        # Steps wake on the version change and answer the servers.
        withdraw_questions(context, lambda item: item.turn_id == turn_id, question_reason)
        for record in _load_all(context).values():
            if not record.status.is_final and record.tool_name in _WAITING_BUILTINS:
                # Ends a durable wait or an open question early (its Step records the outcome).
                BUILTIN_WAKEUPS.publish(context, interrupt_id_for(record), "steer")
        interrupts = PENDING_INTERRUPTS.get(context) or []
        withdrawn = [item for item in interrupts if item.turn_id == turn_id]
        if withdrawn:
            PENDING_INTERRUPTS.set(
                context, [item for item in interrupts if item.turn_id != turn_id]
            )
            for item in withdrawn:
                INTERRUPT_RESOLUTIONS.publish(
                    context,
                    item.interrupt_id,
                    AgentInterruptResolution(
                        interrupt_id=item.interrupt_id,
                        approved=False,
                        rejection_message=rejection_message,
                        superseded=True,
                    ),
                )
        if withdrawn:
            await observe(
                self._flow,
                context,
                status=None,
                turn_id=turn_id,
                closed=[
                    ClosedInterrupt(
                        item.interrupt_id, InterruptOutcome.WITHDRAWN, rejection_message
                    )
                    for item in withdrawn
                ],
            )
        return withdrawn


class RecordTurnFailure(_SessionStep, Step[None]):
    """Failure route of RunModel: records ``last_turn_error``, appends the turn-failure note when
    the turn has final tool call records, and clears the turn's records and run state."""

    def get_step_options(self) -> StepOptions:
        return RECORD_TURN_FAILURE_OPTIONS

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        state = AGENT_STATE.get(context) or AgentState(AgentStatus.WAITING_FOR_USER_MESSAGE)
        if context.recovery_error is None and state.last_turn_error:
            # Reached from RunModel for a ModelCallError, which left its message here.
            error = state.last_turn_error
        else:
            error = _recovery_detail(context)
        records = _load_all(context)
        final = [record for record in records.values() if record.status.is_final]
        sequence = state.message_count
        if final and state.turn_id is not None:
            sequence = _store_turn_note(self._flow, context, final, state.turn_id, sequence)
        _clear_turn_state(context, records)
        _steer_back_taken(context, answer_too=True)
        turn_interrupts = {interrupt_id_for(record) for record in records.values()}
        interrupts = PENDING_INTERRUPTS.get(context) or []
        withdrawn = [item for item in interrupts if item.interrupt_id in turn_interrupts]
        if withdrawn:
            PENDING_INTERRUPTS.set(
                context, [item for item in interrupts if item.interrupt_id not in turn_interrupts]
            )
        events = AgentEventWriter(self._flow.agent_events, context, state.turn_id)
        try:
            await _end_failed_turn(
                self._flow, context, events, state, sequence=sequence, error=error,
                withdrawn=withdrawn,
            )
        finally:
            events.close()
        return go_to(AwaitUserMessage, None)


_LOG = logging.getLogger("dex_agents")


async def _ask_turn_guard(
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


async def _stop_turn(
    flow: SessionFlow,
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    recorded: dict[str, AgentToolCall],
    outcome: ToolCallsRequested,
    reason: str,
) -> StepDecision:
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
    _validate_tool_calls(outcome, recorded)
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
    sequence = _store_turn_note(
        flow,
        context,
        final,
        turn_id,
        state.message_count,
        header=f"[Dex] {reason}\n{TURN_STOPPED_NOTE_HEADER}",
        notice=MessageNotice.TURN_FAILED,
    )
    _clear_turn_state(context, recorded)
    _steer_back_taken(context, answer_too=True)
    withdrawn = _withdraw_turn_interrupts(context, turn_id)
    _forget_stale_cancel(context)
    error = reason
    if len(error) > _TURN_ERROR_MAX_CHARS:
        error = error[: _TURN_ERROR_MAX_CHARS - 1] + "…"
    await _end_failed_turn(
        flow, context, events, state, sequence=sequence, error=error, withdrawn=withdrawn,
        usage=outcome.usage,
    )
    return go_to(AwaitUserMessage, None)


async def _end_failed_turn(
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


def _steer_back_taken(context: AsyncContext, *, answer_too: bool) -> None:
    """For a turn that ended early: the steered messages it took but no model call saw are
    steered again, so they start the next turn (``STEERED_FOR_TURN`` is cleared); the
    question's answer it held (``USER_INPUT_ANSWER``) is deleted, and steered again first
    when ``answer_too``."""
    taken = list(STEERED_FOR_TURN.get(context) or [])
    answer = USER_INPUT_ANSWER.get(context)
    if answer is not None:
        if answer_too:
            taken.insert(0, answer)
        USER_INPUT_ANSWER.delete(context)
    for item in taken:
        STEERED_USER_MESSAGES.publish(context, item)
    if STEERED_FOR_TURN.get(context):
        STEERED_FOR_TURN.delete(context)


def _withdraw_turn_interrupts(context: AsyncContext, turn_id: str) -> list[AgentInterrupt]:
    """Remove ``turn_id``'s pending interrupts from ``PENDING_INTERRUPTS``; returns them."""
    interrupts = PENDING_INTERRUPTS.get(context) or []
    withdrawn = [item for item in interrupts if item.turn_id == turn_id]
    if withdrawn:
        PENDING_INTERRUPTS.set(context, [item for item in interrupts if item.turn_id != turn_id])
    return withdrawn


def _store_turn_note(
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
            created_at=_now(),
            notice=notice,
        ),
    )
    return sequence


def _clear_turn_state(context: AsyncContext, records: Mapping[str, AgentToolCall]) -> None:
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


def _forget_stale_cancel(context: AsyncContext) -> None:
    """Delete a ``TURN_CANCEL`` left by a cancel that arrived as its turn ended anyway."""
    if TURN_CANCEL.get(context) is not None:
        TURN_CANCEL.delete(context)


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
    abandoned call's (``_abandoned_call_usage``), or ``None`` when it is not known; the runner
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
        created_at=_now(),
        interrupted=True,
    )


def _abandoned_call_usage(
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
) -> StepDecision:
    """End the turn ``cancel_turn`` cancelled (platform addition), from RunModel or ResumeTurn.

    Stores, after the turn's messages: a note naming the tool calls the turn ran
    (``TURN_CANCELLED_NOTE_HEADER``, as a failed turn's note), then ``partial_text`` (what the
    abandoned model call had streamed) as an assistant message marked ``interrupted``; when
    the turn left neither, the note ``TURN_CANCELLED_EMPTY_NOTE``. Notes are marked
    ``MessageNotice.TURN_CANCELLED``. Clears
    the turn's records, run state, timers and questions as RecordTurnFailure does (steered
    messages no model call saw start the next turn), deletes ``TURN_CANCEL``, writes
    ``turn_cancelled`` and goes back to AwaitUserMessage. The queue is not touched. The Step
    must have loaded ``AGENT_TOOL_CALLS``. ``usage``: the abandoned model call's, already added
    to ``AGENT_USAGE``, for the observer (usage and cost indexes count a cancelled call too).
    """
    assert state.turn_id is not None
    turn_id = state.turn_id
    record_step_outcome(context, "cancelled")
    records = _load_all(context)
    final = [record for record in records.values() if record.status.is_final]
    sequence = state.message_count
    if final:
        sequence = _store_turn_note(
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
        sequence = _store_turn_note(
            flow,
            context,
            final,
            turn_id,
            sequence,
            notice=MessageNotice.TURN_CANCELLED,
            text=TURN_CANCELLED_EMPTY_NOTE,
        )
    _clear_turn_state(context, records)
    # The answer's turn is over; nothing will read it.
    _steer_back_taken(context, answer_too=False)
    withdrawn = _withdraw_turn_interrupts(context, turn_id)
    _forget_stale_cancel(context)
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
    return go_to(AwaitUserMessage, None)


_WAITING_BUILTINS = frozenset({DURABLE_WAIT_TOOL, REQUEST_USER_INPUT_TOOL})


class DurableWait(_SessionStep, Step[str]):
    """Runs a ``durable_wait`` call (platform addition): waits on a Dex Timer until
    ``PENDING_TIMER.fires_at``, or until ResumeTurn wakes it for a steered message.

    The Timer is the engine's, so it survives Worker and engine restarts; an operator can end
    the wait at once with ``skip_timer`` (condition ``DURABLE_WAIT_TIMER_ID``). Fired:
    ``succeeded`` with
    ``{"status": "completed", ...}``; steered: ``succeeded`` with ``{"status": "interrupted",
    "reason": "superseded_by_steered_user_message"}``; its turn cancelled (``cancel_turn``):
    the same with ``"reason": "turn_cancelled_by_user"``. Either way it clears
    ``PENDING_TIMER`` and publishes the call's result.
    """

    def get_step_options(self) -> StepOptions:
        return _sync_options()

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = _open_record(context, input)
        timer = PENDING_TIMER.get(context)
        if (
            record is None
            or timer is None
            or timer.tool_call_id != input
            or _stop_pending(self._flow, context, record.turn_id)
        ):
            return Wait.skip_immediately()
        seconds = deadline_timer_seconds(timer.fires_at, _now())
        return Wait.any_of(
            BUILTIN_WAKEUPS.for_one(interrupt_id_for(record)),
            Timer.by_duration(timedelta(seconds=seconds), condition_id=DURABLE_WAIT_TIMER_ID),
        )

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = _open_record(context, input)
        if record is None:
            return dead_end()
        timer = PENDING_TIMER.get(context)
        ours = timer is not None and timer.tool_call_id == input
        woken = bool(BUILTIN_WAKEUPS.results(context, interrupt_id_for(record)))
        if cancel_pending(context, record.turn_id):
            output = WAIT_CANCELLED_OUTPUT
        elif woken or _stop_pending(self._flow, context, record.turn_id):
            output = WAIT_INTERRUPTED_OUTPUT
        else:
            seconds, reason = (
                (timer.duration_seconds, timer.reason) if timer is not None and ours else (0, "")
            )
            output = wait_completed_output(seconds, reason)
        if ours:
            PENDING_TIMER.delete(context)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            final = replace(record, status=ToolCallStatus.SUCCEEDED, output=output)
            return _finish_tool_call(context, events, final)
        finally:
            events.close()


class AwaitUserInput(_SessionStep, Step[str]):
    """Runs a ``request_user_input`` call (platform addition): waits for ``answer_user_input``
    (``USER_INPUT_ANSWERS``), or for ResumeTurn's wake-up when a steered message supersedes the
    question.

    Answered: ``succeeded`` with ``{"status": "waiting_for_user", "prompt", "choices"}`` and the
    answer kept in ``USER_INPUT_ANSWER``, which the next model call sees as a user message right
    after the tool results. Superseded: ``cancelled``. PendingUserInput is locked while it
    decides, as ``answer_user_input`` locks it.
    """

    def get_step_options(self) -> StepOptions:
        return _sync_options(execute_lock_attributes=(PENDING_USER_INPUT.lock(),))

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = _open_record(context, input)
        if record is None or _stop_pending(self._flow, context, record.turn_id):
            return Wait.skip_immediately()
        key = interrupt_id_for(record)
        return Wait.any_of(USER_INPUT_ANSWERS.for_one(key), BUILTIN_WAKEUPS.for_one(key))

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = _open_record(context, input)
        if record is None:
            return dead_end()
        key = interrupt_id_for(record)
        answers = USER_INPUT_ANSWERS.results(context, key)
        pending = PENDING_USER_INPUT.get(context)
        if pending is not None and pending.tool_call_id == input:
            PENDING_USER_INPUT.delete(context)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            if answers:
                prompt, choices = parse_user_input(record.arguments)
                USER_INPUT_ANSWER.set(context, AgentUserMessage(text=answers[0].answer))
                events.write_event(
                    AgentEventType.USER_INPUT_ANSWERED, {"tool_call_id": record.tool_call_id}
                )
                final = replace(
                    record,
                    status=ToolCallStatus.SUCCEEDED,
                    output=waiting_for_user_output(prompt, choices),
                )
            else:
                final = replace(
                    record,
                    status=ToolCallStatus.CANCELLED,
                    output=_cancelled_output(context, record.turn_id),
                )
            return _finish_tool_call(context, events, final)
        finally:
            events.close()


# --- Context compaction: RunModel's hooks and the CompactContext Step --------------------------
# (dex_agents._compaction holds the plans, summaries and message ranges they use)


@dataclass(frozen=True)
class ModelContext:
    """What RunModel hands the runner: the messages and the summary before them."""

    messages: tuple[AgentMessage, ...]
    summary: ContextSummary | None


def run_model_movement(
    flow: SessionFlow, message_count: int, summary: ContextSummary
) -> StepMovement[None]:
    """A RunModel movement that loads exactly the unsummarized tail."""

    options = replace(
        COMPACTING_RUN_MODEL_OPTIONS,
        execute_load_attribute_map_instances=message_loads(
            summary.through_sequence + 1, message_count
        ),
    ).on_execute_failure_proceed_to(RecordTurnFailure, RECORD_TURN_FAILURE_OPTIONS)
    return StepMovement.of(RunModel, None, options=options)


def next_model_call(flow: SessionFlow, context: AsyncContext) -> StepDecision:
    """The decision that moves to RunModel: with compaction, loading only the unsummarized tail
    of the state this Step is about to commit."""

    state = AGENT_STATE.get(context)
    if flow.options.compaction is None or state is None:
        return go_to(RunModel, None)
    return go_to_many(run_model_movement(flow, state.message_count, current_summary(context)))


def load_model_context(
    flow: SessionFlow, context: AsyncContext, state: AgentState
) -> ModelContext | StepDecision:
    """RunModel's messages: the whole map without compaction; with it the unsummarized tail,
    or a move to RunModel with the tail's loads when this movement lacks them."""
    if flow.options.compaction is None:
        return ModelContext(
            messages=tuple(
                AGENT_MESSAGES.get(context, key)
                for key in AGENT_MESSAGES.get_all_instance_keys(context)
            ),
            summary=None,
        )
    summary = current_summary(context)
    messages: list[AgentMessage] = []
    for sequence in range(summary.through_sequence + 1, state.message_count + 1):
        try:
            message = AGENT_MESSAGES.get(context, message_sequence_key(sequence))
        except AttributeMapNotLoadedError:
            return go_to_many(run_model_movement(flow, state.message_count, summary))
        if message is not None:
            messages.append(message)
    return ModelContext(
        messages=tuple(messages), summary=summary if summary.generation > 0 else None
    )


def _compacting_runner(flow: SessionFlow) -> CompactingRunner:
    runner = flow.runner
    if not isinstance(runner, CompactingRunner):
        raise AgentContractError("AgentSessionOptions.compaction needs a CompactingRunner")
    return runner


def _token_counter(
    runner: CompactingRunner, agent_config: dict[str, Any] | None
) -> Callable[[AgentMessage], int]:
    counted: dict[int, int] = {}

    def tokens_of(message: AgentMessage) -> int:
        if message.sequence not in counted:
            tokens = runner.count_message_tokens(message, agent_config)
            counted[message.sequence] = max(0, int(tokens))
        return counted[message.sequence]

    return tokens_of


def _plan(
    flow: SessionFlow,
    state: AgentState,
    turn: AgentTurnContext,
    summary: ContextSummary,
    *,
    over_tokens: bool,
    budgets: CompactionBudgets,
    settings: CompactionOptions,
    reason: str,
    force: bool = False,
    overflow_retry_of: str = "",
) -> CompactionPlan | None:
    runner = _compacting_runner(flow)
    tokens_of = _token_counter(runner, turn.agent_config)
    cutoff = choose_cutoff(
        tail=turn.messages,
        tokens_of=tokens_of,
        budgets=budgets,
        settings=settings,
        summary=summary,
        message_count=state.message_count,
        turn_id=state.turn_id,
        over_tokens=over_tokens,
        force=force,
    )
    if cutoff is None:
        return None
    ranged = [message for message in turn.messages if message.sequence <= cutoff]
    following = next((message for message in turn.messages if message.sequence > cutoff), None)
    ends = plan_chunks(ranged, tokens_of, budgets.chunk, following)
    if not ends:
        return None
    return CompactionPlan(chunk_ends=ends, reason=reason, overflow_retry_of=overflow_retry_of)


def _settings(
    flow: SessionFlow, agent_config: dict[str, Any] | None
) -> tuple[CompactionOptions, CompactionBudgets]:
    options = flow.options.compaction
    assert options is not None
    settings = options.for_agent(agent_config)
    window = _compacting_runner(flow).context_window(agent_config)
    return settings, CompactionBudgets.of(window or settings.default_context_window, settings)


def compact_before_model_call(
    flow: SessionFlow, context: AsyncContext, state: AgentState, turn: AgentTurnContext
) -> StepDecision | None:
    """The move to CompactContext when ``turn``'s input reached the trigger (or retention is
    over its limit) and a cutoff exists; ``None`` to call the model now."""
    if flow.options.compaction is None:
        return None
    settings, budgets = _settings(flow, turn.agent_config)
    summary = current_summary(context)
    input_tokens = _compacting_runner(flow).count_input_tokens(turn)
    over_tokens = input_tokens >= budgets.trigger
    reason = "context" if over_tokens else "retention"
    plan = _plan(
        flow,
        state,
        turn,
        summary,
        over_tokens=over_tokens,
        budgets=budgets,
        settings=settings,
        reason=reason,
    )
    if plan is not None:
        return go_to_many(compact_movement(plan, summary))
    _retain(context, state.message_count, settings.retention_limit)
    return None


def _retain(context: AsyncContext, message_count: int, retention_limit: int) -> None:
    """Stage retention's deletions of summarized messages past the newest ``retention_limit``
    (and the summary's new ``first_retained_sequence``) into this Step's commit."""
    summary = current_summary(context)
    kept_from = retained_from(message_count, retention_limit, summary)
    if delete_before(context, summary, kept_from):
        CONTEXT_SUMMARY.set(context, replace(summary, first_retained_sequence=kept_from))


def retain_newest(flow: SessionFlow, context: AsyncContext) -> None:
    """After RunModel stored a turn's messages: retention over the new message count."""
    state = AGENT_STATE.get(context)
    if flow.options.compaction is None or state is None:
        return
    config = AGENT_CONFIG.get(context)
    settings = flow.options.compaction.for_agent(config.agent_config if config else None)
    _retain(context, state.message_count, settings.retention_limit)


def compact_after_overflow(
    flow: SessionFlow, context: AsyncContext, state: AgentState, turn: AgentTurnContext
) -> StepDecision | None:
    """After a ``ContextWindowExceededError``: the move to CompactContext (then the same model
    call again), or ``None`` when this call was already retried or nothing can be summarized
    (the caller fails the turn, or the attempt when the runner's next one may fit)."""
    if flow.options.compaction is None:
        return None
    summary = current_summary(context)
    call = f"{turn.turn_id}:{len(turn.tool_calls)}"
    if summary.overflow_retry_of == call:
        return None
    settings, budgets = _settings(flow, turn.agent_config)
    plan = _plan(
        flow,
        state,
        turn,
        summary,
        over_tokens=True,
        budgets=budgets,
        settings=settings,
        reason="overflow",
        force=True,
        overflow_retry_of=call,
    )
    return None if plan is None else go_to_many(compact_movement(plan, summary))


# --- CompactContext ----------------------------------------------------------------------------

#: Per-attempt timeout, heartbeat timeout and retries of CompactContext (a model call, like
#: RunModel's).
COMPACT_CONTEXT_ATTEMPT_TIMEOUT = timedelta(minutes=15)
_COMPACT_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=3,
    total_duration=timedelta(minutes=30),
)


def compact_context_options(loads: Iterable[AttributeMapLoad] = ()) -> StepOptions:
    """CompactContext: SYNC, 15 minute attempts, 2 minute heartbeat timeout, 3 attempts in 30
    minutes, failure route RecordTurnFailure; ``loads`` are the chunk's messages."""

    return StepOptions(
        wait_for_durability=_SYNC,
        execute_durability=_SYNC,
        execute_method_timeout=COMPACT_CONTEXT_ATTEMPT_TIMEOUT,
        heartbeat_timeout=STEP_HEARTBEAT_TIMEOUT,
        execute_retry=_COMPACT_RETRY,
        execute_load_attribute_map_instances=tuple(loads),
    ).on_execute_failure_proceed_to(RecordTurnFailure, RECORD_TURN_FAILURE_OPTIONS)


def compact_movement(plan: CompactionPlan, summary: ContextSummary) -> StepMovement[CompactionPlan]:
    """A CompactContext movement loading the messages of ``plan``'s first chunk."""
    end = plan.chunk_ends[0]
    return StepMovement.of(
        CompactContext,
        plan,
        options=compact_context_options(message_loads(summary.through_sequence + 1, end)),
    )


class CompactContext(Step[CompactionPlan]):
    """Summarizes one chunk of ``CompactionPlan`` and commits it, with retention's deletions.

    Next: CompactContext for the plan's next chunk, else RunModel (loading the new tail). A
    Worker killed mid-Step reruns the chunk (nothing is committed before the summary); retries
    exhausted go to RecordTurnFailure, which leaves every message in place.
    """

    def __init__(self, flow: SessionFlow) -> None:
        self._flow = flow

    def get_step_options(self) -> StepOptions:
        return compact_context_options()

    async def execute(self, context: AsyncContext, input: CompactionPlan) -> StepDecision:  # type: ignore[override]

        flow = self._flow
        state = AGENT_STATE.get(context)
        if state is None or state.turn_id is None:
            return go_to(AwaitUserMessage, None)
        summary = current_summary(context)
        ends = [end for end in input.chunk_ends if end > summary.through_sequence]
        if not ends:
            return go_to_many(run_model_movement(flow, state.message_count, summary))
        plan = replace(input, chunk_ends=ends)
        end = min(ends[0], state.message_count)
        messages: list[AgentMessage] = []
        for sequence in range(summary.through_sequence + 1, end + 1):
            try:
                message = AGENT_MESSAGES.get(context, message_sequence_key(sequence))
            except AttributeMapNotLoadedError:
                return go_to_many(compact_movement(plan, summary))
            if message is not None:
                messages.append(message)
        config = session_config(context).agent_config
        settings, budgets = _settings(flow, config)
        request = SummarizeRequest(
            flow_id=context.flow_id,
            previous_summary=summary.text,
            messages=tuple(messages),
            agent_config=config,
            input_budget_tokens=budgets.summarizer_input,
            summary_budget_tokens=budgets.summary,
            attempt=context.attempt,
            heartbeat_callback=context.heartbeat,
        )
        events = AgentEventWriter(flow.agent_events, context, state.turn_id)
        try:
            events.write_event(
                AgentEventType.CONTEXT_COMPACTION_STARTED,
                {"through_sequence": end, "reason": plan.reason},
            )
            async with background_heartbeat(context):
                result = await _compacting_runner(flow).summarize(request)
            if isinstance(result, SummaryResult):
                text, usage = result.text, result.usage
            else:
                text, usage = result, None
            if not isinstance(text, str) or not text.strip():
                raise AgentContractError("summarize must return non-blank text")
            decision = self._commit(context, events, state, summary, plan, end, text, settings)
            if usage is not None:
                add_usage(context, events, usage)
                await observe(flow, context, status=None, turn_id=state.turn_id, usage=usage)
            return decision
        finally:
            events.close()

    def _commit(
        self,
        context: AsyncContext,
        events: AgentEventWriter,
        state: AgentState,
        summary: ContextSummary,
        plan: CompactionPlan,
        end: int,
        text: str,
        settings: CompactionOptions,
    ) -> StepDecision:
        """Stage the chunk's summary, retention's deletions and the event; the next move."""
        flow = self._flow
        ends = plan.chunk_ends
        # Retention: the newest retention_limit messages stay; only summarized ones go.
        covered = replace(summary, through_sequence=end)
        kept_from = retained_from(state.message_count, settings.retention_limit, covered)
        deleted = delete_before(context, summary, kept_from)
        last_chunk = len(ends) == 1
        committed = ContextSummary(
            generation=summary.generation + 1,
            through_sequence=end,
            text=text.strip(),
            first_retained_sequence=kept_from,
            overflow_retry_of=(
                plan.overflow_retry_of
                if last_chunk and plan.overflow_retry_of
                else summary.overflow_retry_of
            ),
        )
        CONTEXT_SUMMARY.set(context, committed)
        events.write_event(
            AgentEventType.CONTEXT_COMPACTED,
            {
                "through_sequence": end,
                "generation": committed.generation,
                "first_retained_sequence": kept_from,
                "deleted_count": deleted,
                "reason": plan.reason,
            },
        )
        if not last_chunk:
            return go_to_many(compact_movement(replace(plan, chunk_ends=ends[1:]), committed))
        return go_to_many(run_model_movement(flow, state.message_count, committed))


resolve_annotations(globals())
