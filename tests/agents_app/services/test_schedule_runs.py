"""A schedule's fire repeated against the real engine (no worker: starts are only accepted):
one run row, one session, one outbox message per slot (``services.schedule_runs``), and the
Flow of a created, paused and resumed schedule (``services.schedules``)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from agents_app.gateway import dex_gateway, engine_connection
from agents_app.models import AgentSession, OutboxMessage, Schedule, ScheduleRun
from agents_app.services import schedule_runs, schedules
from agents_app.worker.schedule_flow import schedule_flow_id
from tests.factories import AgentDefinitionFactory

pytestmark = pytest.mark.django_db(transaction=True)

SLOT = datetime.datetime(2026, 1, 1, 9, tzinfo=datetime.UTC)


def flow_running(flow_id: str) -> bool:
    async def describe() -> Any:
        return await engine_connection.connection().client.describe_flow(flow_id)

    try:
        info = dex_gateway.run(describe())
    except Exception:
        return False
    return str(info.status.name) == "RUNNING"


def test_a_repeated_fire_starts_one_session(engine: str, owner: Any) -> None:
    agent = AgentDefinitionFactory.create(slug="demo")
    schedule = Schedule.objects.create(owner=owner, agent=agent, name="ping",
                                       message="ping {scheduled_for}", interval_seconds=60)
    for _ in range(3):
        assert schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1,
                                                slot=SLOT, skip=False)
    run = ScheduleRun.objects.get()
    assert run.outcome == "message_sent"
    assert run.session_id == schedule_runs.run_session_id(schedule_id=schedule.pk, slot=SLOT)
    assert AgentSession.objects.count() == 1
    # A crash after the row said "started": the repeat recognises the started Flow.
    ScheduleRun.objects.update(outcome="started", session=None)
    assert schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1, slot=SLOT,
                                            skip=False)
    assert ScheduleRun.objects.get().outcome == "message_sent"
    assert AgentSession.objects.count() == 1


def test_a_repeated_fire_sends_one_message_to_the_persistent_session(
    engine: str, owner: Any
) -> None:
    agent = AgentDefinitionFactory.create(slug="demo")
    schedule = Schedule.objects.create(owner=owner, agent=agent, name="digest",
                                       message="digest", interval_seconds=60, target="session")
    schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1, slot=SLOT,
                                     skip=False)
    schedule.refresh_from_db()
    assert schedule.session_id is not None
    later = SLOT + datetime.timedelta(minutes=1)
    for _ in range(2):
        ScheduleRun.objects.filter(slot=later).update(outcome="started")
        schedule_runs.schedule_slot_fire(schedule_id=schedule.pk, generation=1, slot=later,
                                         skip=False)
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [
        schedule_runs.run_message_id(schedule_id=schedule.pk, slot=later)]
    assert ScheduleRun.objects.filter(session_id=schedule.session_id).count() == 2


def test_create_pause_and_resume_move_the_flow(engine: str, owner: Any) -> None:
    agent = AgentDefinitionFactory.create(slug="demo")
    schedule = schedules.schedule_create(owner=owner, agent=agent, name="n", message="m",
                                         interval_seconds=3600)
    assert flow_running(schedule_flow_id(schedule_id=schedule.pk, generation=1))
    paused = schedules.schedule_enabled_set(schedule=schedule, enabled=False)
    assert paused.generation == 2
    assert not flow_running(schedule_flow_id(schedule_id=schedule.pk, generation=1))
    assert not flow_running(schedule_flow_id(schedule_id=schedule.pk, generation=2))
    resumed = schedules.schedule_enabled_set(schedule=paused, enabled=True)
    assert flow_running(schedule_flow_id(schedule_id=schedule.pk, generation=3))
    assert schedules.schedules_reconcile() == schedules.ReconcileResult(running=1)
    schedules.schedule_delete(schedule=resumed)
    assert not flow_running(schedule_flow_id(schedule_id=schedule.pk, generation=3))
