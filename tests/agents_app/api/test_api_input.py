"""Input the OpenAPI schema calls invalid is refused with 400 (or 415), never accepted.

Each case here was accepted before schemathesis (tests/e2e/test_api_contract.py) reported it:
DRF converts form fields, numbers and strings between types and ignores a bad page size.
The engine is down in every test (``engine_down``): a request that got past validation would
answer 503, not 400.
"""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents_app.models import AgentSession
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

SESSION_ID = "ses_" + "a" * 32
MESSAGES = f"/api/v1/sessions/{SESSION_ID}/messages/"


@pytest.fixture
def owned_session(owner: Any, engine_down: str) -> AgentSession:
    return AgentSessionFactory.create(
        id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo")
    )


def test_form_bodies_are_unsupported(owner_client: APIClient, owned_session: Any) -> None:
    response = owner_client.post(MESSAGES, {"text": "hi", "plan_mode": "0"}, format="multipart")
    assert response.status_code == 415
    assert response.json()["detail"].startswith("Unsupported media type")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"text": "hi", "plan_mode": 0}, "plan_mode"),
        ({"text": "hi", "plan_mode": "true"}, "plan_mode"),
        ({"text": 5}, "text"),
        ({"text": "   "}, "text"),
        ({"text": "a\x00b"}, "text"),
    ],
)
def test_message_fields_take_their_json_type(
    owner_client: APIClient, owned_session: Any, body: dict[str, Any], field: str
) -> None:
    response = owner_client.post(MESSAGES, body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]


def test_plan_revision_is_a_number(owner_client: APIClient, owned_session: Any) -> None:
    response = owner_client.post(
        f"/api/v1/sessions/{SESSION_ID}/plan/execute/", {"revision": "1"}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"revision": ["A valid integer is required."]}


def test_approval_decision_is_a_boolean(staff_client: APIClient, owned_session: Any) -> None:
    response = staff_client.post(
        f"/api/v1/sessions/{SESSION_ID}/interrupts/turn-1.call_1/",
        {"approved": "yes"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json() == {"approved": ["Must be a valid boolean."]}


def test_session_tools_are_strings(owner_client: APIClient, engine_down: str) -> None:
    AgentDefinitionFactory.create(slug="demo")
    response = owner_client.post(
        "/api/v1/sessions/", {"agent": "demo", "tools": [True]}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"tools": {"0": ["Not a valid string."]}}


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("limit=abc", "limit"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=", "limit"),
        ("offset=-1", "offset"),
        ("offset=null", "offset"),
    ],
)
def test_list_paging_is_checked(owner_client: APIClient, query: str, field: str) -> None:
    response = owner_client.get(f"/api/v1/agents/?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [field]


def test_valid_paging_still_pages(owner_client: APIClient) -> None:
    AgentDefinitionFactory.create(slug="first")
    AgentDefinitionFactory.create(slug="second")
    page = owner_client.get("/api/v1/agents/?limit=1&offset=1").json()
    assert page["count"] == 2
    assert len(page["results"]) == 1


def test_session_list_ordering_is_checked(owner_client: APIClient, owned_session: Any) -> None:
    response = owner_client.get("/api/v1/sessions/?ordering=bogus")
    assert response.status_code == 400
    assert list(response.json()) == ["ordering"]
    listed = owner_client.get("/api/v1/sessions/?ordering=-title&status=&search=")
    assert listed.status_code == 200
    assert [row["id"] for row in listed.json()["results"]] == [SESSION_ID]


@pytest.mark.parametrize("query", ["before=", "limit=", "before=x", "limit=201"])
def test_message_page_query_is_checked(
    owner_client: APIClient, owned_session: Any, query: str
) -> None:
    response = owner_client.get(f"{MESSAGES}?{query}")
    assert response.status_code == 400
    assert list(response.json()) == [query.split("=", 1)[0]]


ELICITATION = f"/api/v1/sessions/{SESSION_ID}/elicitations/turn-1.call_1.0123456789abcdef/"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "action"),
        ({"action": "maybe"}, "action"),
        ({"action": 1}, "action"),
        ({"action": "accept", "content": ["Ada"]}, "content"),
        ({"action": "accept", "content": "Ada"}, "content"),
    ],
)
def test_an_elicitation_answer_is_an_action_and_an_object(
    owner_client: APIClient, owned_session: Any, body: dict[str, Any], field: str
) -> None:
    response = owner_client.post(ELICITATION, body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == [field]


def test_only_the_owner_answers_an_mcp_servers_question(
    owned_session: Any, staff_client: APIClient, other_client: APIClient,
    anonymous_client: APIClient, owner_client: APIClient,
) -> None:
    """Checked before Dex is asked: the engine is down, so an allowed request answers 503."""
    body = {"action": "decline"}
    assert anonymous_client.post(ELICITATION, body, format="json").status_code == 401
    assert other_client.post(ELICITATION, body, format="json").status_code == 404
    refused = staff_client.post(ELICITATION, body, format="json")
    assert refused.status_code == 403, refused.content
    assert owner_client.post(ELICITATION, body, format="json").status_code == 503
