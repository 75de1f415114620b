"""Session observers: mirror a session's status and approvals outside Dex (platform addition).

The seed keeps everything in Dex; a platform that lists sessions by status or shows every pending
approval in a dashboard needs an index it can query. ``AgentSessionOptions.observer`` receives one
``AgentSessionChange`` from each Step that changes the session's status or its pending interrupts,
awaited just before the Step returns its decision, so the index hears of an interrupt before Dex
commits it (an index row may briefly exist for an interrupt whose Step then failed; an index
reconciles such rows from ``get_agent_snapshot``). Observers must be quick, must not raise for
expected failures, and see every change at least once per Step attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from dex_agents._records import AgentInterrupt, AgentStatus, AgentUsage
from dex_agents._wire_types import resolve_annotations

_LOG = logging.getLogger("dex_agents")


class InterruptOutcome(StrEnum):
    """How an interrupt stopped being pending.

    ``approved`` and ``rejected`` answer a ``resolve_interrupt``; ``expired`` means its deadline
    passed first; ``withdrawn`` means its turn failed before a decision.
    """

    APPROVED = "approved"
    REJECTED = "rejected"
    EXPIRED = "expired"
    WITHDRAWN = "withdrawn"


class TurnEnd(StrEnum):
    """How a turn ended (``AgentSessionChange.turn_ended``): with a final answer, failed
    (``last_turn_error``), or cancelled by ``cancel_turn``."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class ClosedInterrupt:
    """An interrupt that left ``PENDING_INTERRUPTS`` (or whose answer a Step consumed).

    Attributes:
        interrupt_id: ``"<turn_id>.<tool_call_id>"``.
        outcome: See ``InterruptOutcome``.
        message: The rejection message, or the expiry / withdrawal explanation; ``None`` on
            approval.
    """

    interrupt_id: str
    outcome: InterruptOutcome
    message: str | None = None


@dataclass(frozen=True)
class ObservedMessage:
    """A user or assistant message a Step stores, as a text index outside Dex needs it
    (platform addition: full-text search over sessions).

    Attributes:
        sequence: The message's ``AgentMessage.sequence`` (stable: an index keyed by session
            and sequence stays idempotent when a Step attempt repeats).
        role: ``"user"`` or ``"assistant"``.
        text: The message's text as stored (tool-call-only assistant messages are not
            reported).
    """

    sequence: int
    role: str
    text: str


@dataclass(frozen=True)
class AgentSessionChange:
    """What one Step attempt is about to commit, as an index outside Dex needs it.

    Attributes:
        flow_id: The session ID.
        observed_at: UTC time on the Worker clock when the Step decided; an index applies a status
            only when it is newer than the one it holds, so late deliveries never go backwards.
        status: The new ``AgentState.status``, or ``None`` when the Step left it unchanged.
        turn_id: The turn the change belongs to, or ``None`` outside a turn.
        raised: Interrupts this Step adds to ``PENDING_INTERRUPTS``.
        closed: Interrupts this Step answered, expired or withdrew.
        usage: The model call this Step made, priced (``AgentUsage`` with ``requests=1``), or
            ``None`` when the Step made none. Every attempt of a Step execution reports the
            same ``model_call_id``, so an index keyed by it counts a retried call once (the
            attempt Dex commits is the one whose figures stay).
        model_call_id: ``"<step_execution_id>"`` of the RunModel Step that made the call;
            ``None`` with ``usage``.
        turn_ended: How the turn ``turn_id`` ended when this Step ends it (``TurnEnd``), else
            ``None``; every attempt of the ending Step reports it, so an index keys what it
            does with it by session and turn.
        turn_error: The turn's error text when ``turn_ended`` is ``failed``, else ``None``.
        messages: The user message that starts a turn and the messages a completed turn
            stores (``ObservedMessage``, with text), for a search index; empty otherwise.
    """

    flow_id: str
    observed_at: datetime
    status: AgentStatus | None
    turn_id: str | None
    raised: tuple[AgentInterrupt, ...] = field(default_factory=tuple)
    closed: tuple[ClosedInterrupt, ...] = field(default_factory=tuple)
    usage: AgentUsage | None = None
    model_call_id: str | None = None
    turn_ended: TurnEnd | None = None
    turn_error: str | None = None
    messages: tuple[ObservedMessage, ...] = field(default_factory=tuple)


#: ``AgentSessionOptions.observer``: awaited with each change on the Worker's event loop.
AgentSessionObserver = Callable[[AgentSessionChange], Awaitable[None]]


@dataclass(frozen=True)
class TurnGuardCheck:
    """What ``AgentSessionOptions.turn_guard`` is asked about: a model call that just ended
    and requested tool calls, before any of them runs (platform addition).

    Attributes:
        flow_id: The session ID.
        turn_id: The running turn.
        agent_config: The session's ``agent_config`` (the platform's agent snapshot).
        usage: The call's priced usage; the observer has already been told of it (awaited),
            so an index the guard reads counts it.
    """

    flow_id: str
    turn_id: str
    agent_config: dict[str, Any] | None
    usage: AgentUsage


#: ``AgentSessionOptions.turn_guard``: ``async (TurnGuardCheck) -> why the turn must stop now
#: (a sentence people read), or None to go on``.
TurnGuard = Callable[[TurnGuardCheck], Awaitable[str | None]]


async def notify_observer(
    observer: AgentSessionObserver | None, change: AgentSessionChange
) -> None:
    """Hand ``change`` to ``observer``; an observer error is logged, never fails the Step.

    The session's truth is in Dex, so a lost notice only leaves the observer's index behind until
    it reconciles; failing a Step for it would repeat a model or tool call instead.
    """
    if observer is None:
        return
    try:
        await observer(change)
    except Exception:
        _LOG.exception("session observer failed for %s", change.flow_id)


resolve_annotations(globals())
