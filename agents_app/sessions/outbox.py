"""The outbox: user messages, approval decisions and turn cancels the API accepted, kept in
Django until Dex has them (ARCHITECTURE.md "Accepted means kept").

Dex RPCs need a running worker; while none answers (a restart, a deploy) or the engine is
down, the API still accepts a message or a decision: it is written here first, the request
tries to deliver it at once, and otherwise a Celery task (``agents_app.tasks``) delivers it
later with backoff, plus a periodic sweep for tasks that were lost. Delivery is idempotent by
ID: a message goes to Dex with its ``OutboxMessage.id`` as ``client_id``, which
``send_user_message`` never queues twice, and a decision is checked against the approvals
index when Dex answers that the call no longer waits.

What holds a message besides the engine (its owner's running-turn cap, a spent budget) is
checked and released in ``outbox_holds``.

Errors raised here:
    DeliveryDeferred: Dex did not take the write now; it stays pending (try again later).
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway, input_rpcs
from agents_app.models import (
    SESSION_STATUS_STARTING,
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
    OutboxMessage,
    OutboxTurnCancel,
)
from agents_app.sessions.approval_index import approval_request_close, approvals_changed_notify
from agents_app.sessions.outbox_holds import (
    ACTIVE_STATUSES,
    active_limit_reached,
    active_limit_reason,
    owner_turn_lock,
)
from agents_app.usage.budgets import BUDGET_REFUSAL_PREFIX, budget_refusal

logger = logging.getLogger(__name__)

# Kept with a row: the start of the last delivery error, for admin.
_ERROR_MAX_CHARS = 500
# How long resolve_interrupt may retry a held PendingInterrupts lock (seed "RPCs": 5 s).
_RESOLVE_LOCK_RETRY_SECONDS = 5.0
SESSION_STOPPED_REASON = "The session was stopped before the message reached it."
SESSION_GONE_REASON = "The engine has no record of this session."
#: How long a decision waits for Dex to record an interrupt the index lists as pending
#: (a Step rerun after its worker died) before it is refused.
INTERRUPT_RECORD_WINDOW = datetime.timedelta(minutes=5)


class DeliveryDeferred(Exception):
    """Dex did not take a write now (the engine or every worker did not answer, or the
    session's queue is full); the row stays pending and a later delivery tries again."""


class InterruptNotRecordedDeferred(DeliveryDeferred):
    """Dex does not hold the interrupt that the approvals index lists as pending.

    A worker indexes an approval just before its Step commits the interrupt to Dex; when that
    worker dies in between, another worker runs the Step again and Dex records the same
    interrupt ID then. Until that happens (at most ``INTERRUPT_RECORD_WINDOW`` after the
    decision) the decision stays pending instead of being refused.
    """


class ActiveLimitDeferred(DeliveryDeferred):
    """The message would start a turn while its owner already has
    ``DEXAGENTS["MAX_ACTIVE_SESSIONS_PER_USER"]`` turns running; it stays pending and is
    delivered when one of them ends (``outbox_holds.active_limit_release``)."""


class BudgetDeferred(DeliveryDeferred):
    """A budget of the message's owner or agent is spent (``budgets.budget_refusal``, whose
    sentence is the exception's text and the row's ``last_error``); the message stays pending
    and the delivery sweep tries it again."""


class QueueFullDeferred(DeliveryDeferred):
    """The session refused a message because its queue is full
    (``DEXAGENTS["MAX_QUEUED_MESSAGES"]``); it can be delivered once a turn took one."""


def _note_attempt(
    model: type[OutboxMessage] | type[ApprovalDecision] | type[OutboxTurnCancel],
    pk: Any,
    error: str,
) -> None:
    model.objects.filter(pk=pk, delivery=Delivery.PENDING).update(
        attempts=F("attempts") + 1, last_error=error[:_ERROR_MAX_CHARS]
    )


def outbox_message_pending(*, session: AgentSession) -> list[OutboxMessage]:
    """The session's messages not delivered yet, oldest first."""
    return list(
        OutboxMessage.objects.filter(session=session, delivery=Delivery.PENDING).order_by(
            "created_at", "id"
        )
    )


def outbox_message_to_queue_entry(message: OutboxMessage) -> dict[str, Any]:
    """A pending message as the queue lists it: ``{"id", "text", "plan_mode", "created_at"
    (ISO 8601), "delivery": "pending"}``, plus ``"held_reason"`` when a spent budget holds
    it (``budgets.budget_refusal``'s sentence; other delivery errors are not shown, they may
    name the platform's addresses)."""
    entry = {
        "id": message.id,
        "text": message.text,
        "plan_mode": message.plan_mode,
        "created_at": message.created_at.isoformat(),
        "delivery": message.delivery,
    }
    if message.last_error.startswith(BUDGET_REFUSAL_PREFIX):
        entry["held_reason"] = message.last_error
    return entry


def outbox_message_deliver(*, message: OutboxMessage) -> str:
    """Send one pending message to its session with ``client_id=message.id``.

    Returns:
        The row's delivery state afterwards: ``delivered``, ``refused`` (the session is
        stopped, or Dex has no such session) or ``withdrawn`` (its sender deleted it while
        the send was on its way; it is taken out of the session's queue again, best effort).

    Raises:
        QueueFullDeferred: The session's queue is full.
        ActiveLimitDeferred: The owner already runs as many turns as allowed.
        BudgetDeferred: A budget of the owner or the agent is spent.
        DeliveryDeferred: The engine or every worker did not answer.
    """
    session = message.session
    if message.delivery != Delivery.PENDING:
        return message.delivery
    if session.status == "stopped":
        return _message_refuse(message, SESSION_STOPPED_REASON)
    refusal = budget_refusal(owner_id=session.owner_id, agent_id=session.agent_id)
    if refusal is not None:
        _note_attempt(OutboxMessage, message.pk, refusal)
        raise BudgetDeferred(refusal)
    reserved = _turn_reserve(message)
    # The delivery time is taken before the send: the turn it starts may begin, end and be
    # observed by the worker before the send's answer comes back, and a time taken after
    # that would make the idle session look about to run (``active_sessions_count``) until
    # its next observation, holding the owner's other messages that long.
    sent_at = timezone.now()
    try:
        sent = dex_gateway.run(
            input_rpcs.session_send_message(
                session_id=session.id,
                text=message.text,
                plan_mode=message.plan_mode,
                client_id=message.id,
                # A held message keeps the time it was sent, not the time it was delivered.
                created_at=message.created_at,
            )
        )
    except dex_gateway.EngineUnavailableError as error:
        _turn_unreserve(session, reserved)
        _note_attempt(OutboxMessage, message.pk, str(error))
        raise DeliveryDeferred(str(error)) from error
    except dex_gateway.SessionNotFoundError:
        _turn_unreserve(session, reserved)
        return _message_refuse(message, SESSION_GONE_REASON)
    except BaseException:
        _turn_unreserve(session, reserved)
        raise
    if not sent:
        _turn_unreserve(session, reserved)
        # The text is never blank (the API validates it), so the queue is full.
        _note_attempt(OutboxMessage, message.pk, "The session's message queue is full.")
        raise QueueFullDeferred("The session's message queue is full.")
    delivered = OutboxMessage.objects.filter(pk=message.pk, delivery=Delivery.PENDING).update(
        delivery=Delivery.DELIVERED, delivered_at=sent_at, attempts=F("attempts") + 1, last_error=""
    )
    try:
        message.refresh_from_db()
    except OutboxMessage.DoesNotExist:
        # Withdrawn and deleted while the send was on its way (a sender whose own delivery
        # met a full queue refuses its message and deletes the row): take it back.
        _take_back(message)
        return Delivery.WITHDRAWN
    if not delivered:
        if message.delivery == Delivery.WITHDRAWN:
            _take_back(message)
        return message.delivery
    if message.steer:
        _steer_quietly(message)
    return Delivery.DELIVERED


def _turn_reserve(message: OutboxMessage) -> bool:
    """Check the owner's running-turn cap for ``message`` and, when it
    will start a turn (the session waits for a message), mark the session ``starting`` in the
    same locked transaction (``owner_turn_lock``), so the owner's next request counts it
    before the worker reports the turn. The worker's next observation replaces the mark.

    Returns:
        Whether the session was marked (``_turn_unreserve`` undoes it if delivery fails).

    Raises:
        ActiveLimitDeferred: The owner already runs as many turns as allowed.
    """
    session = message.session
    limit = int(dexagents_setting("MAX_ACTIVE_SESSIONS_PER_USER"))
    if limit <= 0 or session.status in ACTIVE_STATUSES:
        return False
    marked = 0
    with transaction.atomic():
        owner_turn_lock(owner_id=session.owner_id)
        if active_limit_reached(session=session):
            over = True
        else:
            over = False
            marked = AgentSession.objects.filter(
                pk=session.pk, status="waiting_for_user_message"
            ).update(status=SESSION_STATUS_STARTING)
    if over:
        reason = active_limit_reason()
        _note_attempt(OutboxMessage, message.pk, reason)
        raise ActiveLimitDeferred(reason)
    return bool(marked)


def _turn_unreserve(session: AgentSession, reserved: bool) -> None:
    """Undo ``_turn_reserve``'s mark when the message did not reach the session, unless the
    worker reported a status meanwhile."""
    if reserved:
        AgentSession.objects.filter(
            pk=session.pk,
            status=SESSION_STATUS_STARTING,
            status_observed_at=session.status_observed_at,
        ).update(status="waiting_for_user_message")


def _message_refuse(message: OutboxMessage, reason: str) -> str:
    OutboxMessage.objects.filter(pk=message.pk, delivery=Delivery.PENDING).update(
        delivery=Delivery.REFUSED, last_error=reason
    )
    message.refresh_from_db()
    return message.delivery


def _take_back(message: OutboxMessage) -> None:
    """Delete a message its sender withdrew while it was being delivered."""
    try:
        dex_gateway.run(
            input_rpcs.session_delete_queued_message(
                session_id=message.session_id, message_id=message.id
            )
        )
    except Exception as error:
        logger.warning("Could not take back withdrawn message %s: %s", message.id, error)


def _steer_quietly(message: OutboxMessage) -> None:
    """Steer a message whose sender asked for it before delivery; a turn may have taken it
    already, which is as good."""
    try:
        dex_gateway.run(
            input_rpcs.session_steer_queued_message(
                session_id=message.session_id, message_id=message.id
            )
        )
    except Exception as error:
        logger.info("Could not steer delivered message %s: %s", message.id, error)


def outbox_session_deliver(*, session_id: str) -> int:
    """Deliver the session's pending messages, oldest first, stopping at the first one that
    cannot be delivered now (so messages reach the session in the order they were sent).

    Returns:
        How many messages were delivered.

    Raises:
        QueueFullDeferred, DeliveryDeferred: As ``outbox_message_deliver``; the messages
            after that one stay pending too.
    """
    delivered = 0
    for message in (
        OutboxMessage.objects.select_related("session")
        .filter(session_id=session_id, delivery=Delivery.PENDING)
        .order_by("created_at", "id")
    ):
        try:
            if outbox_message_deliver(message=message) == Delivery.DELIVERED:
                delivered += 1
        except BudgetDeferred as spent:
            # Every message behind it waits for the same budget: say so on each (the queue
            # shows it as held_reason).
            OutboxMessage.objects.filter(
                session_id=session_id, delivery=Delivery.PENDING
            ).update(last_error=str(spent))
            raise
    return delivered


def outbox_message_withdraw(*, session: AgentSession, message_id: str) -> OutboxMessage | None:
    """Withdraw the session's pending message ``message_id`` (delete or edit before delivery).

    Returns:
        The withdrawn row; None when no pending message of the session has that ID (it was
        delivered meanwhile: the caller then asks Dex, which knows it by the same ID).
    """
    with transaction.atomic():
        withdrawn = OutboxMessage.objects.filter(
            pk=message_id, session=session, delivery=Delivery.PENDING
        ).update(delivery=Delivery.WITHDRAWN)
        if not withdrawn:
            return None
        return OutboxMessage.objects.get(pk=message_id)


def outbox_message_mark_steer(*, session: AgentSession, message_id: str) -> bool:
    """Ask for the pending message ``message_id`` to be steered once delivered.

    Returns:
        False when no pending message of the session has that ID.
    """
    return bool(
        OutboxMessage.objects.filter(
            pk=message_id, session=session, delivery=Delivery.PENDING
        ).update(steer=True)
    )


def approval_decision_deliver(*, decision: ApprovalDecision) -> str:
    """Send a recorded decision to Dex through ``resolve_interrupt``.

    When Dex answers that the call no longer waits, an earlier attempt whose answer was lost
    may have landed: the approvals index then shows the same verdict, and the decision counts
    as delivered.

    Returns:
        The decision's delivery state afterwards: ``delivered`` or ``refused``.

    Raises:
        InterruptNotRecordedDeferred: Dex does not hold the interrupt yet, while the index
            still lists it as pending and the decision is younger than
            ``INTERRUPT_RECORD_WINDOW`` (a worker died between indexing and committing it).
        DeliveryDeferred: The engine or every worker did not answer, or a Step kept the
            interrupt locked.
    """
    if decision.delivery != Delivery.PENDING:
        return decision.delivery
    try:
        accepted = dex_gateway.run(
            input_rpcs.session_resolve_interrupt(
                session_id=decision.session_id,
                interrupt_id=decision.interrupt_id,
                approved=decision.approved,
                rejection_message=decision.rejection_message or None,
                edited_arguments=decision.edited_arguments or None,
            ),
            timeout=float(dexagents_setting("ENGINE_TIMEOUT")) + _RESOLVE_LOCK_RETRY_SECONDS,
        )
    except dex_gateway.EngineUnavailableError as error:
        _note_attempt(ApprovalDecision, decision.pk, str(error))
        raise DeliveryDeferred(str(error)) from error
    except dex_gateway.SessionNotFoundError:
        accepted = session_known = False
    else:
        session_known = True
    verdict = (
        ApprovalRequest.State.APPROVED if decision.approved else ApprovalRequest.State.REJECTED
    )
    if not accepted:
        landed = ApprovalRequest.objects.filter(
            session_id=decision.session_id, interrupt_id=decision.interrupt_id, state=verdict
        ).exists()
        still_listed = ApprovalRequest.objects.filter(
            session_id=decision.session_id,
            interrupt_id=decision.interrupt_id,
            state=ApprovalRequest.State.PENDING,
        ).exists()
        if (
            not landed
            and session_known
            and still_listed
            and timezone.now() - decision.decided_at < INTERRUPT_RECORD_WINDOW
        ):
            reason = "Dex does not hold this interrupt yet: its Step is being run again."
            _note_attempt(ApprovalDecision, decision.pk, reason)
            raise InterruptNotRecordedDeferred(reason)
        if not landed:
            ApprovalDecision.objects.filter(pk=decision.pk, delivery=Delivery.PENDING).update(
                delivery=Delivery.REFUSED,
                attempts=F("attempts") + 1,
                last_error="The tool call no longer waited for a decision (decided, past its "
                "deadline, withdrawn, or the session stopped).",
            )
            decision.refresh_from_db()
            return decision.delivery
    ApprovalDecision.objects.filter(pk=decision.pk, delivery=Delivery.PENDING).update(
        delivery=Delivery.DELIVERED,
        delivered_at=timezone.now(),
        attempts=F("attempts") + 1,
        last_error="",
    )
    decision.refresh_from_db()
    if approval_request_close(
        session_id=decision.session_id,
        interrupt_id=decision.interrupt_id,
        state=verdict,
        message=decision.rejection_message,
    ):
        approvals_changed_notify()
    return decision.delivery


def turn_cancel_deliver(*, cancel: OutboxTurnCancel) -> str:
    """Send a kept turn cancel to Dex through ``cancel_turn``, naming the turn it was meant
    for (``cancel.turn_id``; ``""``: whichever runs), so a late one ends no other turn.

    Returns:
        The row's delivery state afterwards: ``delivered``, or ``refused`` when that turn no
        longer runs or Dex has no such session (``last_error`` says which).

    Raises:
        DeliveryDeferred: The engine or every worker did not answer.
    """
    if cancel.delivery != Delivery.PENDING:
        return cancel.delivery
    try:
        result = dex_gateway.run(
            input_rpcs.session_cancel_turn(session_id=cancel.session_id, turn_id=cancel.turn_id)
        )
    except dex_gateway.EngineUnavailableError as error:
        _note_attempt(OutboxTurnCancel, cancel.pk, str(error))
        raise DeliveryDeferred(str(error)) from error
    except dex_gateway.SessionNotFoundError:
        accepted, reason = False, SESSION_GONE_REASON
    else:
        accepted = result.accepted
        reason = "" if accepted else f"The turn was no longer running ({result.reason})."
    OutboxTurnCancel.objects.filter(pk=cancel.pk, delivery=Delivery.PENDING).update(
        delivery=Delivery.DELIVERED if accepted else Delivery.REFUSED,
        delivered_at=timezone.now() if accepted else None,
        attempts=F("attempts") + 1,
        last_error=reason,
    )
    cancel.refresh_from_db()
    return cancel.delivery


def outbox_deliver_all(*, sessions: Iterable[str] | None = None) -> dict[str, int]:
    """Deliver every pending message and decision (the periodic sweep); stops at the first
    that the engine or a worker does not take, since the others would wait for the same.

    Args:
        sessions: Only these sessions' messages and decisions; None: every session.

    Returns:
        ``{"messages": delivered, "decisions": delivered, "cancels": delivered, "pruned":
        finished messages deleted (``outbox_prune``), "pending": left pending}``.
    """
    messages = OutboxMessage.objects.filter(delivery=Delivery.PENDING)
    decisions = ApprovalDecision.objects.filter(delivery=Delivery.PENDING)
    cancels = OutboxTurnCancel.objects.filter(delivery=Delivery.PENDING)
    if sessions is not None:
        wanted = list(sessions)
        messages = messages.filter(session_id__in=wanted)
        decisions = decisions.filter(session_id__in=wanted)
        cancels = cancels.filter(session_id__in=wanted)
    counts = {"messages": 0, "decisions": 0, "cancels": 0, "pruned": 0, "pending": 0}
    try:
        # Before messages: a cancel is meant for the turn running now.
        for cancel in cancels.order_by("requested_at", "id"):
            if turn_cancel_deliver(cancel=cancel) == Delivery.DELIVERED:
                counts["cancels"] += 1
        for decision in decisions.order_by("decided_at", "id"):
            if approval_decision_deliver(decision=decision) == Delivery.DELIVERED:
                counts["decisions"] += 1
        session_ids = list(
            messages.order_by("session_id").values_list("session_id", flat=True).distinct()
        )
        for session_id in session_ids:
            try:
                counts["messages"] += outbox_session_deliver(session_id=session_id)
            except (QueueFullDeferred, ActiveLimitDeferred, BudgetDeferred):
                # Another session's messages do not wait for this one's queue, cap or budget
                # (a held message goes on a later sweep: the next UTC day or month).
                continue
    except DeliveryDeferred as error:
        logger.info("Outbox delivery deferred: %s", error)
    counts["pruned"] = outbox_prune()
    counts["pending"] = (
        OutboxMessage.objects.filter(delivery=Delivery.PENDING).count()
        + ApprovalDecision.objects.filter(delivery=Delivery.PENDING).count()
        + OutboxTurnCancel.objects.filter(delivery=Delivery.PENDING).count()
    )
    return counts


#: Days a delivered, refused or withdrawn message stays in the outbox (for admin) before the
#: sweep deletes it; Dex keeps the conversation.
OUTBOX_KEEP_DAYS = 7


def outbox_prune(*, now: datetime.datetime | None = None) -> int:
    """Delete outbox messages that finished (delivered, refused, withdrawn) more than
    ``OUTBOX_KEEP_DAYS`` days ago. Approval decisions are the audit trail and are kept.

    Returns:
        How many rows were deleted.
    """
    cutoff = (now or timezone.now()) - datetime.timedelta(days=OUTBOX_KEEP_DAYS)
    deleted, _ = (
        OutboxMessage.objects.exclude(delivery=Delivery.PENDING)
        .filter(created_at__lt=cutoff)
        .delete()
    )
    return deleted
