"""Spending limits per user and per agent, per UTC day or month (issue 27 "Budgets").

``budget_refusal`` answers whether a budget that applies to a user's calls with an agent is
spent, summing the ``UsageRecord`` rows the worker writes as each model call ends
(``agents_app.usage.usage_records``). Two places ask it:

- the outbox, before it delivers a message (``outbox.outbox_message_deliver``): a message
  that would start a turn past a budget stays pending in the session's queue, with the
  refusal as its reason, and goes once the budget allows it again (the periodic delivery
  sweep retries it the next UTC day or month; when an administrator saves or deletes a
  budget, ``signals.budget_changed`` queues the delivery of the messages it may have held at once);
- the session Flow, after each model call that requested tool calls (``flow._turn_guard``,
  ``AgentSessionOptions.turn_guard``): the call that crossed a budget stops its turn before
  its tool calls run (they end ``cancelled``), with the refusal as the turn's note and
  ``last_turn_error``; and the runner before each model call (``runner.LiteLLMRunner``,
  ``budget_check``), for a budget another session spent meanwhile.

A budget is "spent" when the period's cost is at or above its limit, so a limit of 0 stops
every call. The call that crosses a limit is never cut short: costs are known only after it.
"""

from __future__ import annotations

import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Q, Sum
from django.utils import timezone

from agents_app.models import Budget, UsageRecord
from agents_app.usage.usage_records import usd_display

#: How every refusal starts.
BUDGET_REFUSAL_PREFIX = "Budget reached:"


def period_start(period: str, today: datetime.date) -> datetime.date:
    """The first UTC day of the ``period`` (``day`` or ``month``) that holds ``today``."""
    return today if period == Budget.Period.DAY else today.replace(day=1)


def budget_refusal(
    *,
    owner_id: Any,
    agent_id: Any = None,
    agent_slug: str = "",
    today: datetime.date | None = None,
) -> str | None:
    """Why a call for ``owner_id`` with the agent (by ID or slug) may not be made now, or
    ``None`` when no enabled budget that applies is spent.

    Returns:
        A sentence for people, starting with ``BUDGET_REFUSAL_PREFIX``: which budget, its
        limit, what was spent and when it resets.
    """
    day = today or timezone.now().astimezone(datetime.UTC).date()
    agent_match = Q(agent_id=agent_id) if agent_id is not None else Q(agent__slug=agent_slug)
    applies = agent_match & Q(agent__isnull=False)
    if owner_id is not None:
        applies |= Q(user_id=owner_id)
    budgets = (
        Budget.objects.filter(enabled=True)
        .filter(applies)
        .select_related("agent")
        .order_by("period", "pk")
    )
    for budget in budgets:
        start = period_start(budget.period, day)
        rows = UsageRecord.objects.filter(day__gte=start, day__lte=day)
        rows = rows.filter(owner_id=owner_id) if budget.user_id else rows.filter(
            agent_id=budget.agent_id
        )
        spent = rows.aggregate(total=Sum("cost_usd"))["total"] or Decimal(0)
        if spent >= budget.limit_usd:
            return _refusal_text(budget, spent)
    return None


def _refusal_text(budget: Budget, spent: Decimal) -> str:
    whom = "your" if budget.user_id else f"agent {budget.agent.name!r}'s" if budget.agent else ""
    period, resets = (
        ("daily", "midnight UTC") if budget.period == Budget.Period.DAY
        else ("monthly", "the start of next month (UTC)")
    )
    return (
        f"{BUDGET_REFUSAL_PREFIX} {whom} {period} budget of {usd_display(str(budget.limit_usd))} "
        f"is spent ({usd_display(str(spent))} used). Messages wait in the queue until "
        f"{resets} or until an administrator raises the budget."
    )
