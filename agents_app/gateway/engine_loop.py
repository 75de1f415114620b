"""Where the web side's Dex calls run: a private event loop thread per process, and deadlines.

Owns: the gateway loop (one daemon thread per process, made again after a fork) and the three
ways to run a coroutine of the gateway (``dex_gateway``, ``event_stream``) under
``DEXAGENTS["ENGINE_TIMEOUT"]``:

- sync callers (DRF views, services, Celery tasks, commands) use ``run(...)``, which executes
  the coroutine on the gateway loop, so every request shares one AsyncClient and one gRPC
  channel whatever server runs Django;
- async views ``await call(...)``, which runs the coroutine on that same loop without holding
  a thread while Dex answers, so a web process serves many Dex-reading requests at once on
  one channel;
- a long-lived loop of its own (the ASGI server's) may ``await call_here(...)`` instead.

Async callers that keep their own loop (Channels consumers, the Dex worker) simply ``await``
the coroutines; they reuse one connection per running loop (``engine_connection``). Callers
reach these as ``dex_gateway.run`` / ``call`` / ``call_here``, where they are re-exported.

May import: ``engine_errors``, ``engine_connection``, the settings, and the worker side's Flow
(imported before a call, outside its deadline).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar, cast

from agents_app.conf import dexagents_setting
from agents_app.gateway.engine_connection import connections_close
from agents_app.gateway.engine_errors import EngineUnavailableError

T = TypeVar("T")


class _GatewayLoop:
    """A private event loop thread per process for sync callers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # A forked child inherits the loop object but not its thread.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="dex-gateway", daemon=True)
                thread.start()
                self._loop = loop
                self._pid = os.getpid()
                atexit.register(_close_gateway_loop, loop, thread, self._pid)
            return self._loop


def _close_gateway_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                        pid: int) -> None:
    """At interpreter exit: close the gateway loop's engine connections, then stop the loop.

    gRPC channels left open on this loop, whose daemon thread is frozen at exit, made the
    process hang in its final garbage collection: ``manage.py dexworker`` printed "dexworker
    stopped" after SIGTERM and then never exited (the e2e tests SIGKILLed it after 15 s; a
    service manager would wait for its own stop timeout). Each wait is bounded (5 s).
    """
    if pid != os.getpid() or loop.is_closed() or not thread.is_alive():
        return
    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(connections_close(loop), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


_gateway_loop = _GatewayLoop()


def _timed_out(limit: float) -> EngineUnavailableError:
    """The error for a call that got no answer within ``limit`` seconds."""
    address = dexagents_setting("DEX_SERVER_ADDRESS")
    return EngineUnavailableError(
        f"The Dex engine at {address} or its workers did not answer within {limit:g} seconds.",
        cause="timeout",
    )


async def call(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await a coroutine of the gateway from async code (async views) without blocking a
    thread, on the process's gateway loop.

    The coroutine runs where ``run`` runs it, so async views and sync callers share the
    process's one AsyncClient and gRPC channel whatever loop the caller is on (the ASGI
    server's, or a short-lived one of ``async_to_sync`` under Django's test client, which
    would otherwise open a channel per request). Cancelling the caller (a client that went
    away) cancels the call on the gateway loop.

    Args:
        coroutine: e.g. ``dex_gateway.session_snapshot(session_id=...)``.

    Raises:
        EngineUnavailableError: The engine did not answer within
            ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds (as ``run``).
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT"))
    # Loaded with the ASGI application in a web process; elsewhere (tests) once, here.
    import agents_app.worker.flow  # noqa: F401

    loop = _gateway_loop.get()
    awaitable: Any = coroutine
    if asyncio.get_running_loop() is not loop:
        awaitable = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return cast(T, await awaitable)
    except TimeoutError:
        # Only the deadline's own expiry means "no answer"; a TimeoutError the coroutine
        # raised passes through as it is.
        if deadline.expired():
            raise _timed_out(limit) from None
        raise


async def call_here(coroutine: Coroutine[Any, Any, T]) -> T:
    """``call``, but on the caller's own event loop and its own connection
    (``engine_connection.connection``): no hop to the gateway loop's thread and back. Only for
    a long-lived loop, such as the ASGI server's (``agents_app.api.snapshot_asgi``); a
    short-lived loop would open a gRPC channel each time.

    Raises:
        EngineUnavailableError: The engine did not answer within
            ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds.
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT"))
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await coroutine
    except TimeoutError:
        if deadline.expired():
            raise _timed_out(limit) from None
        raise


def run(coroutine: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run a coroutine of the gateway from sync code and return its result.

    Args:
        coroutine: e.g. ``dex_gateway.session_snapshot(session_id=...)``.
        timeout: Seconds; defaults to ``DEXAGENTS["ENGINE_TIMEOUT"]``.

    Raises:
        EngineUnavailableError: The engine did not answer within ``timeout``; the
            coroutine is cancelled.
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT")) if timeout is None else timeout
    # The first import of the Flow (LiteLLM, the MCP SDK) takes seconds; do it here, outside
    # the engine deadline and off the gateway loop.
    import agents_app.worker.flow  # noqa: F401

    future = asyncio.run_coroutine_threadsafe(coroutine, _gateway_loop.get())
    try:
        return future.result(timeout=limit)
    except TimeoutError:
        future.cancel()
        raise _timed_out(limit) from None
