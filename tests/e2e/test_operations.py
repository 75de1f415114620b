"""Operations end to end: two Dex workers beating in Redis, ``/readyz``, ``/metrics`` summed
over the processes (prometheus_client multiprocess mode) after a real turn, JSON logs.

Real processes: the embedded engine, the demo model, two ``dexworker`` and one uvicorn web
process, on SQLite and the Redis of this machine.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import connect

from tests.e2e.conftest import PYTHON, Ports, Processes, wait_for_reply, wait_until
from tests.production_services import redis_url  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

_SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def scrape(api: httpx.Client) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``/metrics`` as ``{(name, labels): value}`` (the web process answers loopback)."""
    response = api.get("/metrics")
    assert response.status_code == 200, response.text
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in response.text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        labels = frozenset(
            (key, value.strip('"'))
            for key, _, value in (
                pair.partition("=") for pair in (match["labels"] or "").split(",") if pair
            )
        )
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
          **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_readiness_metrics_and_json_logs_across_processes(
    processes: Processes, ports: Ports, stack_env: dict[str, str], tmp_path: Path,
    redis_url: str,  # noqa: F811
) -> None:
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    stack_env.update({
        "REDIS_URL": redis_url,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "DEXAGENTS_LOG_FORMAT": "json",
    })
    processes.run([PYTHON, "manage.py", "migrate", "--noinput"])
    processes.run([PYTHON, "manage.py", "seed_demo"])
    token = processes.create_token("e2e-user")
    processes.start_engine(ports.engine)
    processes.start_demo_model(ports.model)
    workers = [
        processes.start(f"worker-{n}", [PYTHON, "manage.py", "dexworker"]) for n in (1, 2)
    ]
    for worker in workers:
        worker.wait_for_line("dexworker ready")
    web = processes.start("web", [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                                  "--host", "127.0.0.1", "--port", str(ports.web),
                                  "--no-access-log"])
    web.wait_for_line("Application startup complete")
    api = httpx.Client(base_url=f"http://127.0.0.1:{ports.web}",
                       headers={"Authorization": f"Token {token}"}, timeout=30)

    def ready_with(count: int) -> dict[str, Any] | None:
        response = api.get("/readyz")
        body: dict[str, Any] = response.json()
        return body if response.status_code == 200 and body["workers"] == count else None

    body = wait_until("readyz to see both workers", lambda: ready_with(2), timeout=60)
    assert body["checks"] == {"database": "up", "redis": "up", "engine": "up", "worker": "up"}

    before = scrape(api)
    assert value(before, "dexagents_worker_task_slots") == 64  # 2 workers x 32 slots

    created = api.post(
        "/api/v1/sessions/",
        json={"agent": "demo",
              "message": "/tool search__web_search " + json.dumps({"query": "metrics"})},
        headers={"X-Request-ID": "e2e-create-1"},
    )
    assert created.status_code == 201, created.text
    assert created.headers["X-Request-ID"] == "e2e-create-1"
    session_id = created.json()["id"]

    wait_for_reply(api, session_id, message_count=2, timeout=90)

    # The relay replays the turn's events from the oldest retained one (quickly: an idle
    # consumer on the Redis channel layer currently fails after 5 s, see docs/deploy.md).
    async def relay_until_completed() -> None:
        url = f"ws://127.0.0.1:{ports.web}/ws/sessions/{session_id}/events/"
        async with connect(url, additional_headers={"Authorization": f"Token {token}"}) as ws:
            async with asyncio.timeout(30):
                while True:
                    frame = json.loads(await ws.recv())
                    if frame["type"] == "event" and frame["event"]["type"] == "turn_completed":
                        return

    try:
        asyncio.run(relay_until_completed())
    except Exception as error:
        raise AssertionError(f"relay failed: {error}\n{web.output()[-6000:]}") from error

    def counted() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
        samples = scrape(api)
        moved = (
            value(samples, "dexagents_turns_completed_total")
            >= value(before, "dexagents_turns_completed_total") + 1
        )
        return samples if moved else None

    after = wait_until("the turn to be counted", counted, timeout=30)
    for name in ("dexagents_turns_started_total", "dexagents_turns_completed_total"):
        assert value(after, name) - value(before, name) == 1, name
    assert value(after, "dexagents_turns_failed_total") == value(
        before, "dexagents_turns_failed_total")
    assert (value(after, "dexagents_tool_calls_total", effect="read", status="succeeded")
            - value(before, "dexagents_tool_calls_total", effect="read", status="succeeded")
            ) == 1
    # Every event the websocket read was observed once (text deltas included).
    assert value(after, "dexagents_event_relay_lag_seconds_count") >= 3
    assert value(after, "dexagents_approvals_pending") == 0

    # JSON logs: every line of the web process after start is one JSON object with IDs; the
    # relay's lines name the session.
    records = [json.loads(line) for line in web.lines if line.startswith("{")]
    assert records, web.output()
    assert all({"request_id", "session_id", "level", "logger"} <= set(r) for r in records)
    relay = [r for r in records if "Events relay for session" in r["message"]]
    assert relay and all(r["session_id"] == session_id for r in relay), relay
    assert all(r["request_id"] != "-" for r in relay), relay
    worker_lines = [line for worker in workers for line in worker.lines if line.startswith("{")]
    assert all("request_id" in json.loads(line) for line in worker_lines)

    # A killed worker leaves readiness to the other within the beat age; a stopped last one
    # makes the process not ready at once.
    workers[0].signal_group(signal.SIGKILL)
    workers[0].popen.wait()  # reaped, as a supervisor does (a zombie still has its pid)
    wait_until("readyz to count one worker", lambda: ready_with(1), timeout=15)
    # The killed worker's slots leave the sum (its gauge file is dropped at the scrape).
    assert value(scrape(api), "dexagents_worker_task_slots") == 32
    workers[1].stop()

    def not_ready() -> dict[str, Any] | None:
        response = api.get("/readyz")
        return response.json() if response.status_code == 503 else None

    body = wait_until("readyz to say no worker", not_ready, timeout=5)
    assert body["checks"]["worker"] == "down"
    assert body["unavailable"] == "worker"
