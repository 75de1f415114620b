"""What one model call sees, and context compaction's work inside the Steps.

This module owns RunModel's side of ``AgentSessionOptions.compaction`` (platform addition) and
CompactContext's work, without the moves between them: the messages a model call gets (the
whole map, or the summary and the unsummarized tail), whether a compaction must run first (the
input reached the trigger, retention is over its limit, or the provider refused the input as
too long) and with which plan, retention's deletions, and the summarizing and committing of
one chunk. ``dex_agents._compaction`` keeps the plans' arithmetic, the summaries and the
reads; the turn-loop Steps (``_steps``) turn what this module returns into movements. It names
no Step: it imports ``_step_base`` and ``_compaction`` below it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from dex import AsyncContext, AttributeMapNotLoadedError

from dex_agents._compaction import (
    CompactingRunner,
    CompactionBudgets,
    CompactionOptions,
    SummarizeRequest,
    SummaryResult,
    choose_cutoff,
    current_summary,
    delete_before,
    plan_chunks,
    retained_from,
)
from dex_agents._contract import AgentContractError, AgentTurnContext
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._options import SessionFlow
from dex_agents._persistence import AGENT_CONFIG, AGENT_MESSAGES, AGENT_STATE, CONTEXT_SUMMARY
from dex_agents._records import (
    AgentMessage,
    AgentState,
    CompactionPlan,
    ContextSummary,
    message_sequence_key,
)
from dex_agents._step_base import add_usage, background_heartbeat, observe, session_config
from dex_agents._wire_types import resolve_annotations


@dataclass(frozen=True)
class ModelContext:
    """What RunModel hands the runner: the messages and the summary before them."""

    messages: tuple[AgentMessage, ...]
    summary: ContextSummary | None


@dataclass(frozen=True)
class CompactionStart:
    """A compaction to run before the model call: the ``plan`` for CompactContext and the
    ``summary`` it starts from (its movement loads the first chunk's messages after it)."""

    plan: CompactionPlan
    summary: ContextSummary


def loaded_messages(
    context: AsyncContext, first: int, last: int
) -> list[AgentMessage] | None:
    """The stored messages ``first..last`` (a deleted one is skipped), or ``None`` when this
    Step did not load one of them."""
    messages: list[AgentMessage] = []
    for sequence in range(first, last + 1):
        try:
            message = AGENT_MESSAGES.get(context, message_sequence_key(sequence))
        except AttributeMapNotLoadedError:
            return None
        if message is not None:
            messages.append(message)
    return messages


def load_model_context(
    flow: SessionFlow, context: AsyncContext, state: AgentState
) -> ModelContext | None:
    """RunModel's messages: the whole map without compaction; with it the unsummarized tail,
    or ``None`` when this movement lacks the tail's loads (the caller moves to RunModel with
    them)."""
    if flow.options.compaction is None:
        return ModelContext(
            messages=tuple(
                AGENT_MESSAGES.get(context, key)
                for key in AGENT_MESSAGES.get_all_instance_keys(context)
            ),
            summary=None,
        )
    summary = current_summary(context)
    messages = loaded_messages(context, summary.through_sequence + 1, state.message_count)
    if messages is None:
        return None
    return ModelContext(
        messages=tuple(messages), summary=summary if summary.generation > 0 else None
    )


def compacting_runner(flow: SessionFlow) -> CompactingRunner:
    """The Flow's runner as a ``CompactingRunner``.

    Raises:
        AgentContractError: The runner does not implement ``CompactingRunner``.
    """
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
    runner = compacting_runner(flow)
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
    window = compacting_runner(flow).context_window(agent_config)
    return settings, CompactionBudgets.of(window or settings.default_context_window, settings)


def compaction_before_model_call(
    flow: SessionFlow, context: AsyncContext, state: AgentState, turn: AgentTurnContext
) -> CompactionStart | None:
    """The compaction to run before ``turn``'s model call when its input reached the trigger
    (or retention is over its limit) and a cutoff exists; ``None`` to call the model now
    (retention's deletions are then staged into this Step's commit)."""
    if flow.options.compaction is None:
        return None
    settings, budgets = _settings(flow, turn.agent_config)
    summary = current_summary(context)
    input_tokens = compacting_runner(flow).count_input_tokens(turn)
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
        return CompactionStart(plan, summary)
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


def compaction_after_overflow(
    flow: SessionFlow, context: AsyncContext, state: AgentState, turn: AgentTurnContext
) -> CompactionStart | None:
    """After a ``ContextWindowExceededError``: the compaction to run (then the same model call
    again), or ``None`` when this call was already retried or nothing can be summarized (the
    caller fails the turn, or the attempt when the runner's next one may fit)."""
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
    return None if plan is None else CompactionStart(plan, summary)


async def summarize_chunk(
    flow: SessionFlow,
    context: AsyncContext,
    state: AgentState,
    summary: ContextSummary,
    plan: CompactionPlan,
    end: int,
    messages: list[AgentMessage],
) -> ContextSummary:
    """CompactContext's work for the chunk of ``plan`` that ends at ``end`` (``messages``):
    summarize it with the runner, then stage the new summary, retention's deletions, the
    events and the summarizer's usage into this Step's commit. Returns the committed summary.

    Raises:
        AgentContractError: ``summarize`` returned blank text, or a bad usage.
    """
    assert state.turn_id is not None
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
            result = await compacting_runner(flow).summarize(request)
        if isinstance(result, SummaryResult):
            text, usage = result.text, result.usage
        else:
            text, usage = result, None
        if not isinstance(text, str) or not text.strip():
            raise AgentContractError("summarize must return non-blank text")
        committed = _commit_chunk(context, events, state, summary, plan, end, text, settings)
        if usage is not None:
            add_usage(context, events, usage)
            await observe(flow, context, status=None, turn_id=state.turn_id, usage=usage)
        return committed
    finally:
        events.close()


def _commit_chunk(
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    summary: ContextSummary,
    plan: CompactionPlan,
    end: int,
    text: str,
    settings: CompactionOptions,
) -> ContextSummary:
    """Stage the chunk's summary, retention's deletions and the event; the new summary."""
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
    return committed


resolve_annotations(globals())
