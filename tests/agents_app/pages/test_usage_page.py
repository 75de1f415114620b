"""The usage page (``/usage/``, issue 27) with Django's test client: who sees whose figures,
and bad dates. Its charts are checked in Chromium (tests/e2e/test_usage_browser.py)."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents_app.sessions.session_index import session_changes_apply
from dex_agents import AgentSessionChange, AgentStatus, AgentUsage
from tests.factories import AgentSessionFactory

pytestmark = pytest.mark.django_db


def record(session: Any, call_id: str, cost: str) -> None:
    session_changes_apply(changes=[AgentSessionChange(
        flow_id=session.pk, observed_at=timezone.now(), status=AgentStatus.RUNNING_TOOLS,
        turn_id="turn-1", usage=AgentUsage(input_tokens=3, output_tokens=2, requests=1,
                                           cost_usd=cost),
        model_call_id=call_id,
    )])


def page_for(user: Any, query: str = "") -> Any:
    client = Client()
    client.force_login(user)
    return client.get(f"/usage/{query}")


def test_owners_see_their_own_figures_and_staff_everyones(
    owner: Any, other_user: Any, staff: Any
) -> None:
    record(AgentSessionFactory.create(owner=owner), "a", "0.5")
    record(AgentSessionFactory.create(owner=other_user), "b", "0.25")

    mine = page_for(owner)
    assert mine.status_code == 200
    assert mine.context["usage"].summary["totals"]["cost_usd"] == "0.5"
    assert mine.context["usage"].users == []
    assert b"Cost per user" not in mine.content

    everyone = page_for(staff)
    assert everyone.context["usage"].summary["totals"]["cost_usd"] == "0.75"
    assert [row["owner"] for row in everyone.context["usage"].users] == ["owner", "other"]
    assert b"Cost per user" in everyone.content


def test_anonymous_visitors_are_sent_to_log_in(db: None) -> None:
    answer = Client().get("/usage/")
    assert answer.status_code == 302 and "/accounts/login/" in answer["Location"]


def test_bad_dates_answer_400_with_their_message(owner: Any) -> None:
    answer = page_for(owner, "?from=2026-12-31&to=2026-01-01")
    assert answer.status_code == 400
    assert b'id="usage-from-error"' in answer.content
    # The message is for people: no Markdown backticks around the field's name.
    assert b"Must not be after the last day (to)." in answer.content
    assert b"`" not in answer.content.split(b'id="usage-from-error"')[1].split(b"</p>")[0]
    assert len(answer.context["usage"].summary["days"]) == 30
