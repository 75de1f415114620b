"""Subagents on the platform (issue 29): the snapshot, the offered tools, the child's index row."""

from __future__ import annotations

from typing import Any

import pytest

from agents_app.models import SESSION_STATUS_STARTING, AgentSession, AgentSubagent
from agents_app.services.subagents import PlatformSubagents, subagent_session_index
from agents_app.worker.agent_config import AgentModelConfig
from dex_agents import (
    SubagentRefusedError,
    SubagentRequest,
    SubagentTask,
    subagent_tool_parameters,
)
from tests.factories import AgentDefinitionFactory, AgentSessionFactory, UserFactory

pytestmark = pytest.mark.django_db


def _request(parent: AgentSession, tool_name: str, **overrides: object) -> SubagentRequest:
    values: dict[str, object] = {
        "parent_session_id": parent.pk,
        "child_session_id": f"SubFlow:{parent.pk}-CallSubagent-1-0",
        "tool_call_id": "call-1",
        "turn_id": "turn-1",
        "tool_name": tool_name,
        "task": SubagentTask("Find the invoice"),
        "agent_config": parent.agent.agent_config(),
        "depth": 1,
    }
    values.update(overrides)
    return SubagentRequest(**values)  # type: ignore[arg-type]


def test_the_snapshot_lists_enabled_subagents_and_the_model_is_offered_their_tools() -> None:
    parent = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper", description="Looks things up.")
    off = AgentDefinitionFactory.create(slug="off", enabled=False)
    AgentSubagent.objects.create(parent=parent, child=helper, position=1)
    AgentSubagent.objects.create(parent=parent, child=off, position=2)
    writer = AgentDefinitionFactory.create(slug="writer")
    AgentSubagent.objects.create(parent=parent, child=writer, description="Drafts text.")

    config = parent.agent_config()

    assert config["subagents"] == [
        {"slug": "writer", "name": "agent__writer", "description": "Drafts text."},
        {"slug": "helper", "name": "agent__helper", "description": "Looks things up."},
    ]
    offered = {entry.name: entry for entry in AgentModelConfig.parse(config).tools}
    assert offered["agent__helper"].parameters == subagent_tool_parameters()
    assert offered["agent__helper"].subagent
    assert "agent__off" not in offered
    assert "subagents" not in helper.agent_config()
    directory = PlatformSubagents()
    assert directory.is_subagent_tool(config, "agent__helper")
    assert not directory.is_subagent_tool(config, "agent__off")
    assert not directory.is_subagent_tool(helper.agent_config(), "agent__helper")


def test_child_start_indexes_the_child_for_the_parents_owner_once() -> None:
    lead = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper")
    AgentSubagent.objects.create(parent=lead, child=helper)
    parent = AgentSessionFactory.create(agent=lead)
    request = _request(parent, "agent__helper")

    start = subagent_session_index(request=request)
    again = subagent_session_index(request=request)

    assert start.agent_config is not None and start.agent_config["agent"] == "helper"
    assert start.agent_config["owner_id"] == str(parent.owner_id)
    assert again.agent_config == start.agent_config
    child = AgentSession.objects.get(pk=request.child_session_id)
    assert (child.owner_id, child.agent_id, child.parent_id) == (
        parent.owner_id, helper.pk, parent.pk
    )
    assert child.parent_tool_call_id == "call-1"
    assert child.status == SESSION_STATUS_STARTING
    assert child.title == "Find the invoice"
    assert list(parent.children.all()) == [child]


def test_child_start_refuses_an_agent_the_parent_may_not_call() -> None:
    lead = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper")
    AgentSubagent.objects.create(parent=lead, child=helper)
    parent = AgentSessionFactory.create(agent=lead)

    with pytest.raises(SubagentRefusedError, match="not an agent this one may call"):
        subagent_session_index(request=_request(parent, "agent__stranger"))
    snapshot = lead.agent_config()  # the running session's, taken before the agent was disabled
    helper.enabled = False
    helper.save()
    with pytest.raises(SubagentRefusedError, match="not available"):
        subagent_session_index(
            request=_request(parent, "agent__helper", agent_config=snapshot)
        )
    assert not AgentSession.objects.filter(parent=parent).exists()


def test_a_childs_chat_page_links_its_parent_for_those_who_may_read_it(client: Any) -> None:
    lead = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper")
    parent = AgentSessionFactory.create(agent=lead, title="Plan the trip")
    child = AgentSessionFactory.create(
        id=f"SubFlow:{parent.pk}-CallSubagent-1-0",
        agent=helper,
        owner=parent.owner,
        parent=parent,
        parent_tool_call_id="call_1",
    )
    client.force_login(parent.owner)

    page = client.get(f"/sessions/{child.pk}/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "Subagent of" in html and "Plan the trip" in html
    assert f"/sessions/{parent.pk}/#call-call_1" in html
    assert "Subagent of" not in client.get(f"/sessions/{parent.pk}/").content.decode()


def test_the_sessions_list_gives_a_sessions_children_to_those_who_may_read_them(
    client: Any,
) -> None:
    lead = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper")
    parent = AgentSessionFactory.create(agent=lead)
    child = AgentSessionFactory.create(
        id=f"SubFlow:{parent.pk}-CallSubagent-1-0", agent=helper, owner=parent.owner,
        parent=parent, parent_tool_call_id="call_1",
    )
    AgentSessionFactory.create(agent=helper, owner=parent.owner)  # not a child
    other = AgentSessionFactory.create(agent=lead)
    AgentSessionFactory.create(
        id=f"SubFlow:{other.pk}-CallSubagent-1-0", agent=helper, owner=other.owner,
        parent=other, parent_tool_call_id="call_1",
    )
    client.force_login(parent.owner)

    listed = client.get("/api/v1/sessions/", {"parent": parent.pk})
    strangers = client.get("/api/v1/sessions/", {"parent": other.pk})

    assert listed.status_code == 200, listed.content
    rows = listed.json()["results"] if isinstance(listed.json(), dict) else listed.json()
    assert [(row["id"], row["parent_session"], row["parent_tool_call_id"]) for row in rows] == [
        (child.pk, parent.pk, "call_1")
    ]
    assert strangers.status_code == 200
    assert (strangers.json()["results"] if isinstance(strangers.json(), dict)
            else strangers.json()) == []


def test_admin_edits_an_agents_subagents_inline(client: Any) -> None:
    admin = UserFactory.create(is_staff=True, is_superuser=True)
    lead = AgentDefinitionFactory.create(slug="lead")
    helper = AgentDefinitionFactory.create(slug="helper")
    AgentSubagent.objects.create(parent=lead, child=helper, description="Looks things up.")
    client.force_login(admin)

    page = client.get(f"/admin/agents_app/agentdefinition/{lead.pk}/change/")

    assert page.status_code == 200
    html = page.content.decode()
    assert "subagents (offered to the model as agent__&lt;slug&gt; tools)" in html.lower()
    assert "Looks things up." in html
