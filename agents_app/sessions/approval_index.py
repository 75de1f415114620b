"""The approvals half of the Django index: opening and closing an indexed approval request and
telling the dashboard that the set of approvals changed (ARCHITECTURE.md "The Django index").

Below every writer of the index: ``session_index`` (the worker's reports), ``index_reconcile``
(reconciliation from Dex) and ``outbox`` (a decision Dex accepted). It imports the models and
``notifications`` only.
"""

from __future__ import annotations

import datetime
import logging

from django.utils import timezone

from agents_app.models import ApprovalRequest
from agents_app.notify import notifications

logger = logging.getLogger(__name__)

#: Channel layer group that hears "the approvals index changed".
APPROVALS_GROUP = "approvals"
#: Channel layer message type of that notice (consumers handle ``approvals_changed``).
APPROVALS_CHANGED = "approvals.changed"


def approval_request_open(
    *,
    session_id: str,
    interrupt_id: str,
    tool_call_id: str,
    tool_name: str,
    arguments: str,
    turn_id: str,
    deadline: datetime.datetime | None,
    requested_at: datetime.datetime,
) -> bool:
    """Index a pending interrupt (``ApprovalRequest``, keyed by session and interrupt ID),
    telling ``notifications`` of a new one; a row another writer withdrew is opened again.

    Returns:
        True when a row was created or reopened.
    """
    request, created = ApprovalRequest.objects.get_or_create(
        session_id=session_id,
        interrupt_id=interrupt_id,
        defaults={
            "tool_call_id": tool_call_id,
            "tool_name": tool_name,
            "arguments": arguments,
            "turn_id": turn_id,
            "deadline": deadline,
            "requested_at": requested_at,
        },
    )
    if created:
        notifications.approval_requested_notify(session_id=session_id, interrupt_id=interrupt_id)
        return True
    if request.state == ApprovalRequest.State.WITHDRAWN:
        request.state = ApprovalRequest.State.PENDING
        request.closed_at = None
        request.outcome_message = ""
        request.save(update_fields=["state", "closed_at", "outcome_message", "updated_at"])
        # Notices are unique per approval: a reopened row sends nothing again.
        notifications.approval_requested_notify(session_id=session_id, interrupt_id=interrupt_id)
        return True
    return False


def approval_request_close(
    *,
    session_id: str,
    interrupt_id: str,
    state: str,
    message: str = "",
    closed_at: datetime.datetime | None = None,
) -> bool:
    """Close an indexed interrupt as ``state`` (approved, rejected, expired, withdrawn).

    A pending or withdrawn row takes the new state; a row already answered keeps its answer (the
    worker's later report of the same answer changes nothing). A missing row is not created:
    only raising an interrupt creates rows.

    Returns:
        True when a row changed.
    """
    changed = ApprovalRequest.objects.filter(
        session_id=session_id,
        interrupt_id=interrupt_id,
        state__in=(ApprovalRequest.State.PENDING, ApprovalRequest.State.WITHDRAWN),
    ).exclude(state=state).update(
        state=state,
        outcome_message=message or "",
        closed_at=closed_at or timezone.now(),
        updated_at=timezone.now(),
    )
    if changed and state != ApprovalRequest.State.WITHDRAWN:
        notifications.approval_decided_notify(session_id=session_id, interrupt_id=interrupt_id)
    return bool(changed)


def approvals_changed_notify() -> None:
    """Tell ``APPROVALS_GROUP`` listeners (the dashboard) to re-read; best effort, sync code.

    The notice is only a hint: a lost broadcast delays the dashboard by one poll
    (``approval_index_version``).
    """
    from asgiref.sync import async_to_sync

    try:
        async_to_sync(approvals_changed_anotify)()
    except Exception as error:
        logger.info("Approvals notice not sent: %s", error)


async def approvals_changed_anotify() -> None:
    """``approvals_changed_notify`` for async code; never raises."""
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        await layer.group_send(APPROVALS_GROUP, {"type": APPROVALS_CHANGED})
    except Exception as error:
        logger.info("Approvals notice not sent: %s", error)
