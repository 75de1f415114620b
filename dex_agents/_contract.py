"""The runner contract every framework adapter implements (seed "The runner contract").

The session calls a runner from Steps, so every call may run again after a crash or a retry;
a runner keeps no state between calls and derives everything from its arguments.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from dex_agents._builtin_records import AgentPlan
from dex_agents._events import AgentEventWriter
from dex_agents._records import (
    AgentMessage,
    AgentToolCall,
    AgentUsage,
    ContextSummary,
    MessageRole,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
    TurnMode,
)
from dex_agents._wire_types import resolve_annotations

Heartbeat = Callable[[], Awaitable[None]]

#: The model-visible result of a tool call a steered user message superseded before it started
#: (platform addition; the AI Agent's tool-result vocabulary).
CANCELLED_BY_STEER_OUTPUT = (
    '{"status": "cancelled", "reason": "superseded_by_steered_user_message"}'
)
#: The model-visible result of a tool call that had not started when the user cancelled its
#: turn (platform addition, ``cancel_turn``).
CANCELLED_BY_USER_OUTPUT = '{"status": "cancelled", "reason": "turn_cancelled_by_user"}'
#: The first line of the note a cancelled turn that ended tool calls stores (platform
#: addition). Calls the cancel caught before they started are listed ``cancelled``: they did
#: not run, and the header says so (it once said "after these tool calls ran").
TURN_CANCELLED_NOTE_HEADER = (
    "[Dex] The previous turn was cancelled; its tool calls ended as follows"
    " (cancelled ones did not run):"
)
#: The note a cancelled turn stores when it ran no tool call and streamed no text (platform
#: addition): without it the turn would leave no trace, in the conversation or for the model.
TURN_CANCELLED_EMPTY_NOTE = (
    "[Dex] The previous turn was cancelled before the model answered; no tool call ran."
)
#: The line after the reason in the note of a turn ``AgentSessionOptions.turn_guard`` stopped
#: (platform addition).
TURN_STOPPED_NOTE_HEADER = (
    "The turn was stopped after its last model call; these tool calls of the turn ended"
    " (cancelled ones did not run):"
)
#: ``reason`` in the result of a tool call a stopped turn cancelled:
#: ``{"status": "cancelled", "reason": "turn_stopped", "detail": <the guard's reason>}``.
TURN_STOPPED_OUTPUT_REASON = "turn_stopped"
#: The first line of the note ``RecordTurnFailure`` stores (seed "Flow shape").
TURN_FAILURE_NOTE_HEADER = "[Dex] The previous turn failed after these tool calls ran:"


class AgentContractError(ValueError):
    """A runner broke the contract (bad role, run state or tool call ID); fails the Step."""


@dataclass(frozen=True)
class FrameworkMessage:
    """One conversation item in the runner's own representation.

    Attributes:
        role: Who produced it; ``build_user_message`` must return ``MessageRole.USER``.
        framework_item: JSON-compatible data the runner rebuilds framework input from.
        text: Display text.
    """

    role: MessageRole
    framework_item: Any
    text: str = ""
    #: Platform addition: for a tool result, the call it answers, so the session links the
    #: message to the whole result the call stored (``AgentMessage.text_parts``).
    tool_call_id: str | None = None


@dataclass(frozen=True)
class DeferredToolCall:
    """A tool call the framework stopped before running.

    Attributes:
        tool_call_id: Non-empty, without ``/``, unique within the turn.
        tool_name: The tool's name.
        arguments: The arguments as JSON text, as the model produced them.
        policy: From ``AgentTurnContext.resolve_tool_policy``.
    """

    tool_call_id: str
    tool_name: str
    arguments: str
    policy: ToolPolicy


@dataclass(frozen=True)
class TurnCompleted:
    """The model gave its final answer.

    Attributes:
        new_messages: Every item the turn produced after its user message, in order, across all
            of its model calls; appended in one commit.
        usage: This model call's usage only.
    """

    new_messages: Sequence[FrameworkMessage]
    usage: AgentUsage = field(default_factory=AgentUsage)


@dataclass(frozen=True)
class ToolCallsRequested:
    """The model asked for tools; the session runs each as its own Step.

    Attributes:
        framework_run_state: Non-empty text that continues the turn after the tools.
        tool_calls: One entry per call, in model order; at least one.
        usage: This model call's usage only.
    """

    framework_run_state: str
    tool_calls: Sequence[DeferredToolCall]
    usage: AgentUsage = field(default_factory=AgentUsage)


AgentTurnOutcome = TurnCompleted | ToolCallsRequested


@dataclass(frozen=True)
class ToolExecutionResult:
    """A tool's model-visible output.

    ``full_text`` (platform addition): the result's whole text when ``output`` holds a cut of
    it; the tool Step stores it in parts (``dex_agents._text_parts``, at most
    ``MAX_STORED_TEXT_BYTES``) for people to read, and the model still sees ``output`` only.
    """

    output: str
    full_text: str | None = None


class ToolExecutionError(Exception):
    """A tool failure the model should see: recorded ``failed`` with ``message``, never retried."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelCallError(Exception):
    """A model call another attempt cannot fix (platform addition, issue 25): raised by
    ``run_model_step`` when the provider refused the request itself (an invalid request, a
    key it does not accept, no access, no such model). ``RunModel`` does not retry it: the
    turn fails at once through RecordTurnFailure with ``message`` as ``last_turn_error``.
    Any other exception fails the attempt, which is retried (3 attempts)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ModelRateLimitError(Exception):
    """The provider asked to wait before the next model call (platform addition, issue 25):
    raised by ``run_model_step`` for HTTP 429 with ``Retry-After``. The attempt fails as any
    error does, and RunModel's next attempt starts after ``retry_after_seconds`` (whole seconds,
    at least 1) instead of its backoff interval (``dex.retry_after``)."""

    def __init__(self, message: str, retry_after_seconds: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_seconds = max(1, int(retry_after_seconds))


@dataclass(frozen=True)
class ToolPolicyResolver:
    """Resolves a tool's policy: per-session, then Flow, then framework metadata, then default.

    Per-session policies are a platform addition to the seed (ARCHITECTURE.md "One shared Flow").
    """

    session_policies: Mapping[str, ToolPolicy]
    flow_policies: Mapping[str, ToolPolicy]
    default_tool_effect: ToolEffect

    def resolve(self, tool_name: str, framework_effect: ToolEffect | None = None) -> ToolPolicy:
        """The policy for ``tool_name``; ``framework_effect`` comes from tool metadata."""
        explicit = self.session_policies.get(tool_name) or self.flow_policies.get(tool_name)
        if explicit is not None:
            return explicit
        if framework_effect is not None:
            return ToolPolicy(ToolEffect(framework_effect))
        return ToolPolicy(self.default_tool_effect)


@dataclass(frozen=True)
class AgentTurnContext:
    """Committed state handed to ``run_model_step`` (seed "run_model_step(turn)").

    Attributes:
        flow_id: The session ID.
        turn_id: ``"turn-<n>"``.
        attempt: One-based ``RunModel`` attempt.
        messages: Every stored message in sequence order; the last user message is this turn's.
            With ``AgentSessionOptions.compaction`` (platform addition) only the messages after
            ``summary.through_sequence``: the session never summarizes a message of the running
            turn, so this turn's user message is still among them.
        framework_run_state: ``None`` on the turn's first model call, else the last
            ``ToolCallsRequested.framework_run_state`` of this turn.
        tool_calls: This turn's records by tool call ID; all final when ``RunModel`` runs.
        events: Writer bound to this turn, Step execution and attempt.
        agent_config: Platform addition: the session's agent definition snapshot, or ``None``.
        steered_messages: Platform addition (Steer, ``AgentSessionOptions.steering``): user
            messages built with ``build_user_message`` that this model call must see after the
            tool results of the restored run state (or after the turn's user message on its
            first call), in order. A runner that supports steering appends them to its input
            and keeps them in its run state and ``TurnCompleted.new_messages``; the session
            gives each one to exactly one successful model call.
        turn_mode: Platform addition (``AgentSessionOptions.plans``): ``planning`` offers only
            ``write_todos`` (the session fails any other call), ``executing`` works through
            ``plan`` and keeps its task statuses with ``write_todos``, ``chat`` is an ordinary
            turn (``write_todos`` fails).
        plan: Platform addition: the current plan, or ``None``.
        summary: Platform addition (``AgentSessionOptions.compaction``): the cumulative summary
            of the messages before ``messages`` once a compaction ran, else ``None``. A runner
            puts its ``text`` into the model input (for example as a system message) before
            ``messages``.
    """

    flow_id: str
    turn_id: str
    attempt: int
    messages: Sequence[AgentMessage]
    framework_run_state: str | None
    tool_calls: Mapping[str, AgentToolCall]
    events: AgentEventWriter
    policies: ToolPolicyResolver
    heartbeat_callback: Heartbeat
    agent_config: dict[str, Any] | None = None
    steered_messages: Sequence[FrameworkMessage] = ()
    turn_mode: TurnMode = TurnMode.CHAT
    plan: AgentPlan | None = None
    summary: ContextSummary | None = None

    @property
    def is_resuming(self) -> bool:
        """True when this model call continues a turn after its tool calls."""
        return self.framework_run_state is not None

    def recorded_tool_call(self, tool_call_id: str) -> AgentToolCall:
        """This turn's record of one tool call.

        Raises:
            KeyError: If the turn has no such call.
        """
        return self.tool_calls[tool_call_id]

    def resolve_tool_policy(
        self, tool_name: str, framework_effect: ToolEffect | None = None
    ) -> ToolPolicy:
        """Explicit policy (per-session, then Flow), else framework metadata, else the default."""
        return self.policies.resolve(tool_name, framework_effect)

    async def heartbeat(self) -> None:
        """Record liveness; the session also heartbeats every 20 seconds in the background."""
        await self.heartbeat_callback()


@dataclass(frozen=True)
class DeferredToolExecution:
    """One approved tool call handed to ``execute_deferred_tool_call``.

    Attributes:
        flow_id: The session ID.
        tool_call: The record; its status is ``pending`` or ``approved``.
        idempotency_key: ``"<flow_id>/<turn_id>/<tool_call_id>"``, the same on every attempt.
        attempt: One-based tool Step attempt.
        events: Writer bound to this turn, Step execution and attempt.
        agent_config: Platform addition: the session's agent definition snapshot, or ``None``.
    """

    flow_id: str
    tool_call: AgentToolCall
    idempotency_key: str
    attempt: int
    events: AgentEventWriter
    heartbeat_callback: Heartbeat
    agent_config: dict[str, Any] | None = None

    async def heartbeat(self) -> None:
        """Record liveness; the session also heartbeats every 20 seconds in the background."""
        await self.heartbeat_callback()


@runtime_checkable
class AgentFrameworkRunner(Protocol):
    """What a framework adapter implements (seed "The runner contract")."""

    def build_user_message(self, text: str) -> FrameworkMessage:
        """Return ``FrameworkMessage(role=MessageRole.USER, framework_item=..., text=text)``."""
        ...

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """Make at most one model call and stop before any tool the framework can defer."""
        ...

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        """Run the real tool once; raise ``ToolExecutionError`` for a model-visible failure."""
        ...


def describe_tool_call_outcome(record: AgentToolCall) -> str:
    """The model-visible text for a final tool call record.

    ``succeeded`` renders the output; ``failed``, ``rejected`` and ``outcome_unknown`` render a
    sentence with the error or rejection message; ``cancelled`` (Steer) renders its structured
    result, ``{"status": "cancelled", "reason": "superseded_by_steered_user_message"}``.

    Raises:
        ValueError: If the record is not final.
    """
    if record.status is ToolCallStatus.SUCCEEDED:
        return record.output or ""
    if record.status is ToolCallStatus.FAILED:
        return f"Tool call failed: {record.error or 'unknown error'}"
    if record.status is ToolCallStatus.REJECTED:
        reason = record.rejection_message or "no reason given"
        return f"Tool call was rejected and did not run: {reason}"
    if record.status is ToolCallStatus.CANCELLED:
        return record.output or CANCELLED_BY_STEER_OUTPUT
    if record.status is ToolCallStatus.OUTCOME_UNKNOWN:
        detail = record.error or "the call was interrupted"
        return f"Tool call outcome is unknown ({detail}); it may or may not have taken effect."
    raise ValueError(f"tool call {record.tool_call_id} is not final: {record.status}")


def tool_call_edit_note(record: AgentToolCall) -> str | None:
    """The note a model reads before the result of a call whose arguments a reviewer edited
    before approving (platform addition, approve with edits), or ``None`` when the call ran
    as the model asked. It names the arguments the call ran with, so the model does not
    assume its own ones took effect."""
    if record.original_arguments is None:
        return None
    return (
        "Note: a reviewer edited the arguments of this call before approving it; it ran with "
        f"{record.arguments} instead of {record.original_arguments}."
    )


#: The turn-failure note keeps this much of each call's arguments and outcome (characters),
#: and of the outcome at most this many lines (platform addition, issue 25): the note is a
#: user message the model reads, and four 300 KB outputs in full made it 1.2 MB, which
#: brought the session near the size a worker can load.
NOTE_ARGUMENTS_MAX_CHARS = 200
NOTE_OUTCOME_MAX_CHARS = 300
NOTE_OUTCOME_MAX_LINES = 3


def note_excerpt(text: str, max_chars: int, max_lines: int | None = None) -> str:
    """``text``, or its first ``max_lines`` lines cut to ``max_chars`` characters followed by
    `` [... N more characters]``."""
    head = text
    if max_lines is not None:
        head = "\n".join(text.split("\n")[:max_lines])
    head = head[:max_chars]
    omitted = len(text) - len(head)
    return head if omitted <= 0 else f"{head} [... {omitted} more characters]"


def build_turn_failure_note(
    records: Iterable[AgentToolCall],
    describe: Callable[[AgentToolCall], str] = describe_tool_call_outcome,
    *,
    header: str = TURN_FAILURE_NOTE_HEADER,
) -> str:
    """The note ``RecordTurnFailure`` stores when a failed turn already ran tools.

    One line per final record, in ``deferral_order``, in the seed's exact format; each call's
    arguments and outcome are cut to their first :data:`NOTE_ARGUMENTS_MAX_CHARS` and
    :data:`NOTE_OUTCOME_MAX_CHARS` characters (the outcome to :data:`NOTE_OUTCOME_MAX_LINES`
    lines) with a note of what was left out: the note tells the model which calls ran and how
    they ended, not their whole output. ``describe`` renders a record's outcome before it is
    cut (``describe_tool_call_outcome``, or the runner's ``describe_outcome_for_note`` when it
    has one: a runner that stores encoded outputs turns them into text first). ``header``
    (platform addition) is the first line: ``TURN_CANCELLED_NOTE_HEADER`` for a turn the user
    cancelled.

    Raises:
        ValueError: If there is no record or a record is not final.
    """
    ordered = sorted(records, key=lambda record: record.deferral_order)
    if not ordered:
        raise ValueError("a turn-failure note needs at least one tool call record")
    lines = [header]
    for record in ordered:
        arguments = note_excerpt(record.arguments, NOTE_ARGUMENTS_MAX_CHARS)
        outcome = note_excerpt(
            describe(record), NOTE_OUTCOME_MAX_CHARS, NOTE_OUTCOME_MAX_LINES
        )
        lines.append(f"- {record.tool_name} {arguments} -> {record.status}: {outcome}")
    lines.append("Do not repeat these tool calls unless the user asks again.")
    return "\n".join(lines)


def require_user_message(message: object) -> FrameworkMessage:
    """Check a ``build_user_message`` result.

    Raises:
        AgentContractError: If it is not a ``FrameworkMessage`` with role ``USER``.
    """
    if not isinstance(message, FrameworkMessage):
        raise AgentContractError("build_user_message must return a FrameworkMessage")
    if MessageRole(message.role) is not MessageRole.USER:
        raise AgentContractError(
            f"build_user_message must return role {MessageRole.USER}, got {message.role}"
        )
    return message


resolve_annotations(globals())
