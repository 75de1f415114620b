"""Django admin lists agent definitions and the session index for a superuser."""

from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db


def logged_in(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_superuser_sees_agent_definitions_with_their_model(superuser: Any) -> None:
    AgentDefinitionFactory.create(slug="triage", model="anthropic/claude-sonnet-4-5")
    page = logged_in(superuser).get(reverse("admin:agents_app_agentdefinition_changelist"))
    assert page.status_code == 200
    assert "triage" in page.content.decode()
    assert "anthropic/claude-sonnet-4-5" in page.content.decode()


def test_session_index_is_read_only_in_admin(superuser: Any, owner: Any) -> None:
    session = AgentSessionFactory.create(owner=owner, agent=AgentDefinitionFactory.create())
    client = logged_in(superuser)
    listing = client.get(reverse("admin:agents_app_agentsession_changelist"))
    assert session.id in listing.content.decode()
    assert client.get(reverse("admin:agents_app_agentsession_add")).status_code == 403


@pytest.mark.parametrize("persona", ["owner", "anonymous"])
def test_non_staff_cannot_open_the_agent_admin(persona: str, owner: Any) -> None:
    client = logged_in(owner) if persona == "owner" else Client()
    page = client.get(reverse("admin:agents_app_agentdefinition_changelist"))
    assert page.status_code == 302
    assert "/admin/login/" in page["Location"]


def test_approval_deadlines_are_set_per_agent_and_per_tool_in_admin(superuser: Any) -> None:
    from tests.factories import McpToolFactory

    agent = AgentDefinitionFactory.create(slug="triage")
    tool = McpToolFactory.create(annotations={"destructiveHint": True})
    agent.tools.add(tool)
    client = logged_in(superuser)
    page = client.get(reverse("admin:agents_app_agentdefinition_change", args=[agent.pk]))
    assert 'name="approval_deadline_seconds"' in page.content.decode()
    page = client.get(reverse("admin:mcp_registry_mcptool_change", args=[tool.pk]))
    assert 'name="approval_deadline_override"' in page.content.decode()
    changed = client.post(
        reverse("admin:mcp_registry_mcptool_change", args=[tool.pk]),
        {"enabled": "on", "approval_deadline_override": "0"},
    )
    assert changed.status_code == 200  # the form comes back with an error, nothing saved
    assert "greater than or equal to 1" in changed.content.decode()
    agent.approval_deadline_seconds = 600
    agent.save()
    [config] = agent.agent_config()["tools"]
    assert config["approval_deadline_seconds"] == 600


def test_the_approvals_index_is_read_only_in_admin(superuser: Any, owner: Any) -> None:
    from django.utils import timezone

    from agents_app.models import ApprovalRequest

    session = AgentSessionFactory.create(owner=owner, agent=AgentDefinitionFactory.create())
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.call_1", tool_call_id="call_1",
        tool_name="slack__post_message", requested_at=timezone.now(),
    )
    client = logged_in(superuser)
    listing = client.get(reverse("admin:agents_app_approvalrequest_changelist"))
    assert "slack__post_message" in listing.content.decode()
    assert client.get(reverse("admin:agents_app_approvalrequest_add")).status_code == 403


def test_a_webhook_secret_is_shown_once_and_a_private_url_refused(superuser: Any) -> None:
    """Admin generates the signing secret, shows it in the message after saving only, and
    refuses a URL that points at a loopback address (DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE off)."""
    from agents_app.models import Webhook

    client = logged_in(superuser)
    add = reverse("admin:agents_app_webhook_add")
    refused = client.post(add, {"name": "internal", "url": "http://127.0.0.1:8000/hook",
                                "events": ["turn.completed"], "active": "on"})
    assert refused.status_code == 200
    assert "public addresses only" in refused.content.decode()
    assert not Webhook.objects.exists()

    saved = client.post(add, {"name": "public", "url": "https://93.184.215.14/hook",
                              "events": ["turn.completed", "turn.failed"], "active": "on"},
                        follow=True)
    webhook = Webhook.objects.get()
    assert webhook.secret.startswith("whsec_") and len(webhook.secret) > 30
    assert webhook.events == ["turn.completed", "turn.failed"]
    assert webhook.secret in saved.content.decode()
    change = client.get(reverse("admin:agents_app_webhook_change", args=[webhook.pk]))
    assert webhook.secret not in change.content.decode()
    assert webhook.secret_hint in change.content.decode()
    listing = client.get(reverse("admin:agents_app_webhook_changelist"))
    assert webhook.secret not in listing.content.decode()
    # The delivery log is read-only.
    assert client.get(reverse("admin:agents_app_webhookdelivery_add")).status_code == 403


def test_a_webhook_that_sent_events_is_deleted_with_its_read_only_delivery_log(
    superuser: Any,
) -> None:
    """The delivery log is read-only, yet it does not keep admin from deleting its webhook
    (one by one or with the bulk action); the webhook's deliveries go with it."""
    from agents_app.models import Webhook, WebhookDelivery

    client = logged_in(superuser)
    for how in ("delete view", "bulk action"):
        webhook = Webhook.objects.create(name=how, url="https://93.184.215.14/hook",
                                         secret="whsec_test", events=["turn.completed"])
        WebhookDelivery.objects.create(webhook=webhook, event="ping", event_id="evt_1",
                                       key=f"ping:{webhook.pk}", payload="{}")
        if how == "delete view":
            url = reverse("admin:agents_app_webhook_delete", args=[webhook.pk])
            asked = client.get(url).content.decode()
            assert "permission" not in asked and "Are you sure you want to delete" in asked
            done = client.post(url, {"post": "yes"}, follow=True)
        else:
            done = client.post(reverse("admin:agents_app_webhook_changelist"), {
                "action": "delete_selected", "_selected_action": [webhook.pk], "post": "yes",
            }, follow=True)
        assert done.status_code == 200
        assert "deleted successfully" in done.content.decode() or (
            "Successfully deleted 1 webhook" in done.content.decode()
        ), done.content.decode()[:2000]
        assert not Webhook.objects.filter(pk=webhook.pk).exists()
        assert not WebhookDelivery.objects.filter(webhook_id=webhook.pk).exists()
    # Still read-only row by row.
    assert client.get(reverse("admin:agents_app_webhookdelivery_add")).status_code == 403


def test_admin_creates_a_schedule_for_the_owner_it_picks_and_validates_it(
    superuser: Any, owner: Any, other_user: Any, engine_down: str
) -> None:
    from agents_app.models import Schedule, ScheduleRun, ScheduleRunOutcome

    agent = AgentDefinitionFactory.create(slug="demo")
    client = logged_in(superuser)
    form = {
        "owner": owner.pk, "agent": agent.pk, "name": "nightly", "message": "Go {scheduled_for}",
        "cron": "0 2 * * *", "interval_seconds": "", "timezone": "UTC",
        "target": "new_session", "session": "", "enabled": "on",
        "missed_run_policy": "skip",
        "runs-TOTAL_FORMS": "0", "runs-INITIAL_FORMS": "0",
    }
    bad = client.post(reverse("admin:agents_app_schedule_add"), {**form, "cron": "0 2 * *"})
    assert bad.status_code == 200
    assert "A cron expression has 5 fields" in bad.content.decode()
    assert not Schedule.objects.exists()
    done = client.post(reverse("admin:agents_app_schedule_add"), form)
    assert done.status_code == 302, done.content.decode()[:2000]
    schedule = Schedule.objects.get()
    assert (schedule.owner, schedule.generation, schedule.enabled) == (owner, 1, True)
    moved = client.post(reverse("admin:agents_app_schedule_change", args=[schedule.pk]),
                        {**form, "owner": other_user.pk})
    assert moved.status_code == 302, moved.content.decode()[:2000]
    schedule.refresh_from_db()
    assert (schedule.owner, schedule.generation) == (other_user, 2)
    session = AgentSessionFactory.create(owner=owner, agent=agent)
    ScheduleRun.objects.create(schedule=schedule, slot="2026-01-01T02:00:00Z",
                               outcome=ScheduleRunOutcome.MESSAGE_SENT, session=session)
    page = client.get(reverse("admin:agents_app_schedule_change", args=[schedule.pk]))
    assert reverse("admin:agents_app_agentsession_change", args=[session.id]) in (
        page.content.decode())
