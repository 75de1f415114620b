"""Value types of the questions MCP servers ask during tool calls (platform addition, MCP
"Client features/Elicitation").

This module owns an elicitation as the session keeps it (``ELICITATIONS``) and the inputs and
outputs of the RPCs that open, read, answer and close one, with the statuses a question goes
through and the answers a user can give. Frozen dataclasses and ``StrEnum`` values, as in
``_records``; it imports only ``_wire_types``, and ``_elicitation`` (the logic), the
persistence definitions and ``_rpc_records`` (the snapshot) import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from dex_agents._wire_types import coerce, coerce_datetime, resolve_annotations


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
        object.__setattr__(self, "requested_at", coerce_datetime(self.requested_at))
        object.__setattr__(self, "deadline", coerce_datetime(self.deadline))
        object.__setattr__(self, "closed_at", coerce_datetime(self.closed_at))
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
            object.__setattr__(self, "elicitation", coerce(self.elicitation, AgentElicitation))


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


resolve_annotations(globals())
