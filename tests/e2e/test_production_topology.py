"""The production topology on real PostgreSQL and Redis, with real processes.

``manage.py dev`` (what ``make run`` runs) with ``DATABASE_URL``, ``REDIS_URL``,
``DEXAGENTS_WEB_PROCESSES=2`` and ``DEXAGENTS_WORKERS=3`` runs two uvicorn processes on one
socket, three ``dexworker`` processes, a Celery worker and beat against the embedded engine. One
stack serves several checks, to keep CI time down: its tables are in Postgres and no filesystem
broker directory exists; 30 sessions each run a read and a gated write (the demo Slack server's
``search_messages`` and ``post_message``) while one Dex worker and one web process are SIGKILLed;
the approvals API lists every pending approval exactly once; every write runs exactly once (the
demo server's own ``slack_messages.json``); an approvals notice sent through Redis from another
process reaches a websocket.

A second test runs three beat-less Celery workers and one beat on Redis and counts how often
the periodic MCP discovery ran, from the workers' own logs.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.e2e.conftest import PYTHON, Ports, Proc, Processes, wait_until
from tests.production_services import migrated_postgres_url, postgres_url, redis_url

__all__ = ["migrated_postgres_url", "postgres_url", "redis_url"]

pytestmark = pytest.mark.e2e

SESSIONS = 30
KILL_WORKER_AFTER = 10  # sessions created when a Dex worker is SIGKILLed (mid-batch)
READ = 'slack__search_messages {"query": "deploy"}'
SLOW_SECONDS = 0.2


def _children(pid: int) -> dict[int, str]:
    """``{pid: command line}`` of the direct children of ``pid`` (Linux /proc)."""
    found: dict[int, str] = {}
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            pids = [int(child) for child in task.read_text().split()]
        except OSError:
            continue
        for child in pids:
            try:
                raw = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            found[child] = raw.replace(b"\0", b" ").decode(errors="replace")
    return found


def _children_running(dev: Proc, marker: str) -> list[int]:
    return sorted(pid for pid, command in _children(dev.popen.pid).items() if marker in command)


def _public_tables(database_url: str) -> set[str]:
    with psycopg.connect(database_url) as connection:
        rows = connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return {str(row[0]) for row in rows}


def _write_text(number: int) -> str:
    return f"topology write {number}"


def _message(number: int) -> str:
    arguments = json.dumps({"channel": "general", "text": _write_text(number)})
    # /slow stretches each model call over a second or so, so the SIGKILL finds every worker
    # inside a Step rather than between two.
    return f"/slow {SLOW_SECONDS}\n/tool {READ}\n/tool slack__post_message {arguments}"


def _get(client: httpx.Client, path: str, **params: Any) -> Any:
    """GET ``path`` as JSON, retrying a connection that a killed web process dropped."""

    def probe() -> tuple[Any] | None:
        try:
            answer = client.get(path, params=params)
        except httpx.TransportError:
            return None
        assert answer.status_code == 200, answer.text
        return (answer.json(),)

    return wait_until(f"GET {path}", probe, timeout=30)[0]


def _restarted(dev: Proc, name: str) -> bool:
    """Whether the supervisor restarted ``name`` after a SIGKILL and it printed ready again."""
    lines = dev.lines
    for index, line in enumerate(lines):
        if re.match(rf"\s*{re.escape(name)} \| exited with code -9", line):
            return any(later.strip().startswith(f"{name} |") and
                       ("dexworker ready" in later or "Application startup complete" in later)
                       for later in lines[index:])
    return False


def test_scale_out_on_postgres_and_redis(
    processes: Processes, ports: Ports, stack_env: dict[str, str], postgres_url: str,
    redis_url: str,
) -> None:
    started = time.monotonic()
    stack_env.update({
        "DATABASE_URL": postgres_url,
        "REDIS_URL": redis_url,
        "DEXAGENTS_WEB_PROCESSES": "2",
        "DEXAGENTS_WORKERS": "3",
    })
    var_dir = Path(stack_env["DEXAGENTS_VAR_DIR"])
    dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(ports.web)])
    dev.wait_for_line("dexagents is ready at", timeout=240)
    # The topology lines follow the ready line; the token line comes after all of them.
    token = dev.wait_for_line("API token for the demo user:").rsplit(":", 1)[1].strip()
    topology = dev.output()
    assert f"Web: 2 processes on http://127.0.0.1:{ports.web} (one shared socket)" in topology
    assert "Dex workers: 3" in topology
    assert "Database: postgresql 127.0.0.1:5432/" in topology
    assert f"Redis: {redis_url} (channel layer, Celery broker and results, cache)" in topology
    print(f"stack ready after {time.monotonic() - started:.1f} s")

    # Postgres holds the tables; Redis is the broker, so no filesystem broker directory exists.
    assert {"agents_app_approvalrequest", "mcp_registry_mcpserver",
            "django_celery_beat_periodictask"} <= _public_tables(postgres_url)
    assert not (var_dir / "celery").exists()
    assert not (var_dir / "db.sqlite3").exists()
    workers = _children_running(dev, "dexworker")
    webs = _children_running(dev, "uvicorn")
    assert (len(workers), len(webs)) == (3, 2), _children(dev.popen.pid)

    staff_token = processes.run(
        [PYTHON, "manage.py", "createtoken", "e2e-reviewer", "--staff"]).strip().splitlines()[-1]
    base = f"http://127.0.0.1:{ports.web}"
    # A fresh connection per request, so requests spread over both web processes.
    limits = httpx.Limits(max_keepalive_connections=0)
    owner = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"},
                         timeout=60, limits=limits)
    staff = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {staff_token}"},
                         timeout=60, limits=limits)
    wait_until("healthz to report every part up",
               lambda: owner.get("/healthz").status_code == 200, timeout=60)

    # 30 sessions at once; a Dex worker is SIGKILLed once a third of them exist.
    created: dict[int, str] = {}
    enough = threading.Event()

    def create(number: int) -> None:
        answer = owner.post("/api/v1/sessions/", json={"agent": "demo",
                                                       "message": _message(number)})
        assert answer.status_code == 201, answer.text
        created[number] = answer.json()["id"]
        if len(created) >= KILL_WORKER_AFTER:
            enough.set()

    with ThreadPoolExecutor(max_workers=10) as pool:
        futures = [pool.submit(create, number) for number in range(SESSIONS)]
        assert enough.wait(timeout=120)
        os.kill(workers[0], signal.SIGKILL)
        for future in futures:
            future.result()
    assert len(set(created.values())) == SESSIONS
    # The web process is killed with every session created: a POST it dropped could not be
    # told apart from one it served, while the reads after it are retried.
    os.kill(webs[0], signal.SIGKILL)

    # Every pending approval appears in the list exactly once, whatever process answers.
    expected_sessions = set(created.values())

    def all_pending() -> list[dict[str, Any]] | None:
        listed: list[dict[str, Any]] = _get(staff, "/api/v1/approvals/")
        # Interrupt IDs are per session ("turn-1.call_2"): an approval is the pair.
        ids = [(item["session"], item["interrupt_id"]) for item in listed]
        assert len(ids) == len(set(ids)), f"an approval is listed twice: {ids}"
        sessions = [item["session"] for item in listed]
        assert len(sessions) == len(set(sessions)), f"a session is listed twice: {sessions}"
        assert set(sessions) <= expected_sessions
        return listed if len(listed) == SESSIONS else None

    pending = wait_until("every session to wait for approval", all_pending, timeout=120)
    assert {item["tool_name"] for item in pending} == {"slack__post_message"}
    assert {item["session"] for item in pending} == expected_sessions
    # Nothing was written before an approval.
    slack_file = var_dir / "demo_mcp" / "slack_messages.json"
    assert not slack_file.exists() or json.loads(slack_file.read_text()) == []
    # The killed processes came back (the supervisor restarts them).
    wait_until("the killed worker and web process to be restarted",
               lambda: (_restarted(dev, "worker-1") and _restarted(dev, "web-1")), timeout=60)
    assert len(_children_running(dev, "dexworker")) == 3
    assert len(_children_running(dev, "uvicorn")) == 2

    def approve(item: dict[str, Any]) -> str:
        """Approve ``item``; answers 200 (delivered) or 202 (kept in the outbox).

        A worker indexes an approval just before its Step commits the interrupt to Dex; when
        that worker is SIGKILLed in between, the index lists the approval while Dex does not
        hold it until another worker has run the Step again: the decision is then kept (202)
        and delivered once Dex holds the interrupt, never refused.
        """
        url = f"/api/v1/sessions/{item['session']}/interrupts/{item['interrupt_id']}/"
        answer = staff.post(url, json={"approved": True})
        assert answer.status_code in (200, 202), answer.text
        return str(answer.json()["delivery"])

    with ThreadPoolExecutor(max_workers=6) as pool:
        deliveries = list(pool.map(approve, pending))
    print(f"decisions kept in the outbox (202): {deliveries.count('pending')}")

    def finished() -> list[dict[str, Any]] | None:
        listed = _get(owner, "/api/v1/sessions/", limit=100)["results"]
        statuses = {item["id"]: item["status"] for item in listed}
        done = [sid for sid in expected_sessions
                if statuses.get(sid) == "waiting_for_user_message"]
        return listed if len(done) == SESSIONS else None

    wait_until("every session to finish its turn", finished, timeout=120)
    retried: dict[str, list[str]] = {}
    for session_id in sorted(expected_sessions):
        snapshot = _get(owner, f"/api/v1/sessions/{session_id}/")
        assert snapshot.get("last_turn_error") in (None, ""), snapshot
        final = snapshot["messages"][-1]
        assert final["role"] == "assistant"
        assert final["text"].startswith("Here is what the tools returned:"), final["text"]
        history = _get(owner, f"/api/v1/sessions/{session_id}/history/")
        if again := [entry["step_type"] for entry in history if entry["final_attempt"] > 1]:
            retried[session_id] = again
    # Whether the SIGKILL caught the worker inside a Step depends on scheduling (the kill is
    # mid-batch by construction: two thirds of the sessions did not exist yet), so it is
    # reported, not asserted.
    print(f"Steps with a second attempt: {retried}")
    assert _get(staff, "/api/v1/approvals/") == []

    posts = Counter(post["text"] for post in json.loads(slack_file.read_text()))
    assert posts == Counter({_write_text(number): 1 for number in range(SESSIONS)})

    # An approvals notice sent through Redis by another process (this one) reaches a
    # websocket served by a web process: the in-memory layer could not do this.
    assert asyncio.run(_notice_crosses_processes(ports.web, staff_token, redis_url))

    os.kill(dev.popen.pid, signal.SIGTERM)
    assert dev.popen.wait(timeout=60) == 0, dev.output()[-3000:]
    print(f"scale-out test took {time.monotonic() - started:.1f} s")


async def _notice_crosses_processes(port: int, token: str, redis_url: str) -> bool:
    """Open ``/ws/approvals/``, send ``approvals.changed`` on the Redis channel layer from this
    process, and return whether the socket got a frame for it."""
    from channels_redis.core import RedisChannelLayer
    from websockets.asyncio.client import connect

    from agents_app.sessions.approval_index import APPROVALS_CHANGED, APPROVALS_GROUP

    layer = RedisChannelLayer(hosts=[redis_url])
    async with connect(f"ws://127.0.0.1:{port}/ws/approvals/",
                       additional_headers={"Authorization": f"Bearer {token}"}) as ws:
        first = json.loads(await asyncio.wait_for(ws.recv(), timeout=30))
        assert first == {"type": "approvals_changed"}
        # The consumer joins the group before its first frame; the index is quiet now, so
        # only the notice can bring another frame (its poll sends on a change only).
        await layer.group_send(APPROVALS_GROUP, {"type": APPROVALS_CHANGED})
        second = json.loads(await asyncio.wait_for(ws.recv(), timeout=15))
    await layer.close_pools()
    return bool(second == {"type": "approvals_changed"})


DISCOVERY_TASK = "mcp_registry.discover_all_servers"
PERIOD_SECONDS = 2
PERIODS = 3


def test_beat_runs_discovery_once_per_period_across_workers(
    processes: Processes, stack_env: dict[str, str], migrated_postgres_url: str, redis_url: str,
) -> None:
    stack_env.update({"DATABASE_URL": migrated_postgres_url, "REDIS_URL": redis_url})
    # The discovery schedule (migration mcp_registry 0003) every PERIOD_SECONDS; the other
    # periodic tasks are switched off so the workers' logs are about discovery only.
    processes.run([PYTHON, "manage.py", "shell", "-c", (
        "from django_celery_beat.models import IntervalSchedule, PeriodicTask; "
        f"every, _ = IntervalSchedule.objects.get_or_create(every={PERIOD_SECONDS}, "
        "period='seconds'); "
        f"PeriodicTask.objects.exclude(task={DISCOVERY_TASK!r}).update(enabled=False); "
        f"assert PeriodicTask.objects.filter(task={DISCOVERY_TASK!r}).update(interval=every) == 1"
    )])
    workers = [
        processes.start(f"celery-{number}", [
            PYTHON, "-m", "celery", "-A", "dexagents_site", "worker", "--pool=solo",
            "--loglevel=INFO", "--without-mingle", "--without-gossip",
            "-n", f"topology-{number}@%h"])
        for number in range(1, 4)
    ]
    for worker in workers:
        worker.wait_for_line(" ready.")
    beat = processes.start("beat", [PYTHON, "-m", "celery", "-A", "dexagents_site", "beat",
                                    "--loglevel=INFO", "--pidfile="])
    beat.wait_for_line("beat: Starting...")

    pattern = re.compile(rf"^(?P<at>\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}}).*"
                         rf"Task {re.escape(DISCOVERY_TASK)}\[(?P<id>[^\]]+)\] received")

    def runs() -> list[tuple[datetime, str]]:
        return sorted(
            (datetime.strptime(match["at"], "%Y-%m-%d %H:%M:%S,%f"), match["id"])
            for worker in workers for line in list(worker.lines)
            if (match := pattern.search(line.lstrip("[")))
        )

    # The first run, then PERIODS more: about PERIODS periods of the schedule.
    wait_until(f"{PERIODS + 1} discovery runs", lambda: len(runs()) > PERIODS,
               timeout=60 + PERIODS * PERIOD_SECONDS)
    beat.stop()
    ran = runs()
    ids = [task_id for _at, task_id in ran]
    assert len(ids) == len(set(ids)), ids
    # Once per period: no two runs closer than half a period (two beats, or a task delivered
    # to two workers, would put two runs in one period).
    gaps = [(later - earlier).total_seconds() for (earlier, _), (later, _) in pairwise(ran)]
    assert min(gaps) >= PERIOD_SECONDS / 2, gaps
    by_worker = [sum(1 for line in worker.lines if pattern.search(line.lstrip("[")))
                 for worker in workers]
    assert sum(by_worker) == len(ran)
    print(f"discovery ran {len(ran)} times, gaps {gaps} s, per worker {by_worker}")
