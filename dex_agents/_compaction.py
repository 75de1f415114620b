"""Context compaction and message retention (platform addition, ``AgentSessionOptions.compaction``).

Lifts the seed's limit "RunModel and get_agent_snapshot load the whole AgentMessages map.
History is never compacted". With ``compaction`` set:

- RunModel loads only the unsummarized tail: its movements carry
  ``execute_load_attribute_map_instances`` for messages ``through_sequence + 1 ..
  message_count``, computed from ``AGENT_STATE`` and ``CONTEXT_SUMMARY`` by the Step that
  creates the movement (``next_model_call``). A RunModel reached without them (a plain
  ``go_to(RunModel, None)``) moves to itself once with the right loads.
- Before the model call, RunModel asks the runner (``CompactingRunner``) to count the input it
  would send. At ``trigger_fraction`` of the context window, or with more unsummarized
  messages than ``retention_limit``, it moves to ``CompactContext`` instead of calling the
  model. The cutoff keeps the newest messages within ``keep_fraction`` of the window, never
  reaches the running turn, and never leaves a tool request without its results: a cutoff is
  only placed where the next message is not a ``tool`` message (runners store a call's results
  right after the request that asked for them).
- ``CompactContext`` summarizes one chunk per Step execution: the runner's ``summarize`` gets
  the previous summary and a run of messages whose tokens fit the summarizer's input budget, so
  compaction can never overflow itself. Each Step commits the new cumulative summary
  (``CONTEXT_SUMMARY``); a Worker killed mid-Step reruns the same chunk. Its own retry policy
  ends in RecordTurnFailure, which changes no message.
- Retention: CompactContext, RunModel before its model call and RunModel storing a turn's
  messages delete the summarized messages beyond the newest ``retention_limit`` in the same
  commit; nothing is deleted before the summary that covers it commits.
- A ``ContextWindowExceededError`` from ``run_model_step`` compacts once (everything before the
  running turn that lies outside the keep budget) and retries that model call once; a second
  error of the same call (or one with nothing to compact) fails the turn at once, unless the
  runner says the next attempt may fit (``retry_may_fit``: it learned a smaller window from the
  refusal), which fails only the attempt (issue 25).
- Reads: ``get_message_range`` and ``read_agent_messages`` (with per-call instance loads) page
  retained messages; ``get_agent_snapshot_page`` is the snapshot with only its last page loaded
  (``AgentSessionClient`` uses both when the Flow compacts).

This module holds the plans, summaries, message ranges and reads; the Step side is in two
places: RunModel's hooks (``load_model_context``, ``compaction_before_model_call``,
``compaction_after_overflow``, ``retain_newest``) and CompactContext's work
(``summarize_chunk``) in ``dex_agents._model_context``, and the moves between RunModel and the
``CompactContext`` Step in ``dex_agents._steps``, because those Steps name one another in
their decisions.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

from dex import (
    AttributeMapLoad,
    AttributeMapNotLoadedError,
    Context,
    StepDurability,
)

from dex_agents._contract import AgentTurnContext
from dex_agents._persistence import AGENT_MESSAGES, AGENT_STATE, CONTEXT_SUMMARY
from dex_agents._records import (
    AgentMessage,
    AgentUsage,
    ContextSummary,
    MessageRole,
    message_sequence_key,
)
from dex_agents._rpc_records import AgentMessageRange, AgentMessagesSlice, ReadAgentMessagesRequest
from dex_agents._text_parts import delete_message_parts_before
from dex_agents._views import PAGE_MESSAGES_BYTES, fit_messages
from dex_agents._wire_types import resolve_annotations

#: ``read_agent_messages`` returns at most this many messages.
MAX_READ_MESSAGES = 200
#: Tokens of the summarizer's input kept free for its instructions, per 10 of its budget.
_PROMPT_RESERVE_DIVISOR = 10
#: The smallest summary budget, in tokens, however small the window.
_MIN_SUMMARY_TOKENS = 64

_SYNC = StepDurability.SYNC

#: ``agent_config`` keys that override ``CompactionOptions`` per agent.
AGENT_CONFIG_OVERRIDES = {
    "message_retention_limit": "retention_limit",
    "compaction_trigger_fraction": "trigger_fraction",
    "compaction_keep_fraction": "keep_fraction",
}


@dataclass(frozen=True)
class CompactionOptions:
    """When and how far a session compacts (``AgentSessionOptions.compaction``).

    Per agent, ``agent_config`` may override ``retention_limit``
    (``message_retention_limit``), ``trigger_fraction`` (``compaction_trigger_fraction``) and
    ``keep_fraction`` (``compaction_keep_fraction``); the context window comes from the runner
    (``CompactingRunner.context_window``), else ``default_context_window``.

    Attributes:
        trigger_fraction: Compact before a model call whose input reaches this fraction of the
            window (default 0.85).
        keep_fraction: Keep the newest messages up to this fraction of the window unsummarized
            (default 0.10).
        retention_limit: ``AGENT_MESSAGES`` keeps the newest this many messages; older ones are
            deleted once summarized, before a model call or by CompactContext (default 2,000).
            With more unsummarized messages than this, a compaction also runs without token
            pressure and leaves 90 % of the limit unsummarized.
        summary_fraction: The longest summary, as a fraction of the window (default 0.15).
        summarizer_input_fraction: The longest summarizer input (previous summary plus one
            chunk of messages), as a fraction of the window (default 0.5).
        default_context_window: Tokens assumed when the runner knows no window (default 32,000).

    Raises:
        ValueError: Unless ``0 < keep_fraction < trigger_fraction < 1``,
            ``0 < summary_fraction < summarizer_input_fraction <= 1``, and ``retention_limit``
            and ``default_context_window`` are positive integers.
    """

    trigger_fraction: float = 0.85
    keep_fraction: float = 0.10
    retention_limit: int = 2000
    summary_fraction: float = 0.15
    summarizer_input_fraction: float = 0.5
    default_context_window: int = 32_000

    def __post_init__(self) -> None:
        for name in (
            "trigger_fraction",
            "keep_fraction",
            "summary_fraction",
            "summarizer_input_fraction",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"compaction {name} must be a number")
        if not 0 < self.keep_fraction < self.trigger_fraction < 1:
            raise ValueError("compaction fractions must satisfy 0 < keep < trigger < 1")
        if not 0 < self.summary_fraction < self.summarizer_input_fraction <= 1:
            raise ValueError("compaction needs 0 < summary_fraction < summarizer_input <= 1")
        for name in ("retention_limit", "default_context_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"compaction {name} must be a positive integer")

    def for_agent(self, agent_config: Mapping[str, Any] | None) -> CompactionOptions:
        """These options with the agent's overrides applied.

        Raises:
            ValueError: An override makes the options invalid (fails the Step).
        """
        if not agent_config:
            return self
        changes = {
            name: agent_config[key]
            for key, name in AGENT_CONFIG_OVERRIDES.items()
            if agent_config.get(key) is not None
        }
        return replace(self, **changes) if changes else self

    def retention_target(self) -> int:
        """Unsummarized messages a retention-triggered compaction leaves: 90 % of the limit."""
        return self.retention_limit - self.retention_limit // 10


@dataclass(frozen=True)
class CompactionBudgets:
    """Token budgets derived from a context window (see ``CompactionOptions``)."""

    window: int
    trigger: int
    keep: int
    summary: int
    summarizer_input: int
    chunk: int

    @classmethod
    def of(cls, window: int, settings: CompactionOptions) -> CompactionBudgets:
        summary = max(_MIN_SUMMARY_TOKENS, int(window * settings.summary_fraction))
        summarizer_input = max(2 * summary, int(window * settings.summarizer_input_fraction))
        reserve = summarizer_input // _PROMPT_RESERVE_DIVISOR
        return cls(
            window=window,
            trigger=max(1, int(window * settings.trigger_fraction)),
            keep=max(1, int(window * settings.keep_fraction)),
            summary=summary,
            summarizer_input=summarizer_input,
            chunk=max(1, summarizer_input - summary - reserve),
        )


class ContextWindowExceededError(Exception):
    """Raised by ``run_model_step`` when the provider refused the input as longer than the
    model's context window (platform addition). With ``AgentSessionOptions.compaction`` the
    session compacts once and retries the call. A refusal compaction cannot help fails the
    turn at once (the same input would be refused again, issue 25), unless the runner says
    ``retry_may_fit``: it learned from the refusal a smaller window that its next attempt will
    build the input for, so the attempt fails and is retried as any error.
    """

    def __init__(self, *args: object, retry_may_fit: bool = False) -> None:
        super().__init__(*args)
        self.retry_may_fit = retry_may_fit


@dataclass(frozen=True)
class SummarizeRequest:
    """One summarizer call (``CompactingRunner.summarize``).

    Attributes:
        flow_id: The session ID.
        previous_summary: The cumulative summary so far ("" before the first compaction).
        messages: The chunk to fold into it, oldest first; never a running turn's message.
        agent_config: The session's agent definition snapshot, or ``None``.
        input_budget_tokens: The summarizer's whole input (instructions, previous summary and
            messages) must stay within this; cut an oversized message rather than exceed it.
        summary_budget_tokens: The longest summary to return.
        attempt: One-based CompactContext attempt.
    """

    flow_id: str
    previous_summary: str
    messages: Sequence[AgentMessage]
    agent_config: dict[str, Any] | None
    input_budget_tokens: int
    summary_budget_tokens: int
    attempt: int
    heartbeat_callback: Callable[[], Awaitable[None]] = field(repr=False)

    async def heartbeat(self) -> None:
        """Record liveness; the session also heartbeats every 20 seconds in the background."""
        await self.heartbeat_callback()


@dataclass(frozen=True)
class SummaryResult:
    """What ``CompactingRunner.summarize`` may return instead of bare text (platform
    addition): the summary and the summarizer call's priced usage (``AgentUsage`` with
    ``requests=1``), which CompactContext adds to ``AGENT_USAGE``, writes as
    ``usage_recorded`` and reports to the observer like a RunModel call's (keyed by the
    CompactContext Step execution, so a retried attempt counts once).
    """

    text: str
    usage: AgentUsage | None = None


@runtime_checkable
class CompactingRunner(Protocol):
    """What a runner adds to ``AgentFrameworkRunner`` for ``AgentSessionOptions.compaction``.

    Every method may run again after a crash or a retry; keep them deterministic apart from the
    summarizer's model call.
    """

    def context_window(self, agent_config: dict[str, Any] | None) -> int | None:
        """The model's context window in tokens, or ``None`` when unknown."""
        ...

    def count_input_tokens(self, turn: AgentTurnContext) -> int:
        """Tokens of the whole input ``run_model_step(turn)`` would send (summary, messages,
        the turn's own items, tool results as cut for the model)."""
        ...

    def count_message_tokens(
        self, message: AgentMessage, agent_config: dict[str, Any] | None
    ) -> int:
        """Tokens one stored message takes in the model input."""
        ...

    async def summarize(self, request: SummarizeRequest) -> str | SummaryResult:
        """Fold ``request.messages`` into ``request.previous_summary``; non-blank text, or a
        ``SummaryResult`` with the call's usage."""
        ...


def render_summary(summary: ContextSummary) -> str:
    """The text a runner shows its model for ``summary`` (before the unsummarized messages)."""
    return (
        f"[Summary of the conversation before this point (messages 1 to "
        f"{summary.through_sequence})]\n{summary.text}"
    )


# --- cutoffs and chunks (pure) -----------------------------------------------------------------


def safe_cutoff(messages: Sequence[AgentMessage], cutoff: int, floor: int) -> int:
    """Move ``cutoff`` back until the message after it is not a ``tool`` message.

    ``messages`` are consecutive stored messages in sequence order (the tail); the result is
    ``floor`` when no earlier point is safe.
    """
    by_sequence = {message.sequence: message for message in messages}
    while cutoff > floor:
        following = by_sequence.get(cutoff + 1)
        if following is None or MessageRole(following.role) is not MessageRole.TOOL:
            return cutoff
        cutoff -= 1
    return floor


def choose_cutoff(
    *,
    tail: Sequence[AgentMessage],
    tokens_of: Callable[[AgentMessage], int],
    budgets: CompactionBudgets,
    settings: CompactionOptions,
    summary: ContextSummary,
    message_count: int,
    turn_id: str | None,
    over_tokens: bool,
    force: bool = False,
) -> int | None:
    """The sequence a compaction should summarize through, or ``None`` for no compaction.

    ``tail`` holds the messages after ``summary.through_sequence``, oldest first. Under token
    pressure (or ``force``) the newest messages whose tokens fit ``budgets.keep`` stay; the
    message that crosses the budget and everything older are summarized (``force`` with
    everything inside the budget summarizes all it may). With more unsummarized messages than
    ``settings.retention_limit`` the cutoff also reaches ``message_count -
    retention_target()``. The cutoff never reaches the running turn's messages and is moved
    back to a point no tool result follows (``safe_cutoff``); ``None`` when it does not pass
    ``summary.through_sequence``.
    """
    floor = summary.through_sequence
    over_count = message_count - floor > settings.retention_limit
    if not (force or over_tokens or over_count):
        return None
    running = [message.sequence for message in tail if message.turn_id == turn_id]
    limit = (min(running) - 1) if running and turn_id is not None else message_count
    cutoff = floor
    if force or over_tokens:
        kept = 0
        crossing: int | None = None
        for message in reversed(tail):
            kept += tokens_of(message)
            if kept > budgets.keep:
                crossing = message.sequence
                break
        if crossing is not None:
            cutoff = max(cutoff, crossing)
        elif force:
            cutoff = max(cutoff, limit)
    if over_count:
        cutoff = max(cutoff, message_count - settings.retention_target())
    cutoff = safe_cutoff(tail, min(cutoff, limit), floor)
    return cutoff if cutoff > floor else None


def plan_chunks(
    messages: Sequence[AgentMessage],
    tokens_of: Callable[[AgentMessage], int],
    chunk_budget: int,
    after_cutoff: AgentMessage | None,
) -> list[int]:
    """Split ``messages`` (the range to summarize, oldest first) into chunks of at most
    ``chunk_budget`` tokens, each ending where no tool result follows; a single message over
    the budget is a chunk of its own (the summarizer cuts it). Returns the chunk ends.

    ``after_cutoff`` is the message right after the last one (or ``None``).
    """
    ends: list[int] = []
    running = 0
    last_safe: tuple[int, int] | None = None  # (sequence, tokens up to and including it)
    for index, message in enumerate(messages):
        tokens = tokens_of(message)
        if running + tokens > chunk_budget and last_safe is not None:
            ends.append(last_safe[0])
            running -= last_safe[1]
            last_safe = None
        running += tokens
        following = messages[index + 1] if index + 1 < len(messages) else after_cutoff
        if following is None or MessageRole(following.role) is not MessageRole.TOOL:
            last_safe = (message.sequence, running)
    if messages and (not ends or ends[-1] != messages[-1].sequence):
        ends.append(messages[-1].sequence)
    return ends


# --- state helpers -----------------------------------------------------------------------------


def current_summary(context: Context) -> ContextSummary:
    """``CONTEXT_SUMMARY``, or ``ContextSummary()`` before the first compaction."""
    return CONTEXT_SUMMARY.get(context) or ContextSummary()


def message_loads(first: int, last: int) -> tuple[AttributeMapLoad, ...]:
    """``AGENT_MESSAGES`` instance loads for sequences ``first..last`` (empty when none)."""
    return tuple(
        AGENT_MESSAGES.load(message_sequence_key(sequence))
        for sequence in range(max(first, 1), last + 1)
    )


def _read(context: Context, sequence: int) -> AgentMessage | None:
    """The stored message, or ``None`` when it is absent or was not loaded."""
    try:
        message: AgentMessage | None = AGENT_MESSAGES.get(context, message_sequence_key(sequence))
    except AttributeMapNotLoadedError:
        return None
    return message


def message_range(context: Context) -> AgentMessageRange:
    """The retained and summarized message sequences, from state alone."""
    state = AGENT_STATE.get(context)
    summary = current_summary(context)
    return AgentMessageRange(
        first_retained_sequence=summary.first_retained_sequence,
        last_sequence=state.message_count if state is not None else 0,
        summarized_through_sequence=summary.through_sequence,
    )


def read_messages(context: Context, request: ReadAgentMessagesRequest) -> AgentMessagesSlice:
    """``read_agent_messages``: the loaded retained messages of ``first..last`` (at most 200),
    as many as fit ``PAGE_MESSAGES_BYTES`` (``_views``): the newest of them when the request
    says ``keep_newest``, else the oldest."""
    known = message_range(context)
    first = max(request.first_sequence, known.first_retained_sequence, 1)
    last = min(request.last_sequence, known.last_sequence, first + MAX_READ_MESSAGES - 1)
    messages: list[AgentMessage] = []
    complete = True
    for sequence in range(first, last + 1):
        try:
            message = AGENT_MESSAGES.get(context, message_sequence_key(sequence))
        except AttributeMapNotLoadedError:
            complete = False
            continue
        if message is not None:
            messages.append(message)
    messages = fit_messages(messages, PAGE_MESSAGES_BYTES, keep_newest=request.keep_newest)
    return AgentMessagesSlice(messages=messages, message_range=known, complete=complete)


def snapshot_messages(context: Context, limit: int) -> list[AgentMessage]:
    """The newest ``limit`` stored messages, oldest first: from the whole map when the RPC
    loaded it (the seed's ``get_agent_snapshot``), else from the last page's instances the
    caller loaded (``get_agent_snapshot_page``)."""
    try:
        keys = AGENT_MESSAGES.get_all_instance_keys(context)[-limit:]
    except AttributeMapNotLoadedError:
        known = message_range(context)
        first = max(known.first_retained_sequence, known.last_sequence - limit + 1)
        return [
            message
            for sequence in range(first, known.last_sequence + 1)
            if (message := _read(context, sequence)) is not None
        ]
    return [AGENT_MESSAGES.get(context, key) for key in keys]


def retained_from(message_count: int, retention_limit: int, summary: ContextSummary) -> int:
    """The oldest sequence retention keeps: the newest ``retention_limit`` messages, and every
    message the summary does not cover yet."""
    newest_kept = message_count - retention_limit + 1
    return min(max(summary.first_retained_sequence, newest_kept), summary.through_sequence + 1)


def delete_before(context: Context, summary: ContextSummary, kept_from: int) -> int:
    """Stage the deletion of messages ``first_retained..kept_from - 1``, with the parts of
    their texts stored apart (``dex_agents._text_parts``); their count."""
    for sequence in range(summary.first_retained_sequence, kept_from):
        AGENT_MESSAGES.delete(context, message_sequence_key(sequence))
    if kept_from > summary.first_retained_sequence:
        delete_message_parts_before(context, message_sequence_key(kept_from))
    return max(0, kept_from - summary.first_retained_sequence)


def snapshot_summary(context: Context) -> ContextSummary | None:
    """The summary a snapshot shows: ``None`` until a compaction ran."""
    return CONTEXT_SUMMARY.get(context)


resolve_annotations(globals())
