"""The web side's connection to the Dex engine: one SDK client per event loop and engine address.

Owns: ``Connection`` (an ``AsyncClient`` of the shared Flow, its ``AgentSessionClient`` and a
raw FlowService stub), the process's Dex blob cache, the connections of each event loop
(``connection``; gRPC aio objects are bound to their loop, reference/django-notes.md G1),
opening and closing them, and ``flow_stop`` (StopFlow of any Flow: a session's, a
schedule's). Nothing is created at import time, which keeps the module safe to
import in forking processes (Celery prefork).

May import: the settings, the worker side's Flow (``agents_app.worker.flow.build_flow``, lazily),
the Dex SDK, ``dex_agents`` and ``engine_errors`` (for ``flow_stop``); nothing else of the
gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import weakref
from typing import Any

import grpc

from agents_app.conf import dexagents_setting
from agents_app.gateway.engine_errors import SessionNotFoundError, translate


class Connection:
    """One AsyncClient, its AgentSessionClient and a raw FlowService stub, bound to a loop.

    Attributes:
        flow: The shared ``AgentSessionFlow`` (its ``agent_events`` Stream is read and written).
        schedule_flow: The schedule Flow (``AgentSchedule``), to start schedules' Flows.
        client: The Dex ``AsyncClient``.
        sessions: The ``dex_agents.AgentSessionClient`` of ``flow`` over ``client``.
        history_channel: A gRPC channel of its own, for the calls the SDK lacks.
        flow_service: A FlowService stub on ``history_channel``.
    """

    def __init__(self, address: str) -> None:
        from dex import AsyncClient, ClientOptions, Registry
        from dex.dexpb import dex_pb2_grpc

        from agents_app.worker.flow import build_flow
        from agents_app.worker.schedule_flow import build_schedule_flow
        from dex_agents import AgentCodecRegistry, AgentSessionClient

        self.flow = build_flow()
        self.schedule_flow = build_schedule_flow()
        registry = Registry(
            [self.flow, self.schedule_flow], AgentCodecRegistry(), allow_async_handlers=True
        )
        self.client = AsyncClient(registry, _blob_cache(), ClientOptions(server_address=address))
        self.sessions = AgentSessionClient(self.client, self.flow)
        # SDK 1.23.0's AsyncClient has no history call, so GetHistoryEvents goes through a
        # stub of our own on a separate channel.
        self.history_channel = grpc.aio.insecure_channel(address)
        self.flow_service = dex_pb2_grpc.FlowServiceStub(self.history_channel)

    async def close(self) -> None:
        await self.client.close()
        await self.history_channel.close(None)


_blob_cache_lock = threading.Lock()
_blob_cache_instance: Any = None
# Per loop, per engine address: a changed DEX_SERVER_ADDRESS (tests) gets its own client.
_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, Connection]] = (
    weakref.WeakKeyDictionary()
)


def _blob_cache() -> Any:
    """Open the process's Dex blob cache once (``DEXAGENTS["BLOB_CACHE_DIR"]``)."""
    global _blob_cache_instance
    with _blob_cache_lock:
        if _blob_cache_instance is None:
            from dex import BlobCacheConfig, open_blob_cache

            directory = dexagents_setting("BLOB_CACHE_DIR")
            os.makedirs(directory, exist_ok=True)
            _blob_cache_instance = open_blob_cache(
                BlobCacheConfig(str(directory), dexagents_setting("BLOB_CACHE_BYTES"))
            )
        return _blob_cache_instance


def connection() -> Connection:
    """Return the running loop's connection to ``DEXAGENTS["DEX_SERVER_ADDRESS"]``, creating
    it on first use (no RPC: channels connect on their first call)."""
    loop = asyncio.get_running_loop()
    address = dexagents_setting("DEX_SERVER_ADDRESS")
    by_address = _connections.setdefault(loop, {})
    found = by_address.get(address)
    if found is None:
        found = by_address[address] = Connection(address)
    return found


async def connections_close(loop: asyncio.AbstractEventLoop) -> None:
    """Close ``loop``'s connections and forget them (best effort: a close that fails is
    ignored); the next ``connection()`` on that loop opens a new one. Runs on ``loop``."""
    for open_connection in list(_connections.pop(loop, {}).values()):
        with contextlib.suppress(Exception):
            await open_connection.close()


def session_client() -> Any:
    """The running loop's ``dex_agents.AgentSessionClient`` of the shared Flow, created on
    first use from ``DEXAGENTS["DEX_SERVER_ADDRESS"]``.

    For code that runs on a loop of its own and speaks to the session Flow directly: a Dex
    worker's tool Steps put MCP servers' questions to the user through it
    (``agents_app.worker.runner.LiteLLMRunner``), on the worker's loop. SDK errors are not
    translated.

    Returns:
        An ``AgentSessionClient`` (typed ``Any``: the class is imported lazily).
    """
    return connection().sessions


async def engine_connection_open() -> None:
    """Create the running loop's engine connection now, without an RPC: the Dex client,
    its Flow registry and the gRPC channels (``agents_app.live.lifespan`` does it at start-up, so
    the first request does not)."""
    connection()


async def engine_connections_close() -> None:
    """Close the running loop's engine connections (a Dex worker's, at its stop), so no gRPC
    channel outlives the loop it is bound to; the next call opens a new one."""
    await connections_close(asyncio.get_running_loop())


async def flow_stop(flow_id: str, *, reason: str) -> None:
    """Stop the Flow ``flow_id`` (Dex ``StopFlow``); a Flow Dex no longer has is not an error.

    Raises:
        engine_errors.EngineUnavailableError: The engine did not answer (or another error
            ``engine_errors.translate`` gives, other than ``SessionNotFoundError``).
    """
    from dex import StopFlowOptions

    try:
        await connection().client.stop_flow(flow_id, StopFlowOptions(reason=reason))
    except Exception as error:
        translated = translate(error, flow_id)
        if not isinstance(translated, SessionNotFoundError):
            raise translated from error
