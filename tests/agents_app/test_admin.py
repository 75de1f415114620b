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
