"""Reads of the platform's health: which parts answer (``/healthz``, ``/readyz``), and which
part an engine error means is down.

Owns ``health_get``, ``readiness_get`` (database, Redis, engine, worker), the worker heartbeat
check (``worker_heartbeat_fresh``) and ``unavailable_part`` (a 503's ``unavailable``).

May import: the Dex gateway, the worker's heartbeat and the foundation (tests/test_layering.py).
"""


from typing import Any

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.rest_errors import UnavailablePart


def worker_heartbeat_fresh() -> bool:
    """Whether at least one ``dexworker`` beat recently (``agents_app.worker.heartbeat``).

    Each worker beats every second under its own ID (Redis with ``REDIS_URL``, else a file
    per worker in ``DEXAGENTS["WORKER_HEARTBEAT_DIR"]``); a beat counts as fresh when younger
    than ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]`` seconds (4), so a killed or hung worker
    reads as down within that time, one that stops cleanly at once. Redis not answering
    reads as no fresh worker.
    """
    from agents_app.worker.heartbeat import fresh_workers

    try:
        return bool(fresh_workers())
    except Exception:  # redis.RedisError and socket errors: liveness cannot be shown
        return False


#: Parts of the platform ``/healthz`` reports, in the order a request needs them.
HEALTH_PARTS = ("web", "engine", "worker")


def health_get() -> dict[str, str]:
    """Report the liveness of each part: ``{"web", "engine", "worker"}``, each "up"/"down".

    When a part is down, ``detail`` (a sentence) and ``unavailable`` (the first part down, in
    the order a request needs them: ``"engine"`` before ``"worker"``) are added: the shape of
    every 503 (``agents_app.rest_errors.ServiceUnavailable``).

    The engine is up when it answers FlowService.HealthCheck within
    ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds; the worker when its heartbeat is fresh
    (``worker_heartbeat_fresh``).
    """
    try:
        engine_up = dex_gateway.run(dex_gateway.engine_health_check())
    except dex_gateway.EngineUnavailableError:
        engine_up = False
    parts: dict[str, str] = {
        "web": "up",
        "engine": "up" if engine_up else "down",
        "worker": "up" if worker_heartbeat_fresh() else "down",
    }
    down = [part for part in HEALTH_PARTS if parts[part] == "down"]
    if down:
        names = {"engine": "the Dex engine", "worker": "the Dex worker"}
        subject = " and ".join(names[part] for part in down)
        verb = "is" if len(down) == 1 else "are"
        parts["detail"] = f"{subject[0].upper()}{subject[1:]} {verb} down."
        parts["unavailable"] = down[0]
    return parts


#: Parts ``/readyz`` checks, in the order a request needs them.
READINESS_PARTS = ("database", "redis", "engine", "worker")


def _database_check() -> str:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # any driver error: the database is not usable
        return "down"
    return "up"


def _redis_check() -> str:
    url = dexagents_setting("REDIS_URL")
    if not url:
        return "not_configured"
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError):
        return "down"
    return "up"


def readiness_get() -> dict[str, Any]:
    """Whether this web process can serve: ``/readyz`` (unauthenticated).

    Returns ``{"ready": bool, "checks": {"database", "redis", "engine", "worker"}, "workers"}``.
    Each check is ``"up"`` or ``"down"``; ``redis`` is ``"not_configured"`` without
    ``REDIS_URL`` (not a failure). ``database``: ``SELECT 1`` on the default connection;
    ``redis``: ``PING`` (2 s timeouts); ``engine``: FlowService.HealthCheck within
    ``DEXAGENTS["ENGINE_TIMEOUT"]``; ``worker``: at least one fresh beat
    (``agents_app.worker.heartbeat``). ``workers`` is the number of fresh workers. When not
    ready, ``detail`` (a sentence) and ``unavailable`` (the first part down) are added.
    """
    from agents_app.worker.heartbeat import fresh_workers

    try:
        engine_up = dex_gateway.run(dex_gateway.engine_health_check())
    except dex_gateway.EngineUnavailableError:
        engine_up = False
    try:
        workers = len(fresh_workers())
    except Exception:  # Redis down: no worker can be shown alive
        workers = 0
    checks = {
        "database": _database_check(),
        "redis": _redis_check(),
        "engine": "up" if engine_up else "down",
        "worker": "up" if workers else "down",
    }
    down = [part for part in READINESS_PARTS if checks[part] == "down"]
    body: dict[str, Any] = {"ready": not down, "checks": checks, "workers": workers}
    if down:
        body["detail"] = "Not ready: " + ", ".join(down) + " down."
        body["unavailable"] = down[0]
    return body


def unavailable_part(*, error: dex_gateway.EngineUnavailableError) -> UnavailablePart:
    """Name the part of the platform that ``error`` means is down, for a 503's ``unavailable``.

    ``"engine"`` when the engine refused the connection, or timed out while a worker beats
    (the engine itself is slow); ``"worker"`` when the engine said no worker took the RPC
    (``WorkerUnavailableError``, cause ``"worker"``), when the call timed out and no worker
    heartbeat is fresh (Dex RPCs run on a worker, so the engine waits for one), or when a Step
    kept the session's state locked (its worker is busy with it).
    """
    if error.cause in ("busy", "worker"):
        return "worker"
    if error.cause == "timeout" and not worker_heartbeat_fresh():
        return "worker"
    return "engine"
