"""Per-call usage and cost rows, and their sums per session, agent, user and day (issue 27).

Writes come from the Dex worker: ``session_index.session_changes_apply`` hands each
``AgentSessionChange`` that carries a model call's priced usage to :func:`usage_record_apply`,
an upsert keyed by session and the RunModel Step execution ID (``model_call_id``), so a retried
Step leaves one row, the committed attempt's. Dex keeps each session's own totals
(``snapshot.usage``); Django sums across sessions here, without copying any conversation.

Reads (selectors) return plain dicts whose money is a decimal string in US dollars
(``"0.000125"``, ``dex_agents.usd_text``) and whose days are UTC dates.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.db.models import OuterRef, QuerySet, Subquery, Sum
from django.db.models.functions import Coalesce

from agents_app.models import UsageRecord
from dex_agents import AgentSessionChange, usd_text

#: The counters every sum carries, besides ``cost_usd``.
USAGE_COUNTERS = (
    "input_tokens",
    "output_tokens",
    "reasoning_tokens",
    "cached_input_tokens",
    "requests",
)


# --- writes ------------------------------------------------------------------------------------


def usage_record_apply(*, change: AgentSessionChange, owner_id: int, agent_id: int) -> bool:
    """Store the model call ``change`` reports for its session (owner and agent given by the
    caller, from the session index).

    Returns:
        False when ``change`` carries no usage, else True (the row was created or, for a
        retried Step, overwritten with the later attempt's figures).
    """
    usage = change.usage
    if usage is None or not change.model_call_id:
        return False
    recorded_at = change.observed_at
    UsageRecord.objects.update_or_create(
        session_id=change.flow_id,
        model_call_id=change.model_call_id,
        defaults={
            "owner_id": owner_id,
            "agent_id": agent_id,
            "turn_id": change.turn_id or "",
            "input_tokens": usage.input_tokens,
            "output_tokens": usage.output_tokens,
            "reasoning_tokens": usage.reasoning_tokens,
            "cached_input_tokens": usage.cached_input_tokens,
            "requests": usage.requests,
            "cost_usd": Decimal(usage.cost_usd),
            "recorded_at": recorded_at,
            "day": recorded_at.astimezone(datetime.UTC).date(),
        },
    )
    return True


def usd_display(cost_usd: str) -> str:
    """A cost in US dollars (a decimal string) as pages show it: two decimals from a cent,
    rounded half up (``"$1.23"``), else the exact amount (``"$0.0027125"``); ``"$0"`` for
    nothing. ``usage_display.mjs`` formats the same way."""
    amount = Decimal(cost_usd or "0")
    if amount <= 0:
        return "$0"
    if amount >= Decimal("0.01"):
        return f"${amount.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"
    return "$" + usd_text(amount)


# --- reads -------------------------------------------------------------------------------------


def _sums() -> dict[str, Any]:
    sums: dict[str, Any] = {name: Coalesce(Sum(name), 0) for name in USAGE_COUNTERS}
    sums["cost_usd"] = Coalesce(Sum("cost_usd"), Decimal(0))
    return sums


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """A sums row with ``cost_usd`` as a decimal string and counters as ints."""
    out: dict[str, Any] = {name: int(row.get(name) or 0) for name in USAGE_COUNTERS}
    out["cost_usd"] = usd_text(Decimal(row.get("cost_usd") or 0))
    return out


def usage_records_for(
    *,
    owner_id: int | None,
    date_from: datetime.date,
    date_to: datetime.date,
) -> QuerySet[UsageRecord]:
    """Rows of calls made on UTC days ``date_from`` to ``date_to`` (both included), of one
    owner's sessions, or of everyone's when ``owner_id`` is ``None`` (staff views only)."""
    rows = UsageRecord.objects.filter(day__gte=date_from, day__lte=date_to)
    if owner_id is not None:
        rows = rows.filter(owner_id=owner_id)
    return rows


def usage_summary(
    *, owner_id: int | None, date_from: datetime.date, date_to: datetime.date
) -> dict[str, Any]:
    """Usage and cost over a date range, in total, per day and per agent.

    Returns:
        ``{"from", "to" (ISO dates), "totals": SUMS, "days": [{"day", **SUMS}] (every day of
        the range, oldest first, zero when nothing ran), "agents": [{"agent" (slug), "name",
        **SUMS}] (agents with calls, most expensive first)}`` where ``SUMS`` is
        ``{"input_tokens", "output_tokens", "reasoning_tokens", "cached_input_tokens",
        "requests" (ints), "cost_usd" (decimal string, USD)}``.
    """
    rows = usage_records_for(owner_id=owner_id, date_from=date_from, date_to=date_to)
    totals = _plain(rows.aggregate(**_sums()))
    by_day = {
        row["day"]: _plain(row)
        for row in rows.order_by().values("day").annotate(**_sums())
    }
    days = []
    day = date_from
    while day <= date_to:
        days.append({"day": day.isoformat(), **by_day.get(day, _plain({}))})
        day += datetime.timedelta(days=1)
    agents = [
        {"agent": row["agent__slug"], "name": row["agent__name"], **_plain(row)}
        for row in rows.order_by()
        .values("agent__slug", "agent__name")
        .annotate(**_sums())
        .order_by("-cost_usd", "agent__slug")
    ]
    return {
        "from": date_from.isoformat(),
        "to": date_to.isoformat(),
        "totals": totals,
        "days": days,
        "agents": agents,
    }


def usage_by_owner(
    *, date_from: datetime.date, date_to: datetime.date
) -> list[dict[str, Any]]:
    """Every user's sums over a date range (staff views only), costliest first:
    ``[{"owner" (username), **SUMS}]``."""
    rows = usage_records_for(owner_id=None, date_from=date_from, date_to=date_to)
    return [
        {"owner": row["owner__username"], **_plain(row)}
        for row in rows.order_by()
        .values("owner__username")
        .annotate(**_sums())
        .order_by("-cost_usd", "owner__username")
    ]


#: The sums ``session_usage_annotations`` adds, as ``usage_<name>``.
SESSION_LIST_USAGE = ("input_tokens", "output_tokens", "requests", "cost_usd")


def session_usage_annotations() -> dict[str, Any]:
    """Annotations that give each ``AgentSession`` row of a query its recorded calls' sums:
    ``usage_input_tokens``, ``usage_output_tokens``, ``usage_requests`` and ``usage_cost_usd``
    (``None`` for a session without calls). One correlated subquery each, served by the
    ``(session, model_call_id)`` unique index."""
    annotations: dict[str, Any] = {}
    for name in SESSION_LIST_USAGE:
        per_session = (
            UsageRecord.objects.filter(session_id=OuterRef("pk"))
            .order_by()
            .values("session_id")
            .annotate(total=Sum(name))
            .values("total")
        )
        annotations[f"usage_{name}"] = Subquery(per_session)
    return annotations


def session_row_usage(session: Any) -> dict[str, Any]:
    """``{"input_tokens", "output_tokens", "requests", "cost_usd"}`` of a session row annotated
    with :func:`session_usage_annotations` (zeros when it has no calls)."""
    values = {name: getattr(session, f"usage_{name}", None) for name in SESSION_LIST_USAGE}
    return {
        **{name: int(values[name] or 0) for name in SESSION_LIST_USAGE if name != "cost_usd"},
        "cost_usd": usd_text(Decimal(values["cost_usd"] or 0)),
    }


def session_usage_totals(*, session_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Each listed session's sums over its recorded calls (``SUMS`` as in
    :func:`usage_summary`); sessions without calls are absent."""
    return {
        row["session_id"]: _plain(row)
        for row in UsageRecord.objects.filter(session_id__in=list(session_ids))
        .order_by()
        .values("session_id")
        .annotate(**_sums())
    }
