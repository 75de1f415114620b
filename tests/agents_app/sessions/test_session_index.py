"""The Django index of sessions and approvals (agents_app.sessions.session_index) and the REST lists
that read it, without Dex: changes as the worker reports them, the approvals and decisions
lists, and the worker's observer on an event loop."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents_app.models import AgentSession, ApprovalDecision, ApprovalRequest
from agents_app.sessions.session_index import (
    SessionIndexObserver,
    approval_index_version,
    session_changes_apply,
    session_stopped_index,
)
from dex_agents import (
    AgentInterrupt,
    AgentSessionChange,
    AgentStatus,
    ClosedInterrupt,
    InterruptOutcome,
)
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

INTERRUPT_ID = "turn-1.call_1"
T0 = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.UTC)


@pytest.fixture
def session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        owner=owner, agent=AgentDefinitionFactory.create(slug="demo"), title="Post hello"
    )


def interrupt(deadline: datetime.datetime | None = None) -> AgentInterrupt:
    return AgentInterrupt(
        interrupt_id=INTERRUPT_ID, tool_call_id="call_1", tool_name="slack__post_message",
        arguments='{"channel": "general", "text": "hi"}', deadline=deadline, turn_id="turn-1",
    )


def change(
    session: AgentSession, at: datetime.datetime, status: AgentStatus | None, **extra: Any
) -> AgentSessionChange:
    return AgentSessionChange(
        flow_id=session.pk, observed_at=at, status=status, turn_id="turn-1", **extra
    )


def test_statuses_apply_in_observation_order(session: AgentSession) -> None:
    later = T0 + datetime.timedelta(seconds=1)
    session_changes_apply(changes=[change(session, later, AgentStatus.RUNNING_TOOLS)])
    # A notice observed earlier arrives late (another worker, a retry): it must not win.
    session_changes_apply(changes=[change(session, T0, AgentStatus.RUNNING_MODEL)])
    session.refresh_from_db()
    assert session.status == "running_tools"
    assert session.status_observed_at == later


def test_the_same_status_observed_again_keeps_updated_at(session: AgentSession) -> None:
    session_changes_apply(changes=[change(session, T0, AgentStatus.RUNNING_MODEL)])
    session.refresh_from_db()
    changed_at = session.updated_at
    later = T0 + datetime.timedelta(seconds=1)
    session_changes_apply(changes=[change(session, later, AgentStatus.RUNNING_MODEL)])
    session.refresh_from_db()
    assert (session.status_observed_at, session.updated_at) == (later, changed_at)
    # Another status moves it.
    session_changes_apply(changes=[change(session, later + later.resolution * 1000,
                                          AgentStatus.RUNNING_TOOLS)])
    session.refresh_from_db()
    assert session.updated_at > changed_at


def test_a_stopped_session_stays_stopped(session: AgentSession) -> None:
    session_stopped_index(session=session)
    session_changes_apply(
        changes=[change(session, timezone.now() + datetime.timedelta(hours=1),
                        AgentStatus.RUNNING_MODEL)]
    )
    session.refresh_from_db()
    assert session.status == "stopped"


def test_raised_then_closed_approvals_are_indexed_once(session: AgentSession) -> None:
    raised = change(session, T0, AgentStatus.RUNNING_TOOLS, raised=(interrupt(),))
    assert session_changes_apply(changes=[raised])
    assert not session_changes_apply(changes=[raised])  # a Step retry reports it again
    request = ApprovalRequest.objects.get()
    assert (request.state, request.tool_name, request.requested_at) == (
        "pending", "slack__post_message", T0
    )
    closed = change(
        session, T0 + datetime.timedelta(seconds=3), None,
        closed=(ClosedInterrupt(INTERRUPT_ID, InterruptOutcome.REJECTED, "not today"),),
    )
    assert session_changes_apply(changes=[closed])
    request.refresh_from_db()
    assert (request.state, request.outcome_message) == ("rejected", "not today")
    # The answer is final: a later report of another outcome does not rewrite it.
    expired = change(
        session, T0 + datetime.timedelta(seconds=4), None,
        closed=(ClosedInterrupt(INTERRUPT_ID, InterruptOutcome.EXPIRED, "late"),),
    )
    assert not session_changes_apply(changes=[expired])
    request.refresh_from_db()
    assert request.state == "rejected"


def test_changes_of_sessions_outside_the_index_are_ignored(db: None) -> None:
    stray = AgentSessionChange(
        flow_id="ses_unknown", observed_at=T0, status=AgentStatus.RUNNING_TOOLS, turn_id="turn-1",
        raised=(interrupt(),),
    )
    assert not session_changes_apply(changes=[stray])
    assert not ApprovalRequest.objects.exists()


def test_stopping_withdraws_pending_approvals_and_changes_the_version(
    session: AgentSession,
) -> None:
    session_changes_apply(
        changes=[change(session, T0, AgentStatus.RUNNING_TOOLS, raised=(interrupt(),))]
    )
    before = approval_index_version()
    assert session_stopped_index(session=session)
    request = ApprovalRequest.objects.get()
    assert request.state == "withdrawn"
    assert approval_index_version() != before


# --- REST lists from the index ------------------------------------------------------------------


def test_pending_list_shows_an_expired_deadline_as_expired(
    staff_client: APIClient, session: AgentSession
) -> None:
    past = timezone.now() - datetime.timedelta(seconds=5)
    session_changes_apply(
        changes=[change(session, T0, AgentStatus.RUNNING_TOOLS, raised=(interrupt(past),))]
    )
    [item] = staff_client.get("/api/v1/approvals/").json()
    assert item["state"] == "expired"
    assert item["session_title"] == "Post hello"
    assert item["agent"] == "demo"
    assert item["owner"] == "owner"
    assert item["arguments"] == '{"channel": "general", "text": "hi"}'


def test_decisions_list_names_who_decided(
    staff_client: APIClient, staff: Any, session: AgentSession, owner_client: APIClient
) -> None:
    session_changes_apply(
        changes=[change(session, T0, AgentStatus.RUNNING_TOOLS, raised=(interrupt(),))]
    )
    second = AgentInterrupt(
        interrupt_id="turn-2.call_1", tool_call_id="call_1", tool_name="docs__create_document",
        arguments="{}", deadline=None, turn_id="turn-2",
    )
    session_changes_apply(changes=[change(session, T0, None, raised=(second,))])
    decision = ApprovalDecision.objects.create(
        session=session, interrupt_id=INTERRUPT_ID, tool_call_id="call_1",
        tool_name="slack__post_message", arguments="{}", approved=True, decided_by=staff,
    )
    session_changes_apply(changes=[
        change(session, T0 + datetime.timedelta(seconds=1), None,
               closed=(ClosedInterrupt(INTERRUPT_ID, InterruptOutcome.APPROVED),)),
        change(session, T0 + datetime.timedelta(seconds=2), None,
               closed=(ClosedInterrupt("turn-2.call_1", InterruptOutcome.EXPIRED, "too late"),)),
    ])
    answer = staff_client.get("/api/v1/approvals/decisions/")
    assert answer.status_code == 200
    rows = answer.json()["results"]
    assert [(row["interrupt_id"], row["decision"], row["decided_by"], row["message"])
            for row in rows] == [
        ("turn-2.call_1", "expired", None, "too late"),
        (INTERRUPT_ID, "approved", "staff", ""),
    ]
    # When the person decided (not when the index closed it, later with outbox delivery);
    # an expired one has no decision, so its close time.
    decided_at = [datetime.datetime.fromisoformat(row["decided_at"]) for row in rows]
    assert decided_at == [
        ApprovalRequest.objects.get(interrupt_id="turn-2.call_1").closed_at, decision.decided_at,
    ]
    assert decision.decided_at != ApprovalRequest.objects.get(interrupt_id=INTERRUPT_ID).closed_at
    assert staff_client.get("/api/v1/approvals/").json() == []
    assert owner_client.get("/api/v1/approvals/decisions/").status_code == 403


def test_sessions_list_filters_awaiting_approval_and_staff_sees_everyone(
    staff_client: APIClient, owner_client: APIClient, session: AgentSession, other_user: Any
) -> None:
    foreign = AgentSessionFactory.create(owner=other_user, agent=session.agent, title="Other")
    session_changes_apply(
        changes=[change(session, T0, AgentStatus.RUNNING_TOOLS, raised=(interrupt(),))]
    )
    mine = owner_client.get("/api/v1/sessions/?status=awaiting_approval").json()["results"]
    assert [(row["id"], row["awaiting_approval"]) for row in mine] == [(session.pk, True)]
    everyone = staff_client.get("/api/v1/sessions/?ordering=title").json()["results"]
    assert [row["id"] for row in everyone] == [foreign.pk, session.pk]
    found = staff_client.get("/api/v1/sessions/?search=other").json()["results"]
    assert [row["owner"] for row in found] == ["other"]


# --- the worker's observer ----------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_observer_indexes_a_raised_approval_before_it_returns(owner: Any) -> None:
    from asgiref.sync import sync_to_async

    session = await sync_to_async(AgentSessionFactory.create)(
        owner=owner, agent=await sync_to_async(AgentDefinitionFactory.create)(slug="demo")
    )
    observer = SessionIndexObserver()
    try:
        await observer(change(session, T0, AgentStatus.RUNNING_MODEL))
        await observer(change(session, T0 + datetime.timedelta(seconds=1),
                              AgentStatus.RUNNING_TOOLS, raised=(interrupt(),)))
        # Awaited: the row exists as soon as the call returns, status included (FIFO).
        request = await ApprovalRequest.objects.aget(session_id=session.pk)
        assert request.state == "pending"
        refreshed = await AgentSession.objects.aget(pk=session.pk)
        assert refreshed.status == "running_tools"
        # Status-only changes return at once and are written in order behind them.
        await observer(change(session, T0 + datetime.timedelta(seconds=2),
                              AgentStatus.WAITING_FOR_USER_MESSAGE))
    finally:
        await asyncio.wait_for(observer.aclose(), timeout=10)
    refreshed = await AgentSession.objects.aget(pk=session.pk)
    assert refreshed.status == "waiting_for_user_message"
