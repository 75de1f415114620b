"""The Django index of sessions and approvals, kept current from the worker and reconciled
from Dex (ARCHITECTURE.md "The Django index").

Dex owns every session's truth. Lists that must answer with one query (sessions by status, every
pending approval of every session) read two Django tables instead: ``AgentSession.status`` and
``ApprovalRequest``. They are written

- by the Dex worker, through ``SessionIndexObserver`` (the ``AgentSessionFlow`` observer): every
  Step that changes a session's status or its pending interrupts reports the change just before
  Dex commits it, so a raised approval is indexed before anyone can decide it;
- by the web side, when Dex accepts an approval decision or a stop (``services``);
- by ``session_index_reconcile``, which compares the index with Dex snapshots after restarts and
  periodically (Celery beat), because a worker killed between a Step and its index write, or a Step
  that failed after reporting, leaves the index behind or ahead.

Every write is an idempotent upsert keyed by session ID and interrupt ID; a status is applied only
when it was observed later than the stored one. Whenever the set of approvals changes, a notice goes
to the channel layer group ``approvals``; the notice carries no data, and the dashboard's consumer
also polls ``approval_index_version`` so a lost broadcast only delays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import logging
from collections.abc import Iterable, Sequence
from typing import Any

from django.db import OperationalError, transaction
from django.db.models import Case, Count, F, Max, Q, Value, When
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STARTING,
    SESSION_STATUS_STOPPED,
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    TitleSource,
)
from agents_app.notify import notifications
from agents_app.sessions.approval_index import (
    approval_request_close,
    approvals_changed_anotify,
    approvals_changed_notify,
)
from agents_app.sessions.session_search import message_texts_apply
from agents_app.usage.usage_records import usage_record_apply
from dex_agents import AgentSessionChange, AgentStatus, ClosedInterrupt, InterruptOutcome

logger = logging.getLogger(__name__)

#: Channel layer group of one session's websocket consumers (``session_group(id)``); they
#: hear ``session.deleted`` there and close.
SESSION_GROUP_PREFIX = "session."
#: Channel layer message type of that notice (consumers handle ``session_deleted``).
SESSION_DELETED = "session.deleted"


def session_group(session_id: str) -> str:
    """The channel layer group name of ``session_id``'s websocket consumers."""
    return f"{SESSION_GROUP_PREFIX}{session_id}"


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

_CLOSED_STATE = {
    InterruptOutcome.APPROVED: ApprovalRequest.State.APPROVED,
    InterruptOutcome.REJECTED: ApprovalRequest.State.REJECTED,
    InterruptOutcome.EXPIRED: ApprovalRequest.State.EXPIRED,
    InterruptOutcome.WITHDRAWN: ApprovalRequest.State.WITHDRAWN,
}


# --- writes ------------------------------------------------------------------------------------


def session_status_apply(*, session_id: str, status: str, observed_at: datetime.datetime) -> bool:
    """Set the index status observed at ``observed_at`` unless the session is stopped (final)
    or a status observed later is stored.

    Returns:
        True when the row was written.
    """
    written = (
        AgentSession.objects.filter(pk=session_id)
        .exclude(status=SESSION_STATUS_STOPPED)
        .filter(Q(status_observed_at__isnull=True) | Q(status_observed_at__lt=observed_at))
        .update(
            status=status,
            status_observed_at=observed_at,
            # The same status observed again moves only its observation time: ``updated_at``
            # says when the session last changed (lists sort by it).
            updated_at=Case(
                When(status=status, then=F("updated_at")), default=Value(timezone.now())
            ),
        )
    )
    return bool(written)


def _request_open(
    *,
    session_id: str,
    interrupt_id: str,
    tool_call_id: str,
    tool_name: str,
    arguments: str,
    turn_id: str,
    deadline: datetime.datetime | None,
    requested_at: datetime.datetime,
) -> bool:
    """Index a pending interrupt; a row another writer withdrew is opened again.

    Returns:
        True when a row was created or reopened.
    """
    request, created = ApprovalRequest.objects.get_or_create(
        session_id=session_id,
        interrupt_id=interrupt_id,
        defaults={
            "tool_call_id": tool_call_id,
            "tool_name": tool_name,
            "arguments": arguments,
            "turn_id": turn_id,
            "deadline": deadline,
            "requested_at": requested_at,
        },
    )
    if created:
        notifications.approval_requested_notify(session_id=session_id, interrupt_id=interrupt_id)
        return True
    if request.state == ApprovalRequest.State.WITHDRAWN:
        request.state = ApprovalRequest.State.PENDING
        request.closed_at = None
        request.outcome_message = ""
        request.save(update_fields=["state", "closed_at", "outcome_message", "updated_at"])
        # Notices are unique per approval: a reopened row sends nothing again.
        notifications.approval_requested_notify(session_id=session_id, interrupt_id=interrupt_id)
        return True
    return False


def session_changes_apply(*, changes: Sequence[AgentSessionChange]) -> bool:
    """Apply worker-reported changes to the index, in order, in one transaction.

    Args:
        changes: ``AgentSessionChange`` values from ``dex_agents`` Steps. Changes of sessions the
            index does not hold (code-defined Flows, or a session created elsewhere) are ignored.

        A change that carries a model call's usage also writes its ``UsageRecord``
        (``agents_app.usage.usage_records``); one that carries messages writes their text to the
        search index (``agents_app.sessions.session_search``).

    Returns:
        True when the approvals index changed (callers then notify ``APPROVALS_GROUP``).
    """
    approvals_changed = False
    sessions = {
        pk: (owner_id, agent_id)
        for pk, owner_id, agent_id in AgentSession.objects.filter(
            pk__in={change.flow_id for change in changes}
        ).values_list("pk", "owner_id", "agent_id")
    }
    known = set(sessions)
    with transaction.atomic():
        for change in changes:
            if change.flow_id not in known:
                continue
            if change.usage is not None:
                owner_id, agent_id = sessions[change.flow_id]
                usage_record_apply(change=change, owner_id=owner_id, agent_id=agent_id)
            if change.messages:
                message_texts_apply(session_id=change.flow_id, messages=change.messages)
            if change.status is not None:
                session_status_apply(
                    session_id=change.flow_id,
                    status=str(change.status),
                    observed_at=change.observed_at,
                )
            for interrupt in change.raised:
                approvals_changed |= _request_open(
                    session_id=change.flow_id,
                    interrupt_id=interrupt.interrupt_id,
                    tool_call_id=interrupt.tool_call_id,
                    tool_name=interrupt.tool_name,
                    arguments=interrupt.arguments,
                    turn_id=interrupt.turn_id,
                    deadline=interrupt.deadline,
                    requested_at=change.observed_at,
                )
            for closed in change.closed:
                approvals_changed |= _closed_apply(change.flow_id, closed, change.observed_at)
            if change.turn_ended is not None and change.turn_id:
                notifications.turn_ended_notify(
                    session_id=change.flow_id,
                    turn_id=change.turn_id,
                    outcome=str(change.turn_ended),
                    error=change.turn_error,
                    ended_at=change.observed_at,
                )
    _active_limit_release(changes, known)
    _titles_schedule(changes, known)
    return approvals_changed


def _titles_schedule(changes: Sequence[AgentSessionChange], known: set[str]) -> None:
    """Sessions whose first turn just ended (they wait for a message again) and whose title
    still comes from their first message get a generated title (``agents_app.worker.titles``), once:
    they are marked ``pending`` before the task is queued."""
    from agents_app import task_queue

    if not dexagents_setting("GENERATE_TITLES"):
        return
    ended = {
        change.flow_id
        for change in changes
        if change.flow_id in known
        and change.status is not None
        and str(change.status) == AgentStatus.WAITING_FOR_USER_MESSAGE.value
    }
    if not ended:
        return
    candidates = list(
        AgentSession.objects.filter(
            pk__in=ended, title_source=TitleSource.MESSAGE, agent__generate_titles=True
        ).values_list("pk", flat=True)
    )
    marked = [
        session_id
        for session_id in candidates
        if AgentSession.objects.filter(pk=session_id, title_source=TitleSource.MESSAGE).update(
            title_source=TitleSource.PENDING
        )
    ]
    if marked:
        task_queue.title_generation_schedule(session_ids=marked)


def _active_limit_release(changes: Sequence[AgentSessionChange], known: set[str]) -> None:
    """A turn that ended (or now waits for a person) frees a place under its owner's
    ``MAX_ACTIVE_SESSIONS_PER_USER``: queue delivery of the owner's held messages."""
    from agents_app.sessions import outbox_holds

    if int(dexagents_setting("MAX_ACTIVE_SESSIONS_PER_USER")) <= 0:
        return
    freed = {
        change.flow_id
        for change in changes
        if change.flow_id in known
        and (
            (change.status is not None and str(change.status) not in outbox_holds.ACTIVE_STATUSES)
            or change.raised
        )
    }
    if not freed:
        return
    owners = set(AgentSession.objects.filter(pk__in=freed).values_list("owner_id", flat=True))
    try:
        outbox_holds.active_limit_release(owner_ids=owners)
    except Exception as error:  # the retries and the periodic sweep deliver them anyway
        logger.warning("Could not queue held messages of %s: %s", sorted(owners), error)


def _closed_apply(
    session_id: str, closed: ClosedInterrupt, observed_at: datetime.datetime
) -> bool:
    return approval_request_close(
        session_id=session_id,
        interrupt_id=closed.interrupt_id,
        state=_CLOSED_STATE[InterruptOutcome(closed.outcome)],
        message=closed.message or "",
        closed_at=observed_at,
    )


def session_stopped_index(*, session: AgentSession) -> bool:
    """Mark ``session`` stopped in the index and withdraw its pending approvals.

    Returns:
        True when approvals were withdrawn.
    """
    now = timezone.now()
    with transaction.atomic():
        # Only the first marking counts: a stop already indexed is not reported again.
        if AgentSession.objects.filter(pk=session.pk).exclude(
            status=SESSION_STATUS_STOPPED
        ).update(status=SESSION_STATUS_STOPPED, status_observed_at=now, updated_at=now):
            notifications.session_stopped_notify(session_id=session.pk)
        withdrawn = ApprovalRequest.objects.filter(
            session_id=session.pk, state=ApprovalRequest.State.PENDING
        ).update(
            state=ApprovalRequest.State.WITHDRAWN,
            outcome_message="The session was stopped.",
            closed_at=now,
            updated_at=now,
        )
    session.status = SESSION_STATUS_STOPPED
    return bool(withdrawn)


# --- reads -------------------------------------------------------------------------------------


def approval_index_version() -> str:
    """An opaque value that changes whenever the approvals index changes.

    Cheap enough to poll every second per dashboard: one aggregate over ``ApprovalRequest``.
    """
    row = ApprovalRequest.objects.aggregate(
        latest=Max("updated_at"),
        pending=Count("id", filter=Q(state=ApprovalRequest.State.PENDING)),
        total=Count("id"),
    )
    latest = row["latest"].isoformat() if row["latest"] else "-"
    return f"{latest}|{row['pending']}|{row['total']}"


# --- reconciliation ----------------------------------------------------------------------------


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
            if _request_open(
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


# --- the worker's observer ---------------------------------------------------------------------


class SessionIndexObserver:
    """``AgentSessionOptions.observer`` for ``dexworker``: applies changes to the index in order.

    One writer task per process drains a queue, batching what has queued up into one transaction
    (a session's changes stay in order). A change that raises or closes an interrupt, or
    reports a model call's usage, is awaited (up to ``wait_seconds``) so the approval is
    indexed before Dex commits it and a budget sees the call; a status-only change returns at
    once. Database errors are retried with backoff for ``retry_seconds``, then
    logged; reconciliation repairs what was lost. Build and use it inside the worker's loop.
    """

    def __init__(self, *, wait_seconds: float = 5.0, retry_seconds: float = 10.0) -> None:
        self._wait_seconds = wait_seconds
        self._retry_seconds = retry_seconds
        self._queue: asyncio.Queue[tuple[AgentSessionChange, asyncio.Future[None]]] | None = None
        self._writer: asyncio.Task[None] | None = None

    async def __call__(self, change: AgentSessionChange) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._drain(self._queue), name="session-index")
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((change, done))
        # A model call's usage is awaited too: the budget check before the session's next
        # model call reads the row it writes.
        if change.raised or change.closed or change.usage is not None:
            try:
                await asyncio.wait_for(asyncio.shield(done), timeout=self._wait_seconds)
            except TimeoutError:
                logger.warning("Index write for %s is slow; the Step goes on", change.flow_id)

    async def aclose(self) -> None:
        """Write what is queued (bounded by ``retry_seconds``), then stop the writer task."""
        if self._queue is not None and self._writer is not None and not self._writer.done():
            try:
                await asyncio.wait_for(self._queue.join(), timeout=self._retry_seconds)
            except TimeoutError:
                logger.warning("Index writes still queued at shutdown; reconciliation repairs them")
            self._writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._writer

    async def _drain(
        self, queue: asyncio.Queue[tuple[AgentSessionChange, asyncio.Future[None]]]
    ) -> None:
        from channels.db import database_sync_to_async

        apply = database_sync_to_async(session_changes_apply)
        while True:
            batch = [await queue.get()]
            while not queue.empty():
                batch.append(queue.get_nowait())
            try:
                changed = await self._apply_with_retries(apply, [item[0] for item in batch])
                if changed:
                    await approvals_changed_anotify()
            finally:
                for _change, done in batch:
                    if not done.done():
                        done.set_result(None)
                    queue.task_done()

    async def _apply_with_retries(self, apply: Any, changes: list[AgentSessionChange]) -> bool:
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self._retry_seconds
        pause = 0.05
        while True:
            try:
                return bool(await apply(changes=changes))
            except Exception as error:
                if loop.time() >= give_up_at:
                    logger.error(
                        "Index writes for %s lost (%s); reconciliation will repair them",
                        sorted({change.flow_id for change in changes}),
                        error,
                    )
                    return False
                await asyncio.sleep(pause)
                pause = min(pause * 2, 1.0)

