"""Approvals, the audit trail and stopping sessions: permissions and behaviour without a worker.

Each permission test names its persona (owner, another user, staff, anonymous). Dex is either
absent (a real refused connection, ``engine_down``) or the real embedded engine without a
worker (``engine``); the approve/reject round trip with a worker is in
``tests/e2e/test_approvals.py``.
"""

from typing import Any

import pytest
from django.db import IntegrityError
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from agents_app.gateway import dex_gateway, engine_connection
from agents_app.models import AgentSession, ApprovalDecision, ApprovalRequest
from agents_app.services.session_lifecycle import session_status_record
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

SESSION_ID = "ses_fffffffffffffffffffffffffffffff2"
INTERRUPT_ID = "turn-1.call_1"
INTERRUPT_URL = f"/api/v1/sessions/{SESSION_ID}/interrupts/{INTERRUPT_ID}/"
STOP_URL = f"/api/v1/sessions/{SESSION_ID}/stop/"
APPROVE = {"approved": True}


@pytest.fixture
def owned_session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo"),
        status="running_tools",
    )


def decision_for(session: AgentSession, user: Any, **fields: Any) -> ApprovalDecision:
    values: dict[str, Any] = {
        "session": session, "interrupt_id": INTERRUPT_ID, "tool_call_id": "call_1",
        "tool_name": "slack__post_message", "arguments": '{"channel": "general"}',
        "approved": True, "decided_by": user,
    }
    return ApprovalDecision.objects.create(**{**values, **fields})


# --- who may call what -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [("get", "/api/v1/approvals/"), ("post", INTERRUPT_URL), ("post", STOP_URL)],
)
def test_anonymous_gets_401(
    anonymous_client: APIClient, owned_session: AgentSession, method: str, path: str
) -> None:
    response = getattr(anonymous_client, method)(path, APPROVE, format="json")
    assert response.status_code == 401


@pytest.mark.parametrize("persona", ["owner_client", "other_client"])
def test_non_staff_cannot_list_approvals(
    persona: str, owned_session: AgentSession, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(persona)
    assert client.get("/api/v1/approvals/").status_code == 403


@pytest.mark.parametrize("persona", ["owner_client", "other_client"])
def test_non_staff_cannot_resolve_even_their_own_session(
    persona: str, owned_session: AgentSession, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(persona)
    for body in (APPROVE, {"approved": False, "rejection_message": "no"}):
        response = client.post(INTERRUPT_URL, body, format="json")
        assert response.status_code == 403
    assert not ApprovalDecision.objects.exists()


def test_staff_resolving_an_unknown_session_gets_404(staff_client: APIClient) -> None:
    response = staff_client.post(INTERRUPT_URL, APPROVE, format="json")
    assert response.status_code == 404


def test_staff_must_say_approved_or_not(
    staff_client: APIClient, owned_session: AgentSession
) -> None:
    response = staff_client.post(INTERRUPT_URL, {"rejection_message": "x"}, format="json")
    assert response.status_code == 400
    assert "approved" in response.json()


def test_a_decided_interrupt_answers_409_without_asking_dex(
    staff_client: APIClient, staff: Any, owned_session: AgentSession, engine_down: str
) -> None:
    recorded = decision_for(owned_session, staff, approved=False, rejection_message="No.")
    response = staff_client.post(INTERRUPT_URL, APPROVE, format="json")
    assert response.status_code == 409
    # The 409 says what was decided, by whom and when.
    assert response.json() == {
        "detail": f"Already rejected by staff at {recorded.decided_at:%Y-%m-%d %H:%M:%S} UTC.",
        "decision": {
            "approved": False,
            "decided_by": "staff",
            "decided_at": recorded.decided_at.isoformat().replace("+00:00", "Z"),
            "rejection_message": "No.",
            "edited_arguments": None,
            "delivery": "delivered",
        },
    }
    assert ApprovalDecision.objects.count() == 1


def test_a_decision_while_the_engine_is_down_is_recorded_and_listed_as_decided(
    staff_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    ApprovalRequest.objects.create(
        session=owned_session, interrupt_id=INTERRUPT_ID, tool_call_id="call_1",
        tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
    )
    response = staff_client.post(INTERRUPT_URL, APPROVE, format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["resolved"], body["delivery"]) == (False, "pending")
    assert {key: body["decision"][key] for key in ("approved", "decided_by", "delivery")} == {
        "approved": True, "decided_by": "staff", "delivery": "pending",
    }
    decision = ApprovalDecision.objects.get()
    assert (decision.approved, decision.delivery, decision.attempts) == (True, "pending", 1)
    assert engine_down in decision.last_error
    # The dashboard's list shows it decided, waiting for delivery; the index still waits.
    listed = staff_client.get("/api/v1/approvals/").json()
    assert [(item["state"], item["decision"]["approved"], item["decision"]["delivery"])
            for item in listed] == [("decided", True, "pending")]
    assert ApprovalRequest.objects.get().state == "pending"
    # Deciding again answers 409 with the recorded decision.
    again = staff_client.post(INTERRUPT_URL, {"approved": False}, format="json")
    assert again.status_code == 409
    assert again.json()["decision"] == body["decision"]


def test_resolving_without_an_engine_is_503_and_writes_nothing(
    staff_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    response = staff_client.post(INTERRUPT_URL, APPROVE, format="json")
    assert response.status_code == 503
    assert not ApprovalDecision.objects.exists()


def test_staff_list_is_empty_without_open_sessions(
    staff_client: APIClient, owner: Any, engine_down: str
) -> None:
    AgentSessionFactory.create(owner=owner, status="stopped")
    response = staff_client.get("/api/v1/approvals/")
    assert response.status_code == 200
    assert response.json() == []


def test_staff_list_reads_the_index_without_an_engine(
    staff_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    ApprovalRequest.objects.create(
        session=owned_session, interrupt_id=INTERRUPT_ID, tool_call_id="call_1",
        tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
    )
    response = staff_client.get("/api/v1/approvals/")
    assert response.status_code == 200
    assert [item["interrupt_id"] for item in response.json()] == [INTERRUPT_ID]


def test_other_user_cannot_stop_a_session(
    other_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    assert other_client.post(STOP_URL).status_code == 404
    owned_session.refresh_from_db()
    assert owned_session.status == "running_tools"


@pytest.mark.parametrize("persona", ["owner_client", "staff_client"])
def test_stopping_without_an_engine_is_503_and_keeps_the_status(
    persona: str, owned_session: AgentSession, engine_down: str, request: pytest.FixtureRequest
) -> None:
    client: APIClient = request.getfixturevalue(persona)
    assert client.post(STOP_URL).status_code == 503
    owned_session.refresh_from_db()
    assert owned_session.status == "running_tools"


# --- with the real engine (no worker) ----------------------------------------------------


@pytest.mark.parametrize("persona", ["owner_client", "staff_client"])
def test_owner_or_staff_stop_the_dex_flow(
    persona: str, owner: Any, engine: str, request: pytest.FixtureRequest
) -> None:
    from agents_app.services.session_lifecycle import session_create

    session = session_create(owner=owner, agent=AgentDefinitionFactory.create(slug="demo"))
    client: APIClient = request.getfixturevalue(persona)
    response = client.post(f"/api/v1/sessions/{session.id}/stop/")
    assert response.status_code == 202, response.content
    assert response.json() == {"status": "stopped"}
    session.refresh_from_db()
    assert session.status == "stopped"

    async def describe() -> Any:
        return await engine_connection.connection().client.describe_flow(session.id)

    from dex import FlowStatus

    assert dex_gateway.run(describe()).status == FlowStatus.CANCELED
    # Stopping again is harmless.
    assert client.post(f"/api/v1/sessions/{session.id}/stop/").status_code == 202


# --- index row, audit trail, admin -------------------------------------------------------


def test_a_stopped_row_is_not_reopened_by_a_later_snapshot(owned_session: AgentSession) -> None:
    owned_session.status = "stopped"
    owned_session.save()
    session_status_record(
        session=owned_session, status="waiting_for_user_message", observed_at=timezone.now()
    )
    owned_session.refresh_from_db()
    assert owned_session.status == "stopped"


def test_one_decision_per_interrupt(owned_session: AgentSession, staff: Any) -> None:
    decision_for(owned_session, staff)
    with pytest.raises(IntegrityError):
        decision_for(owned_session, staff, approved=False)


def test_audit_trail_is_read_only_in_admin(
    superuser: Any, staff: Any, owned_session: AgentSession
) -> None:
    decision = decision_for(owned_session, staff)
    client = Client()
    client.force_login(superuser)
    listing = client.get(reverse("admin:agents_app_approvaldecision_changelist"))
    assert listing.status_code == 200
    assert "slack__post_message" in listing.content.decode()
    assert client.get(reverse("admin:agents_app_approvaldecision_add")).status_code == 403
    delete_url = reverse("admin:agents_app_approvaldecision_delete", args=[decision.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert ApprovalDecision.objects.filter(pk=decision.pk).exists()


def test_sessions_cannot_be_deleted_in_admin(superuser: Any, owned_session: AgentSession) -> None:
    client = Client()
    client.force_login(superuser)
    delete_url = reverse("admin:agents_app_agentsession_delete", args=[owned_session.pk])
    assert client.post(delete_url, {"post": "yes"}).status_code == 403
    assert AgentSession.objects.filter(pk=owned_session.pk).exists()


def test_a_message_to_a_stopped_session_is_a_409(
    owned_session: AgentSession, owner_client: APIClient
) -> None:
    owned_session.status = "stopped"
    owned_session.save()
    answer = owner_client.post(f"/api/v1/sessions/{SESSION_ID}/messages/", {"text": "hello?"},
                               format="json")
    assert answer.status_code == 409
    assert "stopped" in answer.json()["detail"]


def test_an_expired_interrupt_answers_409_and_says_so_without_asking_dex(
    staff_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    ApprovalRequest.objects.create(
        session=owned_session, interrupt_id=INTERRUPT_ID, tool_call_id="call_1",
        tool_name="slack__post_message", requested_at=timezone.now(), state="expired",
    )
    response = staff_client.post(INTERRUPT_URL, APPROVE, format="json")
    assert response.status_code == 409
    assert response.json() == {
        "detail": "This tool call expired: its approval deadline passed.",
        "decision": None,
    }
