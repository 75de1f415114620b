"""Reads of agents and sessions (HackSoft "selectors").

Functions that ask Dex raise ``dex_gateway.EngineUnavailableError`` when the engine does
not answer and ``dex_gateway.SessionNotFoundError`` when it has no such session.
"""

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from agents_app import dex_gateway
from agents_app.models import AgentDefinition, AgentSession


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
