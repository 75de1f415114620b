"""Schedules fire exactly once per slot across a SIGKILLed worker and a restarted engine, and a
paused schedule fires no more (issue 29, "Done when"): the real engine, demo model,
``manage.py dexworker``, Celery and web as processes (``tests/e2e/relay_stack.py``).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import ENGINE_READY, PYTHON, wait_for_reply, wait_until
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

INTERVAL = 5


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("schedules")) as platform:
        yield platform


def runs(stack: Stack, schedule_id: int) -> list[dict[str, Any]]:
    with stack.api("owner") as owner:
        answer = owner.get(f"/api/v1/schedules/{schedule_id}/runs/", params={"limit": 500})
    assert answer.status_code == 200, answer.text
    return list(answer.json()["results"])


def sent(stack: Stack, schedule_id: int) -> list[dict[str, Any]]:
    return [run for run in runs(stack, schedule_id) if run["outcome"] == "message_sent"]


def next_slot(stack: Stack, schedule_id: int) -> datetime.datetime:
    with stack.api("owner") as owner:
        body = owner.get(f"/api/v1/schedules/{schedule_id}/").json()
    return datetime.datetime.fromisoformat(body["next_runs"][0])


def until(moment: datetime.datetime) -> None:
    """Poll the clock until ``moment`` (the kills are aimed at a slot's fire time)."""
    wait_until(f"the clock to pass {moment.isoformat()}",
               lambda: datetime.datetime.now(datetime.UTC) >= moment, timeout=3 * INTERVAL,
               interval=0.05)


def replace_worker(stack: Stack) -> None:
    worker = next(proc for proc in reversed(stack.processes.started) if proc.name == "worker")
    worker.signal_group(9)
    worker.popen.wait(timeout=30)
    stack.processes.start(
        "worker", [PYTHON, "manage.py", "dexworker", "--max-concurrent-tasks", "32"]
    ).wait_for_line("dexworker ready")


def restart_engine(stack: Stack) -> None:
    stack.engine.signal_group(9)
    stack.engine.popen.wait(timeout=30)
    stack.start_engine().wait_for_line(ENGINE_READY)


def test_a_schedule_fires_once_per_slot_across_kills_then_stops_when_paused(
    stack: Stack,
) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/schedules/", json={
            "agent": "demo", "name": "ping", "message": "scheduled ping at {scheduled_for}",
            "interval_seconds": INTERVAL, "missed_run_policy": "run_once",
        })
    assert created.status_code == 201, created.text
    schedule_id = created.json()["id"]
    assert len(created.json()["next_runs"]) == 5

    wait_until("the first run", lambda: sent(stack, schedule_id), timeout=60)

    # A worker SIGKILLed just before a slot: the engine's Timer fires while no worker runs,
    # and the new worker fires that slot (or, past the grace, the latest missed one) once.
    until(next_slot(stack, schedule_id) - datetime.timedelta(seconds=0.3))
    replace_worker(stack)
    after_worker = len(sent(stack, schedule_id))
    wait_until("a run after the worker came back",
               lambda: len(sent(stack, schedule_id)) > after_worker, timeout=60)

    # The engine SIGKILLed right at a fire time and started again on its database.
    until(next_slot(stack, schedule_id))
    restart_engine(stack)
    after_engine = len(sent(stack, schedule_id))
    wait_until("a run after the engine came back",
               lambda: len(sent(stack, schedule_id)) > after_engine, timeout=90)

    with stack.api("owner") as owner:
        paused = owner.patch(f"/api/v1/schedules/{schedule_id}/", json={"enabled": False})
    assert paused.status_code == 200, paused.text
    assert paused.json()["next_runs"] == []
    at_pause = runs(stack, schedule_id)
    # Past two slots after the pause, polling: nothing new may appear.
    deadline = time.monotonic() + 2 * INTERVAL + 3
    while time.monotonic() < deadline:
        assert len(runs(stack, schedule_id)) == len(at_pause)
        time.sleep(0.5)

    final = runs(stack, schedule_id)
    slots = [run["slot"] for run in final]
    assert len(slots) == len(set(slots))
    assert all(run["outcome"] in {"message_sent", "skipped_missed"} for run in final), final
    sessions = [run["session"] for run in final if run["outcome"] == "message_sent"]
    assert len(sessions) == len(set(sessions)) >= 3
    # Every session the owner has is one run's, and each was answered.
    with stack.api("owner") as owner:
        listed = owner.get("/api/v1/sessions/", params={"limit": 200}).json()["results"]
        assert sorted(item["id"] for item in listed) == sorted(sessions)
        for session_id in sessions:
            snapshot = wait_for_reply(owner, session_id, 2, timeout=60)
            assert snapshot["messages"][0]["text"].startswith("scheduled ping at ")
    # No Step of the schedule Flow failed on the way (a refused Timer would show here).
    failures = [line for proc in stack.processes.started if proc.name == "worker"
                for line in proc.lines if "Flow AgentSchedule Step" in line]
    assert failures == []


def test_a_persistent_session_gets_one_message_per_run(stack: Stack) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/schedules/", json={
            "agent": "demo", "name": "digest", "message": "digest {schedule_name}",
            "interval_seconds": INTERVAL, "target": "session",
        })
        assert created.status_code == 201, created.text
        schedule_id = created.json()["id"]
        wait_until("two runs", lambda: len(sent(stack, schedule_id)) >= 2, timeout=60)
        paused = owner.patch(f"/api/v1/schedules/{schedule_id}/", json={"enabled": False})
        assert paused.status_code == 200
        final = sent(stack, schedule_id)
        session_id = paused.json()["session"]
        assert session_id and {run["session"] for run in final} == {session_id}
        snapshot = wait_for_reply(owner, session_id, 2 * len(final), timeout=90)
        users = [m for m in snapshot["messages"] if m["role"] == "user"]
        assert [m["text"] for m in users] == ["digest digest"] * len(final)
