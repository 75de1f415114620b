"""Inputs and outputs of the session's RPCs (seed "RPCs", with the platform's additions).

This module owns the shapes the RPCs exchange that are not themselves stored state: the
snapshot, pages and ranges of messages, the message queue and its edits, an interrupt's
resolution request and ``cancel_turn``'s request and answer. Frozen dataclasses, as in
``_records``; it imports ``_records``, ``_builtin_records`` and ``_elicitation_records`` for
the state they carry, and the Flow, the client, compaction's reads and the testing kit import
it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from dex_agents._builtin_records import AgentPlan, PendingTimer, PendingUserInput
from dex_agents._elicitation_records import AgentElicitation
from dex_agents._records import (
    AgentInterrupt,
    AgentMessage,
    AgentState,
    AgentToolCall,
    AgentUsage,
    AgentUserMessage,
    ContextSummary,
)
from dex_agents._wire_types import coerce, coerce_datetime, resolve_annotations


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
        object.__setattr__(self, "created_at", coerce_datetime(self.created_at))


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
            self, "queued", [coerce(item, AgentQueuedMessage) for item in self.queued]
        )
        object.__setattr__(
            self, "steered", [coerce(item, AgentQueuedMessage) for item in self.steered]
        )


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
        object.__setattr__(self, "message", coerce(self.message, AgentUserMessage))


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
            [coerce(item, AgentElicitation) for item in self.pending_elicitations],
        )
        if self.plan is not None:
            object.__setattr__(self, "plan", coerce(self.plan, AgentPlan))
        if self.summary is not None:
            object.__setattr__(self, "summary", coerce(self.summary, ContextSummary))
        if self.pending_timer is not None:
            object.__setattr__(self, "pending_timer", coerce(self.pending_timer, PendingTimer))
        if self.pending_input is not None:
            object.__setattr__(self, "pending_input", coerce(self.pending_input, PendingUserInput))
        if self.state is not None:
            object.__setattr__(self, "state", coerce(self.state, AgentState))


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
            self, "message_range", coerce(self.message_range, AgentMessageRange)
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
