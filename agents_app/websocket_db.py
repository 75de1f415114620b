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
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import close_old_connections

from agents_app.conf import dexagents_setting

T = TypeVar("T")

#: Threads per web process for websocket handshake lookups (token, session cookie, session
#: row, approvals version).
WEBSOCKET_DB_THREADS = 8

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
    future = loop.run_in_executor(_pool(), functools.partial(_run, function, *args, **kwargs))
    timeout = float(dexagents_setting("WEBSOCKET_DB_TIMEOUT"))
    try:
        return await asyncio.wait_for(future, timeout)
    except TimeoutError:
        raise WebsocketDatabaseTimeout(
            f"the database did not answer a websocket lookup within {timeout:g} s"
        ) from None
