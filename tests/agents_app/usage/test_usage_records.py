"""Cost and usage (issue 27) without Dex: pricing a call (agents_app.usage.pricing), the usage rows
the worker's changes write (agents_app.usage.usage_records), their sums, and ``GET /api/v1/usage/``
for each persona."""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

import pytest
from django.utils import timezone

from agents_app.models import UsageRecord
from agents_app.sessions.session_index import session_changes_apply
from agents_app.usage.pricing import call_cost
from agents_app.usage.usage_records import usage_summary
from agents_app.worker.agent_config import AgentConfigError, AgentModelConfig
from dex_agents import AgentSessionChange, AgentStatus, AgentUsage, usd_text
from tests.factories import AgentDefinitionFactory, AgentSessionFactory


def priced_change(
    session: Any, call_id: str, usage: AgentUsage, at: datetime.datetime | None = None
) -> AgentSessionChange:
    return AgentSessionChange(
        flow_id=session.pk,
        observed_at=at or timezone.now(),
        status=AgentStatus.WAITING_FOR_USER_MESSAGE,
        turn_id="turn-1",
        usage=usage,
        model_call_id=call_id,
    )


def test_usage_sums_its_cost_exactly_as_a_decimal_string() -> None:
    total = AgentUsage(input_tokens=1, requests=1, cost_usd="0.1") + AgentUsage(
        output_tokens=2, requests=1, cost_usd="0.2"
    )
    assert (total.cost_usd, total.requests) == ("0.3", 2)  # 0.1 + 0.2 as floats is not 0.3
    assert usd_text(Decimal("3E-7")) == "0.0000003"
    assert usd_text(Decimal("1.500")) == "1.5"


def test_an_agents_own_prices_replace_the_cost_map() -> None:
    usage = AgentUsage(input_tokens=1200, output_tokens=300, requests=1)
    cost = call_cost(
        usage, model="gpt-4o-mini", input_price_per_mtok=Decimal("1.25"),
        output_price_per_mtok=Decimal("10"),
    )
    assert cost == Decimal("0.0045")  # 1200 * 1.25e-6 + 300 * 10e-6


def test_the_local_cost_map_prices_known_models_and_unknown_ones_cost_zero() -> None:
    usage = AgentUsage(input_tokens=1_000_000, output_tokens=1_000_000, requests=1)
    known = call_cost(
        usage, model="gpt-4o-mini", input_price_per_mtok=None, output_price_per_mtok=None
    )
    assert known == Decimal("0.75")  # LiteLLM's bundled map: 0.15 + 0.60 per million
    unknown = call_cost(
        usage, model="openai/dexagents-demo", input_price_per_mtok=None,
        output_price_per_mtok=None,
    )
    assert unknown == 0


def test_a_bad_price_in_the_agent_config_fails_the_step() -> None:
    with pytest.raises(AgentConfigError, match="input_price_per_mtok"):
        AgentModelConfig.parse({"model": "openai/x", "input_price_per_mtok": "-1"})
    with pytest.raises(AgentConfigError, match="output_price_per_mtok"):
        AgentModelConfig.parse({"model": "openai/x", "output_price_per_mtok": "cheap"})


@pytest.mark.django_db
def test_agent_config_carries_the_prices_as_decimal_strings() -> None:
    agent = AgentDefinitionFactory.create(input_price_per_mtok=Decimal("1.25"))
    config = agent.agent_config()
    assert (config["input_price_per_mtok"], config["output_price_per_mtok"]) == ("1.25", None)
    parsed = AgentModelConfig.parse(config)
    assert (parsed.input_price_per_mtok, parsed.output_price_per_mtok) == (Decimal("1.25"), None)
    assert "input_price_per_mtok" not in AgentDefinitionFactory.create().agent_config()


@pytest.mark.django_db
def test_a_retried_model_call_step_is_counted_once(owner: Any) -> None:
    session = AgentSessionFactory.create(owner=owner)
    first = AgentUsage(input_tokens=10, output_tokens=2, requests=1, cost_usd="0.001")
    retried = AgentUsage(input_tokens=11, output_tokens=3, requests=1, cost_usd="0.002")
    session_changes_apply(changes=[priced_change(session, "step-1", first)])
    session_changes_apply(changes=[priced_change(session, "step-1", retried)])
    session_changes_apply(changes=[priced_change(session, "step-2", first)])
    rows = UsageRecord.objects.filter(session=session).order_by("model_call_id")
    assert [(r.model_call_id, r.input_tokens, r.cost_usd) for r in rows] == [
        ("step-1", 11, Decimal("0.002")), ("step-2", 10, Decimal("0.001"))]
    assert {(r.owner_id, r.agent_id, r.turn_id) for r in rows} == {
        (owner.pk, session.agent_id, "turn-1")}


@pytest.mark.django_db
def test_sums_per_day_and_per_agent(owner: Any, other_user: Any) -> None:
    cheap, dear = AgentDefinitionFactory.create(slug="cheap"), AgentDefinitionFactory.create(
        slug="dear")
    mine_cheap = AgentSessionFactory.create(owner=owner, agent=cheap)
    mine_dear = AgentSessionFactory.create(owner=owner, agent=dear)
    theirs = AgentSessionFactory.create(owner=other_user, agent=dear)
    day1 = datetime.datetime(2026, 11, 30, 23, 59, tzinfo=datetime.UTC)
    day2 = day1 + datetime.timedelta(minutes=2)
    call = AgentUsage(input_tokens=5, output_tokens=1, requests=1, cost_usd="0.25")
    session_changes_apply(changes=[
        priced_change(mine_cheap, "a", call, day1),
        priced_change(mine_dear, "b", call + call, day2),
        priced_change(theirs, "c", call, day2),
    ])
    summary = usage_summary(
        owner_id=owner.pk, date_from=day1.date(), date_to=day2.date()
    )
    assert summary["totals"]["cost_usd"] == "0.75"
    assert [(d["day"], d["cost_usd"], d["requests"]) for d in summary["days"]] == [
        ("2026-11-30", "0.25", 1), ("2026-12-01", "0.5", 2)]
    assert [(a["agent"], a["cost_usd"]) for a in summary["agents"]] == [
        ("dear", "0.5"), ("cheap", "0.25")]
    everyone = usage_summary(owner_id=None, date_from=day1.date(), date_to=day2.date())
    assert everyone["totals"]["cost_usd"] == "1"


@pytest.mark.django_db
def test_usage_api_answers_each_persona_with_their_own_figures(
    owner: Any, other_user: Any, owner_client: Any, other_client: Any, staff_client: Any,
    anonymous_client: Any,
) -> None:
    session = AgentSessionFactory.create(owner=owner)
    call = AgentUsage(input_tokens=7, output_tokens=3, requests=1, cost_usd="0.0042")
    session_changes_apply(changes=[priced_change(session, "s1", call)])

    mine = owner_client.get("/api/v1/usage/")
    assert mine.status_code == 200, mine.content
    body = mine.json()
    assert body["totals"] == {**call.as_dict()}
    assert len(body["days"]) == 30 and body["days"][-1]["day"] == body["to"]
    assert body["agents"][0]["cost_usd"] == "0.0042"
    for client in (other_client, staff_client):
        theirs = client.get("/api/v1/usage/").json()
        assert theirs["totals"]["requests"] == 0 and theirs["agents"] == []

    assert anonymous_client.get("/api/v1/usage/").status_code == 401
    # The list of the owner's sessions shows the session's cost.
    listed = owner_client.get("/api/v1/sessions/").json()["results"]
    assert listed[0]["usage"] == {
        "input_tokens": 7, "output_tokens": 3, "requests": 1, "cost_usd": "0.0042"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01"}, "to"),
        ({"to": ""}, "to"),
        ({"from": "2026-12-02", "to": "2026-12-01"}, "from"),
        ({"from": "2024-01-01", "to": "2026-12-01"}, "from"),
    ],
)
def test_usage_api_refuses_bad_dates_with_field_messages(
    owner_client: Any, query: dict[str, str], field: str
) -> None:
    answer = owner_client.get("/api/v1/usage/", query)
    assert answer.status_code == 400, answer.content
    assert field in answer.json(), answer.json()
