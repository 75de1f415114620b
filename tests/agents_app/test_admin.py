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
