"""The database work of a schedule's Flow (issue 29, "Schedules"): planning the next slot,
deciding on time or missed, and firing one slot exactly once.

``SCHEDULE_WORK`` is what ``manage.py dexworker`` hands the Flow
(``agents_app.worker.schedule_flow.ScheduleWork``); each function is blocking and runs in a
worker thread.

Exactly once per slot: ``schedule_slot_fire`` writes the slot's ``ScheduleRun`` (unique per
schedule and slot) in one transaction under the schedule row's lock, after re-checking that
the schedule is enabled and at the Flow's generation. Only then does it start the session,
with an ID derived from (schedule, slot) (``run_session_id``), or send the message to the
persistent session with an outbox ID derived alike (``run_message_id``). A repeat of the Step
(a worker killed, the engine restarted) finds the row: a run still ``started`` repeats the
same start or send, which Dex and the outbox take once; any other outcome is final.

May import: the services beside it (``session_lifecycle``, ``session_input``), the Dex
gateway and the foundation (tests/test_layering.py).
"""

from __future__ import annotations

import datetime
import logging
import uuid

from django.db import transaction

from agents_app import schedule_times
from agents_app.gateway import dex_gateway
from agents_app.models import (
    AgentSession,
    MissedRunPolicy,
    Schedule,
    ScheduleRun,
    ScheduleRunOutcome,
    ScheduleTarget,
)
from agents_app.services import session_input, session_lifecycle
from agents_app.services.schedules import ScheduleValidationError, message_render
from agents_app.worker.schedule_flow import Arrival, ScheduleWork

logger = logging.getLogger(__name__)


def _slot_key(schedule_id: int, slot: datetime.datetime) -> str:
    return f"dexagents:schedule:{schedule_id}:{slot.astimezone(datetime.UTC).isoformat()}"


def run_session_id(*, schedule_id: int, slot: datetime.datetime) -> str:
    """The session ID a run of ``schedule_id`` at ``slot`` starts: ``ses_<uuid5 hex>``, the
    same for every repeat of that fire."""
    return session_lifecycle.SESSION_ID_PREFIX + uuid.uuid5(
        uuid.NAMESPACE_URL, _slot_key(schedule_id, slot)
    ).hex


def run_message_id(*, schedule_id: int, slot: datetime.datetime) -> str:
    """The outbox message ID (32 hex) of a run sent to a persistent session."""
    return uuid.uuid5(uuid.NAMESPACE_URL, _slot_key(schedule_id, slot) + ":message").hex


def _current(schedule_id: int, generation: int) -> Schedule | None:
    return Schedule.objects.filter(pk=schedule_id, enabled=True, generation=generation).first()


def schedule_slot_plan(
    *, schedule_id: int, generation: int, after: datetime.datetime | None
) -> datetime.datetime | None:
    """The first slot after ``after`` (after now when ``None``), UTC; ``None`` when the
    schedule is gone, paused or at another generation (or its times no longer parse)."""
    schedule = _current(schedule_id, generation)
    if schedule is None:
        return None
    try:
        return schedule_times.next_slot(
            cron=schedule.cron, interval_seconds=schedule.interval_seconds,
            timezone=schedule.timezone,
            after=after or datetime.datetime.now(datetime.UTC),
        )
    except schedule_times.ScheduleTimeError as error:
        logger.warning("Schedule %s cannot make slots (%s); its Flow ends", schedule_id, error)
        return None


def schedule_slot_arrive(
    *, schedule_id: int, generation: int, slot: datetime.datetime, now: datetime.datetime
) -> Arrival:
    """What the Timer of ``slot`` that fired at ``now`` fires.

    Returns:
        ``(slot, False)`` when ``now`` is within ``schedule_times.grace_seconds`` of it;
        otherwise the fire is missed and the latest slot at or before ``now`` is handled:
        ``(latest, True)`` (recorded as ``skipped_missed``) under policy ``skip``,
        ``(latest, False)`` (fired once) under ``run_once``; the slots between are not
        recorded. ``None`` when the Flow is stale.
    """
    schedule = _current(schedule_id, generation)
    if schedule is None:
        return None
    cron, interval, zone = schedule.cron, schedule.interval_seconds, schedule.timezone
    grace = schedule_times.grace_seconds(
        cron=cron, interval_seconds=interval, timezone=zone, slot=slot
    )
    if (now - slot).total_seconds() <= grace:
        return slot, False
    latest = schedule_times.latest_slot_until(
        cron=cron, interval_seconds=interval, timezone=zone, slot=slot, now=now
    )
    return latest, schedule.missed_run_policy == MissedRunPolicy.SKIP


def schedule_slot_fire(
    *, schedule_id: int, generation: int, slot: datetime.datetime, skip: bool
) -> bool:
    """Record ``slot`` of the schedule and, unless ``skip``, send its message, once.

    Returns:
        False when no run row existed and the schedule is gone, paused or at another
        generation (nothing is recorded; the Flow ends); True otherwise.

    Raises:
        dex_gateway.EngineUnavailableError: The engine did not answer; the run stays
            ``started`` and the Step's repeat completes it.
    """
    with transaction.atomic():
        schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
        run = ScheduleRun.objects.filter(schedule_id=schedule_id, slot=slot).first()
        if run is None:
            if schedule is None or not schedule.enabled or schedule.generation != generation:
                return False
            if skip:
                ScheduleRun.objects.create(
                    schedule=schedule, slot=slot, outcome=ScheduleRunOutcome.SKIPPED_MISSED,
                    detail="Missed while the engine or the worker was down (policy: skip).",
                )
                return True
            run = ScheduleRun.objects.create(
                schedule=schedule, slot=slot, outcome=ScheduleRunOutcome.STARTED
            )
    if run.outcome != ScheduleRunOutcome.STARTED or schedule is None:
        return True
    try:
        session, detail = _run_send(schedule=schedule, slot=slot)
    except dex_gateway.EngineUnavailableError:
        raise
    except Exception as error:  # the run failed for good: say why on its row
        logger.warning("Schedule %s slot %s failed: %s", schedule_id, slot, error)
        ScheduleRun.objects.filter(pk=run.pk).update(
            outcome=ScheduleRunOutcome.FAILED, detail=_failure_detail(error)
        )
        return True
    run.session, run.outcome, run.detail = session, ScheduleRunOutcome.MESSAGE_SENT, detail
    run.save(update_fields=("session", "outcome", "detail", "updated_at"))
    return True


def _failure_detail(error: Exception) -> str:
    if isinstance(error, session_input.QueueFullError):
        return "The session's message queue is full."
    if isinstance(error, dex_gateway.SessionNotFoundError):
        return ("The schedule's session was stopped or deleted; choose another session, or "
                "none to let the next run create one.")
    if isinstance(error, ScheduleValidationError):
        return str(error)
    return f"{type(error).__name__}: {error}"[:500]


def _run_send(*, schedule: Schedule, slot: datetime.datetime) -> tuple[AgentSession, str]:
    """Start the run's session or send its message to the persistent one.

    Returns:
        The session and a detail for the run row (why a message waits, else ``""``).
    """
    text = message_render(template=schedule.message, slot=slot, schedule=schedule)
    if not schedule.agent.enabled:
        raise RuntimeError(f"The agent {schedule.agent.slug!r} is disabled.")
    persistent = schedule.target == ScheduleTarget.SESSION
    session = schedule.session if persistent else None
    if session is None:
        session = session_lifecycle.session_create(
            owner=schedule.owner, agent=schedule.agent, message=text,
            session_id=run_session_id(schedule_id=schedule.pk, slot=slot),
        )
        if persistent:
            Schedule.objects.filter(pk=schedule.pk, session__isnull=True).update(session=session)
        first = getattr(session, "first_message", None)
        return session, (first.pending_detail or first.pending_reason) if first else ""
    if session.deleted_at is not None or session.status == "stopped":
        raise dex_gateway.SessionNotFoundError(session.id)
    accepted = session_input.session_message_send(
        session=session, text=text,
        message_id=run_message_id(schedule_id=schedule.pk, slot=slot),
    )
    return session, accepted.pending_detail or accepted.pending_reason


#: The Flow's work, as ``manage.py dexworker`` passes it to ``build_schedule_flow``.
SCHEDULE_WORK = ScheduleWork(
    plan=schedule_slot_plan, arrive=schedule_slot_arrive, fire=schedule_slot_fire
)
