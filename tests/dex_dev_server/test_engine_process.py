"""The ``EngineProcess`` fixture: once ``start()`` returns, a new channel is answered at once."""

from __future__ import annotations

import asyncio
import time

import grpc
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2

from .conftest import EngineProcess


async def _server_info(channel: grpc.aio.Channel) -> None:
    await dex_pb2_grpc.FlowServiceStub(channel).GetServerInfo(empty_pb2.Empty(), timeout=2)


async def test_a_fail_fast_call_after_a_restart_on_the_same_port_is_answered(
    engine: EngineProcess,
) -> None:
    """A channel this process holds keeps reconnecting while the engine is down (as the ``dex``
    worker does), which leaves the subchannel all channels to that port share in back-off."""
    held = grpc.aio.insecure_channel(engine.address)
    try:
        await _server_info(held)
        engine.kill()
        refused = 0
        deadline = time.monotonic() + 10
        while refused < 4 and time.monotonic() < deadline:
            try:
                await _server_info(held)
            except grpc.RpcError as error:
                assert error.code() is grpc.StatusCode.UNAVAILABLE, error
                refused += 1
            await asyncio.sleep(0.2)
        assert refused == 4
        engine.start()
        async with grpc.aio.insecure_channel(engine.address) as fresh:
            await _server_info(fresh)
        await _server_info(held)
    finally:
        await held.close()
