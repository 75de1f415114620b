"""Operations: per-worker heartbeats, ``/readyz``, request IDs, ``/metrics`` access, and the
strict ``DEXAGENTS_LOG_FORMAT`` (agents_app.worker.heartbeat, ops_views, log_context, metrics).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from agents_app.worker.heartbeat import REDIS_KEY, WorkerHeartbeat, fresh_workers
from dex_agents.testing import free_port
from tests.agents_app.test_settings import load
from tests.production_services import redis_url  # noqa: F401 (fixture)


@pytest.fixture
def redis_heartbeats(settings: Any, redis_url: str) -> str:  # noqa: F811
    """Worker heartbeats in a Redis logical database of this test."""
    settings.DEXAGENTS = {**settings.DEXAGENTS, "REDIS_URL": redis_url}
    return redis_url


def test_file_heartbeats_are_per_worker(heartbeat_file: Path) -> None:
    first, second = WorkerHeartbeat(worker="host-1"), WorkerHeartbeat(worker="host-2")

    async def scenario() -> None:
        await first.beat()
        await second.beat()
        assert set(fresh_workers()) == {"host-1", "host-2"}
        # One worker stopping cleanly leaves the other's beat in place.
        await first.forget()
        assert set(fresh_workers()) == {"host-2"}

    asyncio.run(scenario())
    beat = heartbeat_file.parent / "host-2.heartbeat"
    stale = time.time() - 4.5
    os.utime(beat, (stale, stale))
    assert fresh_workers() == {}


def test_redis_heartbeats_are_per_worker_and_age_on_the_redis_clock(
    redis_heartbeats: str,
) -> None:
    first, second = WorkerHeartbeat(worker="host-a-1"), WorkerHeartbeat(worker="host-b-1")

    async def scenario() -> None:
        await first.beat()
        await second.beat()
        assert set(fresh_workers()) == {"host-a-1", "host-b-1"}
        await first.forget()
        await second.forget()

    asyncio.run(scenario())
    assert fresh_workers() == {}
    with redis.Redis.from_url(redis_heartbeats) as client:
        seconds, micros = client.time()
        now = seconds + micros / 1_000_000
        client.zadd(REDIS_KEY, {"killed-worker": now - 4.5, "live-worker": now - 0.5})
    assert set(fresh_workers()) == {"live-worker"}


def test_healthz_reads_a_redis_heartbeat(
    client: Any, engine_down: str, redis_heartbeats: str
) -> None:
    assert client.get("/healthz").json()["worker"] == "down"
    beat = WorkerHeartbeat(worker="w1")
    asyncio.run(beat.beat())
    assert client.get("/healthz").json()["worker"] == "up"


def test_readyz_names_each_part(
    db: None, client: Any, engine: str, heartbeat_file: Path, settings: Any
) -> None:
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json() == {
        "ready": False,
        "checks": {"database": "up", "redis": "not_configured", "engine": "up", "worker": "down"},
        "workers": 0,
        "detail": "Not ready: worker down.",
        "unavailable": "worker",
    }
    heartbeat_file.touch()
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "ready": True,
        "checks": {"database": "up", "redis": "not_configured", "engine": "up", "worker": "up"},
        "workers": 1,
    }
    # Redis configured but not answering: down, and no worker beat can be read from it.
    settings.DEXAGENTS = {
        **settings.DEXAGENTS, "REDIS_URL": f"redis://127.0.0.1:{free_port()}/0",
    }
    body = client.get("/readyz").json()
    assert body["checks"]["redis"] == "down"
    assert body["checks"]["worker"] == "down"
    assert body["unavailable"] == "redis"


def test_readyz_with_redis_and_no_engine(
    db: None, client: Any, engine_down: str, redis_heartbeats: str
) -> None:
    asyncio.run(WorkerHeartbeat(worker="w1").beat())
    asyncio.run(WorkerHeartbeat(worker="w2").beat())
    response = client.get("/readyz")
    assert response.status_code == 503
    body = response.json()
    assert body["checks"] == {
        "database": "up", "redis": "up", "engine": "down", "worker": "up",
    }
    assert body["workers"] == 2
    assert body["unavailable"] == "engine"


def test_request_id_is_echoed_or_generated(client: Any, engine_down: str) -> None:
    given = client.get("/healthz", HTTP_X_REQUEST_ID="req-123.abc")
    assert given["X-Request-ID"] == "req-123.abc"
    generated = client.get("/healthz", HTTP_X_REQUEST_ID="not allowed\n")
    assert len(generated["X-Request-ID"]) == 32
    assert generated["X-Request-ID"] != client.get("/healthz")["X-Request-ID"]


def test_metrics_are_for_loopback_callers_only_by_default(db: None, client: Any) -> None:
    local = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert local.status_code == 200
    assert local["Content-Type"].startswith("text/plain")
    text = local.content.decode()
    assert "dexagents_approvals_pending 0.0" in text
    assert "# TYPE dexagents_turns_started_total counter" in text
    assert client.get("/metrics", REMOTE_ADDR="::1").status_code == 200
    assert client.get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 404
    # A reverse proxy on the same host: the peer is loopback, the client is not.
    proxied = client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_X_FORWARDED_FOR="10.1.2.3")
    assert proxied.status_code == 404


def test_metrics_with_a_token_need_the_token(db: None, client: Any, settings: Any) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "METRICS_TOKEN": "s3cret-metrics"}
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1").status_code == 404
    wrong = client.get("/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.status_code == 404
    right = client.get(
        "/metrics", REMOTE_ADDR="10.1.2.3", HTTP_AUTHORIZATION="Bearer s3cret-metrics"
    )
    assert right.status_code == 200


def test_log_format_is_parsed_strictly(tmp_path: Path) -> None:
    refused = load(tmp_path, DEXAGENTS_LOG_FORMAT="xml")
    assert refused.returncode != 0
    assert "DEXAGENTS_LOG_FORMAT must be plain or json" in refused.stderr


def test_json_log_lines_carry_request_and_session_ids(tmp_path: Path) -> None:
    """A request to a session's URL under DEXAGENTS_LOG_FORMAT=json logs JSON lines with both
    IDs (a real settings load in a child process; the 401 is logged by django.request)."""
    import subprocess
    import sys

    probe = (
        "import django, os\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'dexagents_site.settings')\n"
        "django.setup()\n"
        "from django.test import Client\n"
        "from django.test.utils import setup_test_environment\n"
        "setup_test_environment()\n"
        "import logging\n"
        "response = Client().get('/api/v1/sessions/ses_0123/history/',\n"
        "                        headers={'X-Request-ID': 'trace-42'})\n"
        "logging.getLogger('agents_app.probe').warning('outside any request')\n"
        "print(response.status_code, response['X-Request-ID'])\n"
    )
    env = {key: value for key, value in os.environ.items()
           if key not in ("DATABASE_URL", "REDIS_URL", "DEXAGENTS_VAR_DIR")}
    env.update(DEXAGENTS_VAR_DIR=str(tmp_path / "var"), DEXAGENTS_LOG_FORMAT="json",
               ALLOWED_HOSTS="testserver")
    done = subprocess.run([sys.executable, "-c", probe], cwd=Path(__file__).parents[2],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["401", "trace-42"]
    lines = [json.loads(line) for line in done.stderr.splitlines() if line.strip()]
    unauthorized = [line for line in lines if line["logger"] == "django.request"]
    assert unauthorized, done.stderr
    assert unauthorized[0]["request_id"] == "trace-42"
    assert unauthorized[0]["session_id"] == "ses_0123"
    assert {"time", "level", "message"} <= set(unauthorized[0])
    # ISO 8601 in UTC.
    assert datetime.datetime.fromisoformat(unauthorized[0]["time"]).utcoffset() == (
        datetime.timedelta(0))
    outside = [line for line in lines if line["logger"] == "agents_app.probe"]
    assert outside == [{**outside[0], "request_id": "-", "session_id": "-"}]


def test_turn_counters_count_a_first_call_and_a_last_failed_attempt() -> None:
    """RunModel without an agent config fails: the first attempt counts a started turn, only
    the last of the 3 attempts a failed one (the in-process registry: no multiprocess dir)."""
    import dataclasses

    from prometheus_client import REGISTRY

    from agents_app.worker.agent_config import AgentConfigError
    from agents_app.worker.runner import LiteLLMRunner
    from tests.agents_app.worker.test_runner import _unused_resolver, make_turn, user_message

    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    runner = LiteLLMRunner(_unused_resolver)
    turn = make_turn(None, [user_message(1, "hi", "turn-2")])
    started = sample("dexagents_turns_started_total")
    failed = sample("dexagents_turns_failed_total")
    with pytest.raises(AgentConfigError):
        asyncio.run(runner.run_model_step(turn))
    assert sample("dexagents_turns_started_total") == started + 1
    assert sample("dexagents_turns_failed_total") == failed
    with pytest.raises(AgentConfigError):
        asyncio.run(runner.run_model_step(dataclasses.replace(turn, attempt=3)))
    assert sample("dexagents_turns_started_total") == started + 1  # attempt 3 is no start
    assert sample("dexagents_turns_failed_total") == failed + 1


def test_worker_ids_are_safe_file_names(settings: Any) -> None:
    from agents_app.worker.heartbeat import worker_id

    settings.DEXAGENTS = {**settings.DEXAGENTS, "WORKER_NAME": "node 1/../x"}
    assert worker_id() == "node_1_.._x"
    settings.DEXAGENTS = {**settings.DEXAGENTS, "WORKER_NAME": ""}
    assert worker_id().endswith(f"-{os.getpid()}")
