"""The Steps that run a tool call and their failure routes (seed "Effects and policies").

This module owns a tool call record from the moment its Step starts to the moment it is final:
``CallTool`` (read, idempotent_write: retried) and ``CallSingleAttemptTool``
(non_idempotent_write, unclassified: one attempt), their failure routes
``RecordToolFailure`` and ``RecordToolOutcomeUnknown``, the options and movements that start
them with the limits the call's policy set, and how any Step makes a record final and
publishes its one ``TOOL_CALL_RESULTS`` message (``publish_final``, ``finish_tool_call``).
These Steps name only one another; the module imports ``_step_base`` and
``_turn_interruptions`` below it, and the approval, built-in and turn-loop Steps import it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from dex import (
    AsyncContext,
    RetryPolicy,
    Step,
    StepDecision,
    StepMovement,
    StepOptions,
    dead_end,
)

from dex_agents._builtin_tools import (
    DURABLE_WAIT_TOOL,
    REQUEST_USER_INPUT_TOOL,
    WAIT_CANCELLED_OUTPUT,
    WAIT_INTERRUPTED_OUTPUT,
)
from dex_agents._contract import (
    AgentContractError,
    DeferredToolExecution,
    ToolExecutionError,
    ToolExecutionResult,
)
from dex_agents._elicitation import WITHDRAWN_CALL_ENDED, withdraw_questions
from dex_agents._events import AgentEventWriter
from dex_agents._options import SessionFlow
from dex_agents._persistence import AGENT_TOOL_CALLS, ELICITATIONS, TOOL_CALL_RESULTS
from dex_agents._records import (
    AgentToolCall,
    ToolCallCompleted,
    ToolCallStatus,
    ToolEffect,
    idempotency_key,
)
from dex_agents._step_base import (
    STEP_HEARTBEAT_TIMEOUT,
    SessionStep,
    background_heartbeat,
    record_load,
    recovery_detail,
    session_config,
    sync_options,
)
from dex_agents._text_parts import store_text_parts, tool_output_key
from dex_agents._turn_interruptions import cancelled_output, stop_pending

_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
_SINGLE_ATTEMPT = RetryPolicy(maximum_attempts=1)


def _tool_step_options(
    effect: ToolEffect,
    *,
    retries: int | None = None,
    timeout_seconds: float | None = None,
    **loads: Any,
) -> StepOptions:
    # The failure routes withdraw the call's pending MCP elicitations (platform addition).
    failure_options = sync_options(execute_lock_attributes=(ELICITATIONS.lock(),), **loads)
    route: type[Step[str]]
    if effect.retries:
        retry = _TOOL_RETRY
        if retries is not None:
            retry = replace(_TOOL_RETRY, maximum_attempts=retries + 1)
        route = RecordToolFailure
    else:
        retry, route = _SINGLE_ATTEMPT, RecordToolOutcomeUnknown
    timeout = None if timeout_seconds is None else timedelta(seconds=math.ceil(timeout_seconds))
    return sync_options(
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
        effect, retries=retries, timeout_seconds=timeout_seconds, **record_load(tool_call_id)
    )


def _tool_step(effect: ToolEffect) -> type[Step[str]]:
    return CallTool if effect.retries else CallSingleAttemptTool


def tool_movement(record: AgentToolCall) -> StepMovement[str]:
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


def open_record(context: AsyncContext, tool_call_id: str) -> AgentToolCall | None:
    """The Step's own record, or ``None`` when it is missing or already final."""
    record = AGENT_TOOL_CALLS.get(context, tool_call_id)
    if record is None or record.status.is_final:
        return None
    return record


def publish_final(context: AsyncContext, events: AgentEventWriter, record: AgentToolCall) -> None:
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


def finish_tool_call(
    context: AsyncContext, events: AgentEventWriter, record: AgentToolCall
) -> StepDecision:
    """Store a final record, publish its one ToolCallResults message, and end the path."""
    publish_final(context, events, record)
    return dead_end()


async def _run_tool(
    flow: SessionFlow, context: AsyncContext, tool_call_id: str
) -> StepDecision:
    record = open_record(context, tool_call_id)
    if record is None:
        return dead_end()
    events = AgentEventWriter(flow.agent_events, context, record.turn_id)
    try:
        if context.attempt == 1 and stop_pending(flow, context, record.turn_id):
            # A safe boundary (platform additions, Steer and cancel_turn): the call has not
            # started, so it ends with a structured cancelled result instead of running.
            cancelled = replace(
                record,
                status=ToolCallStatus.CANCELLED,
                output=cancelled_output(context, record.turn_id),
            )
            return finish_tool_call(context, events, cancelled)
        events.write_tool_call_started(record.tool_call_id, record.tool_name)
        await context.heartbeat()
        call = DeferredToolExecution(
            flow_id=context.flow_id,
            tool_call=record,
            idempotency_key=idempotency_key(context.flow_id, record),
            attempt=context.attempt,
            events=events,
            heartbeat_callback=context.heartbeat,
            agent_config=session_config(context).agent_config,
        )
        try:
            async with background_heartbeat(context):
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
        return finish_tool_call(context, events, final)
    finally:
        events.close()


class CallTool(SessionStep, Step[str]):
    """Runs one read or idempotent_write call: 3 attempts (``ToolPolicy.retries`` + 1 when
    set), failure route RecordToolFailure."""

    def get_step_options(self) -> StepOptions:
        """SYNC, 2 minute heartbeat timeout, 3 attempts, failure route RecordToolFailure;
        movements (``tool_options``) add the call's own record load and its policy's limits."""
        return _tool_step_options(ToolEffect.READ)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return await _run_tool(self._flow, context, input)


class CallSingleAttemptTool(SessionStep, Step[str]):
    """Runs one non_idempotent_write or unclassified call: 1 attempt, failure route
    RecordToolOutcomeUnknown."""

    def get_step_options(self) -> StepOptions:
        """SYNC, 2 minute heartbeat timeout, 1 attempt, failure route RecordToolOutcomeUnknown;
        movements (``tool_options``) add the call's own record load."""
        return _tool_step_options(ToolEffect.UNCLASSIFIED)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        return await _run_tool(self._flow, context, input)


class RecordToolFailure(SessionStep, Step[str]):
    """Failure route of CallTool: ``failed`` for a read, ``outcome_unknown`` for a write."""

    def get_step_options(self) -> StepOptions:
        return sync_options()

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


class RecordToolOutcomeUnknown(SessionStep, Step[str]):
    """Failure route of CallSingleAttemptTool: ``outcome_unknown`` with the recovery detail."""

    def get_step_options(self) -> StepOptions:
        return sync_options()

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
    record = open_record(context, tool_call_id)
    if record is None:
        return dead_end()
    withdraw_questions(
        context,
        lambda item: item.turn_id == record.turn_id and item.tool_call_id == tool_call_id,
        WITHDRAWN_CALL_ENDED,
    )
    events = AgentEventWriter(flow.agent_events, context, record.turn_id)
    try:
        final = replace(record, status=status_for(record), error=recovery_detail(context))
        return finish_tool_call(context, events, final)
    finally:
        events.close()
