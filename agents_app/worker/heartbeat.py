"""Per-worker liveness beats of ``manage.py dexworker``, read by ``/healthz`` and ``/readyz``.

Each worker process beats under its own ID (``worker_id``: ``DEXAGENTS["WORKER_NAME"]``, else
``<host>-<pid>``), so several workers on one or many hosts never overwrite or delete each
other's beat. Where the beats live:

- With ``REDIS_URL`` set: one Redis sorted set, key ``dexagents:worker_heartbeats``, member the
  worker ID, score the Redis server's clock (``TIME``) at the beat, so hosts with skewed clocks
  agree. A beat also drops members older than ``_FORGET_SECONDS``; a clean stop removes the
  worker's own member. (A Django cache cannot list its keys, so the set is kept with the Redis
  client directly; nothing else is stored under ``dexagents:worker_heartbeats``.)
- Without it: one file per worker, ``DEXAGENTS["WORKER_HEARTBEAT_DIR"]/<worker id>.heartbeat``,
  whose modification time is the beat (one host only, the zero-setup run).

A beat is fresh while younger than ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]`` seconds (4): a
killed or hung worker reads as down within that time, one that stops cleanly at once.
"""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

from agents_app.conf import dexagents_setting

#: Redis sorted set of beats: member worker ID, score Unix time (Redis clock), seconds.
REDIS_KEY = "dexagents:worker_heartbeats"
#: Beats older than this (seconds) are deleted by the next beat of any worker.
_FORGET_SECONDS = 3600
_SUFFIX = ".heartbeat"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")

# Server-side clock, add, prune in one round trip (KEYS[1] the set; ARGV[1] the worker ID,
# ARGV[2] the forget age in seconds). Returns the beat time as text.
_BEAT_SCRIPT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
return tostring(now)
"""


def worker_id() -> str:
    """This process's worker ID: ``DEXAGENTS["WORKER_NAME"]`` or ``<hostname>-<pid>``.

    Characters other than letters, digits, ``_``, ``.`` and ``-`` become ``_`` (the ID names
    a file).
    """
    name = str(dexagents_setting("WORKER_NAME") or "")
    return _UNSAFE.sub("_", name or f"{socket.gethostname()}-{os.getpid()}")


def _redis_url() -> str:
    return str(dexagents_setting("REDIS_URL") or "")


def _heartbeat_dir() -> Path:
    return Path(dexagents_setting("WORKER_HEARTBEAT_DIR"))


def _max_age() -> float:
    return float(dexagents_setting("WORKER_HEARTBEAT_MAX_AGE"))


class WorkerHeartbeat:
    """The beat of one worker (``worker_id``); used from the worker's event loop.

    ``beat()`` records that the worker is alive now; ``forget()`` removes its beat on a clean
    stop. Redis errors propagate (the caller logs them and beats again a second later).
    """

    def __init__(self, *, worker: str | None = None) -> None:
        self.worker = worker or worker_id()
        self._redis_url = _redis_url()
        self._path = _heartbeat_dir() / f"{self.worker}{_SUFFIX}"
        self._client = None
        if self._redis_url:
            import redis.asyncio

            self._client = redis.asyncio.Redis.from_url(self._redis_url)

    async def beat(self) -> None:
        """Record a beat now (Redis ``EVAL`` or a file touch, microseconds locally)."""
        if self._client is not None:
            await self._client.eval(
                _BEAT_SCRIPT, 1, REDIS_KEY, self.worker, str(_FORGET_SECONDS)
            )
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._path.touch()

    async def forget(self) -> None:
        """Remove this worker's beat (clean stop): it reads as down at once."""
        if self._client is not None:
            try:
                await self._client.zrem(REDIS_KEY, self.worker)
            finally:
                await self._client.aclose()
            return
        self._path.unlink(missing_ok=True)


def fresh_workers() -> dict[str, float]:
    """The workers whose beat is fresh, as ``{worker ID: beat age in seconds}``.

    Fresh means younger than ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]``. Reads the Redis set
    (with ``REDIS_URL``; the ages use the Redis clock) or the heartbeat directory.

    Raises:
        redis.RedisError: Redis did not answer (with ``REDIS_URL`` set).
    """
    max_age = _max_age()
    url = _redis_url()
    if url:
        import redis

        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            seconds, micros = client.time()
            now = seconds + micros / 1_000_000
            members = client.zrangebyscore(REDIS_KEY, now - max_age, "+inf", withscores=True)
        return {
            (member.decode() if isinstance(member, bytes) else str(member)): max(0.0, now - score)
            for member, score in members
        }
    directory = _heartbeat_dir()
    now = time.time()
    fresh: dict[str, float] = {}
    try:
        entries = list(directory.iterdir())
    except OSError:
        return fresh
    for entry in entries:
        if not entry.name.endswith(_SUFFIX):
            continue
        try:
            age = now - entry.stat().st_mtime
        except OSError:
            continue  # removed by a clean stop meanwhile
        if age < max_age:
            fresh[entry.name[: -len(_SUFFIX)]] = max(0.0, age)
        elif age > _FORGET_SECONDS:
            # A killed worker never removes its file; its ID (host-pid) does not come back.
            entry.unlink(missing_ok=True)
    return fresh
