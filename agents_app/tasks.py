"""Celery tasks of the agents app; thin wrappers over services.

The top of the app's Celery side: nothing in ``agents_app`` imports this module; the modules
below queue these tasks by name through ``agents_app.task_queue``.
"""

import logging
from typing import Any

from celery import shared_task

from agents_app.gateway import dex_gateway
from agents_app.models import ApprovalDecision, OutboxTurnCancel
from agents_app.sessions import outbox
from agents_app.sessions.index_reconcile import session_index_reconcile

logger = logging.getLogger(__name__)


@shared_task(name="agents_app.reconcile_session_index")
def reconcile_session_index() -> dict[str, int] | None:
    """Repair the Django session and approvals index from Dex snapshots.

    django-celery-beat runs this periodically (PeriodicTask created by migration 0004,
    interval editable in admin); ``dexworker`` also runs it once at start.

    Returns:
        The counts of ``index_reconcile.ReconcileResult``, or ``None`` when the engine did not
        answer (the next run tries again).
    """
    try:
        result = session_index_reconcile()
    except dex_gateway.EngineUnavailableError as error:
        logger.info("Index reconciliation skipped: %s", error)
        return None
    return {
        "checked": result.checked,
        "statuses": result.statuses,
        "stopped": result.stopped,
        "opened": result.opened,
        "closed": result.closed,
        "missing": result.missing,
        "unreadable": result.unreadable,
        "unanswered": result.unanswered,
    }


#: Seconds between delivery attempts of one session's outbox: 1, 2, 4, ... up to this.
OUTBOX_RETRY_MAX_SECONDS = 30
#: Attempts of one delivery task (about two hours at the longest interval); the periodic
#: ``deliver_outbox`` sweep goes on after that.
OUTBOX_MAX_RETRIES = 240


def _outbox_countdown(retries: int) -> int:
    return int(min(OUTBOX_RETRY_MAX_SECONDS, 2**retries))


@shared_task(bind=True, name="agents_app.deliver_session_messages", max_retries=OUTBOX_MAX_RETRIES)
def deliver_session_messages(self: Any, session_id: str) -> int:
    """Deliver the session's pending outbox messages, oldest first
    (``outbox.outbox_session_deliver``), retrying with backoff while the engine or every
    worker does not answer or the session's queue is full.

    Returns:
        How many messages were delivered by this run.
    """
    try:
        return outbox.outbox_session_deliver(session_id=session_id)
    except outbox.DeliveryDeferred as error:
        raise self.retry(exc=error, countdown=_outbox_countdown(self.request.retries)) from None


@shared_task(bind=True, name="agents_app.deliver_approval_decision", max_retries=OUTBOX_MAX_RETRIES)
def deliver_approval_decision(self: Any, decision_id: int) -> str | None:
    """Deliver a recorded approval decision to Dex (``outbox.approval_decision_deliver``),
    retrying with backoff while the engine or every worker does not answer.

    Returns:
        Its delivery state afterwards, or None when the decision no longer exists.
    """
    decision = ApprovalDecision.objects.filter(pk=decision_id).first()
    if decision is None:
        return None
    try:
        return outbox.approval_decision_deliver(decision=decision)
    except outbox.DeliveryDeferred as error:
        raise self.retry(exc=error, countdown=_outbox_countdown(self.request.retries)) from None


@shared_task(bind=True, name="agents_app.deliver_turn_cancel", max_retries=OUTBOX_MAX_RETRIES)
def deliver_turn_cancel(self: Any, cancel_id: int) -> str | None:
    """Deliver a kept turn cancel to Dex (``outbox.turn_cancel_deliver``), retrying with
    backoff while the engine or every worker does not answer.

    Returns:
        Its delivery state afterwards, or None when the row no longer exists.
    """
    cancel = OutboxTurnCancel.objects.filter(pk=cancel_id).first()
    if cancel is None:
        return None
    try:
        return outbox.turn_cancel_deliver(cancel=cancel)
    except outbox.DeliveryDeferred as error:
        raise self.retry(exc=error, countdown=_outbox_countdown(self.request.retries)) from None


@shared_task(name="agents_app.deliver_outbox")
def deliver_outbox() -> dict[str, int]:
    """Deliver every pending outbox message and approval decision (the periodic sweep;
    PeriodicTask created by migration 0006), for deliveries whose own task was lost."""
    return outbox.outbox_deliver_all()


@shared_task(name="agents_app.generate_session_title", ignore_result=True)
def generate_session_title(session_id: str) -> str | None:
    """Write a session's generated title after its first turn
    (``session_lifecycle.session_title_generate``); never raises."""
    from agents_app.services import session_lifecycle

    return session_lifecycle.session_title_generate(session_id=session_id)


#: Attempts of one approval email after the first (SMTP errors), 30 s apart at first.
EMAIL_MAX_RETRIES = 5
#: Retries of one webhook delivery after the first attempt; the pause doubles from
#: ``WEBHOOK_RETRY_FIRST_SECONDS`` up to ``WEBHOOK_RETRY_MAX_SECONDS`` (about 2.5 hours in all).
WEBHOOK_MAX_RETRIES = 8
WEBHOOK_RETRY_FIRST_SECONDS = 10
WEBHOOK_RETRY_MAX_SECONDS = 3600


def webhook_retry_countdown(retries: int) -> int:
    """Seconds before retry number ``retries + 1`` of a webhook delivery: 10, 20, 40, ...
    at most ``WEBHOOK_RETRY_MAX_SECONDS``."""
    return int(min(WEBHOOK_RETRY_MAX_SECONDS, WEBHOOK_RETRY_FIRST_SECONDS * 2**retries))


@shared_task(bind=True, name="agents_app.send_approval_email", max_retries=EMAIL_MAX_RETRIES,
             ignore_result=True)
def send_approval_email(self: Any, notification_id: int) -> bool:
    """Send one approval email (``notifications.approval_email_send``), retrying on the
    backend's errors (30 s, 60 s, ... apart).

    Returns:
        Whether this run sent it.
    """
    from agents_app.notify import notifications

    try:
        return notifications.approval_email_send(notification_id=notification_id)
    except Exception as error:
        logger.warning("Approval email %s not sent: %s", notification_id, error)
        raise self.retry(exc=error, countdown=30 * 2**self.request.retries) from None


@shared_task(bind=True, name="agents_app.deliver_webhook", max_retries=WEBHOOK_MAX_RETRIES,
             ignore_result=True)
def deliver_webhook(self: Any, delivery_id: int) -> str:
    """Deliver one webhook event (``webhooks.webhook_delivery_send``), retrying with
    exponential backoff (``webhook_retry_countdown``); after the last retry the delivery is
    marked ``failed``.

    Returns:
        The delivery's status afterwards.
    """
    from agents_app.notify import webhooks

    try:
        return webhooks.webhook_delivery_send(delivery_id=delivery_id)
    except webhooks.WebhookDeliveryFailed as error:
        if self.request.retries >= WEBHOOK_MAX_RETRIES:
            webhooks.webhook_delivery_give_up(delivery_id=delivery_id)
            return "failed"
        raise self.retry(
            exc=error, countdown=webhook_retry_countdown(self.request.retries)
        ) from None


@shared_task(name="agents_app.send_approval_reminders", ignore_result=True)
def send_approval_reminders() -> int:
    """Queue the reminder emails of approvals near their deadline
    (``notifications.approval_reminders_send``); Celery beat runs it every minute
    (PeriodicTask created by migration 0016)."""
    from agents_app.notify import notifications

    return notifications.approval_reminders_send()


@shared_task(bind=True, name="agents_app.delete_session_history", max_retries=OUTBOX_MAX_RETRIES)
def delete_session_history(self: Any, session_id: str) -> bool:
    """Delete a deleted session's history from the engine
    (``dex_gateway.session_history_delete``), retrying with backoff while it does not answer.

    Returns:
        Whether the engine deleted it (False: it has no deletion call).
    """
    try:
        return dex_gateway.run(dex_gateway.session_history_delete(session_id=session_id))
    except dex_gateway.EngineUnavailableError as error:
        raise self.retry(exc=error, countdown=_outbox_countdown(self.request.retries)) from None
