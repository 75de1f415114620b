"""A pull AsyncWorker serving the test Flows in its own process (killed by tests)."""

from __future__ import annotations

import asyncio
import sys
import tempfile

from dex import (
    AsyncWorker,
    BlobCacheConfig,
    PullWorkerOptions,
    Registry,
    WorkerOptions,
    open_blob_cache,
)

from .flows import ALL_FLOWS


async def main(address: str) -> None:
    registry = Registry(ALL_FLOWS, allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(tempfile.mkdtemp(), 16 * 1024 * 1024))
    worker = AsyncWorker(
        registry,
        cache,
        WorkerOptions(server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=32)),
    )
    runner = asyncio.create_task(worker.start())
    await worker.wait_pull_registered(timeout=20)
    print("worker ready", flush=True)
    await runner


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
