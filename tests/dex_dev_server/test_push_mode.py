# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""Push (listen) mode: the engine calls a listening AsyncWorker's WorkerService."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import pytest
from dex import (
    AsyncClient,
    AsyncWorker,
    BlobCacheConfig,
    ClientOptions,
    FlowStatus,
    Registry,
    WorkerInvocationError,
    WorkerOptions,
    WorkerTarget,
    open_blob_cache,
)

from dex_agents.testing import free_port

from . import flows
from .conftest import EngineProcess


async def test_push_worker_runs_steps_and_rpcs(engine: EngineProcess, tmp_path: Path) -> None:
    registry = Registry(flows.ALL_FLOWS, allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "blobs"), 1 << 24))
    address = f"127.0.0.1:{free_port()}"
    worker = AsyncWorker(
        registry, cache, WorkerOptions(server_address=engine.address, bind_address=address)
    )
    client = AsyncClient(
        registry,
        cache,
        ClientOptions(server_address=engine.address, worker_target=WorkerTarget(address)),
    )
    runner = asyncio.create_task(worker.start())
    try:
        await asyncio.sleep(0)
        await client.start_flow(flows.CHAIN, "push-chain", 1)
        result = await client.wait_for_flow("push-chain", timedelta(seconds=20))
        assert result.single_output(int) == 20

        await client.start_flow(flows.RETRY, "push-retry", "p")
        retry = await client.wait_for_flow("push-retry", timedelta(seconds=30))
        assert retry.single_output(str) == "recovered p from doomed p attempt 2"

        counter_flow = flows.COUNTER
        await client.start_flow(counter_flow, "push-counter", None)
        assert await client.invoke_rpc(counter_flow.increment, "push-counter", 0) == 1
        with pytest.raises(WorkerInvocationError):
            await client.invoke_rpc(counter_flow.explode, "push-counter")
        await client.invoke_rpc(counter_flow.finish, "push-counter", 1)
        done = await client.wait_for_flow("push-counter", timedelta(seconds=10))
        assert done.status is FlowStatus.COMPLETED and done.single_output(int) == 2
    finally:
        await worker.stop()
        await asyncio.gather(runner, return_exceptions=True)
        await client.close()
        cache.close()
