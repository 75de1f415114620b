"""Benchmark of many active sessions on several Dex workers.

Starts the platform as real processes (``tests/e2e/relay_stack.py``: the embedded engine, the
demo model, one uvicorn, a Celery worker) plus ``--workers`` ``manage.py dexworker``
processes in all, on SQLite (or ``--database-url``, e.g. a PostgreSQL database), then runs
``--sessions`` sessions at once, each ``--turns`` demo-model turns in a row: the first starts
with the session (``POST /api/v1/sessions/``), each next one is a ``POST .../messages/`` sent
when the previous turn's ``turn_completed`` arrived on the session's websocket
(``/ws/sessions/<id>/events/``).

Prints:
- Steps per second: the Steps the sessions completed (Dex history, ``GET .../history/``) over
  the run's wall time, and per worker;
- turn latency p50 / p99, from the request that started a turn to its ``turn_completed``;
- errors (goal 0): failed turns, refused requests after retries, sessions that did not finish;
- the reference, in the same run: the same turn latency of one session of ours alone on the
  platform (after a warm-up session), so the ratio shows what 200 concurrent sessions cost
  each turn.

``--tools`` makes every turn ``bench.peer_server``'s (three parallel READ tool calls), so its
turns/s compare with that benchmark's at 100 clients (issue 24: >= 0.9x, p99 <= 3x p50).

Nothing is asserted. Run: ``.venv/bin/python -m bench.scale`` (``--quick``: 50 sessions), or
``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._django import django_setup
from bench.peer_server import OUR_TURN_MESSAGE
from bench.relay import percentile


@dataclass
class SessionRun:
    """What one session saw."""

    session_id: str = ""
    turn_seconds: list[float] = field(default_factory=list)
    error: str = ""
    retries: int = 0


async def post_with_retries(api: Any, path: str, body: dict[str, Any], run: SessionRun) -> Any:
    """POST, repeating a 503 (the engine or every worker slot busy) as a client would."""
    for _ in range(60):
        answer = await api.post(path, json=body)
        if answer.status_code != 503:
            answer.raise_for_status()
            return answer.json()
        run.retries += 1
        await asyncio.sleep(1)
    answer.raise_for_status()
    return answer.json()


async def session_drive(stack: Any, api: Any, turns: int, limit: asyncio.Semaphore,
                        run: SessionRun, tools: bool = False) -> None:
    """Start one session and run ``turns`` turns, each timed to its ``turn_completed``
    (``tools``: each turn is ``bench.peer_server``'s, three parallel READ tool calls, instead
    of a text answer)."""
    from websockets.asyncio.client import connect

    headers = stack.personas["owner"].bearer()
    phase = "create"
    try:
        async with limit:
            created = await post_with_retries(api, "/api/v1/sessions/", {"agent": "demo"}, run)
        run.session_id = str(created["id"])
        phase = "websocket"
        async with connect(stack.events_url(run.session_id), additional_headers=headers,
                           open_timeout=120, max_queue=None) as ws:
            for turn in range(turns):
                started = time.perf_counter()
                phase = f"turn {turn}"
                async with limit:
                    await post_with_retries(api, f"/api/v1/sessions/{run.session_id}/messages/",
                                            {"text": OUR_TURN_MESSAGE if tools else
                                             f"turn {turn}: tell me something"}, run)
                async with asyncio.timeout(300):
                    while True:
                        frame = json.loads(await ws.recv())
                        kind = frame.get("event", {}).get("type")
                        if kind == "turn_failed":
                            run.error = f"turn failed: {frame['event']['data']}"
                            return
                        if kind == "turn_completed":
                            break
                run.turn_seconds.append(time.perf_counter() - started)
    except Exception as error:
        run.error = f"{phase}: {type(error).__name__}: {error}"[:300]


async def steps_completed(stack: Any, api: Any, session_ids: list[str]) -> int:
    """Completed Steps of the sessions (Dex history)."""
    limit = asyncio.Semaphore(16)

    async def count(session_id: str) -> int:
        async with limit:
            answer = await api.get(f"/api/v1/sessions/{session_id}/history/")
            answer.raise_for_status()
            return len(answer.json())

    return sum(await asyncio.gather(*(count(session_id) for session_id in session_ids)))


async def measure(stack: Any, args: argparse.Namespace) -> None:
    import httpx

    headers = stack.personas["owner"].bearer()
    # Idle connections expire before uvicorn's 5 s keep-alive does, so no request goes out on
    # a connection the server is closing (httpx's default expiry is also 5 s).
    limits = httpx.Limits(max_connections=64, keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=stack.base_url(), headers=headers, timeout=120,
                                 limits=limits) as api:
        # A warm-up session (worker, model, MCP servers), then the reference: one session
        # of ours alone.
        await session_drive(stack, api, 1, asyncio.Semaphore(1), SessionRun(), args.tools)
        alone = SessionRun()
        await session_drive(stack, api, args.turns, asyncio.Semaphore(1), alone, args.tools)
        if alone.error:
            print(f"the single session failed: {alone.error}")

        runs = [SessionRun() for _ in range(args.sessions)]
        # Bounds the requests in flight (creating and sending), not the active sessions.
        limit = asyncio.Semaphore(32)
        started = time.perf_counter()
        await asyncio.gather(*(session_drive(stack, api, args.turns, limit, run, args.tools)
                               for run in runs))
        elapsed = time.perf_counter() - started
        ids = [run.session_id for run in runs if run.session_id]
        steps = await steps_completed(stack, api, ids)

    turns = [seconds for run in runs for seconds in run.turn_seconds]
    errors = [run.error for run in runs if run.error]
    unfinished = sum(1 for run in runs if not run.error and len(run.turn_seconds) < args.turns)
    retries = sum(run.retries for run in runs)
    print(f"{args.sessions} sessions x {args.turns} turns on {args.workers} Dex workers "
          f"({args.database}): {len(turns)} turns in {elapsed:.1f} s, "
          f"{len(turns) / elapsed:.1f} turns/s (issue 24: >= 0.9x bench.peer_server's "
          "turns/s at 100 clients)")
    print(f"Steps completed: {steps}, {steps / elapsed:.1f} Steps/s "
          f"({steps / elapsed / args.workers:.1f} per worker)")
    if turns:
        p50, p99 = percentile(turns, 0.5), percentile(turns, 0.99)
        print(f"turn latency (request -> turn_completed): p50 {p50 * 1000:.0f} ms, "
              f"p99 {p99 * 1000:.0f} ms, p99 / p50 x{p99 / p50:.2f} (issue 24: <= 3x)")
        if alone.turn_seconds:
            alone_p50 = percentile(alone.turn_seconds, 0.5)
            print(f"reference, one session of ours alone (after a warm-up session): "
                  f"p50 {alone_p50 * 1000:.0f} ms; "
                  f"{args.sessions} sessions / alone: p50 x{p50 / alone_p50:.2f}")
    print(f"errors: {len(errors) + unfinished} (goal 0); 503 answers repeated: {retries}")
    for error in errors[:5]:
        print(f"  error: {error}")


def workers_add(stack: Any, workers: int, slots: int) -> None:
    """Start ``manage.py dexworker`` processes until ``stack`` has ``workers`` of them (it
    starts with one), each with ``slots`` task slots, and wait until each is ready."""
    from tests.e2e.conftest import PYTHON

    for number in range(2, workers + 1):
        stack.processes.start(f"worker-{number}", [
            PYTHON, "manage.py", "dexworker", "--max-concurrent-tasks", str(slots)]
        ).wait_for_line("dexworker ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--worker-slots", type=int, default=32)
    parser.add_argument("--database-url", default="",
                        help="e.g. postgres://postgres@127.0.0.1:5432/<empty database>; "
                        "default: SQLite")
    parser.add_argument("--quick", action="store_true", help="50 sessions x 2 turns")
    parser.add_argument("--tools", action="store_true",
                        help="turns of three parallel READ tool calls, as bench.peer_server's "
                        "(default: a text answer)")
    args = parser.parse_args()
    if args.quick:
        args.sessions, args.turns = 50, 2
    args.database = "PostgreSQL" if args.database_url else "SQLite"

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as root:
        django_setup(Path(root))
        from tests.e2e.relay_stack import running_stack

        extra = {"LOG_LEVEL": "WARNING"}
        if args.database_url:
            extra["DATABASE_URL"] = args.database_url
        print(f"starting engine, demo model, web and {args.workers} workers ...", flush=True)
        with running_stack(Path(root) / "stack", extra_env=extra,
                           worker_slots=args.worker_slots) as stack:
            workers_add(stack, args.workers, args.worker_slots)
            asyncio.run(measure(stack, args))


if __name__ == "__main__":
    main()
