"""The Django index of sessions and approvals, kept current from the worker and reconciled
from Dex (ARCHITECTURE.md "The Django index").

Dex owns every session's truth. Lists that must answer with one query (sessions by status, every
pending approval of every session) read two Django tables instead: ``AgentSession.status`` and
``ApprovalRequest``. They are written

- by the Dex worker, through ``SessionIndexObserver`` (the ``AgentSessionFlow`` observer): every
  Step that changes a session's status or its pending interrupts reports the change just before
  Dex commits it, so a raised approval is indexed before anyone can decide it;
- by the web side, when Dex accepts an approval decision or a stop (``services``);
- by ``session_index_reconcile`` (``index_reconcile``), which compares the index with Dex
  snapshots after restarts and periodically (Celery beat), because a worker killed between a Step
  and its index write, or a Step that failed after reporting, leaves the index behind or ahead.

This module holds the worker's side and the writes both sides share: applying reported changes
(``session_changes_apply``, ``SessionIndexObserver``), a status (``session_status_apply``) and a
stop (``session_stopped_index``). Approval rows are opened and closed by ``approval_index``.

Every write is an idempotent upsert keyed by session ID and interrupt ID; a status is applied only
when it was observed later than the stored one. Whenever the set of approvals changes, a notice goes
to the channel layer group ``approvals``; the notice carries no data, and the dashboard's consumer
also polls ``approval_index_version`` so a lost broadcast only delays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Sequence
from typing import Any

from django.db import transaction
from django.db.models import Case, Count, F, Max, Q, Value, When
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.models import (
    SESSION_STATUS_STOPPED,
    AgentSession,
    ApprovalRequest,
    TitleSource,
)
from agents_app.notify import notifications
from agents_app.sessions.approval_index import (
    approval_request_close,
    approval_request_open,
    approvals_changed_anotify,
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
                approvals_changed |= approval_request_open(
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

