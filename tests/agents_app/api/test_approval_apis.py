"""The approvals inbox endpoints (``agents_app.api.approvals``) without a worker: decisions
list with filters, approve with edits (schema checks and the audit), the lost race's 409, bulk.

Each permission test names its persona. Dex is absent (``engine_down``, a real refused
connection): a decision on an indexed call is then recorded and kept for delivery (202), which
is enough to see what is audited. The edited call running through a real MCP tool is in
``tests/e2e/test_approvals.py``.
"""

import datetime
import json
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents_app.api.approvals import EDITS_NEED_APPROVAL, REJECTION_MESSAGE_MAX_CHARS
from agents_app.models import AgentSession, ApprovalDecision, ApprovalRequest
from mcp_registry.models import McpTool
from tests.factories import (
    AgentDefinitionFactory,
    AgentSessionFactory,
    McpServerFactory,
    McpToolFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

DECISIONS_URL = "/api/v1/approvals/decisions/"
PENDING_URL = "/api/v1/approvals/"
BULK_URL = "/api/v1/approvals/bulk/"
TOOL_NAME = "notes__write_note"
SCHEMA = {
    "type": "object",
    "properties": {"title": {"type": "string", "maxLength": 20}, "count": {"type": "integer"}},
    "required": ["title"],
    "additionalProperties": False,
}


@pytest.fixture
def session(owner: Any) -> AgentSession:
    agent = AgentDefinitionFactory.create(slug="demo")
    tool = McpToolFactory.create(
        server=McpServerFactory.create(name="notes"), name="write_note", input_schema=SCHEMA
    )
    agent.tools.add(tool)
    assert tool.exposed_name == TOOL_NAME
    return AgentSessionFactory.create(
        id="ses_fffffffffffffffffffffffffffffff5", owner=owner, agent=agent,
        title="Notes", status="running_tools",
    )


def pending_call(session: AgentSession, call: str = "call_1", **fields: Any) -> ApprovalRequest:
    values: dict[str, Any] = {
        "session": session, "interrupt_id": f"turn-1.{call}", "tool_call_id": call,
        "tool_name": TOOL_NAME, "arguments": '{"title": "draft"}',
        "requested_at": timezone.now(),
    }
    return ApprovalRequest.objects.create(**{**values, **fields})


def interrupt_url(request: ApprovalRequest) -> str:
    return f"/api/v1/sessions/{request.session_id}/interrupts/{request.interrupt_id}/"


# --- who may call what -------------------------------------------------------------------


@pytest.mark.parametrize(("method", "path"), [("get", DECISIONS_URL), ("post", BULK_URL)])
def test_anonymous_gets_401(
    anonymous_client: APIClient, session: AgentSession, method: str, path: str
) -> None:
    assert getattr(anonymous_client, method)(path, {}, format="json").status_code == 401


@pytest.mark.parametrize("persona", ["owner_client", "other_client"])
def test_non_staff_get_403_even_for_their_own_sessions(
    persona: str, session: AgentSession, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(persona)
    call = pending_call(session)
    assert client.get(DECISIONS_URL).status_code == 403
    body = {"items": [{"session": session.id, "interrupt_id": call.interrupt_id}],
            "approved": True}
    assert client.post(BULK_URL, body, format="json").status_code == 403
    edit = {"approved": True, "edited_arguments": {"title": "x"}}
    assert client.post(interrupt_url(call), edit, format="json").status_code == 403
    assert not ApprovalDecision.objects.exists()


# --- approve with edits -----------------------------------------------------------------


def test_edited_arguments_are_audited_next_to_the_models(
    staff_client: APIClient, session: AgentSession, engine_down: str
) -> None:
    call = pending_call(session)
    response = staff_client.post(
        interrupt_url(call),
        {"approved": True, "edited_arguments": {"title": "final", "count": 2}},
        format="json",
    )
    assert response.status_code == 202, response.content
    assert response.json()["decision"]["edited_arguments"] == '{"title":"final","count":2}'
    decision = ApprovalDecision.objects.get()
    assert decision.arguments == '{"title": "draft"}'
    assert decision.edited_arguments == '{"title":"final","count":2}'
    # The pending list shows the decision waiting for delivery with its edit.
    listed = staff_client.get(PENDING_URL).json()
    assert listed[0]["decision"]["edited_arguments"] == '{"title":"final","count":2}'


@pytest.mark.parametrize(
    ("edited", "messages"),
    [
        ({"count": 1}, ["'title' is a required property"]),
        ({"title": 5}, ["title: 5 is not of type 'string'"]),
        (
            {"title": "x" * 21, "extra": True},
            [
                "Additional properties are not allowed ('extra' was unexpected)",
                f"title: '{'x' * 21}' is too long",
            ],
        ),
        ([1, 2], ['Expected a dictionary of items but got type "list".']),
    ],
)
def test_edits_the_schema_refuses_are_400_with_field_messages(
    staff_client: APIClient,
    session: AgentSession,
    engine_down: str,
    edited: Any,
    messages: list[str],
) -> None:
    call = pending_call(session)
    response = staff_client.post(
        interrupt_url(call), {"approved": True, "edited_arguments": edited}, format="json"
    )
    assert response.status_code == 400
    assert response.json() == {"edited_arguments": messages}
    assert not ApprovalDecision.objects.exists()


def test_an_unchanged_edit_is_no_edit_and_a_rejection_with_edits_is_400(
    staff_client: APIClient, session: AgentSession, engine_down: str
) -> None:
    same, rejected = pending_call(session, "call_1"), pending_call(session, "call_2")
    staff_client.post(
        interrupt_url(same), {"approved": True, "edited_arguments": {"title": "draft"}},
        format="json",
    )
    for edits in ({"title": "final"}, {}):
        refused = staff_client.post(
            interrupt_url(rejected),
            {"approved": False, "rejection_message": "No.", "edited_arguments": edits},
            format="json",
        )
        assert refused.status_code == 400, refused.content
        assert refused.json() == {"edited_arguments": [EDITS_NEED_APPROVAL]}
    assert "approved true" in EDITS_NEED_APPROVAL
    assert sorted(ApprovalDecision.objects.values_list("tool_call_id", "edited_arguments")) == [
        ("call_1", ""),
    ]


@pytest.mark.parametrize(
    ("schema", "edited", "messages"),
    [
        # Named nowhere and the schema is silent on other properties: refused.
        (
            {"type": "object", "properties": {"title": {"type": "string"}}},
            {"title": "a", "titel": "b", "count": 1},
            [
                "count: the tool's input schema has no such property",
                "titel: the tool's input schema has no such property",
            ],
        ),
        # The schema says other properties are welcome, or names none: allowed.
        (
            {"type": "object", "properties": {"title": {}}, "additionalProperties": True},
            {"title": "a", "extra": 1},
            [],
        ),
        ({"type": "object"}, {"anything": 1}, []),
    ],
)
def test_edits_with_properties_the_schema_does_not_name_are_400(
    staff_client: APIClient,
    session: AgentSession,
    engine_down: str,
    schema: dict[str, Any],
    edited: dict[str, Any],
    messages: list[str],
) -> None:
    McpTool.objects.filter(name="write_note").update(input_schema=schema)
    call = pending_call(session)
    response = staff_client.post(
        interrupt_url(call), {"approved": True, "edited_arguments": edited}, format="json"
    )
    if messages:
        assert response.status_code == 400, response.content
        assert response.json() == {"edited_arguments": messages}
        assert not ApprovalDecision.objects.exists()
    else:
        assert response.status_code == 202, response.content
        assert json.loads(ApprovalDecision.objects.get().edited_arguments) == edited


# --- the race ------------------------------------------------------------------------------


def test_the_reviewer_who_lost_the_race_is_told_who_won_and_when(
    staff_client: APIClient, session: AgentSession, engine_down: str, token_client: Any
) -> None:
    call = pending_call(session)
    alice = UserFactory.create(username="alice", is_staff=True)
    first = token_client(alice).post(interrupt_url(call), {"approved": True}, format="json")
    assert first.status_code == 202
    decided_at = ApprovalDecision.objects.get().decided_at
    lost = staff_client.post(
        interrupt_url(call), {"approved": False, "rejection_message": "No."}, format="json"
    )
    assert lost.status_code == 409
    body = lost.json()
    assert body["detail"] == (
        f"Already approved by alice at {decided_at.astimezone(datetime.UTC):%Y-%m-%d %H:%M:%S} UTC."
    )
    assert (body["decision"]["decided_by"], body["decision"]["approved"]) == ("alice", True)
    assert ApprovalDecision.objects.count() == 1


# --- bulk ----------------------------------------------------------------------------------


def test_a_rejection_message_past_2000_characters_is_400_single_and_bulk(
    staff_client: APIClient, session: AgentSession, engine_down: str
) -> None:
    assert REJECTION_MESSAGE_MAX_CHARS == 2_000
    too_long = "\u00e9" * 2_001  # characters, not bytes
    call = pending_call(session)
    single = staff_client.post(
        interrupt_url(call), {"approved": False, "rejection_message": too_long}, format="json"
    )
    assert single.status_code == 400
    assert single.json() == {
        "rejection_message": ["Ensure this field has no more than 2000 characters."]
    }
    bulk = staff_client.post(BULK_URL, {
        "items": [{"session": session.id, "interrupt_id": call.interrupt_id}],
        "approved": False, "rejection_message": too_long,
    }, format="json")
    assert bulk.status_code == 400
    assert list(bulk.json()) == ["rejection_message"]
    assert not ApprovalDecision.objects.exists()
    # At the limit it is taken (kept for delivery while the engine is away).
    kept = staff_client.post(
        interrupt_url(call), {"approved": False, "rejection_message": too_long[:-1]},
        format="json",
    )
    assert kept.status_code == 202, kept.content
    assert ApprovalDecision.objects.get().rejection_message == too_long[:-1]


def test_bulk_decides_each_call_and_reports_each(
    staff_client: APIClient, staff: Any, session: AgentSession, engine_down: str
) -> None:
    first, second, taken = (pending_call(session, f"call_{n}") for n in (1, 2, 3))
    ApprovalDecision.objects.create(
        session=session, interrupt_id=taken.interrupt_id, tool_call_id="call_3",
        tool_name=TOOL_NAME, arguments="{}", approved=True,
        decided_by=UserFactory.create(username="alice", is_staff=True),
    )
    items = [
        {"session": session.id, "interrupt_id": call.interrupt_id}
        for call in (first, second, taken)
    ] + [{"session": session.id, "interrupt_id": "turn-9.nope"}]
    response = staff_client.post(
        BULK_URL,
        {"items": items, "approved": False, "rejection_message": "Not today."},
        format="json",
    )
    assert response.status_code == 200, response.content
    results = response.json()["results"]
    assert [(item["interrupt_id"], item["status"]) for item in results] == [
        ("turn-1.call_1", 202), ("turn-1.call_2", 202), ("turn-1.call_3", 409),
        # Neither the index nor the (unreachable) engine knows it.
        ("turn-9.nope", 503),
    ]
    assert results[2]["detail"].startswith("Already approved by alice at ")
    assert results[0]["decision"]["rejection_message"] == "Not today."
    mine = ApprovalDecision.objects.filter(decided_by=staff)
    assert sorted(mine.values_list("tool_call_id", "approved")) == [
        ("call_1", False), ("call_2", False),
    ]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"items": [], "approved": True}, "items"),
        ({"items": [{"session": "s"}], "approved": True}, "items"),
        ({"items": [{"session": "s", "interrupt_id": "i"}]}, "approved"),
        ({"items": [{"session": "s", "interrupt_id": "i"}] * 101, "approved": True}, "items"),
    ],
)
def test_bulk_bad_input_is_400(
    staff_client: APIClient, session: AgentSession, body: dict[str, Any], field: str
) -> None:
    response = staff_client.post(BULK_URL, body, format="json")
    assert response.status_code == 400
    assert field in response.json()


# --- the decisions list and filters ---------------------------------------------------------


def test_decisions_show_what_was_decided_and_filter(
    staff_client: APIClient, staff: Any, session: AgentSession, owner: Any
) -> None:
    edited = pending_call(session, "call_1", state="approved", closed_at=timezone.now())
    ApprovalDecision.objects.create(
        session=session, interrupt_id=edited.interrupt_id, tool_call_id="call_1",
        tool_name=TOOL_NAME, arguments=edited.arguments, edited_arguments='{"title":"final"}',
        approved=True, decided_by=staff,
    )
    other = AgentSessionFactory.create(
        owner=UserFactory.create(username="bob"),
        agent=AgentDefinitionFactory.create(slug="helper"),
    )
    pending_call(
        other, "call_9", tool_name="mail__send", state="rejected",
        outcome_message="Wrong address.", closed_at=timezone.now(),
    )
    response = staff_client.get(DECISIONS_URL)
    assert response.status_code == 200
    body = response.json()
    assert body["count"] == 2
    row = next(item for item in body["results"] if item["tool_call_id"] == "call_1")
    assert {key: row[key] for key in (
        "tool_name", "arguments", "edited_arguments", "decision", "decided_by", "owner", "agent",
    )} == {
        "tool_name": TOOL_NAME, "arguments": '{"title": "draft"}',
        "edited_arguments": '{"title":"final"}', "decision": "approved", "decided_by": "staff",
        "owner": "owner", "agent": "demo",
    }
    for query, expected in [
        ("agent=helper", ["call_9"]),
        (f"tool={TOOL_NAME}", ["call_1"]),
        ("owner=bob", ["call_9"]),
        (f"session={session.id}", ["call_1"]),
        ("decision=rejected", ["call_9"]),
        ("owner=nobody", []),
        # Case is ignored in names (as Django admin's filters do), not in session IDs.
        ("owner=BOB&agent=Helper&tool=Mail__Send", ["call_9"]),
        ("owner=bo", []),
        (f"session={session.id.upper()}", []),
    ]:
        page = staff_client.get(f"{DECISIONS_URL}?{query}").json()
        assert [item["tool_call_id"] for item in page["results"]] == expected, query
    assert staff_client.get(f"{DECISIONS_URL}?decision=pending").status_code == 400


def test_pending_list_filters(
    staff_client: APIClient, session: AgentSession, engine_down: str
) -> None:
    pending_call(session, "call_1")
    other = AgentSessionFactory.create(
        owner=UserFactory.create(username="bob"),
        agent=AgentDefinitionFactory.create(slug="helper"),
    )
    pending_call(other, "call_2", tool_name="mail__send")
    for query, expected in [
        ("", ["call_1", "call_2"]),
        ("agent=demo", ["call_1"]),
        ("tool=mail__send", ["call_2"]),
        ("owner=bob&agent=helper", ["call_2"]),
        (f"session={session.id}", ["call_1"]),
        # Case is ignored in names, but a filter still names a whole value.
        ("owner=BOB", ["call_2"]),
        ("agent=DEMO", ["call_1"]),
        ("tool=MAIL__SEND", ["call_2"]),
        ("tool=mail", []),
    ]:
        listed = staff_client.get(f"{PENDING_URL}?{query}").json()
        assert [item["tool_call_id"] for item in listed] == expected, query
    assert staff_client.get(f"{PENDING_URL}?owner={'x' * 151}").status_code == 400
