"""Queueing the agents app's Celery tasks by name, for the modules below ``tasks``.

``agents_app.tasks`` holds the task bodies, thin wrappers that call down into the outbox,
the session index, notifications, webhooks and the gateway. Those modules queue tasks in
turn (a kept message's delivery, an approval email, a webhook delivery), and importing
``tasks`` for it would make the imports run in a circle. They queue through this module
instead, which names each task and imports nothing of the app but its models.

A task queued by name runs exactly as one queued through its function: Celery looks the
name up in the app's registry (``CELERY_TASK_ALWAYS_EAGER`` included), so a test that runs
tasks eagerly still runs them at once.

Every function here logs a broker that does not take a task instead of raising: each caller
has a periodic sweep or a later event that tries again.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from celery import current_app
from django.db import transaction

logger = logging.getLogger(__name__)

# The tasks' registered names (``shared_task(name=...)`` in ``agents_app.tasks``).
DELIVER_SESSION_MESSAGES = "agents_app.deliver_session_messages"
DELIVER_APPROVAL_DECISION = "agents_app.deliver_approval_decision"
DELIVER_TURN_CANCEL = "agents_app.deliver_turn_cancel"
DELIVER_OUTBOX = "agents_app.deliver_outbox"
GENERATE_SESSION_TITLE = "agents_app.generate_session_title"
SEND_APPROVAL_EMAIL = "agents_app.send_approval_email"
DELIVER_WEBHOOK = "agents_app.deliver_webhook"
DELETE_SESSION_HISTORY = "agents_app.delete_session_history"


def task_enqueue(name: str, *args: Any, countdown: float | None = None) -> None:
    """Queue the task registered as ``name`` with positional ``args``.

    Args:
        name: A registered task name, one of this module's constants.
        countdown: Seconds before a worker may run it; ``None`` for at once.

    Raises:
        Whatever the broker raises when it does not take the task (callers below log it).
    """
    options: dict[str, Any] = {} if countdown is None else {"countdown": countdown}
    current_app.signature(name, args=args).apply_async(**options)


def _enqueue_logged(what: str, name: str, *args: Any, countdown: float | None = None) -> bool:
    try:
        task_enqueue(name, *args, countdown=countdown)
    except Exception as error:
        logger.warning("Could not queue %s: %s", what, error)
        return False
    return True


def outbox_sweep_schedule() -> bool:
    """Queue one ``deliver_outbox`` sweep now; the web process does this at start-up.

    A web process killed after it kept a message or a decision but before it delivered or
    queued it leaves the row pending; the restarted process sweeps at once instead of leaving
    it to the periodic sweep (every 30 s by default). Delivery is idempotent: a row another
    process delivers meanwhile is skipped.

    Returns:
        Whether the broker took the task.
    """
    return _enqueue_logged("the start-up outbox sweep", DELIVER_OUTBOX)


def outbox_delivery_schedule(
    *,
    session_id: str | None = None,
    decision_id: int | None = None,
    cancel_id: int | None = None,
) -> None:
    """Queue the delivery task of a session's messages, of one decision or of one turn
    cancel once the current transaction commits, 1 s later. A broker that does not take it
    is logged: the periodic sweep delivers the row anyway."""

    def send() -> None:
        if session_id is not None:
            _enqueue_logged("an outbox delivery", DELIVER_SESSION_MESSAGES, session_id,
                            countdown=1)
        if decision_id is not None:
            _enqueue_logged("an outbox delivery", DELIVER_APPROVAL_DECISION, decision_id,
                            countdown=1)
        if cancel_id is not None:
            _enqueue_logged("an outbox delivery", DELIVER_TURN_CANCEL, cancel_id, countdown=1)

    transaction.on_commit(send)


def title_generation_schedule(*, session_ids: Sequence[str]) -> None:
    """Queue ``generate_session_title`` for each session. A broker that does not take a task
    is logged; the session is marked back so its next ended turn tries again."""
    from agents_app.models import AgentSession, TitleSource

    for session_id in session_ids:
        if not _enqueue_logged(f"a title for session {session_id}", GENERATE_SESSION_TITLE,
                               session_id):
            AgentSession.objects.filter(pk=session_id, title_source=TitleSource.PENDING).update(
                title_source=TitleSource.MESSAGE
            )


def approval_emails_schedule(notification_ids: Sequence[int]) -> None:
    """Queue ``send_approval_email`` for each ``ApprovalNotification`` ID."""
    for notification_id in notification_ids:
        _enqueue_logged(f"approval email {notification_id}", SEND_APPROVAL_EMAIL,
                        notification_id)


def webhook_deliveries_schedule(delivery_ids: Sequence[int]) -> None:
    """Queue ``deliver_webhook`` for each ``WebhookDelivery`` ID."""
    for delivery_id in delivery_ids:
        _enqueue_logged(f"webhook delivery {delivery_id}", DELIVER_WEBHOOK, delivery_id)


def session_history_delete_schedule(*, session_id: str) -> None:
    """Queue ``delete_session_history`` 1 s from now; a broker that does not take it is
    logged (the history then stays until the engine's retention, or a later delete of the
    ID)."""
    _enqueue_logged(f"the history deletion of {session_id}", DELETE_SESSION_HISTORY,
                    session_id, countdown=1)
