"""Database work of websocket handshakes, on threads of their own with a deadline (issue 25).

Channels runs ``database_sync_to_async`` work on one shared thread per process (asgiref's
thread-sensitive executor, outside any request). A handshake whose lookup waits on the
database (a locked ``django_session`` row in PostgreSQL) held that thread, so every other
websocket handshake of the process, token-authenticated or not, waited behind it.

:func:`websocket_db` runs one lookup on a small pool of its own (``WEBSOCKET_DB_THREADS``
threads per process, each with its own Django connection, closed after the call as
``database_sync_to_async`` does) and waits at most ``DEXAGENTS["WEBSOCKET_DB_TIMEOUT"]``
seconds. Past that it raises :class:`WebsocketDatabaseTimeout` and the consumer closes that one
socket with 4503 (``consumers.CLOSE_DATABASE_BUSY``); the thread finishes its query whenever
the database answers, and a full pool makes later lookups wait their own deadline, never
anyone else's.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import close_old_connections, connection

from agents_app.conf import dexagents_setting

T = TypeVar("T")

#: Threads per web process for websocket handshake lookups (token, session cookie, session
#: row, approvals version).
WEBSOCKET_DB_THREADS = 8

#: How long after its caller's deadline a lookup's PostgreSQL statement is cancelled (seconds).
STATEMENT_MARGIN_SECONDS = 5.0

_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


class WebsocketDatabaseTimeout(Exception):
    """A websocket handshake's database lookup did not answer within
    ``DEXAGENTS["WEBSOCKET_DB_TIMEOUT"]`` seconds."""


def _pool() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(
                max_workers=WEBSOCKET_DB_THREADS, thread_name_prefix="websocket-db"
            )
        return _executor


def _run(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    close_old_connections()
    try:
        if connection.vendor == "postgresql":
            # The query ends a little after the caller gave up on it, so a thread does not
            # wait on a lock for as long as the lock is held (nor keep the process from exiting).
            seconds = float(dexagents_setting("WEBSOCKET_DB_TIMEOUT")) + STATEMENT_MARGIN_SECONDS
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('statement_timeout', %s, false)",
                               [f"{int(seconds * 1000)}ms"])
        return function(*args, **kwargs)
    finally:
        close_old_connections()


async def websocket_db(function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``function(*args, **kwargs)`` (sync, ORM) on the websocket lookup pool.

    Raises:
        WebsocketDatabaseTimeout: No answer within ``DEXAGENTS["WEBSOCKET_DB_TIMEOUT"]``
            seconds (the call goes on in its thread; its result is dropped).
        Exception: Whatever ``function`` raised.
    """
    loop = asyncio.get_running_loop()
    # The caller's context (its log fields: agents_app.log_context) goes with the call.
    call = functools.partial(contextvars.copy_context().run, _run, function, *args, **kwargs)
    future = loop.run_in_executor(_pool(), call)
    timeout = float(dexagents_setting("WEBSOCKET_DB_TIMEOUT"))
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise WebsocketDatabaseTimeout(
            f"the database did not answer a websocket lookup within {timeout:g} s"
        ) from None
