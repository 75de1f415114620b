"""Reads of schedules (issue 29, "Schedules"): a user's schedules, one schedule, its runs
(all of them, and the newest as the schedule's page shows them), the next run times, and the
form's preview.

May import: the foundation (``schedule_times``, the models) (tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import zoneinfo
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import OuterRef, QuerySet, Subquery

from agents_app import schedule_times
from agents_app.models import AgentSession, Schedule, ScheduleRun, ScheduleRunOutcome

#: How many coming run times a schedule shows (REST ``next_runs``, the pages).
NEXT_RUNS = 5
#: How many runs the schedule's page lists (the REST runs endpoint pages through all).
RECENT_RUNS = 20


def schedule_list(*, owner: AbstractBaseUser | AnonymousUser) -> QuerySet[Schedule]:
    """``owner``'s schedules by name, with ``agent`` joined and each row's latest run's
    outcome and slot annotated as ``last_outcome`` and ``last_slot`` (``None``: no run)."""
    latest = ScheduleRun.objects.filter(schedule=OuterRef("pk")).order_by("-slot")
    return (
        Schedule.objects.filter(owner_id=owner.pk)
        .select_related("agent")
        .annotate(
            last_outcome=Subquery(latest.values("outcome")[:1]),
            last_slot=Subquery(latest.values("slot")[:1]),
        )
        .order_by("name", "id")
    )


def schedule_get(*, owner: AbstractBaseUser | AnonymousUser, schedule_id: int) -> Schedule:
    """``owner``'s schedule ``schedule_id`` (annotated as in ``schedule_list``).

    Raises:
        Schedule.DoesNotExist: No such schedule of ``owner`` (another user's included).
    """
    return schedule_list(owner=owner).get(pk=schedule_id)


def schedule_runs(*, schedule: Schedule) -> QuerySet[ScheduleRun]:
    """The schedule's runs, newest slot first, with their sessions joined."""
    return ScheduleRun.objects.filter(schedule=schedule).select_related("session").order_by(
        "-slot"
    )


@dataclasses.dataclass(frozen=True)
class ScheduleRunRow:
    """One run as the schedule's page shows it.

    Attributes:
        slot: The run's nominal time, in the schedule's zone (aware).
        outcome: ``ScheduleRunOutcome`` value (``started``, ``message_sent``, ...).
        outcome_text: The outcome in words (``"Message sent"``).
        detail: Why a run failed or was skipped; ``""`` when there is nothing to say.
        session_id: The session the run started or wrote to; ``None`` (skipped, failed, or
            the session is gone).
        session_title: That session's title (``""`` when it has none or there is none).
    """

    slot: datetime.datetime
    outcome: str
    outcome_text: str
    detail: str
    session_id: str | None
    session_title: str

    @property
    def slot_iso(self) -> str:
        """``slot`` in ISO 8601 with its offset (``2026-12-07T07:30:00+01:00``)."""
        return self.slot.isoformat()

    @property
    def slot_text(self) -> str:
        """``slot`` for people, in the schedule's zone (``2026-12-07 07:30:00 CET``)."""
        return self.slot.strftime("%Y-%m-%d %H:%M:%S %Z")


def schedule_runs_recent(
    *, schedule: Schedule, limit: int = RECENT_RUNS
) -> list[ScheduleRunRow]:
    """The newest ``limit`` runs of ``schedule`` (newest slot first), with each slot in the
    schedule's time zone (UTC when the zone no longer resolves) and the outcome in words,
    for the schedule's page (issue 29: "each run is listed with its session and outcome")."""
    try:
        zone: datetime.tzinfo = zoneinfo.ZoneInfo(schedule.timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        zone = datetime.UTC
    return [
        ScheduleRunRow(
            slot=run.slot.astimezone(zone),
            outcome=run.outcome,
            outcome_text=schedule_outcome_text(run.outcome),
            detail=run.detail,
            session_id=run.session_id,
            session_title=run.session.title if run.session is not None else "",
        )
        for run in schedule_runs(schedule=schedule)[:limit]
    ]


def schedule_outcome_text(outcome: str | None) -> str:
    """A run's outcome in words, as the pages show it ("Message sent"); ``""`` for none."""
    if not outcome:
        return ""
    return str(dict(ScheduleRunOutcome.choices).get(outcome, outcome)).capitalize()


def schedule_next_runs(
    *, schedule: Schedule, now: datetime.datetime | None = None, count: int = NEXT_RUNS
) -> list[str]:
    """The next ``count`` run times of ``schedule`` after ``now``, ISO 8601 in its zone;
    ``[]`` when it is paused or its times do not parse."""
    if not schedule.enabled:
        return []
    return schedule_preview(
        cron=schedule.cron, interval_seconds=schedule.interval_seconds,
        timezone=schedule.timezone, now=now, count=count,
    ).next_runs


@dataclasses.dataclass(frozen=True)
class SchedulePreview:
    """The form's preview: the next run times, or why there are none.

    Attributes:
        next_runs: ISO 8601 times in the schedule's zone.
        errors: ``{field: [message]}`` (``cron``, ``interval_seconds``, ``timezone``).
    """

    next_runs: list[str]
    errors: dict[str, list[str]]

    def as_data(self) -> dict[str, Any]:
        return {"next_runs": self.next_runs, "errors": self.errors}


def schedule_preview(
    *, cron: str, interval_seconds: int | None, timezone: str,
    now: datetime.datetime | None = None, count: int = NEXT_RUNS,
) -> SchedulePreview:
    """Validate schedule times (``schedule_times.schedule_times_validate``) and list the next
    ``count`` run times after ``now``."""
    try:
        schedule_times.schedule_times_validate(
            cron=cron, interval_seconds=interval_seconds, timezone=timezone
        )
        runs = schedule_times.next_slots(
            cron=cron.strip(), interval_seconds=interval_seconds, timezone=timezone,
            after=now or datetime.datetime.now(datetime.UTC), count=count,
        )
    except schedule_times.ScheduleTimeError as error:
        return SchedulePreview(next_runs=[], errors={error.field: [str(error)]})
    return SchedulePreview(next_runs=[run.isoformat() for run in runs], errors={})


def schedule_sessions_choosable(
    *, owner: AbstractBaseUser | AnonymousUser
) -> QuerySet[AgentSession]:
    """``owner``'s live sessions a schedule may target (newest first)."""
    return AgentSession.objects.filter(owner_id=owner.pk).exclude(status="stopped").select_related(
        "agent"
    )
