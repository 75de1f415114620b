"""Cost and usage per model call against the real platform (issue 27): engine, dexworker, web
and the demo model as processes, LiteLLM calling the demo model over HTTP. The demo agent is
given its own prices so every call's cost is non-zero and exactly checkable from its tokens."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

#: USD per million tokens set on the demo agent.
INPUT_PRICE = Decimal("1.25")
OUTPUT_PRICE = Decimal("10")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("usage")) as platform:
        platform.django_shell(
            "import json; from agents_app.models import AgentDefinition as A; "
            f"A.objects.filter(slug='demo').update(input_price_per_mtok='{INPUT_PRICE}', "
            f"output_price_per_mtok='{OUTPUT_PRICE}'); print(json.dumps(1))"
        )
        yield platform


def expected_cost(usage: dict[str, Any]) -> Decimal:
    return (
        usage["input_tokens"] * INPUT_PRICE + usage["output_tokens"] * OUTPUT_PRICE
    ) / Decimal(1_000_000)


def finished_detail(client: httpx.Client, session_id: str) -> dict[str, Any] | None:
    detail: dict[str, Any] = client.get(f"/api/v1/sessions/{session_id}/").json()
    if detail["status"] != "waiting_for_user_message" or not detail["messages"]:
        return None
    return detail


def test_each_call_is_priced_and_summed_per_message_turn_session_and_user(stack: Stack) -> None:
    owner, other = stack.api("owner"), stack.api("other")
    query = json.dumps({"query": "durable agents"})
    created = owner.post("/api/v1/sessions/", json={
        "agent": "demo", "message": f"/tool search__web_search {query}"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    detail = wait_until("the turn to finish", lambda: finished_detail(owner, session_id),
                        timeout=60)

    # Two model calls (one asks for the tool, one answers): each assistant message carries
    # the usage of the call that produced it, priced at the agent's prices.
    assistants = [m for m in detail["messages"] if m["role"] == "assistant"]
    assert len(assistants) == 2, detail["messages"]
    for message in assistants:
        usage = message["usage"]
        assert usage["requests"] == 1
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        assert Decimal(usage["cost_usd"]) == expected_cost(usage) > 0
    assert all("usage" not in m for m in detail["messages"] if m["role"] != "assistant")

    # The session total is the sum of its calls, the cost exactly.
    total = detail["usage"]
    assert total["requests"] == 2
    for key in ("input_tokens", "output_tokens"):
        assert total[key] == sum(m["usage"][key] for m in assistants)
    assert Decimal(total["cost_usd"]) == sum(Decimal(m["usage"]["cost_usd"]) for m in assistants)

    # The list shows the session's cost from the Django rows the worker wrote.
    def listed() -> dict[str, Any] | None:
        rows = owner.get("/api/v1/sessions/", params={"limit": "200"}).json()["results"]
        row = next(row for row in rows if row["id"] == session_id)
        return row if row["usage"]["requests"] == 2 else None

    row = wait_until("the list to show both calls", listed, timeout=30)
    assert row["usage"]["cost_usd"] == total["cost_usd"]

    # GET /api/v1/usage/: the owner's own figures, per day and per agent.
    mine = owner.get("/api/v1/usage/").json()
    assert mine["totals"]["cost_usd"] == total["cost_usd"]
    assert mine["totals"]["input_tokens"] == total["input_tokens"]
    assert [a["agent"] for a in mine["agents"]] == ["demo"]
    assert mine["agents"][0]["cost_usd"] == total["cost_usd"]
    today = [day for day in mine["days"] if day["requests"]]
    assert len(today) == 1 and today[0]["day"] == mine["to"]
    assert today[0]["cost_usd"] == total["cost_usd"]

    # Another user's figures do not include the owner's calls.
    theirs = other.get("/api/v1/usage/").json()
    assert theirs["totals"]["requests"] == 0 and theirs["agents"] == []

    # A second turn adds to the same day and agent.
    sent = owner.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "thanks"})
    assert sent.status_code in (200, 201, 202), sent.text
    wait_until(
        "the second turn's call in the usage figures",
        lambda: owner.get("/api/v1/usage/").json()["totals"]["requests"] == 3 or None,
        timeout=60,
    )
    final = owner.get(f"/api/v1/sessions/{session_id}/").json()
    assert owner.get("/api/v1/usage/").json()["totals"]["cost_usd"] == final["usage"]["cost_usd"]


def test_a_spent_budget_stops_the_turn_after_its_call_and_holds_the_next_message(
    stack: Stack,
) -> None:
    # The small-context demo agent, so the other test's figures stay the demo agent's.
    stack.django_shell(
        "import json; from agents_app.models import AgentDefinition as A, Budget as B; "
        "a = A.objects.get(slug='demo-small'); "
        f"A.objects.filter(pk=a.pk).update(input_price_per_mtok='{INPUT_PRICE}', "
        f"output_price_per_mtok='{OUTPUT_PRICE}'); "
        "B.objects.create(agent=a, period='day', limit_usd='0.000001'); print(json.dumps(1))"
    )
    owner = stack.api("owner")
    query = json.dumps({"query": "budgets"})
    created = owner.post("/api/v1/sessions/", json={
        "agent": "demo-small", "message": f"/tool search__web_search {query}"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]

    def failed() -> dict[str, Any] | None:
        detail: dict[str, Any] = owner.get(f"/api/v1/sessions/{session_id}/").json()
        return detail if detail.get("last_turn_error") else None

    # The first call crossed the budget: the turn stopped right after it, its tool call
    # ended cancelled without running, and the note the user sees names the budget.
    detail = wait_until("the turn to stop at the budget", failed, timeout=60)
    assert detail["last_turn_error"].startswith("Budget reached: agent 'Demo agent, small")
    assert detail["usage"]["requests"] == 1
    assert Decimal(detail["usage"]["cost_usd"]) > Decimal("0.000001")
    note = detail["messages"][-1]
    assert note["notice"] == "turn_failed"
    assert note["text"].startswith("[Dex] Budget reached: agent 'Demo agent, small")
    assert "- search__web_search " in note["text"] and "-> cancelled: " in note["text"]
    assert not [m for m in detail["messages"] if m["role"] == "tool"]

    # The next message is kept in the queue with the reason, not started.
    sent = owner.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "more"})
    assert sent.status_code == 202, sent.text
    body = sent.json()
    assert (body["delivery"], body["pending_reason"]) == ("pending", "budget")
    assert body["pending_detail"].startswith("Budget reached:")
    queue = owner.get(f"/api/v1/sessions/{session_id}/queue/").json()
    assert [item["text"] for item in queue["queued"]] == ["more"]
    assert owner.get(f"/api/v1/sessions/{session_id}/").json()["usage"]["requests"] == 1


def test_a_first_message_sent_past_a_budget_waits_held_and_is_answered_once_raised(
    stack: Stack,
) -> None:
    # Staff's own daily budget of $0: spent before any call. Staff's figures are no other
    # test's; the budget is deleted again at the end.
    stack.django_shell(
        "import json; from django.contrib.auth import get_user_model; "
        "from agents_app.models import Budget as B; "
        "B.objects.create(user=get_user_model().objects.get(username='staff'), period='day', "
        "limit_usd='0'); print(json.dumps(1))"
    )
    staff = stack.api("staff")
    # Neither send blocks for its wait: no turn takes a held message before the budget allows
    # it (the client's timeout is far below the 60 s asked for).
    created = staff.post("/api/v1/sessions/", params={"wait": "60"}, timeout=30,
                         json={"agent": "demo", "message": "first while spent"})
    assert created.status_code == 201, created.text
    body = created.json()
    session_id = body["id"]
    held = body["first_message"]
    assert (held["delivery"], held["pending_reason"]) == ("pending", "budget")
    assert held["pending_detail"].startswith("Budget reached: your daily budget of $0")
    assert body["turn"]["finished"] is False and body["turn"]["turn_id"] is None
    # No turn started: nothing failed, and the message waits in the queue with the reason.
    assert body["status"] == "waiting_for_user_message"
    assert not body["session"]["last_turn_error"] and body["session"]["messages"] == []
    sent = staff.post(f"/api/v1/sessions/{session_id}/messages/", params={"wait": "60"},
                      timeout=30, json={"text": "second while spent"})
    assert sent.status_code == 202, sent.text
    assert sent.json()["pending_reason"] == "budget" and sent.json()["turn"]["finished"] is False
    queue = staff.get(f"/api/v1/sessions/{session_id}/queue/").json()
    assert [(item["text"], item["id"]) for item in queue["queued"]] == [
        ("first while spent", held["id"]), ("second while spent", sent.json()["id"])
    ]
    assert all(item["held_reason"].startswith("Budget reached:") for item in queue["queued"])
    sent_at = [item["created_at"] for item in queue["queued"]]
    # Steering a held message changes nothing and says why.
    steer = staff.post(f"/api/v1/sessions/{session_id}/queue/{held['id']}/steer/")
    assert steer.status_code == 409, steer.text
    assert steer.json()["reason"] == "budget"
    assert steer.json()["detail"].startswith("Budget reached:")

    # The administrator raises the budget: both messages are answered, in order, and each
    # keeps the time it was sent.
    stack.django_shell(
        "import json; from agents_app.models import Budget as B; "
        "b = B.objects.get(user__username='staff'); b.limit_usd = '100'; b.save(); "
        "print(json.dumps(1))"
    )

    def answered() -> dict[str, Any] | None:
        detail: dict[str, Any] = staff.get(f"/api/v1/sessions/{session_id}/").json()
        users = [m["text"] for m in detail["messages"] if m["role"] == "user"]
        done = (
            detail["status"] == "waiting_for_user_message"
            and len(users) == 2
            and not detail["queued_messages"]
            and detail["messages"][-1]["role"] == "assistant"
        )
        return detail if done else None

    detail = wait_until("both held messages to be answered", answered, timeout=90)
    assert not detail["last_turn_error"]
    users = [m for m in detail["messages"] if m["role"] == "user"]
    assert [m["text"] for m in users] == ["first while spent", "second while spent"]
    assert [datetime.datetime.fromisoformat(m["created_at"]) for m in users] == [
        datetime.datetime.fromisoformat(at) for at in sent_at
    ]
    stack.django_shell(
        "import json; from agents_app.models import Budget as B; "
        "B.objects.filter(user__username='staff').delete(); print(json.dumps(1))"
    )
