"""Reads of agents and sessions (HackSoft "selectors").

Functions that ask Dex raise ``dex_gateway.EngineUnavailableError`` when the engine does
not answer and ``dex_gateway.SessionNotFoundError`` when it has no such session.
"""

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet

from agents_app import dex_gateway
from agents_app.models import AgentDefinition, AgentSession

logger = logging.getLogger(__name__)


def agent_list_enabled() -> QuerySet[AgentDefinition]:
    """Enabled agent definitions, by slug."""
    return AgentDefinition.objects.filter(enabled=True).order_by("slug")


def agent_get_enabled(*, slug: str) -> AgentDefinition:
    """Return the enabled agent ``slug``.

    Raises:
        AgentDefinition.DoesNotExist: No agent has that slug, or it is disabled.
    """
    return AgentDefinition.objects.get(slug=slug, enabled=True)


def session_list_for_owner(*, owner: AbstractBaseUser | AnonymousUser) -> QuerySet[AgentSession]:
    """The sessions ``owner`` started, newest first."""
    return AgentSession.objects.filter(owner_id=owner.pk).select_related("agent")


def session_get_for_owner(
    *, owner: AbstractBaseUser | AnonymousUser, session_id: str
) -> AgentSession:
    """Return ``owner``'s session ``session_id``.

    Raises:
        AgentSession.DoesNotExist: No such session, or it belongs to someone else (callers
            answer 404 either way, so foreign IDs are not revealed).
    """
    return session_list_for_owner(owner=owner).get(pk=session_id)


def session_snapshot_get(*, session: AgentSession) -> dict[str, Any]:
    """Read the session's snapshot from Dex (shape: ``dex_gateway.session_snapshot``)."""
    return dex_gateway.run(dex_gateway.session_snapshot(session_id=session.id))


def session_history_get(*, session: AgentSession) -> list[dex_gateway.StepHistoryEntry]:
    """List the session's completed Steps from Dex history, oldest first."""
    return dex_gateway.run(dex_gateway.session_history(session_id=session.id))


def session_get_for_staff(*, session_id: str) -> AgentSession:
    """Return any user's session ``session_id`` (callers have checked the caller is staff).

    Raises:
        AgentSession.DoesNotExist: No such session.
    """
    return AgentSession.objects.select_related("agent", "owner").get(pk=session_id)


def session_get_for_owner_or_staff(
    *, user: AbstractBaseUser | AnonymousUser, session_id: str
) -> AgentSession:
    """Return ``session_id`` when ``user`` owns it or is staff.

    Raises:
        AgentSession.DoesNotExist: No such session, or a non-staff caller does not own it.
    """
    if getattr(user, "is_staff", False):
        return session_get_for_staff(session_id=session_id)
    return session_get_for_owner(owner=user, session_id=session_id)


# The pending-approval list reads the snapshots of at most this many sessions, the most
# recently created ones that are not stopped; an older session still waiting for a decision
# is missing from the list (its owner's snapshot still shows it). Snapshots are read at most
# APPROVAL_SNAPSHOT_CONCURRENCY at a time.
APPROVAL_SESSION_LIMIT = 200
APPROVAL_SNAPSHOT_CONCURRENCY = 16
CLOSED_SESSION_STATUSES = ("stopped",)


async def _snapshots_read(session_ids: list[str]) -> dict[str, dict[str, Any]]:
    """Read several snapshots concurrently; sessions Dex no longer has are left out."""
    gate = asyncio.Semaphore(APPROVAL_SNAPSHOT_CONCURRENCY)

    async def read(session_id: str) -> tuple[str, dict[str, Any] | None]:
        async with gate:
            try:
                return session_id, await dex_gateway.session_snapshot(session_id=session_id)
            except dex_gateway.SessionNotFoundError:
                logger.info("Session %s is indexed but unknown to Dex.", session_id)
                return session_id, None

    pairs = await asyncio.gather(*(read(session_id) for session_id in session_ids))
    return {session_id: snapshot for session_id, snapshot in pairs if snapshot is not None}


def approval_list_pending() -> list[dict[str, Any]]:
    """Tool calls waiting for approval across sessions, read from their Dex snapshots.

    Looks at the ``APPROVAL_SESSION_LIMIT`` (200) most recently created sessions whose index
    status is not closed (``stopped``); Django keeps no copy of pending interrupts.

    Returns:
        ``[{"session", "agent" (slug), "owner" (username), "interrupt_id", "tool_call_id",
        "tool_name", "arguments" (JSON text), "deadline" (ISO 8601 UTC or None)}]``, sessions
        newest first, each session's interrupts in snapshot order.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer.
    """
    sessions = list(
        AgentSession.objects.exclude(status__in=CLOSED_SESSION_STATUSES)
        .select_related("agent", "owner")
        .order_by("-created_at")[:APPROVAL_SESSION_LIMIT]
    )
    if not sessions:
        return []
    snapshots = dex_gateway.run(_snapshots_read([session.id for session in sessions]))
    pending: list[dict[str, Any]] = []
    for session in sessions:
        snapshot = snapshots.get(session.id)
        if snapshot is None:
            continue
        for interrupt in snapshot["pending_interrupts"]:
            pending.append(
                {
                    "session": session.id,
                    "agent": session.agent.slug,
                    "owner": session.owner.get_username(),
                    "interrupt_id": interrupt["interrupt_id"],
                    "tool_call_id": interrupt["tool_call_id"],
                    "tool_name": interrupt["tool_name"],
                    "arguments": interrupt["arguments"],
                    "deadline": interrupt.get("deadline"),
                }
            )
    return pending


def worker_heartbeat_fresh() -> bool:
    """Whether ``dexworker`` touched its heartbeat file recently.

    The file is ``DEXAGENTS["WORKER_HEARTBEAT_FILE"]``, touched every 5 s; it counts as
    fresh when younger than ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]`` seconds.
    """
    path = Path(settings.DEXAGENTS["WORKER_HEARTBEAT_FILE"])
    try:
        age = time.time() - path.stat().st_mtime
    except OSError:
        return False
    return age < float(settings.DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"])


def health_get() -> dict[str, str]:
    """Report the liveness of each part: ``{"web", "engine", "worker"}``, each "up"/"down".

    The engine is up when it answers FlowService.HealthCheck within
    ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds.
    """
    try:
        engine_up = dex_gateway.run(dex_gateway.engine_health_check())
    except dex_gateway.EngineUnavailableError:
        engine_up = False
    return {
        "web": "up",
        "engine": "up" if engine_up else "down",
        "worker": "up" if worker_heartbeat_fresh() else "down",
    }


def session_get_for_reader(
    *, user: AbstractBaseUser | AnonymousUser, session_id: str
) -> AgentSession:
    """Return ``session_id`` for a reader: its owner, or any staff member.

    Unlike ``session_get_for_owner_or_staff`` this tells the two refusals apart, for the
    websocket relay's close codes (4404 / 4403).

    Raises:
        AgentSession.DoesNotExist: No index row has this ID.
        PermissionDenied: The session exists but belongs to someone else and ``user`` is
            not staff.
    """
    session = AgentSession.objects.get(pk=session_id)
    if session.owner_id != user.pk and not getattr(user, "is_staff", False):
        raise PermissionDenied("Only the owner or staff may read this session.")
    return session


def session_events_after_get(*, session: AgentSession) -> str:
    """The snapshot's ``events_after``: the newest retained AgentEvents token, ``""`` if none.

    Read it before the snapshot, so relaying from it misses nothing the snapshot lacks.
    """
    return dex_gateway.run(dex_gateway.session_events_tail_token(session_id=session.id))
