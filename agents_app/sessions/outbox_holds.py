"""What holds an accepted message in the outbox besides an engine that does not answer: its
owner's cap on running turns, and spent budgets.

Owns: the count of an owner's running turns as the index sees it (``active_sessions_count``),
the owner's lock that makes checking the cap and starting a turn one step
(``owner_turn_lock``), the check and the sentence a held message shows
(``active_limit_reached``, ``active_limit_reason``), and the releases that queue delivery of
held messages again when a turn ends (``active_limit_release``) or a budget changes
(``budget_release``). The outbox (``outbox``) and the session services check the cap here; the
index's observer and the budget signal release.

May import: the settings, the models, ``agents_app.usage.budgets`` and ``agents_app.task_queue``
(lazily); nothing of the gateway.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.db.models import F

from agents_app.conf import dexagents_setting
from agents_app.models import AgentSession, ApprovalRequest, Delivery, OutboxMessage
from agents_app.usage.budgets import BUDGET_REFUSAL_PREFIX

#: Index statuses of a session whose turn runs (and holds a Dex worker's attention).
ACTIVE_STATUSES = ("starting", "running_model", "running_tools")


def active_sessions_count(*, owner_id: Any, exclude_session_id: str = "") -> int:
    """How many of ``owner_id``'s sessions run a turn now, as the index sees it: status
    ``starting``, ``running_model`` or ``running_tools`` without a pending approval (a turn
    that waits for a person holds nothing), plus idle sessions that a message was delivered
    to after their status was last observed (their turn is about to start; the worker has not
    reported it yet).
    """
    running = (
        AgentSession.objects.filter(owner_id=owner_id, status__in=ACTIVE_STATUSES)
        .exclude(approval_requests__state=ApprovalRequest.State.PENDING)
        .exclude(pk=exclude_session_id)
        .values_list("pk", flat=True)
    )
    about_to_run = (
        OutboxMessage.objects.filter(
            session__owner_id=owner_id,
            session__status="waiting_for_user_message",
            delivery=Delivery.DELIVERED,
            delivered_at__gt=F("session__status_observed_at"),
        )
        .exclude(session_id=exclude_session_id)
        .values_list("session_id", flat=True)
    )
    return len(set(running) | set(about_to_run))


def owner_turn_lock(*, owner_id: Any) -> None:
    """Take ``owner_id``'s lock for the running-turn cap, held until the enclosing
    ``transaction.atomic()`` ends, so two requests of one owner cannot both see room under
    ``DEXAGENTS["MAX_ACTIVE_SESSIONS_PER_USER"]`` and both start a turn. PostgreSQL locks the
    owner's user row (``SELECT ... FOR UPDATE``); SQLite, which has no row locks, serializes
    on its database write lock, taken by a no-op ``UPDATE`` of that row.

    Raises:
        django.db.transaction.TransactionManagementError: Called outside a transaction.
    """
    from django.contrib.auth import get_user_model
    from django.db import connection

    if not connection.in_atomic_block:
        raise transaction.TransactionManagementError("owner_turn_lock needs a transaction.")
    users = get_user_model().objects.filter(pk=owner_id)
    if connection.features.has_select_for_update:
        list(users.select_for_update().values_list("pk", flat=True))
    else:
        users.update(last_login=F("last_login"))


def active_limit_reached(*, session: AgentSession) -> bool:
    """Whether a message to ``session`` must wait for the owner's other turns: the session
    is not running a turn itself (a message to a running session only queues behind it) and
    its owner already has ``DEXAGENTS["MAX_ACTIVE_SESSIONS_PER_USER"]`` running (0: no cap)."""
    limit = int(dexagents_setting("MAX_ACTIVE_SESSIONS_PER_USER"))
    if limit <= 0 or session.status in ACTIVE_STATUSES:
        return False
    return active_sessions_count(owner_id=session.owner_id, exclude_session_id=session.pk) >= limit


def active_limit_reason() -> str:
    """Why a message waits for the owner's other turns (kept as the row's ``last_error``)."""
    limit = int(dexagents_setting("MAX_ACTIVE_SESSIONS_PER_USER"))
    return (f"Held: {limit} of your sessions are running a turn "
            "(DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER); it goes when one ends.")


def active_limit_release(*, owner_ids: Iterable[Any]) -> int:
    """Queue delivery of the pending messages of ``owner_ids``' sessions (a turn of theirs
    ended, so a message held by the cap may go now); the delivery checks the cap again.

    Returns:
        How many sessions' deliveries were queued.
    """
    from agents_app import task_queue

    session_ids = list(
        OutboxMessage.objects.filter(
            session__owner_id__in=list(owner_ids), delivery=Delivery.PENDING
        )
        .values_list("session_id", flat=True)
        .distinct()
    )
    for session_id in session_ids:
        task_queue.outbox_delivery_schedule(session_id=session_id)
    return len(session_ids)


def budget_release(*, owner_id: Any = None, agent_id: Any = None) -> int:
    """Queue delivery of the messages a spent budget holds in the sessions of ``owner_id``
    or of ``agent_id`` (a budget of theirs was raised, disabled or deleted, so they may go
    now); the delivery checks every budget again.

    Returns:
        How many sessions' deliveries were queued.
    """
    from agents_app import task_queue

    held = OutboxMessage.objects.filter(
        delivery=Delivery.PENDING, last_error__startswith=BUDGET_REFUSAL_PREFIX
    )
    if owner_id is not None:
        held = held.filter(session__owner_id=owner_id)
    elif agent_id is not None:
        held = held.filter(session__agent_id=agent_id)
    else:
        return 0
    session_ids = list(held.values_list("session_id", flat=True).distinct())
    for session_id in session_ids:
        task_queue.outbox_delivery_schedule(session_id=session_id)
    return len(session_ids)
