"""Approval emails and the events of the session index (agents_app.notify.notifications): who is
mailed, what the email says, once per approval however often the index write repeats, the
reminder before the deadline, the turn and stop events, and the opt-in API per persona."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from django.core import mail
from django.utils import timezone

from agents_app.models import (
    AgentSession,
    ApprovalNotification,
    ApprovalRequest,
    NotificationPreference,
    Webhook,
    WebhookDelivery,
)
from agents_app.notify import notifications
from agents_app.sessions.session_index import session_changes_apply, session_stopped_index
from dex_agents import AgentInterrupt, AgentSessionChange, AgentStatus, TurnEnd
from tests.factories import AgentDefinitionFactory, AgentSessionFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/me/notifications/"
ARGUMENTS = json.dumps({"channel": "general", "text": "hi", "api_key": "sk-very-secret"})


@pytest.fixture
def session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        owner=owner, agent=AgentDefinitionFactory.create(slug="demo"), title="Post hello"
    )


@pytest.fixture
def reviewers(db: None) -> dict[str, Any]:
    """Staff who opted in (the only one mailed), staff who did not, staff without an
    address, and a non-staff user who opted in."""
    users = {
        "opted": UserFactory.create(username="opted", is_staff=True, email="opted@example.com"),
        "quiet": UserFactory.create(username="quiet", is_staff=True, email="quiet@example.com"),
        "nomail": UserFactory.create(username="nomail", is_staff=True, email=""),
        "user": UserFactory.create(username="user", email="user@example.com"),
    }
    for name in ("opted", "nomail", "user"):
        NotificationPreference.objects.create(user=users[name], email_on_approval=True)
    return users


@pytest.fixture
def webhook(settings: Any) -> Webhook:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "WEBHOOKS_ALLOW_PRIVATE": True}
    return Webhook.objects.create(
        name="all", url="http://127.0.0.1:9/hook", secret="whsec_x",
        events=["approval.requested", "approval.decided", "turn.completed", "turn.failed",
                "session.stopped"],
    )


def raised(session: AgentSession, deadline: datetime.datetime | None) -> AgentSessionChange:
    return AgentSessionChange(
        flow_id=session.pk, observed_at=timezone.now(), status=AgentStatus.RUNNING_TOOLS,
        turn_id="turn-1",
        raised=(AgentInterrupt(
            interrupt_id="turn-1.call_1", tool_call_id="call_1",
            tool_name="slack__post_message", arguments=ARGUMENTS, deadline=deadline,
            turn_id="turn-1",
        ),),
    )


def test_an_approval_mails_opted_in_staff_once(
    session: AgentSession, reviewers: dict[str, Any], webhook: Webhook, settings: Any,
    eager_celery: None, django_capture_on_commit_callbacks: Any,
) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "PUBLIC_URL": "https://agents.example.com"}
    deadline = timezone.now() + datetime.timedelta(hours=1)
    with django_capture_on_commit_callbacks(execute=True):
        session_changes_apply(changes=[raised(session, deadline)])
    # The worker reports the same Step again (a retried attempt): nothing more is sent.
    with django_capture_on_commit_callbacks(execute=True):
        session_changes_apply(changes=[raised(session, deadline)])

    assert [message.to for message in mail.outbox] == [["opted@example.com"]]
    email = mail.outbox[0]
    assert email.subject == "[dexagents] Approval needed: slack__post_message (demo)"
    assert "Tool: slack__post_message" in email.body
    assert '"channel": "general"' in email.body and '"api_key": "[masked]"' in email.body
    assert "sk-very-secret" not in email.body
    assert ("Open the session at this call: "
            f"https://agents.example.com/sessions/{session.pk}/#call-call_1") in email.body
    assert f"Deadline: {deadline.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC" in email.body
    assert "Session: Post hello (owner: owner)" in email.body
    row = ApprovalNotification.objects.get()
    assert (row.user.username, row.kind, row.attempts) == ("opted", "requested", 1)
    assert row.sent_at is not None

    events = list(WebhookDelivery.objects.values_list("event", flat=True))
    assert events == ["approval.requested"]
    data = json.loads(WebhookDelivery.objects.get().payload)["data"]
    assert data["arguments"] == notifications.arguments_summary(ARGUMENTS)
    assert "sk-very-secret" not in WebhookDelivery.objects.get().payload
    assert (data["session"], data["tool"], data["owner"], data["agent"]) == (
        session.pk, "slack__post_message", "owner", "demo"
    )


def test_an_email_for_an_approval_already_decided_is_not_sent(
    session: AgentSession, reviewers: dict[str, Any], eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    session_changes_apply(changes=[raised(session, None)])  # the tasks are not run yet
    ApprovalRequest.objects.update(state=ApprovalRequest.State.APPROVED)
    notification = ApprovalNotification.objects.get()
    assert notifications.approval_email_send(notification_id=notification.pk) is False
    notification.refresh_from_db()
    assert (notification.sent_at, notification.last_error) == (
        None, "Not sent: the approval is approved."
    )
    assert mail.outbox == []


def test_a_reminder_goes_once_before_the_deadline(
    session: AgentSession, reviewers: dict[str, Any], eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    now = timezone.now()
    near_deadline = now + datetime.timedelta(minutes=5)
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.call_1", tool_call_id="call_1",
        tool_name="slack__post_message", arguments="{}", turn_id="turn-1",
        requested_at=now - datetime.timedelta(hours=1), deadline=near_deadline,
    )
    # Its whole wait is shorter than the reminder's lead: its first email said the deadline.
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.call_2", tool_call_id="call_2",
        tool_name="slack__post_message", arguments="{}", turn_id="turn-1",
        requested_at=now - datetime.timedelta(minutes=1),
        deadline=now + datetime.timedelta(minutes=5),
    )
    # Far from its deadline: not yet.
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.call_3", tool_call_id="call_3",
        tool_name="slack__post_message", arguments="{}", turn_id="turn-1",
        requested_at=now - datetime.timedelta(hours=1),
        deadline=now + datetime.timedelta(hours=5),
    )
    for _ in range(2):
        with django_capture_on_commit_callbacks(execute=True):
            notifications.approval_reminders_send(now=now)
    assert [(m.to, m.subject) for m in mail.outbox] == [(
        ["opted@example.com"],
        f"[dexagents] Reminder: approve slack__post_message before "
        f"{near_deadline.astimezone(datetime.UTC):%Y-%m-%d %H:%M} UTC",
    )]


def test_reminders_can_be_turned_off(session: AgentSession, settings: Any) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "APPROVAL_REMINDER_BEFORE": 0}
    assert notifications.approval_reminders_send() == 0


def test_turn_ends_and_stops_are_events_once_each(
    session: AgentSession, webhook: Webhook
) -> None:
    def ended(turn_id: str, how: TurnEnd, error: str | None = None) -> AgentSessionChange:
        return AgentSessionChange(
            flow_id=session.pk, observed_at=timezone.now(),
            status=AgentStatus.WAITING_FOR_USER_MESSAGE, turn_id=turn_id, turn_ended=how,
            turn_error=error,
        )

    session_changes_apply(changes=[ended("turn-1", TurnEnd.COMPLETED)])
    session_changes_apply(changes=[ended("turn-1", TurnEnd.COMPLETED)])
    session_changes_apply(changes=[ended("turn-2", TurnEnd.FAILED, "provider said no")])
    session_changes_apply(changes=[ended("turn-3", TurnEnd.CANCELLED)])
    session_stopped_index(session=session)
    session_stopped_index(session=session)
    bodies = [json.loads(row.payload) for row in WebhookDelivery.objects.order_by("id")]
    assert [(body["event"], body["data"].get("turn_id")) for body in bodies] == [
        ("turn.completed", "turn-1"), ("turn.failed", "turn-2"), ("session.stopped", None),
    ]
    assert bodies[1]["data"]["error"] == "provider said no"


def test_arguments_are_summarized_without_secrets() -> None:
    nested = json.dumps({"auth": {"Password": "p"}, "items": [{"token": "t", "n": 1}],
                         "text": "x" * 1000})
    summary = notifications.arguments_summary(nested)
    assert summary.startswith('{"auth": "[masked]", "items": [{"token": "[masked]", "n": 1}]')
    assert len(summary) == notifications.ARGUMENTS_SUMMARY_MAX_CHARS
    assert summary.endswith("…")
    assert notifications.arguments_summary("not json") == "not json"


def test_the_opt_in_api_per_persona(
    anonymous_client: Any, owner_client: Any, staff_client: Any, staff: Any
) -> None:
    assert anonymous_client.get(URL).status_code == 401
    assert owner_client.get(URL).status_code == 403
    assert owner_client.put(URL, {"email_on_approval": True}, format="json").status_code == 403
    staff.email = "staff@example.com"
    staff.save()
    assert staff_client.get(URL).json() == {
        "email_on_approval": False, "email": "staff@example.com"
    }
    answer = staff_client.put(URL, {"email_on_approval": True}, format="json")
    assert answer.status_code == 200, answer.content
    assert answer.json() == {"email_on_approval": True, "email": "staff@example.com"}
    assert NotificationPreference.objects.get(user=staff).email_on_approval is True
    assert staff_client.get(URL).json()["email_on_approval"] is True

    unknown = staff_client.put(URL, {"email_on_approval": True, "sms": True}, format="json")
    assert unknown.status_code == 400
    assert list(unknown.json()) == ["sms"]
    wrong = staff_client.put(URL, {"email_on_approval": "maybe"}, format="json")
    assert wrong.status_code == 400
    assert list(wrong.json()) == ["email_on_approval"]
    assert staff_client.put(URL, {}, format="json").status_code == 400
