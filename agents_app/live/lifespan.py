"""The web process's ASGI lifespan: load and connect before the server says it serves.

Without it, the first request after start paid for Django's URLconf (every view module, DRF
and drf-spectacular imported: 0.3-1.4 s on a loaded 2-core machine) and for the gateway's
engine connection (its event loop thread, the Dex client and the gRPC channel's first
connect: ~0.1 s); with it, uvicorn prints "Application startup complete" after both, and
``manage.py dev`` says ready after that. Mount it as the ``"lifespan"`` entry of the
``ProtocolTypeRouter`` (``dexagents_site/asgi.py``); ASGI lifespan spec 2.0.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]

#: Seconds the start-up waits for the engine's health check: a channel to an engine that is
#: down or slow (it may start after the web) connects on the first request instead.
ENGINE_WARM_TIMEOUT = 2.0


async def web_warm(*, engine_timeout: float = ENGINE_WARM_TIMEOUT) -> bool:
    """Import the URLconf, create the gateway's engine connection and connect its channel
    (a health check).

    Returns:
        Whether the engine answered its health check within ``engine_timeout`` seconds.
        Never raises for an engine that is down or slow.
    """
    from django.urls import get_resolver

    from agents_app.gateway import dex_gateway, engine_connection

    # Resolving the patterns imports every view module, as the first request would.
    get_resolver().url_patterns  # noqa: B018
    try:
        await dex_gateway.call(engine_connection.engine_connection_open())
        return await asyncio.wait_for(
            dex_gateway.call(dex_gateway.engine_health_check()), engine_timeout
        )
    except (TimeoutError, dex_gateway.EngineUnavailableError):
        logger.info("The Dex engine did not answer at start; the first request connects")
        return False


def _sweep_outbox() -> None:
    from agents_app import task_queue

    task_queue.outbox_sweep_schedule()


class WebWarmUp:
    """ASGI application for ``lifespan`` scopes: :func:`web_warm` at start-up, then one outbox
    sweep queued (``task_queue.outbox_sweep_schedule``: rows a killed predecessor kept but did not
    deliver go out now, not at the next periodic sweep).

    Raises:
        ValueError: Called with a scope that is not ``lifespan``.
    """

    async def __call__(
        self,
        scope: Scope,
        receive: Callable[[], Awaitable[Message]],
        send: Callable[[Message], Awaitable[None]],
    ) -> None:
        if scope["type"] != "lifespan":
            raise ValueError(f"WebWarmUp serves lifespan scopes, not {scope['type']!r}")
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await web_warm()
                await asyncio.to_thread(_sweep_outbox)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
