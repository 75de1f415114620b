"""Slots, validation and missed runs of schedules (``agents_app.schedule_times``) and the
Flow's decisions over the database (``agents_app.services.schedule_runs``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from agents_app import schedule_times
from agents_app.models import Schedule, ScheduleRun, ScheduleRunOutcome
from agents_app.services import schedule_runs
from tests.factories import AgentDefinitionFactory

UTC = datetime.UTC


def at(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text).astimezone(UTC)


def test_interval_slots_are_epoch_aligned_and_strictly_after() -> None:
    slots = schedule_times.next_slots(cron="", interval_seconds=5, timezone="UTC",
                                      after=at("2026-01-01T00:00:05+00:00"), count=3)
    assert [s.isoformat() for s in slots] == [
        "2026-01-01T00:00:10+00:00", "2026-01-01T00:00:15+00:00", "2026-01-01T00:00:20+00:00",
    ]


def test_cron_is_read_in_the_schedule_zone_across_dst() -> None:
    # 09:00 Paris is 08:00 UTC on 28 March 2026 and 07:00 UTC from the switch on the 29th.
    slots = schedule_times.next_slots(cron="0 9 * * *", interval_seconds=None,
                                      timezone="Europe/Paris",
                                      after=at("2026-03-27T12:00:00+00:00"), count=2)
    assert [s.astimezone(UTC).hour for s in slots] == [8, 7]
    assert all(s.utcoffset() in (datetime.timedelta(hours=1), datetime.timedelta(hours=2))
               for s in slots)


def test_six_field_cron_has_seconds() -> None:
    slot = schedule_times.next_slot(cron="* * * * * */10", interval_seconds=None,
                                    timezone="UTC", after=at("2026-01-01T00:00:01+00:00"))
    assert slot == at("2026-01-01T00:00:10+00:00")


@pytest.mark.parametrize(
    ("cron", "interval", "zone", "field"),
    [
        ("61 * * * *", None, "UTC", "cron"),
        ("* * *", None, "UTC", "cron"),
        ("* * * * *", 60, "UTC", "cron"),
        ("", None, "UTC", "cron"),
        ("", 4, "UTC", "interval_seconds"),
        ("* * * * * *", None, "UTC", "cron"),
        ("0 9 * * *", None, "Mars/Olympus", "timezone"),
    ],
)
def test_bad_times_name_their_field(cron: str, interval: int | None, zone: str,
                                    field: str) -> None:
    with pytest.raises(schedule_times.ScheduleTimeError) as raised:
        schedule_times.schedule_times_validate(cron=cron, interval_seconds=interval,
                                               timezone=zone)
    assert raised.value.field == field


def test_grace_is_the_gap_to_the_next_slot_at_most_a_minute() -> None:
    slot = at("2026-01-01T00:00:00+00:00")
    assert schedule_times.grace_seconds(cron="", interval_seconds=5, timezone="UTC",
                                        slot=slot) == 5
    assert schedule_times.grace_seconds(cron="0 * * * *", interval_seconds=None,
                                        timezone="UTC", slot=slot) == 60


@pytest.mark.parametrize("cron,interval", [("", 5), ("* * * * * */5", None)])
def test_latest_slot_until_now(cron: str, interval: int | None) -> None:
    slot = at("2026-01-01T00:00:00+00:00")
    latest = schedule_times.latest_slot_until(
        cron=cron, interval_seconds=interval, timezone="UTC", slot=slot,
        now=at("2026-01-01T00:00:23+00:00"),
    )
    assert latest == at("2026-01-01T00:00:20+00:00")


@pytest.fixture
def schedule(owner: Any) -> Schedule:
    return Schedule.objects.create(
        owner=owner, agent=AgentDefinitionFactory.create(slug="demo"), name="ping",
        message="ping {scheduled_for}", interval_seconds=10,
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "skip"), [("skip", True), ("run_once", False)])
def test_a_late_arrival_handles_the_latest_missed_slot(
    schedule: Schedule, policy: str, skip: bool
) -> None:
    schedule.missed_run_policy = policy
    schedule.save()
    slot = at("2026-01-01T00:00:00+00:00")
    on_time = schedule_runs.schedule_slot_arrive(
        schedule_id=schedule.pk, generation=1, slot=slot, now=slot + datetime.timedelta(seconds=9)
    )
    assert on_time == (slot, False)
    late = schedule_runs.schedule_slot_arrive(
        schedule_id=schedule.pk, generation=1, slot=slot,
        now=slot + datetime.timedelta(seconds=35),
    )
    assert late == (at("2026-01-01T00:00:30+00:00"), skip)


@pytest.mark.django_db
def test_a_stale_flow_plans_and_fires_nothing(schedule: Schedule) -> None:
    slot = at("2026-01-01T00:00:00+00:00")
    assert schedule_runs.schedule_slot_plan(schedule_id=schedule.pk, generation=2,
                                            after=slot) is None
    assert schedule_runs.schedule_slot_plan(
        schedule_id=schedule.pk, generation=1, after=slot
    ) == at("2026-01-01T00:00:10+00:00")
    Schedule.objects.filter(pk=schedule.pk).update(enabled=False)
    assert schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1, slot=slot,
                                            skip=False) is False
    assert not ScheduleRun.objects.exists()


@pytest.mark.django_db
def test_a_skipped_slot_is_recorded_once(schedule: Schedule) -> None:
    slot = at("2026-01-01T00:00:00+00:00")
    for _ in range(2):
        assert schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1,
                                                slot=slot, skip=True)
    run = ScheduleRun.objects.get()
    assert (run.slot, run.outcome, run.session) == (slot, ScheduleRunOutcome.SKIPPED_MISSED, None)


def test_run_ids_are_deterministic_per_slot() -> None:
    slot = at("2026-01-01T00:00:00+00:00")
    first = schedule_runs.run_session_id(schedule_id=1, slot=slot)
    assert first == schedule_runs.run_session_id(schedule_id=1, slot=slot.astimezone(
        datetime.timezone(datetime.timedelta(hours=2))))
    assert first.startswith("ses_") and len(first) == 36
    assert first != schedule_runs.run_session_id(
        schedule_id=1, slot=slot + datetime.timedelta(seconds=5))
    assert len(schedule_runs.run_message_id(schedule_id=1, slot=slot)) == 32


def test_the_slot_timer_is_whole_seconds_never_early() -> None:
    from agents_app.worker.schedule_flow import slot_timer_seconds

    slot = at("2026-01-01T00:00:10+00:00")
    assert slot_timer_seconds(slot, slot - datetime.timedelta(seconds=2.3)) == 3
    assert slot_timer_seconds(slot, slot - datetime.timedelta(seconds=2)) == 2
    assert slot_timer_seconds(slot, slot + datetime.timedelta(seconds=1)) == 0


async def test_the_await_step_asks_dex_for_a_whole_second_timer() -> None:
    from dex import Timer, Wait

    from agents_app.worker.schedule_flow import ScheduleAwaitSlot, ScheduleSlotRef

    later = datetime.datetime.now(UTC) + datetime.timedelta(seconds=7.5)
    wait = await ScheduleAwaitSlot(None).wait_for(
        None, ScheduleSlotRef(schedule_id=1, generation=1, slot=later.isoformat())  # type: ignore[arg-type]
    )
    timer = wait.conditions[0]
    assert wait.kind == Wait.until(Timer.by_duration(datetime.timedelta(seconds=1))).kind
    assert timer.duration.microseconds == 0 and 7 <= timer.duration.total_seconds() <= 8  # type: ignore[attr-defined]
