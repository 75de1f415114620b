"""Reconciliation of the Django index of sessions and approvals from Dex (ARCHITECTURE.md
"The Django index").

A worker killed between a Step and its index write, or a Step that failed after reporting,
leaves the index behind or ahead of Dex. ``session_index_reconcile`` reads the Dex snapshot of
every session the index may have wrong (``reconcile_candidates``) and makes the index agree:
statuses, pending approval rows, and sessions whose Flow is gone. It runs after a worker's
start (``manage.py dexworker``) and periodically (Celery beat, ``agents_app.tasks``).

May import: the Dex gateway, the models, ``session_index`` and ``approval_index`` (their
idempotent writes), and the settings.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
from collections.abc import Iterable
from typing import Any

from django.db import OperationalError, transaction
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STARTING,
    SESSION_STATUS_STOPPED,
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
)
from agents_app.sessions.approval_index import (
    approval_request_close,
    approval_request_open,
    approvals_changed_notify,
)
from agents_app.sessions.session_index import session_status_apply, session_stopped_index

logger = logging.getLogger(__name__)

#: Index statuses that say a session is doing something a snapshot may have moved on from.
ACTIVE_STATUSES = (
    SESSION_STATUS_STARTING,
    "running_model",
    "running_tools",
    "waiting_for_user_input",
)

#: A pending row younger than this is not closed by reconciliation when the snapshot lacks it:
#: the worker indexes an interrupt just before Dex commits it, so a snapshot read in between
#: does not show it yet.
RECONCILE_GRACE = datetime.timedelta(seconds=30)
#: A session still ``starting`` that Dex does not know after this long never started.
START_ABANDONED_AFTER = datetime.timedelta(minutes=5)
RECONCILE_CONCURRENCY = 16


@dataclasses.dataclass
class ReconcileResult:
    """What one reconciliation pass did.

    Attributes:
        checked: Sessions whose snapshot was read.
        statuses: Sessions whose index status changed.
        opened: Approval rows created or reopened.
        closed: Approval rows closed.
        missing: Sessions Dex does not know (marked stopped).
        stopped: Sessions whose Flow no longer runs in Dex (marked stopped): stopped outside
            the platform, or by a stop whose index write was lost.
        unreadable: Sessions whose snapshot is too large to load (left as indexed).
        unanswered: Sessions Dex or its workers did not answer for within ``ENGINE_TIMEOUT``
            (left as indexed until the next run).
    """

    checked: int = 0
    statuses: int = 0
    stopped: int = 0
    opened: int = 0
    closed: int = 0
    missing: int = 0
    unreadable: int = 0
    unanswered: int = 0

    @property
    def approvals_changed(self) -> bool:
        return bool(self.opened or self.closed or self.missing or self.stopped)


#: ``_snapshots_read``'s value for a session whose snapshot cannot be read right now.
UNREADABLE: dict[str, Any] = {}
#: ``_snapshots_read``'s value for a session whose Flow no longer runs.
FLOW_CLOSED: dict[str, Any] = {}
#: ``_snapshots_read``'s value for a session Dex or its workers did not answer for in time (a
#: worker killed during the RPC, every worker busy): it is left as indexed until the next run.
UNANSWERED: dict[str, Any] = {}


async def _snapshots_read(session_ids: list[str]) -> dict[str, dict[str, Any] | None]:
    """Read snapshots concurrently, ``RECONCILE_CONCURRENCY`` at a time, each within
    ``ENGINE_TIMEOUT`` seconds; ``None`` for a session Dex does not know, ``FLOW_CLOSED`` for
    one whose Flow no longer runs, ``UNREADABLE`` for one it cannot load (too large for a worker
    message), ``UNANSWERED`` for one Dex or its workers did not answer for in time (or whose
    read failed otherwise, logged as a warning), so one
    session never stops the others from being reconciled (issue 13: under worker SIGKILLs one
    slow snapshot RPC made every run time out, and a lost approval stayed unindexed)."""
    gate = asyncio.Semaphore(RECONCILE_CONCURRENCY)
    limit = float(_engine_timeout())

    async def read(session_id: str) -> tuple[str, dict[str, Any] | None]:
        async with gate:
            try:
                async with asyncio.timeout(limit):
                    if not await dex_gateway.session_flow_running(session_id=session_id):
                        return session_id, FLOW_CLOSED
                    return session_id, await dex_gateway.session_snapshot(session_id=session_id)
            except dex_gateway.SessionNotFoundError:
                return session_id, None
            except dex_gateway.SessionTooLargeError:
                logger.info("Session %s is too large to reconcile; left as indexed.", session_id)
                return session_id, UNREADABLE
            except (TimeoutError, dex_gateway.EngineUnavailableError) as error:
                logger.info("Session %s not reconciled this time: %s", session_id,
                            error or "no answer in time")
                return session_id, UNANSWERED
            except Exception:
                # Whatever else one session's read raises, the others still go ahead.
                logger.warning("Reading session %s to reconcile it failed", session_id,
                               exc_info=True)
                return session_id, UNANSWERED

    pairs = await asyncio.gather(*(read(session_id) for session_id in session_ids))
    return dict(pairs)


def reconcile_candidates() -> list[str]:
    """Sessions whose index may disagree with Dex: those with pending approval rows, and those
    not stopped whose index status says they are busy or starting."""
    with_pending = ApprovalRequest.objects.filter(
        state=ApprovalRequest.State.PENDING
    ).values_list("session_id", flat=True)
    ids = set(with_pending)
    ids.update(
        AgentSession.objects.filter(status__in=ACTIVE_STATUSES).values_list("pk", flat=True)
    )
    return sorted(ids)


def session_index_reconcile(*, session_ids: Iterable[str] | None = None) -> ReconcileResult:
    """Make the index agree with Dex for ``session_ids`` (default: ``reconcile_candidates()``).

    For each session: the snapshot's status becomes the index status (unless a later one is
    stored); every pending interrupt of the snapshot gets a pending row; pending rows the
    snapshot no longer lists (and older than ``RECONCILE_GRACE``) are closed with the recorded
    decision, as expired when their deadline passed, else as withdrawn. A session whose Flow no
    longer runs in Dex is marked stopped (its approvals withdrawn); one Dex does not know, once
    it is older than ``START_ABANDONED_AFTER``.

    A session Dex does not answer for within ``ENGINE_TIMEOUT`` is left as indexed and counted
    as ``unanswered``; the others are reconciled all the same.

    Raises:
        dex_gateway.EngineUnavailableError: Dex answered for none of them; nothing was changed.
    """
    ids = list(session_ids) if session_ids is not None else reconcile_candidates()
    result = ReconcileResult()
    if not ids:
        return result
    read_at = timezone.now()
    # Each read has its own deadline; this one only bounds the whole run (the reads go in
    # batches of RECONCILE_CONCURRENCY), plus one read's worth of slack.
    rounds = -(-len(ids) // RECONCILE_CONCURRENCY) + 1
    snapshots = dex_gateway.run(_snapshots_read(ids), timeout=float(_engine_timeout()) * rounds)
    if all(snapshot is UNANSWERED for snapshot in snapshots.values()):
        raise dex_gateway.EngineUnavailableError(
            f"Dex or its workers answered for none of the {len(ids)} sessions to reconcile.",
            cause="timeout",
        )
    sessions = {session.pk: session for session in AgentSession.objects.filter(pk__in=ids)}
    for session_id, snapshot in snapshots.items():
        session = sessions.get(session_id)
        if session is None or session.status == SESSION_STATUS_STOPPED:
            continue
        if snapshot is UNREADABLE:
            result.unreadable += 1
            continue
        if snapshot is UNANSWERED:
            result.unanswered += 1
            continue
        result.checked += 1
        if snapshot is FLOW_CLOSED:
            logger.info("Session %s no longer runs in Dex; marking it stopped.", session_id)
            session_stopped_index(session=session)
            result.stopped += 1
            continue
        try:
            _reconcile_one(session, snapshot, read_at, result)
        except OperationalError as error:
            logger.warning("Reconciling %s failed: %s", session_id, error)
    if result.approvals_changed:
        approvals_changed_notify()
    return result


def _engine_timeout() -> int:
    return int(dexagents_setting("ENGINE_TIMEOUT"))


def _reconcile_one(
    session: AgentSession,
    snapshot: dict[str, Any] | None,
    read_at: datetime.datetime,
    result: ReconcileResult,
) -> None:
    if snapshot is None:
        if read_at - session.created_at < START_ABANDONED_AFTER:
            return
        logger.warning("Session %s is indexed but unknown to Dex; marking it stopped.", session.pk)
        session_stopped_index(session=session)
        result.missing += 1
        return
    with transaction.atomic():
        written = session_status_apply(
            session_id=session.pk, status=snapshot["status"], observed_at=read_at
        )
        if written and session.status != snapshot["status"]:
            result.statuses += 1
        pending_ids = set()
        for interrupt in snapshot["pending_interrupts"]:
            pending_ids.add(interrupt["interrupt_id"])
            deadline = interrupt.get("deadline")
            if approval_request_open(
                session_id=session.pk,
                interrupt_id=interrupt["interrupt_id"],
                tool_call_id=str(interrupt.get("tool_call_id", "")),
                tool_name=str(interrupt.get("tool_name", "")),
                arguments=str(interrupt.get("arguments", "")),
                turn_id=str(interrupt.get("turn_id", "")),
                deadline=datetime.datetime.fromisoformat(deadline) if deadline else None,
                requested_at=read_at,
            ):
                result.opened += 1
        stale = ApprovalRequest.objects.filter(
            session_id=session.pk,
            state=ApprovalRequest.State.PENDING,
            requested_at__lt=read_at - RECONCILE_GRACE,
        ).exclude(interrupt_id__in=pending_ids)
        for request in stale:
            state, message = _closed_outcome(request, read_at)
            if approval_request_close(
                session_id=session.pk,
                interrupt_id=request.interrupt_id,
                state=state,
                message=message,
                closed_at=read_at,
            ):
                result.closed += 1


def _closed_outcome(request: ApprovalRequest, now: datetime.datetime) -> tuple[str, str]:
    """Why an indexed interrupt is no longer pending in Dex: its recorded decision, its
    deadline, or (neither) its turn ended without one."""
    decision = ApprovalDecision.objects.filter(
        session_id=request.session_id, interrupt_id=request.interrupt_id
    ).first()
    if decision is not None:
        if decision.approved:
            return ApprovalRequest.State.APPROVED, ""
        return ApprovalRequest.State.REJECTED, decision.rejection_message
    if request.deadline is not None and request.deadline <= now:
        return ApprovalRequest.State.EXPIRED, "No approval before the deadline."
    return ApprovalRequest.State.WITHDRAWN, "The turn ended before a decision."
