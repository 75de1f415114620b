"""The Steps of subagents (platform addition, issue 29; ``dex_agents._subagents``).

``CallSubagent`` runs one ``agent__<slug>`` call of the parent session: its ``wait_for`` asks
the application's ``SubagentDirectory`` for the child's start input and waits on a Dex
sub-flow of the same Flow type (Dex spec section 2.11), which the engine starts exactly once
when that ``wait_for`` commits, with the deterministic ID
``SubFlow:<parent>-<step execution ID>-0``; its ``execute`` turns the child's ``FlowResult``
into the call's final record. While it waits, a steered message or a cancelled turn wakes it
(``BUILTIN_WAKEUPS``, as a durable wait) and it stops the child through the directory.

``FinishSubagentSession`` is the child's last Step: after its first turn the child's
``AwaitUserMessage`` moves here instead of waiting, and it completes the Flow with a
``SubagentResult``. This module also holds the deferral's side (``subagent_refusal``: the
depth and per-turn limits, the arguments). It names no turn-loop Step; it imports
``_step_base``, ``_tool_steps`` and ``_turn_interruptions`` below it, and ``_tool_deferral``
and ``_steps`` import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from dex import (
    AsyncContext,
    FlowStatus,
    Step,
    StepDecision,
    StepMovement,
    StepOptions,
    SubFlow,
    SubFlowOptions,
    SubFlowReusePolicy,
    Wait,
    dead_end,
    force_complete,
)

from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    AGENT_MESSAGES,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    BUILTIN_WAKEUPS,
)
from dex_agents._records import (
    AgentMessage,
    AgentState,
    AgentToolCall,
    MessageNotice,
    MessageRole,
    SubagentLink,
    ToolCallStatus,
    message_sequence_key,
)
from dex_agents._step_base import (
    SessionStep,
    interrupt_id_for,
    record_load,
    session_config,
    sync_options,
)
from dex_agents._subagents import (
    ANSWER_MAX_CHARS,
    SubagentArgumentError,
    SubagentOutcome,
    SubagentRefusedError,
    SubagentRequest,
    SubagentResult,
    children_limit_error,
    depth_limit_error,
    parse_subagent_arguments,
)
from dex_agents._tool_steps import finish_tool_call, open_record, publish_final
from dex_agents._turn_interruptions import cancelled_output, stop_pending

#: The reason a parent gives the directory when it stops a child.
CHILD_CANCELLED_REASON = "the parent's turn was cancelled or steered"
#: The tool error of a child that ended without a result the parent can read.
CHILD_LOST_ERROR = "the agent's session ended without an answer"


def is_subagent_call(flow: SessionFlow, context: AsyncContext, tool_name: str) -> bool:
    """Whether the session runs ``tool_name`` as a subagent (``AgentSessionOptions.subagents``
    and its directory names the tool for this session's agent config)."""
    options = flow.options.subagents
    if options is None:
        return False
    return options.directory.is_subagent_tool(session_config(context).agent_config, tool_name)


def session_depth(context: AsyncContext) -> int:
    """This session's depth: 0 for a top-level session, ``subagent_of.depth`` for a child."""
    link = session_config(context).subagent_of
    return link.depth if link is not None else 0


def subagent_refusal(
    flow: SessionFlow, context: AsyncContext, arguments: str, started_in_turn: int
) -> str | None:
    """Why a subagent call must not start, as the model reads it, or ``None``: the session
    is at ``max_depth``, the turn already deferred ``max_children_per_turn`` subagent calls
    (``started_in_turn``), or the arguments are unusable."""
    options = flow.options.subagents
    assert options is not None
    if session_depth(context) >= options.max_depth:
        return depth_limit_error(options.max_depth)
    if started_in_turn >= options.max_children_per_turn:
        return children_limit_error(options.max_children_per_turn)
    try:
        parse_subagent_arguments(arguments)
    except SubagentArgumentError as error:
        return str(error)
    return None


def subagent_calls_in(records: Iterable[AgentToolCall]) -> int:
    """How many of ``records`` are subagent calls that were deferred to run."""
    return sum(1 for record in records if record.subagent and record.error is None)


def subagent_movement(tool_call_id: str) -> StepMovement[str]:
    """The ``CallSubagent`` movement of a call: its own record loaded."""
    return StepMovement.of(
        CallSubagent, tool_call_id, options=sync_options(**record_load(tool_call_id))
    )


def _child_id(context: AsyncContext) -> str:
    # Dex spec section 2.11: the engine names the child after the waiting Step execution;
    # it is known before the wait commits, and the same on every attempt of this execution.
    return f"SubFlow:{context.flow_id}-{context.step_execution_id}-0"


class CallSubagent(SessionStep, Step[str]):
    """Runs one subagent call (platform addition): starts the child session as a Dex sub-flow
    and waits for its ``SubagentResult``.

    ``wait_for``: asks ``SubagentDirectory.child_start`` (idempotent; it may run again on a
    retried attempt before the commit), stores the child's ID in the record, writes
    ``subagent_started``, and waits for the sub-flow or a wake-up of the turn. A refusal
    makes the call ``failed`` at once. ``execute``: the child's answer makes the call
    ``succeeded``; a failed child or one without an answer ``failed`` with the reason (a tool
    error the model reads); a wake-up before the child ended stops the child and makes the call
    ``cancelled``. Every path writes ``subagent_finished`` and publishes the call's one result.
    """

    def get_step_options(self) -> StepOptions:
        return sync_options()

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        flow = self._flow
        record = open_record(context, input)
        options = flow.options.subagents
        if record is None or options is None or stop_pending(flow, context, record.turn_id):
            return Wait.skip_immediately()
        child_id = _child_id(context)
        config = session_config(context)
        depth = session_depth(context) + 1
        events = AgentEventWriter(flow.agent_events, context, record.turn_id)
        try:
            try:
                task = parse_subagent_arguments(record.arguments)
                start = await options.directory.child_start(
                    SubagentRequest(
                        parent_session_id=context.flow_id,
                        child_session_id=child_id,
                        tool_call_id=record.tool_call_id,
                        turn_id=record.turn_id,
                        tool_name=record.tool_name,
                        task=task,
                        agent_config=config.agent_config,
                        depth=depth,
                    )
                )
            except (SubagentArgumentError, SubagentRefusedError) as error:
                message = error.message if isinstance(error, SubagentRefusedError) else str(error)
                publish_final(
                    context, events, replace(record, status=ToolCallStatus.FAILED, error=message)
                )
                return Wait.skip_immediately()
            start = replace(
                start,
                initial_message=task.message(),
                initial_plan_mode=False,
                subagent_of=SubagentLink(context.flow_id, record.tool_call_id, depth),
            )
            AGENT_TOOL_CALLS.set(
                context, record.tool_call_id, replace(record, child_session_id=child_id)
            )
            events.write_tool_call_started(record.tool_call_id, record.tool_name)
            events.write_event(
                AgentEventType.SUBAGENT_STARTED,
                {
                    "tool_call_id": record.tool_call_id,
                    "tool_name": record.tool_name,
                    "child_session_id": child_id,
                    "depth": depth,
                },
            )
        finally:
            events.close()
        target: Any = flow
        return Wait.any_of(
            BUILTIN_WAKEUPS.for_one(interrupt_id_for(record)),
            SubFlow.run(
                target, start, SubFlowOptions(reuse_policy=SubFlowReusePolicy.ATTACH)
            ),
        )

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        flow = self._flow
        record = open_record(context, input)
        if record is None:
            return dead_end()
        options = flow.options.subagents
        try:
            result = SubFlow.get_condition_results(context, 0)
        except ValueError:
            result = None  # the wait was skipped: the child never started
        child_id = record.child_session_id
        events = AgentEventWriter(flow.agent_events, context, record.turn_id)
        try:
            outcome: SubagentResult | None = None
            if result is not None and result.is_terminal:
                outcome = _child_outcome(result)
                final = _final_record(record, outcome)
            else:
                if child_id is not None and options is not None:
                    await options.directory.child_cancel(child_id, CHILD_CANCELLED_REASON)
                final = replace(
                    record,
                    status=ToolCallStatus.CANCELLED,
                    output=cancelled_output(context, record.turn_id),
                )
                outcome = SubagentResult(SubagentOutcome.CANCELLED)
            if child_id is not None and options is not None:
                await options.directory.child_finished(child_id, outcome)
            if child_id is not None:
                events.write_event(
                    AgentEventType.SUBAGENT_FINISHED,
                    {
                        "tool_call_id": record.tool_call_id,
                        "tool_name": record.tool_name,
                        "child_session_id": child_id,
                        "outcome": str(outcome.outcome),
                    },
                )
            return finish_tool_call(context, events, final)
        finally:
            events.close()


def _child_outcome(result: Any) -> SubagentResult:
    if result.status is FlowStatus.COMPLETED:
        try:
            return result.single_output(SubagentResult)
        except ValueError:
            return SubagentResult(SubagentOutcome.FAILED, error=CHILD_LOST_ERROR)
    if result.status in (FlowStatus.CANCELED, FlowStatus.TERMINATED):
        return SubagentResult(SubagentOutcome.CANCELLED, error="the agent's session was stopped")
    detail = result.error_message or CHILD_LOST_ERROR
    return SubagentResult(SubagentOutcome.FAILED, error=detail)


def _final_record(record: AgentToolCall, outcome: SubagentResult) -> AgentToolCall:
    if outcome.outcome is SubagentOutcome.COMPLETED:
        return replace(record, status=ToolCallStatus.SUCCEEDED, output=outcome.answer)
    if outcome.outcome is SubagentOutcome.CANCELLED:
        return replace(
            record,
            status=ToolCallStatus.FAILED,
            error=f"the agent's turn was cancelled before it answered: {outcome.error}".rstrip(
                ": "
            ),
        )
    return replace(
        record,
        status=ToolCallStatus.FAILED,
        error=f"the agent failed: {outcome.error or CHILD_LOST_ERROR}",
    )


# --- the child's side --------------------------------------------------------------------------


def is_subagent_session(context: AsyncContext) -> bool:
    """Whether this session is a child (``AgentSessionStartInput.subagent_of``)."""
    return session_config(context).subagent_of is not None


def finish_movement(context: AsyncContext) -> StepMovement[None]:
    """The child's ``FinishSubagentSession`` movement, loading its newest message."""
    state = AGENT_STATE.get(context)
    loads: tuple[Any, ...] = ()
    if state is not None and state.message_count > 0:
        loads = (AGENT_MESSAGES.load(message_sequence_key(state.message_count)),)
    return StepMovement.of(
        FinishSubagentSession,
        None,
        options=sync_options(execute_load_attribute_map_instances=loads),
    )


def subagent_result(state: AgentState | None, last: AgentMessage | None) -> SubagentResult:
    """The child's ``SubagentResult`` from its state after the first turn and its newest
    message: failed with ``last_turn_error``; cancelled when the turn was cancelled (a
    cancelled turn's note, an interrupted answer) or stored no answer; else completed with
    the answer."""
    if state is not None and state.last_turn_error:
        return SubagentResult(SubagentOutcome.FAILED, error=state.last_turn_error)
    if last is None or last.notice is MessageNotice.TURN_CANCELLED or last.interrupted:
        return SubagentResult(SubagentOutcome.CANCELLED, error="the agent's turn was cancelled")
    if last.role != MessageRole.ASSISTANT:
        return SubagentResult(SubagentOutcome.FAILED, error=CHILD_LOST_ERROR)
    return SubagentResult(SubagentOutcome.COMPLETED, answer=last.text[:ANSWER_MAX_CHARS])


class FinishSubagentSession(SessionStep, Step[None]):
    """The child session's last Step (platform addition): completes its Flow with the
    ``SubagentResult`` of its first turn, which Dex delivers to the parent's
    ``CallSubagent``."""

    def get_step_options(self) -> StepOptions:
        return sync_options()

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        state = AGENT_STATE.get(context)
        last = None
        if state is not None and state.message_count > 0:
            last = AGENT_MESSAGES.get(context, message_sequence_key(state.message_count))
        return force_complete(subagent_result(state, last))
