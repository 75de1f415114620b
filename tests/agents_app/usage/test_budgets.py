"""Budgets (issue 27) without a worker: which budget applies to whom, what a spent one says,
and that a message to a session past a budget is kept in the queue, never sent to Dex (the
engine is absent: ``engine_down``, so a delivery attempt would say so instead). A turn stopped
by a budget runs against the real stack in tests/e2e/test_budgets.py."""

from __future__ import annotations

import datetime
import re
from decimal import Decimal
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from agents_app.models import AgentSession, Budget, OutboxMessage
from agents_app.sessions.outbox import DeliveryDeferred, outbox_session_deliver
from agents_app.sessions.session_index import session_changes_apply
from agents_app.usage.budgets import BUDGET_REFUSAL_PREFIX, budget_refusal
from dex_agents import AgentSessionChange, AgentStatus, AgentUsage
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

TODAY = datetime.date(2026, 12, 5)


def spend(session: AgentSession, call_id: str, cost: str, day: datetime.date = TODAY) -> None:
    at = datetime.datetime.combine(day, datetime.time(12), tzinfo=datetime.UTC)
    session_changes_apply(changes=[AgentSessionChange(
        flow_id=session.pk, observed_at=at, status=AgentStatus.RUNNING_TOOLS, turn_id="turn-1",
        usage=AgentUsage(input_tokens=1, output_tokens=1, requests=1, cost_usd=cost),
        model_call_id=call_id,
    )])


@pytest.fixture
def session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        owner=owner, agent=AgentDefinitionFactory.create(slug="demo", name="Demo agent"),
        status="waiting_for_user_message",
    )


def test_a_users_daily_budget_counts_their_calls_of_that_day_only(
    session: AgentSession, owner: Any, other_user: Any
) -> None:
    Budget.objects.create(user=owner, period="day", limit_usd=Decimal("1"))
    spend(session, "yesterday", "5", TODAY - datetime.timedelta(days=1))
    spend(session, "a", "0.6")
    assert budget_refusal(owner_id=owner.pk, agent_id=session.agent_id, today=TODAY) is None
    spend(session, "b", "0.4")
    refusal = budget_refusal(owner_id=owner.pk, agent_id=session.agent_id, today=TODAY)
    assert refusal is not None and refusal.startswith(BUDGET_REFUSAL_PREFIX)
    assert "your daily budget of $1.00 is spent ($1.00 used)" in refusal
    assert "midnight UTC" in refusal
    # Another user of the same agent is not limited by the owner's budget.
    assert budget_refusal(owner_id=other_user.pk, agent_id=session.agent_id, today=TODAY) is None


def test_an_agents_monthly_budget_counts_every_users_calls(
    session: AgentSession, other_user: Any
) -> None:
    Budget.objects.create(agent=session.agent, period="month", limit_usd=Decimal("2"))
    theirs = AgentSessionFactory.create(owner=other_user, agent=session.agent)
    spend(session, "a", "1", TODAY.replace(day=1))
    spend(theirs, "b", "1")
    spend(theirs, "last-month", "9", TODAY.replace(day=1) - datetime.timedelta(days=1))
    refusal = budget_refusal(owner_id=other_user.pk, agent_slug="demo", today=TODAY)
    assert refusal is not None and "agent 'Demo agent''s monthly budget of $2.00" in refusal
    other_agent = AgentDefinitionFactory.create(slug="other")
    assert budget_refusal(owner_id=other_user.pk, agent_id=other_agent.pk, today=TODAY) is None
    # A disabled budget limits nothing.
    Budget.objects.update(enabled=False)
    assert budget_refusal(owner_id=other_user.pk, agent_slug="demo", today=TODAY) is None


def test_a_budget_is_for_a_user_or_an_agent(owner: Any) -> None:
    agent = AgentDefinitionFactory.create()
    for fields in ({}, {"user": owner, "agent": agent}):
        with pytest.raises(ValidationError):
            Budget(period="day", limit_usd=1, **fields).full_clean()


def test_a_message_past_a_budget_waits_in_the_queue_with_the_reason(
    session: AgentSession, owner: Any, owner_client: Any, engine_down: str
) -> None:
    Budget.objects.create(user=owner, period="day", limit_usd=Decimal("0"))
    answer = owner_client.post(f"/api/v1/sessions/{session.pk}/messages/", {"text": "hello"},
                               format="json")
    assert answer.status_code == 202, answer.content
    body = answer.json()
    assert (body["delivery"], body["pending_reason"]) == ("pending", "budget")
    assert body["pending_detail"].startswith(BUDGET_REFUSAL_PREFIX)
    kept = OutboxMessage.objects.get(pk=body["id"])
    # Refused before Dex was asked: the note is the budget's, not the absent engine's.
    assert kept.delivery == "pending" and kept.last_error == body["pending_detail"]
    assert engine_down not in kept.last_error


def test_usage_on_another_day_does_not_hold_todays_messages(
    session: AgentSession, owner: Any
) -> None:
    Budget.objects.create(user=owner, period="day", limit_usd=Decimal("1"))
    spend(session, "old", "3", timezone.now().date() - datetime.timedelta(days=2))
    assert budget_refusal(owner_id=owner.pk, agent_id=session.agent_id) is None


def held_message(client: Any, session: AgentSession, text: str) -> OutboxMessage:
    answer = client.post(f"/api/v1/sessions/{session.pk}/messages/", {"text": text},
                         format="json")
    assert answer.status_code == 202, answer.content
    assert answer.json()["pending_reason"] == "budget"
    return OutboxMessage.objects.get(pk=answer.json()["id"])


@pytest.mark.parametrize("change", ["raise", "delete"])
def test_raising_or_deleting_the_budget_delivers_the_held_message_at_once(
    session: AgentSession, owner: Any, owner_client: Any, engine_down: str,
    django_capture_on_commit_callbacks: Any, change: str,
) -> None:
    budget = Budget.objects.create(user=owner, period="day", limit_usd=Decimal("0"))
    kept = held_message(owner_client, session, "hello")
    with django_capture_on_commit_callbacks() as queued:
        if change == "raise":
            budget.limit_usd = Decimal("5")
            budget.save()
        else:
            budget.delete()
    # The change queued one delivery of the session's messages; run it as the task does: it
    # passes the budget and asks the engine (absent here: the message stays pending).
    assert len(queued) == 1
    with pytest.raises(DeliveryDeferred, match=re.escape(engine_down)):
        outbox_session_deliver(session_id=session.pk)
    kept.refresh_from_db()
    assert kept.delivery == "pending" and engine_down in kept.last_error


def test_a_budget_change_leaves_other_users_held_messages_alone(
    session: AgentSession, owner: Any, owner_client: Any, other_user: Any,
    engine_down: str, django_capture_on_commit_callbacks: Any,
) -> None:
    Budget.objects.create(user=owner, period="day", limit_usd=Decimal("0"))
    kept = held_message(owner_client, session, "hello")
    with django_capture_on_commit_callbacks() as queued:
        Budget.objects.create(user=other_user, period="month", limit_usd=Decimal("9"))
    assert queued == []
    kept.refresh_from_db()
    assert kept.last_error.startswith(BUDGET_REFUSAL_PREFIX) and kept.attempts == 1


def test_the_sweep_passes_a_held_session_and_delivers_it_the_next_day(
    session: AgentSession, owner: Any, owner_client: Any, other_user: Any,
    token_client: Any, engine_down: str,
) -> None:
    from agents_app.models import UsageRecord
    from agents_app.sessions.outbox import outbox_deliver_all

    Budget.objects.create(user=owner, period="day", limit_usd=Decimal("1"))
    spend(session, "today", "2", timezone.now().date())
    held = held_message(owner_client, session, "held")
    other = AgentSessionFactory.create(owner=other_user, agent=session.agent,
                                       status="waiting_for_user_message")
    free = OutboxMessage.objects.create(session=other, text="free")

    outbox_deliver_all()
    held.refresh_from_db()
    free.refresh_from_db()
    # The held session did not stop the sweep: the other one was tried (the engine is absent).
    assert held.last_error.startswith(BUDGET_REFUSAL_PREFIX)
    assert free.attempts == 1 and not free.last_error.startswith(BUDGET_REFUSAL_PREFIX)

    # A new UTC day: yesterday's spending no longer holds the message; the sweep tries it.
    UsageRecord.objects.update(day=timezone.now().date() - datetime.timedelta(days=1))
    outbox_deliver_all()
    held.refresh_from_db()
    assert held.delivery == "pending" and not held.last_error.startswith(BUDGET_REFUSAL_PREFIX)
