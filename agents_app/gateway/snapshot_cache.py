"""The last snapshot read of each session, served again while the session has not changed.

``GET /api/v1/sessions/<id>/`` reads the session's AgentSnapshot through a Dex RPC that a
worker answers. A read of a session that has not changed since the last read is served from
here instead, without that RPC. "Not changed" is decided by a stamp that costs no worker:

- the session's newest AgentEvents resume token (an engine read the snapshot view makes
  anyway, for its ``events_after``): Steps write an event for each change they make, and the
  web announces its own writes (``message_queued``, ``queue_changed``, ``session_stopped``);
- the index row's ``status`` and ``updated_at``, which the worker's observer moves on every
  status change it reports.

Read-your-writes: every write the web sends to a session (the message, queue, answer,
decision, plan and turn-cancel RPCs of ``input_rpcs``, ``dex_gateway.session_stop``) forgets
the session's entry before and after the RPC (``writes_session``), so the writer's next read
goes to Dex even when the announcement event could not be written.
Staleness a reader can see: none from this cache beyond what the stamp misses, i.e. a change
that a Step makes without writing an event and without a status change (none is known).

Who reads here: the DRF view (``agents_app.api.snapshot.snapshot_read``), and in front of it,
for API clients, ``agents_app.api.snapshot_asgi`` (the short path), which serves only hits and
takes the stamp's token from this process's reader of the session's Stream when it runs
(``session_feed.known_tail``): it may trail the engine by the message being delivered at
that moment, so the short path can answer a change one read late, always with the
``events_after`` of the snapshot it answers.

Where entries live: Redis (key ``dexagents:snapshot:<session id>``, pickled, expiring after
``TTL_SECONDS``) when ``REDIS_URL`` is set, so every web process shares them and a write
through one process is seen by the others; else this process's memory, the
``LOCAL_MAX_ENTRIES`` most recently used sessions.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import logging
import pickle
import time
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from agents_app.conf import dexagents_setting

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: Sessions kept in process memory without Redis (least recently used go first).
LOCAL_MAX_ENTRIES = 2000
#: How long a Redis entry lives unread (seconds).
TTL_SECONDS = 600
KEY_PREFIX = "dexagents:snapshot:"


@dataclasses.dataclass(frozen=True)
class Entry:
    """One cached read: its stamp, the snapshot data (``dex_gateway.session_snapshot``'s
    shape), when it was read (``datetime``, for the index's ``status_observed_at``) and when the
    engine last said that the session's Flow runs (``datetime``; the reader re-asks after a
    while)."""

    stamp: tuple[str, ...]
    snapshot: dict[str, Any]
    read_at: Any
    flow_checked_at: Any


_local: collections.OrderedDict[str, Entry] = collections.OrderedDict()
# When this process last sent a write to each session (monotonic seconds; the newest
# LOCAL_MAX_ENTRIES sessions).
_written: dict[str, float] = {}
# One Redis client per event loop (the ASGI loop, the gateway loop): redis.asyncio clients
# are bound to the loop that made them.
_clients: dict[int, Any] = {}


def _redis() -> Any | None:
    url = str(dexagents_setting("REDIS_URL") or "")
    if not url:
        return None
    loop = asyncio.get_running_loop()
    client = _clients.get(id(loop))
    if client is None:
        import redis.asyncio

        client = redis.asyncio.Redis.from_url(url, socket_timeout=2.0)
        _clients[id(loop)] = client
    return client


def stamp_of(*, events_after: str, status: str, updated_at: Any) -> tuple[str, ...]:
    """The stamp of a session's state: its newest event token and its index row's status and
    ``updated_at``."""
    return (events_after, status, updated_at.isoformat() if updated_at else "")


async def get(session_id: str, stamp: tuple[str, ...]) -> Entry | None:
    """The cached read of ``session_id`` if it was made under ``stamp``; None otherwise (and
    when Redis does not answer: the caller reads Dex)."""
    client = _redis()
    if client is None:
        entry = _local.get(session_id)
        if entry is None or entry.stamp != stamp:
            return None
        _local.move_to_end(session_id)
        return entry
    try:
        raw = await client.get(KEY_PREFIX + session_id)
    except Exception as error:
        logger.info("Snapshot cache read failed: %s", error)
        return None
    if raw is None:
        return None
    try:
        entry = pickle.loads(raw)
    except Exception:
        return None
    return entry if isinstance(entry, Entry) and entry.stamp == stamp else None


async def put(session_id: str, entry: Entry) -> None:
    """Keep ``entry`` as the session's last read (best effort)."""
    client = _redis()
    if client is None:
        _local[session_id] = entry
        _local.move_to_end(session_id)
        while len(_local) > LOCAL_MAX_ENTRIES:
            _local.popitem(last=False)
        return
    try:
        await client.set(KEY_PREFIX + session_id, pickle.dumps(entry), ex=TTL_SECONDS)
    except Exception as error:
        logger.info("Snapshot cache write failed: %s", error)


async def forget(session_id: str) -> None:
    """Drop the session's entry: a write is on its way (read-your-writes). This process also
    remembers when (``written_within``)."""
    _local.pop(session_id, None)
    _written[session_id] = time.monotonic()
    while len(_written) > LOCAL_MAX_ENTRIES:
        _written.pop(next(iter(_written)))
    client = _redis()
    if client is None:
        return
    try:
        await client.delete(KEY_PREFIX + session_id)
    except Exception as error:
        logger.warning("Snapshot cache could not forget %s: %s", session_id, error)


def writes_session(
    function: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Mark an RPC coroutine that changes a session (keyword ``session_id``): its cached
    snapshot is forgotten before and after the call (read-your-writes, as ``forget``)."""

    @functools.wraps(function)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        session_id = str(kwargs["session_id"])
        await forget(session_id)
        try:
            return await function(*args, **kwargs)
        finally:
            await forget(session_id)

    return wrapper


def written_within(session_id: str, seconds: float) -> bool:
    """Whether this process sent a write to the session less than ``seconds`` ago
    (``forget``): the snapshot short path then reads the stamp's token from the engine, so the
    writer's next read cannot be answered from a stamp that has not seen the write yet."""
    at = _written.get(session_id)
    return at is not None and time.monotonic() - at < seconds


def clear_local() -> None:
    """Forget every in-process entry (tests)."""
    _local.clear()
