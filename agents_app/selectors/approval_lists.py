"""Reads of approvals: the tool calls that wait for a decision and those that stopped waiting.

Owns the filters both lists take (``ApprovalFilters``), the navigation's count
(``approval_count_pending``), the dashboard's pending list (``approval_list_pending``) and the
decided list with its audit (``approval_list_decided``); each reads the Django index, never
Dex.

May import: the foundation (tests/test_layering.py).
"""


import dataclasses
import datetime
from typing import Any

from django.db.models import F, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents_app.models import (
    ApprovalDecision,
    ApprovalRequest,
)


@dataclasses.dataclass(frozen=True)
class ApprovalFilters:
    """What the approvals lists are narrowed to; an empty string does not narrow.

    ``agent`` is an agent slug, ``tool`` a tool call's (model-facing) tool name and ``owner``
    the session owner's username, each matched whole but ignoring case (``iexact``: ``DEMO``
    finds ``demo``, as Django admin's filters and searches ignore case); ``session`` is a
    session ID, matched exactly.
    """

    agent: str = ""
    tool: str = ""
    owner: str = ""
    session: str = ""

    def lookups(self) -> dict[str, str]:
        """Django lookups on ``ApprovalRequest`` or ``ApprovalDecision`` rows."""
        fields = {
            "session__agent__slug__iexact": self.agent,
            "tool_name__iexact": self.tool,
            "session__owner__username__iexact": self.owner,
            "session_id": self.session,
        }
        return {lookup: value for lookup, value in fields.items() if value}


def approval_count_pending() -> int:
    """How many indexed tool calls wait for a decision (one query), for the navigation's count.

    Counts ``ApprovalRequest`` rows in state ``pending``, so it includes calls decided while
    the engine did not answer and calls past a deadline the worker has not recorded yet, as
    ``approval_list_pending`` lists them.
    """
    return ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING).count()


def approval_list_pending(
    *, now: datetime.datetime | None = None, filters: ApprovalFilters | None = None
) -> list[dict[str, Any]]:
    """Every indexed tool call waiting for approval, oldest first (two queries), narrowed to
    ``filters``.

    Returns:
        ``[{"session", "session_title", "parent_session", "parent_session_title" (the session
        whose subagent call started this one, else None; issue 29), "agent" (slug), "owner"
        (username), "interrupt_id",
        "tool_call_id", "tool_name", "arguments" (JSON text), "requested_at", "deadline" (or
        None), "state", "decision"}]``; ``state`` is ``decided`` when staff decided and the
        decision waits for delivery to Dex (``decision`` is then ``{"approved",
        "decided_by", "decided_at", "rejection_message", "delivery": "pending"}``, else
        None), ``expired`` once the deadline passed (the worker has not recorded it yet, and
        Dex refuses a decision), else ``pending``.
    """
    moment = now or timezone.now()
    requests = list(
        ApprovalRequest.objects.filter(
            state=ApprovalRequest.State.PENDING, **(filters or ApprovalFilters()).lookups()
        )
        .select_related("session__agent", "session__owner", "session__parent")
        .order_by("requested_at", "id")
    )
    undelivered = {
        (decision.session_id, decision.interrupt_id): decision
        for decision in ApprovalDecision.objects.filter(
            delivery="pending", session_id__in={request.session_id for request in requests}
        ).select_related("decided_by")
    }
    items = []
    for request in requests:
        decision = undelivered.get((request.session_id, request.interrupt_id))
        if decision is not None:
            state = "decided"
        elif request.deadline is not None and request.deadline <= moment:
            state = "expired"
        else:
            state = "pending"
        items.append(
            {
                "session": request.session_id,
                "session_title": request.session.title,
                "parent_session": request.session.parent_id,
                "parent_session_title": (
                    request.session.parent.title if request.session.parent is not None else None
                ),
                "agent": request.session.agent.slug,
                "owner": request.session.owner.get_username(),
                "interrupt_id": request.interrupt_id,
                "tool_call_id": request.tool_call_id,
                "tool_name": request.tool_name,
                "arguments": request.arguments,
                "requested_at": request.requested_at,
                "deadline": request.deadline,
                "state": state,
                "decision": None
                if decision is None
                else {
                    "approved": decision.approved,
                    "decided_by": decision.decided_by.get_username(),
                    "decided_at": decision.decided_at,
                    "rejection_message": decision.rejection_message,
                    "edited_arguments": decision.edited_arguments or None,
                    "delivery": decision.delivery,
                },
            }
        )
    return items


def approval_list_decided(
    *, filters: ApprovalFilters | None = None, decision: str = ""
) -> QuerySet[ApprovalRequest]:
    """Approvals that stopped waiting, newest first, narrowed to ``filters`` and, when
    ``decision`` is not empty, to that state (approved, rejected, expired, withdrawn).

    Annotated from the ``ApprovalDecision`` audit rows: ``decided_by`` (username, or None when
    no person decided), ``decision_at`` (when the person decided, else when it closed) and
    ``edited_arguments`` (the JSON text an approval ran with instead of ``arguments``; None or
    blank when not edited)."""
    decisions = ApprovalDecision.objects.filter(
        session_id=OuterRef("session_id"), interrupt_id=OuterRef("interrupt_id")
    )
    rows = ApprovalRequest.objects.exclude(state=ApprovalRequest.State.PENDING).filter(
        **(filters or ApprovalFilters()).lookups()
    )
    if decision:
        rows = rows.filter(state=decision)
    return (
        rows.select_related("session__agent", "session__owner")
        .annotate(
            edited_arguments=Subquery(decisions.values("edited_arguments")[:1]),
            decided_by=Subquery(decisions.values("decided_by__username")[:1]),
            # When the person decided (the audit row), not when Dex took the decision: with
            # the outbox these differ by the delivery's delay. Expired or withdrawn: closed_at.
            decision_at=Coalesce(Subquery(decisions.values("decided_at")[:1]), F("closed_at")),
        )
        .order_by("-closed_at", "-id")
    )
