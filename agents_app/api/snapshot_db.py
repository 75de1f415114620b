"""The snapshot short path's database work (``snapshot_asgi``): the threads it runs on, which
keep their connections between reads (``Lane``, ``lane``), and queries compiled once
(``PreparedQuery``), so a cached read pays for neither a new connection nor the ORM's
compiler.

May import: Django only (the ORM, imported where it is used).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

#: Threads that run this path's database work, each with its own connection.
DATABASE_THREADS = 4
#: A thread closes its connections once no read has used them for this long (seconds), so an
#: idle web process holds none that a read opened ...
CONNECTION_IDLE_SECONDS = 10.0
#: ... and after this long open however busy (seconds), so a database that moved (a failover,
#: a PgBouncer restart) is reached anew; ``CONN_MAX_AGE``, when set above 0, applies instead.
CONNECTION_MAX_SECONDS = 300.0
#: A kept connection idle for longer than this (seconds) gets Django's health check before
#: its next query (``CONN_HEALTH_CHECKS``; a ``SELECT 1`` on PostgreSQL), so one that the
#: server closed meanwhile is replaced instead of failing a read.
HEALTH_CHECK_IDLE_SECONDS = 1.0


class Lane:
    """One thread of the path's database work and the connections it keeps between reads.

    Django opens and closes a connection around each request by default (``CONN_MAX_AGE =
    0``, see the settings for why); opening a SQLite connection (its ``init_command``
    pragmas) cost ~40 % of a cached read's web CPU. A lane's thread is the path's own, so its
    connections are kept while reads keep coming and closed on the thread that opened them:
    after ``CONNECTION_IDLE_SECONDS`` without a read, after ``CONNECTION_MAX_SECONDS``, after
    an error that left one unusable (as Django's ``close_if_unusable_or_obsolete``)."""

    def __init__(self, number: int) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(
            1, thread_name_prefix=f"snapshot-short-path-{number}"
        )
        self.busy = 0
        self.last_used = 0.0
        self.closer: asyncio.TimerHandle | None = None
        self.closer_loop: asyncio.AbstractEventLoop | None = None

    async def run(self, work: Callable[[], T]) -> T:
        """``work()`` on this lane's thread, its connections checked before and noted after
        (``_connections_check``, ``_connections_opened``)."""
        loop = asyncio.get_running_loop()
        self.busy += 1
        try:
            return await loop.run_in_executor(self.executor, _on_lane, work)
        finally:
            self.busy -= 1
            self.last_used = loop.time()
            if self.closer is None or self.closer_loop is not loop:
                # (A closer left on a loop that ended, in tests, never runs.)
                self.closer_loop = loop
                self.closer = loop.call_later(CONNECTION_IDLE_SECONDS, self._close_if_idle)

    def _close_if_idle(self) -> None:
        loop = asyncio.get_running_loop()
        idle_for = loop.time() - self.last_used
        if self.busy or idle_for < CONNECTION_IDLE_SECONDS:
            self.closer = loop.call_later(
                max(CONNECTION_IDLE_SECONDS - idle_for, 0.1), self._close_if_idle
            )
            return
        self.closer = None
        self.executor.submit(_close_connections)


_lanes_lock = threading.Lock()
_lanes: list[Lane] = []


def lane() -> Lane:
    """The least busy lane (the first of equals, so that one client's reads keep one
    connection)."""
    if not _lanes:
        with _lanes_lock:
            if not _lanes:
                _lanes.extend(Lane(number) for number in range(DATABASE_THREADS))
    return min(_lanes, key=lambda lane: lane.busy)


def _on_lane(work: Callable[[], T]) -> T:
    _connections_check()
    try:
        return work()
    finally:
        _connections_opened()


#: This thread's connections: when each opened and was last used, by database alias.
_kept = threading.local()


def _kept_times() -> tuple[dict[str, float], dict[str, float]]:
    if not hasattr(_kept, "opened"):
        _kept.opened, _kept.used = {}, {}
    return _kept.opened, _kept.used


def _connections_check() -> None:
    """Before a read on a lane: close this thread's connections that an error left unusable,
    that changed autocommit, or that are older than their age limit (``Lane``); have those
    idle for more than ``HEALTH_CHECK_IDLE_SECONDS`` health-checked (as Django checks a
    persistent connection at each request)."""
    from django.db import connections

    opened, used = _kept_times()
    now = time.monotonic()
    for connection in connections.all(initialized_only=True):
        alias = connection.alias
        if connection.connection is None:
            opened.pop(alias, None)
            continue
        if connection.settings_dict["CONN_MAX_AGE"] != 0:
            connection.close_if_unusable_or_obsolete()
            continue
        if (
            (connection.errors_occurred and not connection.is_usable())
            or connection.get_autocommit() != connection.settings_dict["AUTOCOMMIT"]
            or now - opened.get(alias, now) >= CONNECTION_MAX_SECONDS
        ):
            connection.close()
            opened.pop(alias, None)
            continue
        connection.errors_occurred = False
        if now - used.get(alias, now) > HEALTH_CHECK_IDLE_SECONDS:
            connection.health_check_done = False  # type: ignore[attr-defined]


def _connections_opened() -> None:
    """After a read on a lane: note when this thread's connections opened and were used."""
    from django.db import connections

    opened, used = _kept_times()
    now = time.monotonic()
    for connection in connections.all(initialized_only=True):
        if connection.connection is not None:
            opened.setdefault(connection.alias, now)
            used[connection.alias] = now


def _close_connections() -> None:
    from django.db import connections

    for connection in connections.all(initialized_only=True):
        connection.close()
    for times in _kept_times():
        times.clear()


_SENTINEL = "\x00dexagents-short-path-parameter\x00"


class PreparedQuery:
    """A ``values_list`` queryset compiled once per database alias and run again with another
    value in place of ``_SENTINEL``: the ORM's SQL and its value converters (datetimes from
    SQLite text, ...) without compiling the query on every read, which was most of the web
    CPU of a cached read."""

    def __init__(self, build: Callable[[str], Any]) -> None:
        self._build = build
        self._compiled: dict[str, tuple[Any, str, list[Any], int]] = {}
        self._lock = threading.Lock()

    def rows(self, value: str, *, using: str = "default") -> list[tuple[Any, ...]]:
        """The queryset's rows with ``value`` as its parameter (values converted as the ORM
        would)."""
        from django.db import connections

        compiled = self._compiled.get(using)
        if compiled is None:
            with self._lock:
                queryset = self._build(_SENTINEL).using(using)
                compiler = queryset.query.get_compiler(using)
                sql, params = compiler.as_sql()
                params = list(params)
                compiled = (compiler, sql, params, params.index(_SENTINEL))
                self._compiled[using] = compiled
        compiler, sql, params, position = compiled
        params = [*params[:position], value, *params[position + 1 :]]
        with connections[using].cursor() as cursor:
            cursor.execute(sql, params)
            fetched = cursor.fetchall()
        return [tuple(row) for row in compiler.results_iter(results=[fetched])]
