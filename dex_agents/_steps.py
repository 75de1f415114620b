"""The turn loop of ``AgentSessionFlow``: the Steps that name one another (seed "Flow shape").

This module owns the Steps a turn goes round through, which name one another in their
decisions and so share one module: ``StartAgentSession``, ``AwaitUserMessage``, ``RunModel``,
``ResumeTurn``, ``RecordTurnFailure`` and ``CompactContext``, with their options and the
movements that reach them (``next_model_call``, ``run_model_movement``, ``compact_movement``).
Every Step sets ``wait_for`` and ``execute`` durability to SYNC explicitly. The Steps stay
thin: the work is in the modules below, which name none of these Steps and return what the
decision needs (``_turn_start``, ``_turn_endings``, ``_turn_interruptions``,
``_tool_deferral``, ``_model_context``, ``_step_base``); the tool, approval and built-in Steps
(``_tool_steps``, ``_approval_steps``, ``_builtin_steps``) sit below too. Only ``_flow``
imports this module.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import timedelta

from dex import (
    AsyncContext,
    AttributeMapLoad,
    RetryPolicy,
    Step,
    StepDecision,
    StepMovement,
    StepOptions,
    Wait,
    go_to,
    go_to_many,
    retry_after,
)

from dex_agents._compaction import ContextWindowExceededError, current_summary, message_loads
from dex_agents._contract import (
    AgentContractError,
    AgentTurnContext,
    ModelCallError,
    ModelRateLimitError,
    ToolCallsRequested,
    ToolPolicyResolver,
    TurnCompleted,
    require_user_message,
)
from dex_agents._elicitation import WITHDRAWN_TURN_CANCELLED
from dex_agents._events import AgentEventWriter
from dex_agents._model_context import (
    CompactionStart,
    compaction_after_overflow,
    compaction_before_model_call,
    load_model_context,
    loaded_messages,
    retain_newest,
    summarize_chunk,
)
from dex_agents._observer import TurnEnd
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    AGENT_CONFIG,
    AGENT_MESSAGES,
    AGENT_PLAN,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    ELICITATIONS,
    FRAMEWORK_RUN_STATE,
    PENDING_INTERRUPTS,
    PLAN_EXECUTIONS,
    QUEUED_USER_MESSAGES,
    STEERED_FOR_TURN,
    STEERED_USER_MESSAGES,
    TOOL_CALL_RESULTS,
    TURN_CANCELS,
    USER_INPUT_ANSWER,
)
from dex_agents._records import (
    AgentSessionConfig,
    AgentSessionStartInput,
    AgentState,
    AgentStatus,
    AgentUsage,
    AgentUserMessage,
    CompactionPlan,
    ContextSummary,
)
from dex_agents._step_base import (
    STEP_HEARTBEAT_TIMEOUT,
    SYNC,
    SessionStep,
    add_usage,
    background_heartbeat,
    load_tool_calls,
    observe,
    observed_messages,
    session_config,
    sync_options,
)
from dex_agents._subagent_steps import finish_movement, is_subagent_session
from dex_agents._tool_deferral import defer_tool_calls
from dex_agents._turn_cancel import ModelCallCancelled, unless_cancelled
from dex_agents._turn_endings import (
    abandoned_call_usage,
    ask_turn_guard,
    complete_turn,
    end_cancelled_turn,
    fail_turn_now,
    record_turn_failure,
    stop_turn,
)
from dex_agents._turn_interruptions import (
    CANCELLED_TURN_MESSAGE,
    cancel_pending,
    steered_condition,
    take_steered,
    withdraw_turn_waits,
)
from dex_agents._turn_start import start_plan_turn, start_turn

# --- options and movements --------------------------------------------------------------------

#: Per-attempt timeout of RunModel (seed "run_model_step": "Each attempt has a 15 minute timeout").
RUN_MODEL_ATTEMPT_TIMEOUT = timedelta(minutes=15)

RECORD_TURN_FAILURE_OPTIONS = sync_options(execute_load_attribute_maps=(AGENT_TOOL_CALLS,))
RUN_MODEL_OPTIONS = sync_options(
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
RESUME_TURN_OPTIONS = sync_options(execute_load_attribute_maps=(AGENT_TOOL_CALLS,))
#: ResumeTurn's movements: for a steered message or a cancelled turn it may withdraw approvals
#: and MCP elicitations, so it locks PendingInterrupts and Elicitations.
STEERING_RESUME_TURN_OPTIONS = sync_options(
    execute_load_attribute_maps=(AGENT_TOOL_CALLS,),
    execute_lock_attributes=(PENDING_INTERRUPTS.lock(), ELICITATIONS.lock()),
)

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


def _resume_movement(flow: SessionFlow, count: int) -> StepMovement[int]:
    # Every session can cancel a turn (platform addition, cancel_turn), which withdraws
    # approvals and questions from ResumeTurn as a steered message does.
    return StepMovement.of(ResumeTurn, count, options=STEERING_RESUME_TURN_OPTIONS)


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


def compact_context_options(loads: Iterable[AttributeMapLoad] = ()) -> StepOptions:
    """CompactContext: SYNC, 15 minute attempts, 2 minute heartbeat timeout, 3 attempts in 30
    minutes, failure route RecordTurnFailure; ``loads`` are the chunk's messages."""

    return StepOptions(
        wait_for_durability=SYNC,
        execute_durability=SYNC,
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


def _compact_first(start: CompactionStart) -> StepDecision:
    return go_to_many(compact_movement(start.plan, start.summary))


# --- Steps ------------------------------------------------------------------------------------


class StartAgentSession(SessionStep, Step[AgentSessionStartInput]):
    """Start Step: initializes state, usage, interrupts and the agent config.

    Next: RunModel for a non-blank ``initial_message``, else AwaitUserMessage.
    """

    def get_step_options(self) -> StepOptions:
        return sync_options()

    async def execute(self, context: AsyncContext, input: AgentSessionStartInput) -> StepDecision:  # type: ignore[override]
        AGENT_USAGE.set(context, AgentUsage())
        PENDING_INTERRUPTS.set(context, [])
        AGENT_CONFIG.set(
            context,
            AgentSessionConfig(
                agent_config=input.agent_config,
                tool_policies=dict(input.tool_policies),
                subagent_of=input.subagent_of,
            ),
        )
        state = AgentState(status=AgentStatus.WAITING_FOR_USER_MESSAGE)
        if input.initial_message.strip():
            await start_turn(
                self._flow,
                context,
                state,
                input.initial_message,
                plan_mode=input.initial_plan_mode,
            )
            return next_model_call(self._flow, context)
        AGENT_STATE.set(context, state)
        await observe(self._flow, context, status=state.status, turn_id=None)
        return go_to(AwaitUserMessage, None)


class AwaitUserMessage(SessionStep, Step[None]):
    """Waits for ``QUEUED_USER_MESSAGES.for_one()``, stores the message, starts the turn."""

    def get_step_options(self) -> StepOptions:
        return sync_options()

    async def wait_for(self, context: AsyncContext, input: None) -> Wait:  # type: ignore[override]
        options = self._flow.options
        if options.subagents is not None and is_subagent_session(context):
            return Wait.skip_immediately()  # a child's first turn ended: it finishes
        if not (options.steering or options.plans):
            return Wait.until(QUEUED_USER_MESSAGES.for_one())
        # Steered messages first (one that arrives between turns is simply the next turn),
        # then queued ones, then a plan execution.
        conditions = [steered_condition()] if options.steering else []
        conditions.append(QUEUED_USER_MESSAGES.for_one())
        if options.plans:
            conditions.append(PLAN_EXECUTIONS.for_one())
        return Wait.any_of(*conditions)

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        if self._flow.options.subagents is not None and is_subagent_session(context):
            # Platform addition (subagents): a child session answers one task.
            return go_to_many(finish_movement(context))
        state = AGENT_STATE.get(context) or AgentState(AgentStatus.WAITING_FOR_USER_MESSAGE)
        if self._flow.options.steering:
            steered = [m for m in STEERED_USER_MESSAGES.results(context) if m.text.strip()]
            if steered:
                # The first starts the turn; the rest reach its first model call after it.
                if len(steered) > 1:
                    STEERED_FOR_TURN.set(context, steered[1:])
                first = steered[0]
                await start_turn(
                    self._flow, context, state, first.text, plan_mode=first.plan_mode,
                    client_ids=[message.client_id for message in steered],
                    created_at=first.created_at,
                )
                return next_model_call(self._flow, context)
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
                await start_plan_turn(self._flow, context, state, plan)
                return next_model_call(self._flow, context)
        messages = QUEUED_USER_MESSAGES.results(context)
        if not messages or not messages[0].text.strip():
            return go_to(AwaitUserMessage, None)
        await start_turn(
            self._flow, context, state, messages[0].text, plan_mode=messages[0].plan_mode,
            client_ids=[messages[0].client_id], created_at=messages[0].created_at,
        )
        return next_model_call(self._flow, context)


class RunModel(SessionStep, Step[None]):
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
            await end_cancelled_turn(flow, context, state, partial_text="")
            return go_to(AwaitUserMessage, None)
        if flow.options.steering and STEERED_USER_MESSAGES.size(context) > 0:
            # A safe boundary before the model call: ResumeTurn takes the steered messages
            # (durably) and comes straight back here.
            return go_to_many(_resume_movement(flow, 0))
        answer = USER_INPUT_ANSWER.get(context) if flow.options.user_input else None
        steered: list[AgentUserMessage] = [answer] if answer is not None else []
        if flow.options.steering:
            steered.extend(STEERED_FOR_TURN.get(context) or [])
        loaded = load_model_context(flow, context, state)  # compaction: the tail only
        if loaded is None:
            # This movement lacks the tail's loads: RunModel again, with them.
            return go_to_many(
                run_model_movement(flow, state.message_count, current_summary(context))
            )
        recorded = load_tool_calls(context)
        config = session_config(context)
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
            compaction = compaction_before_model_call(flow, context, state, turn)
            if compaction is not None:
                return _compact_first(compaction)
            try:
                async with background_heartbeat(context):
                    # cancel_turn wakes the call it finds here (platform addition,
                    # dex_agents._turn_cancel); nothing awaits before it is registered.
                    with flow.model_calls.running(context.flow_id, turn_id) as cancelled:
                        outcome = await unless_cancelled(
                            flow.runner.run_model_step(turn), cancelled
                        )
            except ContextWindowExceededError as overflow:
                compaction = compaction_after_overflow(flow, context, state, turn)
                if compaction is not None:
                    return _compact_first(compaction)
                if overflow.retry_may_fit:
                    raise  # the next attempt builds its input for the window the refusal named
                # Too long even after this call's compaction (or without compaction): the same
                # input would be refused again.
                fail_turn_now(context, state, str(overflow) or "the input is longer"
                              " than the model's context window")
                return go_to(RecordTurnFailure, None)
            except ModelCallError as refused:
                fail_turn_now(context, state, refused.message)
                return go_to(RecordTurnFailure, None)
            except ModelRateLimitError as limited:
                # Raised here, outside the context managers: the SDK's RetryAfterError is a
                # frozen dataclass, which contextlib's re-raise cannot give a traceback.
                raise retry_after(limited.retry_after_seconds, limited) from None
            if isinstance(outcome, ModelCallCancelled):
                usage = abandoned_call_usage(flow, turn, events.streamed_text)
                if usage is not None:
                    add_usage(context, events, usage)
                await end_cancelled_turn(
                    flow, context, state, partial_text=events.streamed_text, usage=usage
                )
                return go_to(AwaitUserMessage, None)
            if isinstance(outcome, ToolCallsRequested) and flow.options.turn_guard is not None:
                reason = await ask_turn_guard(flow, context, turn_id, config, outcome)
                if reason:
                    await stop_turn(flow, context, events, state, recorded, outcome, reason)
                    return go_to(AwaitUserMessage, None)
            if steered and isinstance(outcome, TurnCompleted | ToolCallsRequested):
                if answer is not None:
                    USER_INPUT_ANSWER.delete(context)
                if STEERED_FOR_TURN.get(context):
                    STEERED_FOR_TURN.delete(context)
            if isinstance(outcome, TurnCompleted):
                complete_turn(context, events, state, recorded, outcome)
                retain_newest(flow, context)  # compaction: retention after the new messages
                await observe(
                    flow,
                    context,
                    status=AgentStatus.WAITING_FOR_USER_MESSAGE,
                    turn_id=turn_id,
                    usage=outcome.usage,
                    turn_ended=TurnEnd.COMPLETED,
                    messages=observed_messages(
                        [
                            (state.message_count + number, str(message.role), message.text)
                            for number, message in enumerate(outcome.new_messages, start=1)
                        ]
                    ),
                )
                return go_to(AwaitUserMessage, None)
            if isinstance(outcome, ToolCallsRequested):
                movements, raised, status = defer_tool_calls(
                    flow, context, events, state, recorded, outcome
                )
                movements.append(_resume_movement(flow, len(outcome.tool_calls)))
                await observe(
                    flow,
                    context,
                    status=status,
                    turn_id=turn_id,
                    raised=raised,
                    usage=outcome.usage,
                )
                return go_to_many(*movements)
            raise AgentContractError(
                "run_model_step must return TurnCompleted or ToolCallsRequested"
            )
        finally:
            events.close()


class ResumeTurn(SessionStep, Step[int]):
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
        conditions = [steered_condition()] if self._flow.options.steering else []
        if state is not None and state.turn_id is not None:
            conditions.append(TURN_CANCELS.for_one(state.turn_id))
        conditions.append(TOOL_CALL_RESULTS.for_n(input))
        return Wait.any_of(*conditions) if len(conditions) > 1 else Wait.until(conditions[0])

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        flow = self._flow
        state = AGENT_STATE.get(context)
        turn_id = state.turn_id if state is not None else None
        cancelled = turn_id is not None and bool(TURN_CANCELS.results(context, turn_id))
        if cancelled:
            await withdraw_turn_waits(
                flow, context, turn_id, WITHDRAWN_TURN_CANCELLED, CANCELLED_TURN_MESSAGE
            )
        if flow.options.steering or cancelled:
            steered = (
                list(STEERED_USER_MESSAGES.results(context)) if flow.options.steering else []
            )
            if steered:
                await take_steered(flow, context, state, steered)
            remaining = input - len(TOOL_CALL_RESULTS.results(context))
            if remaining > 0:
                return go_to_many(_resume_movement(flow, remaining))
        open_records = [
            record for record in load_tool_calls(context).values() if not record.status.is_final
        ]
        if open_records:
            return go_to_many(_resume_movement(flow, len(open_records)))
        if state is not None and cancel_pending(context, turn_id):
            # Every call has its result: the cancelled turn ends instead of calling the model.
            await end_cancelled_turn(flow, context, state, partial_text="")
            return go_to(AwaitUserMessage, None)
        if state is not None:
            AGENT_STATE.set(context, replace(state, status=AgentStatus.RUNNING_MODEL))
            await observe(flow, context, status=AgentStatus.RUNNING_MODEL, turn_id=state.turn_id)
        return next_model_call(flow, context)


class RecordTurnFailure(SessionStep, Step[None]):
    """Failure route of RunModel: records ``last_turn_error``, appends the turn-failure note when
    the turn has final tool call records, and clears the turn's records and run state."""

    def get_step_options(self) -> StepOptions:
        return RECORD_TURN_FAILURE_OPTIONS

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:  # type: ignore[override]
        await record_turn_failure(self._flow, context)
        return go_to(AwaitUserMessage, None)


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
        messages = loaded_messages(context, summary.through_sequence + 1, end)
        if messages is None:
            return go_to_many(compact_movement(plan, summary))
        committed = await summarize_chunk(flow, context, state, summary, plan, end, messages)
        if len(ends) > 1:
            return go_to_many(compact_movement(replace(plan, chunk_ends=ends[1:]), committed))
        return go_to_many(run_model_movement(flow, state.message_count, committed))
