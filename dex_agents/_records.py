"""Value types of the session's state that a turn reads and writes (seed "Persistence").

This module owns the records every Step works with: the session's state, status and usage, the
stored messages, the tool call records with their effects, policies and statuses, the
interrupts and their resolutions, the user messages, the start input and config, and the
context summary with the compaction plan. Every type here is a frozen dataclass or a
``StrEnum``, so the Dex SDK's automatic JSON codec encodes it; enums travel as their plain
string values. The SDK codec does not decode a dataclass or ``datetime`` inside an ``X | None``
field, so the few such fields convert themselves in ``__post_init__`` (``_wire_types``). The
other records build on these: the built-in tools' (``_builtin_records``), MCP servers'
questions (``_elicitation_records``) and the RPCs' inputs and outputs (``_rpc_records``). It
imports only ``_wire_types``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any

from dex_agents._wire_types import coerce, coerce_datetime, resolve_annotations


class MessageRole(StrEnum):
    """Who produced a stored message (seed "The runner contract")."""

    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"
    SYSTEM = "system"


class MessageNotice(StrEnum):
    """Platform addition: what kind of note the Flow itself stored (``AgentMessage.notice``).

    The note is stored with the runner's user item (seed: ``RecordTurnFailure`` builds it with
    ``build_user_message``) so the model reads it, but nobody typed it: pages show it as a
    notice of the session, not as the user's message.
    """

    TURN_FAILED = "turn_failed"
    TURN_CANCELLED = "turn_cancelled"


class ToolEffect(StrEnum):
    """What a tool does to the world; selects its Step and retries (seed "Effects and policies")."""

    READ = "read"
    IDEMPOTENT_WRITE = "idempotent_write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write"
    UNCLASSIFIED = "unclassified"

    @property
    def retries(self) -> bool:
        """True for effects that run in ``CallTool``, which retries (3 attempts by default)."""
        return self in (ToolEffect.READ, ToolEffect.IDEMPOTENT_WRITE)

    @property
    def requires_approval_by_default(self) -> bool:
        """The "Default approval" column of the seed's effect table."""
        return not self.retries


class ToolCallStatus(StrEnum):
    """Lifecycle of one ``AgentToolCall`` record.

    ``pending`` (runs without approval), ``awaiting_approval`` and ``approved`` are open;
    ``succeeded``, ``failed``, ``rejected``, ``outcome_unknown`` and ``cancelled`` are final.
    ``cancelled`` (platform addition, Steer) marks a call that never started because a steered
    user message superseded it; its ``output`` is the structured result the model sees.
    """

    PENDING = "pending"
    AWAITING_APPROVAL = "awaiting_approval"
    APPROVED = "approved"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    REJECTED = "rejected"
    OUTCOME_UNKNOWN = "outcome_unknown"
    CANCELLED = "cancelled"

    @property
    def is_final(self) -> bool:
        """True once the record will not change again within its turn."""
        return self in _FINAL_STATUSES


_FINAL_STATUSES = frozenset(
    {
        ToolCallStatus.SUCCEEDED,
        ToolCallStatus.FAILED,
        ToolCallStatus.REJECTED,
        ToolCallStatus.OUTCOME_UNKNOWN,
        ToolCallStatus.CANCELLED,
    }
)


class TurnMode(StrEnum):
    """Platform addition (plans): ``chat`` (an ordinary turn), ``planning`` (a ``plan_mode``
    message: only ``write_todos`` may run) or ``executing`` (``execute_plan``: work through the
    plan, keeping task statuses with ``write_todos``)."""

    CHAT = "chat"
    PLANNING = "planning"
    EXECUTING = "executing"


class AgentStatus(StrEnum):
    """``AgentState.status`` (seed "Persistence").

    ``waiting_for_user_input`` is a platform addition (``AgentSessionOptions.user_input``): the
    turn's model asked the user a question and waits for ``answer_user_input``.
    """

    WAITING_FOR_USER_MESSAGE = "waiting_for_user_message"
    RUNNING_MODEL = "running_model"
    RUNNING_TOOLS = "running_tools"
    WAITING_FOR_USER_INPUT = "waiting_for_user_input"


@dataclass(frozen=True)
class ToolPolicy:
    """Per-tool override of the effect defaults (seed "Effects and policies").

    Attributes:
        effect: The tool's effect; selects ``CallTool`` or ``CallSingleAttemptTool``.
        requires_approval: ``None`` uses the effect's default approval.
        approval_deadline_seconds: Platform addition: how long an approval of this tool may wait
            before it counts as rejected, in seconds; ``None`` uses
            ``AgentSessionOptions.interrupt_deadline``.
        timeout_seconds: Platform addition: how long one attempt of the call's Step may run,
            in seconds (its ``execute_method_timeout``, rounded up to whole seconds because Dex
            counts whole seconds). A runner that enforces a limit of its own, such as an MCP
            request timeout, sets this a little longer, so that its own error comes first and
            this is the backstop. ``None``: no Step timeout is set (the engine's default
            applies), as in the seed.
        retries: Platform addition: extra attempts after the first for a ``read`` or
            ``idempotent_write`` call (``CallTool`` runs ``retries + 1`` attempts). ``None``:
            the seed's three attempts. A ``non_idempotent_write`` or ``unclassified`` call
            runs one attempt whatever this says: the seed's effect table never repeats such a
            call.

    Raises:
        ValueError: ``timeout_seconds`` is not a positive finite number, or ``retries`` is not
            a non-negative integer.
    """

    effect: ToolEffect
    requires_approval: bool | None = None
    approval_deadline_seconds: float | None = None
    timeout_seconds: float | None = None
    retries: int | None = None

    def __post_init__(self) -> None:
        timeout, retries = self.timeout_seconds, self.retries
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise ValueError(f"timeout_seconds must be a positive number, got {timeout!r}")
        if retries is not None and (
            isinstance(retries, bool) or not isinstance(retries, int) or retries < 0
        ):
            raise ValueError(f"retries must be a non-negative integer, got {retries!r}")

    @property
    def is_approval_required(self) -> bool:
        """Whether the call waits in ``AwaitToolApproval`` before it runs."""
        if self.requires_approval is not None:
            return self.requires_approval
        return self.effect.requires_approval_by_default


@dataclass(frozen=True)
class AgentUsage:
    """Token and request counts, and their cost; ``+`` adds field by field.

    Attributes:
        input_tokens, output_tokens, reasoning_tokens, cached_input_tokens: token counts.
        requests: number of model requests.
        cost_usd: Platform addition: what the calls cost in US dollars, as a decimal string
            (``"0.000125"``, never exponent notation) so sums stay exact. The runner prices each
            call; ``"0"`` when it could not (a model without a known price). Older stored
            values lack it and decode as ``"0"``.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_input_tokens: int = 0
    requests: int = 0
    cost_usd: str = "0"

    def __add__(self, other: AgentUsage) -> AgentUsage:
        if not isinstance(other, AgentUsage):
            return NotImplemented
        return AgentUsage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            requests=self.requests + other.requests,
            cost_usd=usd_text(Decimal(self.cost_usd) + Decimal(other.cost_usd)),
        )

    def as_dict(self) -> dict[str, int | str]:
        """The five counters and ``cost_usd`` as a plain dict, as event payloads carry them."""
        return {
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cached_input_tokens": self.cached_input_tokens,
            "requests": self.requests,
            "cost_usd": self.cost_usd,
        }


def usd_text(amount: Decimal) -> str:
    """``amount`` as ``AgentUsage.cost_usd`` spells it: fixed-point, no exponent, no trailing
    zeros (``Decimal("3E-7")`` gives ``"0.0000003"``, ``Decimal("0.00")`` gives ``"0"``).

    Raises:
        decimal.InvalidOperation: ``amount`` is not finite.
    """
    if not amount.is_finite():
        raise InvalidOperation(f"cost must be finite, got {amount}")
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


@dataclass(frozen=True)
class AgentState:
    """The session's ``AGENT_STATE`` Attribute.

    Attributes:
        status: See ``AgentStatus``.
        turn_number: Turns started so far; the active or last turn is ``turn-<turn_number>``.
        turn_id: The running turn, or ``None`` while waiting for a user message.
        message_count: Stored messages; sequences run ``1..message_count``.
        last_turn_error: Why the last turn failed; cleared when a later turn completes.
        turn_mode: Platform addition (plans): what the running or last turn does.
    """

    status: AgentStatus
    turn_number: int = 0
    turn_id: str | None = None
    message_count: int = 0
    last_turn_error: str | None = None
    turn_mode: TurnMode = TurnMode.CHAT


@dataclass(frozen=True)
class TextParts:
    """Platform addition: a text too large for one Dex value, stored whole in ``TEXT_PARTS``
    instances ``text_part_key(key, 0..count-1)`` (``dex_agents._text_parts``), each at most
    ``TEXT_PART_BYTES`` of UTF-8; joined in order they are the text.

    Attributes:
        key: The instances' common prefix: ``<turn_id>:<tool_call_id>`` for a tool result.
        count: How many parts (at least 2).
        length: The whole text's length in characters.
    """

    key: str
    count: int
    length: int


@dataclass(frozen=True)
class AgentMessage:
    """One stored conversation item, keyed ``message_sequence_key(sequence)``.

    Attributes:
        sequence: One-based position in the session.
        role: Who produced it.
        text: Display text (may be empty for pure tool-request items).
        framework_item: The runner's own JSON-compatible representation.
        turn_id: The turn that stored it.
        text_parts: Platform addition: for a tool result whose whole text did not fit one
            value, where it is stored (``text`` holds the record's cut of it); ``None`` otherwise.
        created_at: Platform addition: when it was written (UTC, Worker clock); for a user
            message that starts a turn, its ``AgentUserMessage.created_at`` (when it was
            sent). ``None`` for a message stored before the field existed.
        interrupted: Platform addition (``cancel_turn``): an assistant message that holds the
            text a model call had streamed when the user cancelled the turn; the call never
            finished, so the text may stop mid-sentence.
        notice: Platform addition: set on a note the Flow stored when a turn ended early (a
            failed turn's note, or a cancelled turn's); its ``role`` is ``USER`` because the
            model reads it as one, but no user wrote it. ``None`` for every other message.
    """

    sequence: int
    role: MessageRole
    text: str
    framework_item: Any
    turn_id: str
    text_parts: TextParts | None = None
    created_at: datetime | None = None
    interrupted: bool = False
    notice: MessageNotice | None = None

    def __post_init__(self) -> None:
        if self.text_parts is not None and not isinstance(self.text_parts, TextParts):
            object.__setattr__(self, "text_parts", coerce(self.text_parts, TextParts))
        object.__setattr__(self, "created_at", coerce_datetime(self.created_at))
        if self.notice is not None and not isinstance(self.notice, MessageNotice):
            object.__setattr__(self, "notice", MessageNotice(self.notice))


@dataclass(frozen=True)
class AgentToolCall:
    """One tool call of the active turn, keyed by tool call ID in ``AGENT_TOOL_CALLS``.

    Attributes:
        tool_call_id: Unique within the turn; non-empty, without ``/``.
        tool_name: The tool's name.
        arguments: The arguments as JSON text, exactly as the model produced them.
        effect: The resolved effect.
        requires_approval: Whether the call waited (or waits) for approval.
        status: See ``ToolCallStatus``.
        output: Tool output for ``succeeded``.
        error: Failure text for ``failed`` and the recovery detail for ``outcome_unknown``.
        rejection_message: The reviewer's message for ``rejected``.
        deferral_order: Zero-based model order within the turn.
        turn_id: The turn that requested the call.
        timeout_seconds, retries: Platform addition: the ``ToolPolicy`` limits the call was
            deferred with, so that every path that starts its Step (RunModel, and
            AwaitToolApproval after an approval) builds the same options. ``None``: the seed's
            defaults; a record stored before these fields existed decodes with ``None``
            (``AgentCodecRegistry``).
        output_parts: Platform addition: where the tool Step stored the result's whole text
            when ``output`` holds a cut of it (``ToolExecutionResult.full_text``); the tool
            message of the turn takes it over (``AgentMessage.text_parts``).
        original_arguments: Platform addition (approve with edits): the arguments as the
            model produced them when the reviewer changed them before approving; ``arguments``
            then holds the edited ones, which the tool Step runs. ``None``: not edited.
        subagent: Platform addition (``AgentSessionOptions.subagents``): the call runs another
            agent as a child session (a ``CallSubagent`` Step) instead of the runner's tool.
        child_session_id: Platform addition: the child session's ID (its Dex Flow ID,
            ``SubFlow:<flow_id>-<step_execution_id>-0``) once ``CallSubagent`` started it.
    """

    tool_call_id: str
    tool_name: str
    arguments: str
    effect: ToolEffect
    requires_approval: bool
    status: ToolCallStatus
    deferral_order: int
    turn_id: str
    output: str | None = None
    error: str | None = None
    rejection_message: str | None = None
    timeout_seconds: float | None = None
    retries: int | None = None
    output_parts: TextParts | None = None
    original_arguments: str | None = None
    subagent: bool = False
    child_session_id: str | None = None

    def __post_init__(self) -> None:
        if self.output_parts is not None and not isinstance(self.output_parts, TextParts):
            object.__setattr__(self, "output_parts", coerce(self.output_parts, TextParts))


def is_approval_required(policy: ToolPolicy) -> bool:
    """Whether a tool with ``policy`` waits for approval (seed "Effects and policies")."""
    return policy.is_approval_required


def idempotency_key(flow_id: str, record: AgentToolCall) -> str:
    """``"<flow_id>/<turn_id>/<tool_call_id>"``, the same on every attempt (seed table)."""
    return f"{flow_id}/{record.turn_id}/{record.tool_call_id}"


@dataclass(frozen=True)
class AgentInterrupt:
    """A tool call waiting for approval (``PENDING_INTERRUPTS``).

    Attributes:
        interrupt_id: ``"<turn_id>.<tool_call_id>"``; the ``INTERRUPT_RESOLUTIONS`` key.
        tool_call_id, tool_name, arguments: The call awaiting the decision.
        deadline: UTC time after which the call counts as rejected, or ``None``.
        turn_id: The turn that raised it.
    """

    interrupt_id: str
    tool_call_id: str
    tool_name: str
    arguments: str
    deadline: datetime | None
    turn_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "deadline", coerce_datetime(self.deadline))


@dataclass(frozen=True)
class AgentUserMessage:
    """Input of ``send_user_message``; value of ``QUEUED_USER_MESSAGES`` and (platform addition)
    ``STEERED_USER_MESSAGES``.

    Attributes:
        text: The message text.
        plan_mode: Platform addition: ask the agent for a plan instead of executing.
        client_id: Platform addition: an ID the sender chose (empty when it chose none); the
            queue RPCs find a message by its Channel message ID or by this ID.
        created_at: Platform addition: when the user sent it, as the sender gave it (a sender
            that kept the message before the send, such as an outbox, gives the time it was
            sent), else when ``send_user_message`` accepted it (UTC, Worker clock); ``None``
            for messages queued before this field existed.
    """

    text: str
    plan_mode: bool = False
    client_id: str = ""
    created_at: datetime | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "created_at", coerce_datetime(self.created_at))


@dataclass(frozen=True)
class AgentInterruptResolution:
    """Value of ``INTERRUPT_RESOLUTIONS``; ``rejection_message`` is ``None`` on approval.

    ``superseded`` (platform addition, Steer): the session withdrew the interrupt because a
    steered user message superseded its tool call; the call ends ``cancelled``.
    ``edited_arguments`` (platform addition, approve with edits): on approval, the JSON text
    the reviewer put in place of the model's arguments; ``None`` runs the call unchanged.
    """

    interrupt_id: str
    approved: bool
    rejection_message: str | None = None
    superseded: bool = False
    edited_arguments: str | None = None


@dataclass(frozen=True)
class ToolCallCompleted:
    """Internal ``TOOL_CALL_RESULTS`` message: one per tool call, when its record is final."""

    tool_call_id: str
    status: ToolCallStatus


@dataclass(frozen=True)
class SubagentLink:
    """Platform addition: the call that started a child session (``AgentSessionOptions.subagents``).

    Attributes:
        parent_session_id: The parent session's ID (its Flow ID).
        tool_call_id: The parent's ``agent__<slug>`` call.
        depth: How many sessions are above this one: 1 for a child of a top-level session.
    """

    parent_session_id: str
    tool_call_id: str
    depth: int = 1


@dataclass(frozen=True)
class AgentSessionStartInput:
    """Input of the start Step ``StartAgentSession``.

    Attributes:
        initial_message: A non-blank message starts the first turn at once.
        agent_config: Platform addition: a JSON snapshot of the agent definition, opaque here and
            handed to the runner as ``AgentTurnContext.agent_config``.
        tool_policies: Platform addition: per-session policies, consulted before the Flow's own.
        initial_plan_mode: Platform addition: ``initial_message`` asks for a plan first (as
            ``AgentUserMessage.plan_mode``); ignored without a message.
        subagent_of: Platform addition (``AgentSessionOptions.subagents``): set when the
            session is a child started by another session's ``agent__<slug>`` call; the child
            runs its first turn and completes its Flow with a ``SubagentResult``.
    """

    initial_message: str = ""
    agent_config: dict[str, Any] | None = None
    tool_policies: dict[str, ToolPolicy] = field(default_factory=dict)
    initial_plan_mode: bool = False
    subagent_of: SubagentLink | None = None

    def __post_init__(self) -> None:
        if self.subagent_of is not None and not isinstance(self.subagent_of, SubagentLink):
            object.__setattr__(self, "subagent_of", coerce(self.subagent_of, SubagentLink))


@dataclass(frozen=True)
class AgentSessionConfig:
    """Platform addition: the ``AGENT_CONFIG`` Attribute, written once by ``StartAgentSession``.

    ``subagent_of`` is the start input's: the parent call of a child session, else ``None``.
    """

    agent_config: dict[str, Any] | None = None
    tool_policies: dict[str, ToolPolicy] = field(default_factory=dict)
    subagent_of: SubagentLink | None = None

    def __post_init__(self) -> None:
        if self.subagent_of is not None and not isinstance(self.subagent_of, SubagentLink):
            object.__setattr__(self, "subagent_of", coerce(self.subagent_of, SubagentLink))


def message_sequence_key(sequence: int) -> str:
    """The ``AGENT_MESSAGES`` key of a message: 12-digit zero-padded ``sequence``.

    Raises:
        ValueError: If ``sequence`` is not in 1..999999999999.
    """
    if not 1 <= sequence <= 999_999_999_999:
        raise ValueError(f"message sequence out of range: {sequence}")
    return f"{sequence:012d}"


# --- context compaction and retention (platform addition, AgentSessionOptions.compaction) ------


@dataclass(frozen=True)
class ContextSummary:
    """The ``CONTEXT_SUMMARY`` Attribute: what the model no longer sees message by message.

    Absent until the first compaction commits (read as ``ContextSummary()``).

    Attributes:
        generation: Compactions committed so far (one per summarized chunk).
        through_sequence: Messages ``1..through_sequence`` are covered by ``text``; the model
            sees ``text`` and the messages after it.
        text: The cumulative summary.
        first_retained_sequence: The oldest message ``AGENT_MESSAGES`` still holds; older ones
            were deleted after they were summarized (retention).
        overflow_retry_of: The model call (``"<turn_id>:<tool call count>"``) whose context
            window error the last compaction answered; a second error of that call fails it.
    """

    generation: int = 0
    through_sequence: int = 0
    text: str = ""
    first_retained_sequence: int = 1
    overflow_retry_of: str = ""


@dataclass(frozen=True)
class CompactionPlan:
    """Input of ``CompactContext``: the summary advances chunk by chunk, one Step each.

    Attributes:
        chunk_ends: Ascending message sequences; each chunk runs from the previous end (or the
            current ``through_sequence``) + 1 to its end, and its summarizer input is bounded.
            The last end is the cutoff.
        reason: ``context`` (the input reached the trigger fraction of the window),
            ``retention`` (more retained messages than the limit) or ``overflow`` (the provider
            refused the input as too long).
        overflow_retry_of: For ``overflow``: the model call that is retried afterwards.
    """

    chunk_ends: list[int]
    reason: str
    overflow_retry_of: str = ""


resolve_annotations(globals())
