"""The session snapshot as ``GET /api/v1/sessions/<id>/`` answers it, apart from the view.

``snapshot_read`` reads the snapshot from Dex, or from the snapshot cache when the session did
not change (``agents_app.gateway.snapshot_cache``), and ``snapshot_answer`` adds the Django
side (the index status, the outbox, the caller's extras); ``session_detail_body`` puts the
answer's keys in order and ``flow_check_due`` says when a cached entry needs the engine asked
whether the Flow still runs. The view (``sessions.SessionDetailApi``), send-and-wait
(``events.turn_wait_answer``) and the ASGI short path (``snapshot_asgi``) share them, so the
three give the same answer.

May import: of ``agents_app.api`` only ``async_views``; the domain and everything below it.
"""

import asyncio
import dataclasses
from typing import Any

from django.utils import timezone
from rest_framework.request import Request

from agents_app.api.async_views import db
from agents_app.gateway import dex_gateway, event_stream, snapshot_cache
from agents_app.models import SESSION_STATUS_STOPPED, AgentSession
from agents_app.selectors import session_reads
from agents_app.services import session_lifecycle
from agents_app.services.session_lifecycle import session_status_record

#: How old a cached snapshot may get before a read asks the engine again whether the Flow
#: still runs (``session_flow_running``, no worker involved).
FLOW_CHECK_SECONDS = 5.0


def flow_check_due(cached: snapshot_cache.Entry, *, stopped: bool, now: Any) -> bool:
    """Whether a read served from ``cached`` must first ask the engine whether the session's
    Flow still runs: not for a stopped session, else once ``FLOW_CHECK_SECONDS`` passed since
    the entry's last check (``now``: an aware ``datetime``)."""
    return not stopped and (now - cached.flow_checked_at).total_seconds() > FLOW_CHECK_SECONDS


async def snapshot_read(request: Request, session: AgentSession) -> dict[str, Any]:
    """The ``GET /api/v1/sessions/<id>/`` answer for ``session`` (``SessionDetailApi``).

    A session that has not changed since its last read is answered from ``snapshot_cache``
    without the worker RPC (the stamp: its newest event token and its index row).

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    # Read before the snapshot: relaying from it then misses nothing the snapshot lacks.
    events_after = await dex_gateway.call(
        event_stream.session_events_tail_token(session_id=session.id)
    )
    stopped = session.status == SESSION_STATUS_STOPPED
    stamp = snapshot_cache.stamp_of(
        events_after=events_after, status=session.status, updated_at=session.updated_at
    )
    cached = await snapshot_cache.get(session.id, stamp)
    flow_running = None
    if cached is not None:
        # Nothing changed since the last read: no worker RPC. Whether the Flow still runs is
        # asked of the engine alone, at most every FLOW_CHECK_SECONDS.
        snapshot, read_at = cached.snapshot, cached.read_at
        now = timezone.now()
        if flow_check_due(cached, stopped=stopped, now=now):
            flow_running = await dex_gateway.call(
                dex_gateway.session_flow_running(session_id=session.id)
            )
            if flow_running:
                await snapshot_cache.put(
                    session.id, dataclasses.replace(cached, flow_checked_at=now)
                )
    else:
        read_at = timezone.now()
        snapshot_read = dex_gateway.call(dex_gateway.session_snapshot(session_id=session.id))
        if stopped:
            snapshot = await snapshot_read
        else:
            # A Flow stopped behind the index's back keeps its last status in the snapshot;
            # both reads at once: one engine round trip instead of two.
            snapshot, flow_running = await asyncio.gather(
                snapshot_read,
                dex_gateway.call(dex_gateway.session_flow_running(session_id=session.id)),
            )
        await snapshot_cache.put(
            session.id, snapshot_cache.Entry(stamp, snapshot, read_at, read_at)
        )
    answer: dict[str, Any] = await db(snapshot_answer)(
        request=request,
        session=session,
        snapshot=snapshot,
        read_at=read_at,
        flow_running=flow_running,
        events_after=events_after,
    )
    return answer


def snapshot_answer(
    *,
    request: Request,
    session: AgentSession,
    snapshot: dict[str, Any],
    read_at: Any,
    flow_running: bool | None,
    events_after: str,
) -> dict[str, Any]:
    """The Django side of ``snapshot_read``'s answer, in one thread hop (run it with ``db``):
    record the snapshot's status in the index (observed at ``read_at``, an aware
    ``datetime``), mark the session stopped when its Flow no longer runs (``flow_running``
    False; None: not asked, the cached entry was checked recently), show a stopped session as
    stopped, add the outbox's pending messages, then the body (``session_detail_body``) with
    ``request.user``'s extras.
    """
    session_status_record(session=session, status=snapshot["status"], observed_at=read_at)
    # flow_running is None for a cached snapshot checked recently (snapshot_read).
    if session.status != SESSION_STATUS_STOPPED and flow_running is not None:
        session_lifecycle.session_stopped_detect(session=session, flow_running=flow_running)
    if session.status == SESSION_STATUS_STOPPED:
        snapshot = session_reads.snapshot_as_stopped(snapshot=snapshot)
    snapshot = session_reads.snapshot_with_outbox(session=session, snapshot=snapshot)
    return session_detail_body(
        session_id=session.id,
        agent_slug=session.agent.slug,
        extras=session_reads.session_detail_extras(session=session, user=request.user),
        snapshot=snapshot,
        events_after=events_after,
        live_events_after=session_reads.session_live_events_after(
            session=session, snapshot=snapshot, events_after=events_after
        ),
    )


def session_detail_body(
    *,
    session_id: str,
    agent_slug: str,
    extras: dict[str, Any],
    snapshot: dict[str, Any],
    events_after: str,
    live_events_after: str,
) -> dict[str, Any]:
    """The ``GET /api/v1/sessions/<id>/`` answer (``SessionDetailApi``) from its parts, in the
    order of its keys: ``id``, ``agent`` (the agent's slug), ``extras``
    (``session_reads.session_detail_extras``), the snapshot as readers see it (stopped, with the
    outbox), ``events_after``, ``live_events_after``. No database access."""
    return {
        "id": session_id,
        "agent": agent_slug,
        **extras,
        **snapshot,
        "events_after": events_after,
        "live_events_after": live_events_after,
    }
