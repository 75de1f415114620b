"""Notices of what happens in sessions: approval emails to staff and webhook events
(issue 27 "Notifications" and "Webhooks"; README "Notifications and webhooks").

``agents_app.sessions.session_index`` calls the ``*_notify`` functions where each fact is
committed to the index, inside its transaction, so a notice exists exactly when its fact does:

- ``approval_requested_notify``: an approval row was opened (worker or reconciliation): an
  ``ApprovalNotification`` per opted-in staff user (``NotificationPreference``) and the
  ``approval.requested`` webhook event;
- ``approval_decided_notify``: a row closed as approved, rejected or expired:
  ``approval.decided``;
- ``turn_ended_notify``: the worker reported a turn's end: ``turn.completed`` or
  ``turn.failed`` (a cancelled turn sends nothing);
- ``session_stopped_notify``: the index marked a session stopped: ``session.stopped``.

Each is idempotent: the notification rows and webhook deliveries are unique per fact, so a
repeated index write sends nothing twice. Emails and deliveries go out from Celery tasks with
retries once the transaction commits; a notice never fails or blocks the write it reports.
``approval_reminders_send`` (Celery beat) mails a reminder once per approval and user before
its deadline. No credentials travel: tool arguments are summarized with secret-looking values
masked (``arguments_summary``).
"""

from __future__ import annotations

import datetime
import json
import logging
import re
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone

from agents_app import task_queue
from agents_app.conf import dexagents_setting
from agents_app.models import (
    AgentSession,
    ApprovalDecision,
    ApprovalNotification,
    ApprovalRequest,
    WebhookEvent,
)
from agents_app.notify.webhooks import webhook_event_emit_safely

logger = logging.getLogger(__name__)

#: Characters of a tool call's arguments an email or webhook shows.
ARGUMENTS_SUMMARY_MAX_CHARS = 500
#: Argument names whose values are masked wherever a notice shows arguments.
SECRET_NAME = re.compile(
    r"pass(word|phrase)?|secret|token|api[_-]?key|auth|credential|private[_-]?key|cookie",
    re.IGNORECASE,
)
MASK = "[masked]"
_DECIDED_STATES = (
    ApprovalRequest.State.APPROVED,
    ApprovalRequest.State.REJECTED,
    ApprovalRequest.State.EXPIRED,
)


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: MASK if SECRET_NAME.search(str(key)) else _masked(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_masked(item) for item in value]
    return value


def arguments_summary(arguments: str) -> str:
    """A tool call's JSON arguments for a person to read: values under secret-looking names
    (password, token, api_key, ...) masked, cut to ``ARGUMENTS_SUMMARY_MAX_CHARS`` with
    "…". Text that is not JSON is shown cut, as it is."""
    try:
        text = json.dumps(_masked(json.loads(arguments)), ensure_ascii=False)
    except ValueError:
        text = arguments
    if len(text) > ARGUMENTS_SUMMARY_MAX_CHARS:
        return text[: ARGUMENTS_SUMMARY_MAX_CHARS - 1] + "…"
    return text


def public_url(path: str) -> str:
    """``DEXAGENTS_PUBLIC_URL`` (no trailing slash) joined with ``path`` (``/...``)."""
    return str(dexagents_setting("PUBLIC_URL")).rstrip("/") + path


def _session_data(session: AgentSession) -> dict[str, Any]:
    return {
        "session": session.pk,
        "session_url": public_url(f"/sessions/{session.pk}/"),
        "agent": session.agent.slug,
        "owner": session.owner.get_username(),
        "title": session.title,
    }


def approval_event_data(request: ApprovalRequest) -> dict[str, Any]:
    """The webhook ``data`` (and email facts) of an approval: the session's fields plus
    ``interrupt_id``, ``tool_call_id``, ``turn_id``, ``tool``, ``arguments`` (a summary,
    ``arguments_summary``), ``requested_at``, ``deadline`` (ISO 8601 or null) and ``url``
    (the chat page at the call)."""
    data = _session_data(request.session)
    data.update({
        "interrupt_id": request.interrupt_id,
        "tool_call_id": request.tool_call_id,
        "turn_id": request.turn_id,
        "tool": request.tool_name,
        "arguments": arguments_summary(request.arguments),
        "requested_at": request.requested_at.isoformat(),
        "deadline": request.deadline.isoformat() if request.deadline else None,
        "url": public_url(f"/sessions/{request.session_id}/#call-{request.tool_call_id}"),
    })
    return data


def _request_get(session_id: str, interrupt_id: str) -> ApprovalRequest | None:
    return (
        ApprovalRequest.objects.select_related("session__agent", "session__owner")
        .filter(session_id=session_id, interrupt_id=interrupt_id)
        .first()
    )


def approval_recipients() -> Any:
    """Users mailed about approvals: active staff with an email address who opted in."""
    return get_user_model().objects.filter(
        is_staff=True, is_active=True, notification_preference__email_on_approval=True
    ).exclude(email="")


def approval_requested_notify(*, session_id: str, interrupt_id: str) -> None:
    """The approval ``interrupt_id`` started waiting: queue one email per recipient and the
    ``approval.requested`` event (both at most once per approval). Never raises."""
    try:
        with transaction.atomic():
            request = _request_get(session_id, interrupt_id)
            if request is None:
                return
            _notifications_create(request, ApprovalNotification.Kind.REQUESTED)
    except Exception as error:
        logger.warning("Approval emails for %s not queued: %s", interrupt_id, error)
        return
    webhook_event_emit_safely(
        event=WebhookEvent.APPROVAL_REQUESTED,
        key=f"{WebhookEvent.APPROVAL_REQUESTED}:{session_id}:{interrupt_id}",
        data=approval_event_data(request),
    )


def _notifications_create(request: ApprovalRequest, kind: str) -> list[int]:
    created_ids = []
    for user in approval_recipients():
        notification, created = ApprovalNotification.objects.get_or_create(
            request=request, user=user, kind=kind
        )
        if created:
            created_ids.append(notification.pk)
    if created_ids:
        transaction.on_commit(lambda: task_queue.approval_emails_schedule(created_ids))
    return created_ids


def approval_decided_notify(*, session_id: str, interrupt_id: str) -> None:
    """The approval closed as approved, rejected or expired: the ``approval.decided`` event,
    with ``outcome`` (that state), ``decided_by`` and ``decided_at`` (null when it expired),
    ``message`` (the rejection message or why it expired) and ``edited`` (approved with
    edited arguments). Never raises."""
    request = _request_get(session_id, interrupt_id)
    if request is None or request.state not in _DECIDED_STATES:
        return
    decision = (
        ApprovalDecision.objects.select_related("decided_by")
        .filter(session_id=session_id, interrupt_id=interrupt_id)
        .first()
    )
    data = approval_event_data(request)
    data.update({
        "outcome": request.state,
        "decided_by": decision.decided_by.get_username() if decision else None,
        "decided_at": decision.decided_at.isoformat() if decision else None,
        "closed_at": request.closed_at.isoformat() if request.closed_at else None,
        "message": request.outcome_message,
        "edited": bool(decision and decision.edited_arguments),
    })
    webhook_event_emit_safely(
        event=WebhookEvent.APPROVAL_DECIDED,
        key=f"{WebhookEvent.APPROVAL_DECIDED}:{session_id}:{interrupt_id}",
        data=data,
    )


def turn_ended_notify(
    *, session_id: str, turn_id: str, outcome: str, error: str | None = None,
    ended_at: datetime.datetime | None = None,
) -> None:
    """A turn ended: ``turn.completed`` (``outcome`` ``completed``) or ``turn.failed``
    (``failed``, with ``error``); other outcomes send nothing. Never raises."""
    events = {"completed": WebhookEvent.TURN_COMPLETED, "failed": WebhookEvent.TURN_FAILED}
    event = events.get(outcome)
    if event is None:
        return
    session = AgentSession.objects.select_related("agent", "owner").filter(pk=session_id).first()
    if session is None:
        return
    data = _session_data(session)
    data.update({
        "turn_id": turn_id,
        "ended_at": (ended_at or timezone.now()).isoformat(),
    })
    if event == WebhookEvent.TURN_FAILED:
        data["error"] = error or ""
    webhook_event_emit_safely(event=event, key=f"{event}:{session_id}:{turn_id}", data=data)


def session_stopped_notify(*, session_id: str) -> None:
    """The session was marked stopped: ``session.stopped``. Never raises."""
    session = AgentSession.objects.select_related("agent", "owner").filter(pk=session_id).first()
    if session is None:
        return
    data = _session_data(session)
    data["stopped_at"] = timezone.now().isoformat()
    webhook_event_emit_safely(
        event=WebhookEvent.SESSION_STOPPED,
        key=f"{WebhookEvent.SESSION_STOPPED}:{session_id}",
        data=data,
    )


def approval_reminders_send(*, now: datetime.datetime | None = None) -> int:
    """Queue a reminder email, once per approval and recipient, for every pending approval
    whose deadline is less than ``APPROVAL_REMINDER_BEFORE`` seconds away. An approval
    whose whole wait is shorter than that gets none (its first email said the deadline).
    ``APPROVAL_REMINDER_BEFORE`` 0 turns reminders off. Run by Celery beat.

    Returns:
        How many reminders were queued.
    """
    lead = int(dexagents_setting("APPROVAL_REMINDER_BEFORE"))
    if lead <= 0:
        return 0
    now = now or timezone.now()
    window = datetime.timedelta(seconds=lead)
    due = ApprovalRequest.objects.filter(
        state=ApprovalRequest.State.PENDING, deadline__gt=now, deadline__lte=now + window
    ).select_related("session")
    queued = 0
    for request in due:
        assert request.deadline is not None
        if request.deadline - request.requested_at <= window:
            continue
        with transaction.atomic():
            queued += len(_notifications_create(request, ApprovalNotification.Kind.REMINDER))
    return queued


def approval_email_send(*, notification_id: int) -> bool:
    """Send the email of one ``ApprovalNotification`` unless it went out already or its
    approval no longer waits (then it is left unsent, with a note).

    Returns:
        True when this call sent it.

    Raises:
        Exception: Whatever the email backend raises (SMTP errors): the task retries.
    """
    notification = (
        ApprovalNotification.objects.select_related(
            "user", "request__session__agent", "request__session__owner"
        )
        .filter(pk=notification_id)
        .first()
    )
    if notification is None or notification.sent_at is not None:
        return False
    request = notification.request
    if request.state != ApprovalRequest.State.PENDING:
        ApprovalNotification.objects.filter(pk=notification_id).update(
            last_error=f"Not sent: the approval is {request.state}."
        )
        return False
    subject, body = _email_text(notification)
    ApprovalNotification.objects.filter(pk=notification_id).update(
        attempts=notification.attempts + 1
    )
    try:
        send_mail(subject, body, settings.DEFAULT_FROM_EMAIL, [notification.user.email])
    except Exception as error:
        ApprovalNotification.objects.filter(pk=notification_id).update(
            last_error=f"{type(error).__name__}: {error}"[:500]
        )
        raise
    ApprovalNotification.objects.filter(pk=notification_id).update(
        sent_at=timezone.now(), last_error=""
    )
    return True


def _utc(moment: datetime.datetime) -> str:
    return moment.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")


def _email_text(notification: ApprovalNotification) -> tuple[str, str]:
    request = notification.request
    data = approval_event_data(request)
    deadline = (
        _utc(request.deadline) if request.deadline else "none (it waits until someone decides)"
    )
    if notification.kind == ApprovalNotification.Kind.REMINDER:
        subject = f"[dexagents] Reminder: approve {request.tool_name} before {deadline}"
        opening = "A tool call still waits for approval; past its deadline it counts as rejected."
    else:
        subject = f"[dexagents] Approval needed: {request.tool_name} ({data['agent']})"
        opening = "A tool call waits for approval."
    body = "\n".join([
        opening,
        "",
        f"Tool: {request.tool_name}",
        f"Arguments: {data['arguments']}",
        f"Agent: {data['agent']}",
        f"Session: {data['title'] or data['session']} (owner: {data['owner']})",
        f"Requested: {_utc(request.requested_at)}",
        f"Deadline: {deadline}",
        "",
        f"Open the session at this call: {data['url']}",
        f"All pending approvals: {public_url('/approvals/')}",
        "",
        "You get these emails because you opted in; turn them off at "
        f"{public_url('/settings/notifications/')}.",
    ])
    return subject, body
