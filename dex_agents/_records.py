"""Value types stored in Dex state and exchanged over RPCs (seed "Persistence" and "RPCs").

Every type here is a frozen dataclass or a ``StrEnum``, so the Dex SDK's automatic JSON codec
encodes it; enums travel as their plain string values. The SDK codec does not decode a dataclass
or ``datetime`` inside an ``X | None`` field, so the few such fields convert themselves in
``__post_init__``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Any, TypeVar

from dex import CodecRegistry, Value, WireKind

from dex_agents._wire_types import resolve_annotations

_T = TypeVar("_T")
_CODECS = CodecRegistry()


def _coerce(value: object, value_type: type[_T]) -> _T:
    """Decode plain JSON data left by the SDK codec into ``value_type``."""
    if isinstance(value, value_type):
        return value
    codec = _CODECS.resolve(value_type)
    decoded: _T = codec.decode(Value(WireKind.JSON, json.dumps(value)))
    return decoded


def _coerce_datetime(value: datetime | str | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


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


class PlanStatus(StrEnum):
    """``AgentPlan.status``: ``draft`` (written in plan mode, not executed), ``active``
    (executing, or stopped with unfinished tasks) or ``completed`` (every task completed)."""

    DRAFT = "draft"
    ACTIVE = "active"
    COMPLETED = "completed"


class PlanTaskStatus(StrEnum):
    """``PlanTask.status``."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class PlanTask:
    """One task of a plan: ``content`` (non-blank text) and its ``status``."""

    content: str
    status: PlanTaskStatus = PlanTaskStatus.PENDING


@dataclass(frozen=True)
class AgentPlan:
    """``AGENT_PLAN`` (platform addition): the session's plan, replaced whole by each
    ``write_todos`` and untouched by compaction.

    Attributes:
        revision: Increases by one with every ``write_todos`` (also across a cleared plan).
        status: See ``PlanStatus``.
        tasks: The ordered tasks; empty once the model cleared the plan.
    """

    revision: int
    status: PlanStatus
    tasks: list[PlanTask] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", [_coerce(item, PlanTask) for item in self.tasks])

    @property
    def is_executable(self) -> bool:
        """True for a draft, or an active plan with a task not completed."""
        if not self.tasks:
            return False
        if self.status is PlanStatus.DRAFT:
            return True
        return self.status is PlanStatus.ACTIVE and any(
            task.status is not PlanTaskStatus.COMPLETED for task in self.tasks
        )


@dataclass(frozen=True)
class PlanExecutionRequest:
    """Input of ``execute_plan`` and value of ``PLAN_EXECUTIONS`` (platform addition).

    Attributes:
        revision: The plan revision the user reviewed.
    """

    revision: int


@dataclass(frozen=True)
class PlanExecutionResult:
    """Output of ``execute_plan``: ``accepted``, or the ``reason`` it was not (one of
    ``no_session``, ``stale_revision``, ``not_executable``, ``busy``, ``queued``,
    ``already_requested``, ``no_plans``)."""

    accepted: bool
    reason: str = ""


@dataclass(frozen=True)
class CancelTurnRequest:
    """Input of ``cancel_turn`` (platform addition): ``turn_id`` names the turn to cancel,
    so a cancel delivered late (kept while no Worker ran) cannot end a turn that started
    since; ``""`` cancels whichever turn runs."""

    turn_id: str = ""


@dataclass(frozen=True)
class TurnCancelResult:
    """Output of ``cancel_turn`` (platform addition): ``accepted`` with the ``turn_id`` the
    cancel applies to, or the ``reason`` it was not: ``no_turn`` (no turn is running) or
    ``turn_ended`` (the turn named in the request is no longer the running one; ``turn_id``
    is then the turn that runs)."""

    accepted: bool
    turn_id: str | None = None
    reason: str = ""


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
            object.__setattr__(self, "text_parts", _coerce(self.text_parts, TextParts))
        object.__setattr__(self, "created_at", _coerce_datetime(self.created_at))
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

    def __post_init__(self) -> None:
        if self.output_parts is not None and not isinstance(self.output_parts, TextParts):
            object.__setattr__(self, "output_parts", _coerce(self.output_parts, TextParts))


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
        object.__setattr__(self, "deadline", _coerce_datetime(self.deadline))


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
        object.__setattr__(self, "created_at", _coerce_datetime(self.created_at))


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
class ResolveInterruptRequest:
    """Input of ``resolve_interrupt``.

    ``edited_arguments`` (platform addition): JSON text that replaces the call's arguments on
    approval (the reviewer's edit); ignored on rejection. The RPC does not check it against the
    tool's schema: the caller does (the platform's approvals API answers 400 first).
    """

    interrupt_id: str
    approved: bool
    rejection_message: str | None = None
    edited_arguments: str | None = None


@dataclass(frozen=True)
class ToolCallCompleted:
    """Internal ``TOOL_CALL_RESULTS`` message: one per tool call, when its record is final."""

    tool_call_id: str
    status: ToolCallStatus


@dataclass(frozen=True)
class ListAgentMessagesRequest:
    """Input of ``list_agent_messages``: messages with ``sequence > after_sequence``.

    ``limit`` is clamped to 1..200.
    """

    after_sequence: int = 0
    limit: int = 200


@dataclass(frozen=True)
class AgentMessagesPage:
    """Output of ``list_agent_messages``: oldest first; ``has_more`` when the limit cut it."""

    messages: list[AgentMessage]
    has_more: bool


@dataclass(frozen=True)
class AgentQueuedMessage:
    """Platform addition: one user message still waiting in ``QUEUED_USER_MESSAGES`` or
    ``STEERED_USER_MESSAGES`` (or steered and taken by the turn, not yet given to the model).

    Attributes:
        message_id: The Channel message ID Dex assigned (UUIDv7) while it is pending; for a
            steered message the turn already took, its ``client_id``.
        text: The message text.
        plan_mode: As sent.
        created_at: When it was accepted, or ``None``.
        client_id: The sender's own ID, or empty.
    """

    message_id: str
    text: str
    plan_mode: bool = False
    created_at: datetime | None = None
    client_id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "created_at", _coerce_datetime(self.created_at))


@dataclass(frozen=True)
class AgentMessageQueue:
    """Output of ``get_message_queue`` (platform addition): both queues, oldest first, read in
    one RPC invocation.

    Attributes:
        queued: Messages waiting for a later turn; editable, deletable and steerable.
        steered: Messages that will be applied at the running turn's next safe boundary.
    """

    queued: list[AgentQueuedMessage] = field(default_factory=list)
    steered: list[AgentQueuedMessage] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "queued", [_coerce(item, AgentQueuedMessage) for item in self.queued]
        )
        object.__setattr__(
            self, "steered", [_coerce(item, AgentQueuedMessage) for item in self.steered]
        )


@dataclass(frozen=True)
class PendingTimer:
    """``PENDING_TIMER`` (platform addition, ``durable_wait``): the turn's running durable wait.

    Attributes:
        tool_call_id: The ``durable_wait`` call.
        fires_at: When the wait ends (UTC; Worker clock when the call was deferred).
        duration_seconds: The requested duration in whole seconds.
        reason: Why the agent waits, as it said.
        turn_id: The turn it belongs to.
    """

    tool_call_id: str
    fires_at: datetime
    duration_seconds: int
    reason: str
    turn_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "fires_at", _coerce_datetime(self.fires_at))


@dataclass(frozen=True)
class PendingUserInput:
    """``PENDING_USER_INPUT`` (platform addition, ``request_user_input``): the open question.

    Attributes:
        tool_call_id: The ``request_user_input`` call; ``answer_user_input`` names it.
        prompt: The question.
        choices: Suggested answers (2 to 8 distinct strings), or empty for free text.
        turn_id: The turn it belongs to.
    """

    tool_call_id: str
    prompt: str
    choices: list[str]
    turn_id: str


@dataclass(frozen=True)
class UserInputAnswer:
    """Input of ``answer_user_input`` and value of ``USER_INPUT_ANSWERS`` (platform addition).

    Attributes:
        tool_call_id: The pending question's call ID.
        answer: The user's answer (non-blank).
    """

    tool_call_id: str
    answer: str


class ElicitationStatus(StrEnum):
    """``AgentElicitation.status`` (platform addition, MCP elicitation).

    ``pending`` waits for the user; the others are final: ``accepted``, ``declined`` and
    ``cancelled`` are the user's answers; ``expired`` means no answer came before the
    deadline; ``withdrawn`` means the session took the question back (``AgentElicitation.reason``
    says why: ``steered``, ``call_ended``, ``superseded`` or ``not_running``).
    """

    PENDING = "pending"
    ACCEPTED = "accepted"
    DECLINED = "declined"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"

    @property
    def action(self) -> str:
        """The MCP ``ElicitResult.action`` this status answers the server with: ``accept``,
        ``decline`` or ``cancel`` (expired and withdrawn questions are cancelled)."""
        if self is ElicitationStatus.ACCEPTED:
            return "accept"
        if self is ElicitationStatus.DECLINED:
            return "decline"
        return "cancel"


#: The answers a user can give, mapped to the status they close a question with.
ELICITATION_ACTIONS = {
    "accept": ElicitationStatus.ACCEPTED,
    "decline": ElicitationStatus.DECLINED,
    "cancel": ElicitationStatus.CANCELLED,
}


@dataclass(frozen=True)
class AgentElicitation:
    """One question an MCP server asked during a running tool call (platform addition, MCP
    "Client features/Elicitation"), kept in ``ELICITATIONS`` until its turn ends.

    Attributes:
        elicitation_id: ``"<turn_id>.<tool_call_id>.<fingerprint>"``; the fingerprint (16 hex
            digits) hashes mode, message, schema, URL, the server's elicitation ID and the
            occurrence, so a retried attempt that asks the same question gets the same ID.
        tool_call_id, tool_name, turn_id: The running tool call that asked.
        server_name: The MCP server that asked (may be empty).
        mode: ``form`` (fill ``requested_schema``) or ``url`` (open ``url`` out of band).
        message: The server's text for the user.
        requested_schema: The form's restricted JSON Schema (flat object of primitive
            properties); ``None`` in URL mode. Dex stores JSON with sorted keys, so the
            properties' order is in ``field_order``.
        url: The page to open, in URL mode; empty in form mode.
        server_elicitation_id: The server's own ID of a URL-mode request, or empty.
        requested_at: When the session recorded it (UTC, Worker clock).
        deadline: When it expires unanswered (UTC, Worker clock).
        status: See ``ElicitationStatus``.
        content: The accepted form's values (field name to value); ``None`` otherwise.
        closed_at: When it left ``pending``, or ``None``.
        reason: Why a ``withdrawn`` question was taken back; empty otherwise.
        field_order: The form's property names in the order the server listed them.
    """

    elicitation_id: str
    tool_call_id: str
    tool_name: str
    turn_id: str
    server_name: str
    mode: str
    message: str
    requested_schema: dict[str, Any] | None
    url: str
    server_elicitation_id: str
    requested_at: datetime
    deadline: datetime
    status: ElicitationStatus = ElicitationStatus.PENDING
    content: dict[str, Any] | None = None
    closed_at: datetime | None = None
    reason: str = ""
    field_order: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "requested_at", _coerce_datetime(self.requested_at))
        object.__setattr__(self, "deadline", _coerce_datetime(self.deadline))
        object.__setattr__(self, "closed_at", _coerce_datetime(self.closed_at))
        object.__setattr__(self, "status", ElicitationStatus(self.status))


@dataclass(frozen=True)
class ElicitationRequest:
    """Input of ``open_elicitation`` (platform addition): a question a server asks during the
    running tool call ``tool_call_id``.

    Attributes:
        tool_call_id: The running call (its record names the turn and the tool).
        mode: ``form`` or ``url``.
        message: The server's text for the user.
        requested_schema: The form's schema (form mode).
        url: The page to open (URL mode).
        server_elicitation_id: The server's ID of a URL-mode request.
        server_name: The MCP server that asks.
        occurrence: How many times this attempt of the call asked this same question so far,
            this one included (1 for the first).
        timeout_seconds: How long the user may take, in seconds, from when it is first asked.
        field_order: The form's property names in the server's order (the RPC's JSON input
            sorts the schema's keys).
    """

    tool_call_id: str
    mode: str
    message: str
    requested_schema: dict[str, Any] | None = None
    url: str = ""
    server_elicitation_id: str = ""
    server_name: str = ""
    occurrence: int = 1
    timeout_seconds: float = 600.0
    field_order: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ElicitationState:
    """Output of ``open_elicitation``, ``get_elicitation`` and ``close_elicitation``
    (platform addition).

    Attributes:
        elicitation: The question, or ``None`` when the session has no such question.
        version: ``ELICITATION_VERSION`` read in the same invocation; it grows with every
            change to any question of the session, so a waiter can wait for it to pass this.
        created: ``open_elicitation`` made this question now (it is not one an earlier
            attempt of the call asked).
    """

    elicitation: AgentElicitation | None
    version: int = 0
    created: bool = False

    def __post_init__(self) -> None:
        if self.elicitation is not None:
            object.__setattr__(self, "elicitation", _coerce(self.elicitation, AgentElicitation))


@dataclass(frozen=True)
class ElicitationAnswer:
    """Input of ``answer_elicitation`` (platform addition).

    Attributes:
        elicitation_id: The pending question.
        action: ``accept``, ``decline`` or ``cancel``.
        content: The form's values, with ``accept`` in form mode only.
    """

    elicitation_id: str
    action: str
    content: dict[str, Any] | None = None


@dataclass(frozen=True)
class ElicitationAnswerResult:
    """Output of ``answer_elicitation`` (platform addition).

    Attributes:
        accepted: The answer was stored and the waiting call goes on with it.
        reason: Why not: ``not_pending`` (answered, withdrawn or never asked), ``expired``
            (past its deadline), ``invalid`` (see ``errors``) or ``bad_action``.
        errors: For ``invalid``: messages per field name, and under ``""`` for the content
            as a whole.
    """

    accepted: bool
    reason: str = ""
    errors: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class ElicitationRef:
    """Input of ``get_elicitation`` and ``close_elicitation`` (platform addition): one
    question of the session by its ``elicitation_id``."""

    elicitation_id: str


@dataclass(frozen=True)
class QueuedMessageRequest:
    """Input of ``delete_queued_message`` and ``steer_queued_message`` (platform addition).

    Attributes:
        message_id: A Channel message ID or a sender's ``client_id``.
    """

    message_id: str


@dataclass(frozen=True)
class ReplaceQueuedMessageRequest:
    """Input of ``replace_queued_message`` (platform addition).

    Attributes:
        message_id: The queued message to remove (Channel message ID or ``client_id``).
        message: The message appended at the tail in its place.
    """

    message_id: str
    message: AgentUserMessage

    def __post_init__(self) -> None:
        object.__setattr__(self, "message", _coerce(self.message, AgentUserMessage))


@dataclass(frozen=True)
class AgentSnapshot:
    """Output of ``get_agent_snapshot`` (seed "RPCs").

    Attributes:
        state: ``None`` until ``StartAgentSession`` commits.
        messages: The last 200 messages, oldest first.
        pending_interrupts: Approvals still awaited.
        tool_calls: The active turn's records in ``deferral_order``.
        usage: Session total.
        queued_message_count: User messages waiting for the next turn.
        last_turn_error: Platform addition: ``state.last_turn_error`` repeated for REST clients.
        queued_messages: Platform addition: the queued messages themselves, oldest first, so a
            UI can show what waits for the current turn.
        steered_messages: Platform addition: steered messages not yet given to the model.
        pending_timer: Platform addition: the running ``durable_wait``, or ``None``.
        pending_input: Platform addition: the open ``request_user_input`` question, or ``None``.
        plan: Platform addition: the current plan (``None`` before the first ``write_todos``
            and once cleared).
        plan_execution_requested: Platform addition: ``execute_plan`` was accepted and the
            execution turn has not started yet.
        summary: Platform addition (``AgentSessionOptions.compaction``): the cumulative summary
            of the older messages once a compaction ran, else ``None``.
        pending_elicitations: Platform addition: the questions MCP servers ask during the
            running turn's tool calls that wait for the user, oldest first.
    """

    state: AgentState | None
    messages: list[AgentMessage]
    pending_interrupts: list[AgentInterrupt]
    tool_calls: list[AgentToolCall]
    usage: AgentUsage
    queued_message_count: int
    last_turn_error: str | None = None
    queued_messages: list[AgentQueuedMessage] = field(default_factory=list)
    steered_messages: list[AgentQueuedMessage] = field(default_factory=list)
    pending_timer: PendingTimer | None = None
    pending_input: PendingUserInput | None = None
    plan: AgentPlan | None = None
    plan_execution_requested: bool = False
    summary: ContextSummary | None = None
    pending_elicitations: list[AgentElicitation] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "pending_elicitations",
            [_coerce(item, AgentElicitation) for item in self.pending_elicitations],
        )
        if self.plan is not None:
            object.__setattr__(self, "plan", _coerce(self.plan, AgentPlan))
        if self.summary is not None:
            object.__setattr__(self, "summary", _coerce(self.summary, ContextSummary))
        if self.pending_timer is not None:
            object.__setattr__(self, "pending_timer", _coerce(self.pending_timer, PendingTimer))
        if self.pending_input is not None:
            object.__setattr__(self, "pending_input", _coerce(self.pending_input, PendingUserInput))
        if self.state is not None:
            object.__setattr__(self, "state", _coerce(self.state, AgentState))


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
    """

    initial_message: str = ""
    agent_config: dict[str, Any] | None = None
    tool_policies: dict[str, ToolPolicy] = field(default_factory=dict)
    initial_plan_mode: bool = False


@dataclass(frozen=True)
class AgentSessionConfig:
    """Platform addition: the ``AGENT_CONFIG`` Attribute, written once by ``StartAgentSession``."""

    agent_config: dict[str, Any] | None = None
    tool_policies: dict[str, ToolPolicy] = field(default_factory=dict)


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


@dataclass(frozen=True)
class AgentMessageRange:
    """Output of ``get_message_range`` (platform addition): which sequences exist.

    Attributes:
        first_retained_sequence: The oldest stored message (1 until retention deleted some).
        last_sequence: The newest stored message (0 when there is none).
        summarized_through_sequence: Messages up to here are covered by the summary.
    """

    first_retained_sequence: int = 1
    last_sequence: int = 0
    summarized_through_sequence: int = 0


@dataclass(frozen=True)
class ReadAgentMessagesRequest:
    """Input of ``read_agent_messages`` (platform addition): sequences ``first..last``.

    The caller loads exactly those ``AGENT_MESSAGES`` instances with
    ``dex.RPCInvokeOptions(load_attribute_map_instances=...)``; ``AgentSessionClient`` does.
    """

    first_sequence: int
    last_sequence: int
    #: Which end a page over ``PAGE_MESSAGES_BYTES`` keeps (``_views.fit_messages``): the
    #: newest messages (paging backwards) or the oldest (paging forwards).
    keep_newest: bool = False


@dataclass(frozen=True)
class AgentMessagesSlice:
    """Output of ``read_agent_messages`` (platform addition).

    Attributes:
        messages: The requested messages that exist and were loaded, oldest first.
        message_range: The session's message range, read in the same invocation.
        complete: False when a requested retained message was not loaded (the caller read a
            stale range; read again).
    """

    messages: list[AgentMessage]
    message_range: AgentMessageRange
    complete: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "message_range", _coerce(self.message_range, AgentMessageRange)
        )


@dataclass(frozen=True)
class AgentMessagesBeforePage:
    """One page of ``AgentSessionClient.list_agent_messages_before`` (platform addition).

    Attributes:
        messages: Up to ``limit`` retained messages before the requested sequence, oldest
            first.
        next_before_sequence: Where the next older page ends (exclusive), or ``None`` when no
            older retained message exists.
        first_retained_sequence: The oldest retained message.
    """

    messages: list[AgentMessage]
    next_before_sequence: int | None
    first_retained_sequence: int = 1


@dataclass(frozen=True)
class ReadMessageTextRequest:
    """Input of ``read_message_text`` (platform addition): part ``part`` of message
    ``sequence``'s whole text. ``parts_key`` names the message's ``TextParts.key`` once the
    caller knows it, so the call loads that part (``AgentSessionClient.read_message_text``)."""

    sequence: int
    part: int = 0
    parts_key: str | None = None


@dataclass(frozen=True)
class MessageTextPart:
    """Output of ``read_message_text`` (platform addition).

    Attributes:
        found: False when the message is not stored (never was, or compaction deleted it).
        sequence: The message.
        part: The part asked for (zero-based).
        parts: How many parts the whole text has (1 for a text of at most
            ``TEXT_PART_BYTES``; 0 when not found).
        text_length: The whole text's length in characters.
        text: The part, at most ``TEXT_PART_BYTES`` of UTF-8; ``None`` when ``part`` is out
            of range or the part was not loaded yet (then ``parts_key`` says which to load).
        parts_key: The message's ``TextParts.key`` when its text is stored in parts.
    """

    found: bool
    sequence: int
    part: int = 0
    parts: int = 0
    text_length: int = 0
    text: str | None = None
    parts_key: str | None = None


resolve_annotations(globals())
