# mypy: disable-error-code="override"
# (dex-python-sdk 1.23.0 types Step handlers as synchronous; async handlers are valid
# with Registry(allow_async_handlers=True) but do not match those stubs.)
"""Benchmark: Step throughput of the embedded Dex engine, as a ratio to bare gRPC calls.

Starts ``python -m dex_dev_server`` on a temporary database, a pull AsyncWorker and an
AsyncClient, runs ``--flows`` three-Step flows concurrently, and measures, in the same run,
the peer: the same number of bare ``HealthCheck`` round trips to the same server. Prints
the time per committed Step and its ratio to one bare gRPC round trip.

Run: ``.venv/bin/python -m bench.engine --flows 200``
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from dex import (
    AsyncClient,
    AsyncContext,
    AsyncWorker,
    BlobCacheConfig,
    ClientOptions,
    Flow,
    PullWorkerOptions,
    Registry,
    Step,
    StepDecision,
    StepList,
    WorkerOptions,
    WorkerTarget,
    go_to,
    graceful_complete,
    open_blob_cache,
)
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2

REPO = Path(__file__).resolve().parents[1]


class First(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return go_to(Second, input + 1)


class Second(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return go_to(Third, input + 1)


class Third(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        return graceful_complete(input + 1)


class BenchFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(First()).other_steps(Second(), Third())


def _start_engine(db: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "dex_dev_server", "--port", "0", "--db", str(db),
         "--log-level", "warning"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("dex_dev_server ready on "):
        raise RuntimeError(f"engine did not start: {line!r}")
    return proc, line.rsplit(" ", 1)[1]


async def _run(flows: int, address: str, cache_dir: str) -> tuple[float, float]:
    flow = BenchFlow()
    registry = Registry([flow], allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(cache_dir, 1 << 24))
    client = AsyncClient(
        registry,
        cache,
        ClientOptions(server_address=address, worker_target=WorkerTarget(pull=True)),
    )
    worker = AsyncWorker(
        registry,
        cache,
        WorkerOptions(server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=32)),
    )
    runner = asyncio.create_task(worker.start())
    await worker.wait_pull_registered(timeout=30)
    try:
        started = time.perf_counter()
        await asyncio.gather(*(client.start_flow(flow, f"bench-{i}", i) for i in range(flows)))
        results = await asyncio.gather(*(client.wait_for_flow(f"bench-{i}") for i in range(flows)))
        engine_seconds = time.perf_counter() - started
        assert all(r.single_output(int) == i + 3 for i, r in enumerate(results))

        calls = flows * 3
        async with grpc.aio.insecure_channel(address) as channel:
            stub = dex_pb2_grpc.FlowServiceStub(channel)
            started = time.perf_counter()
            semaphore = asyncio.Semaphore(32)

            async def ping() -> None:
                async with semaphore:
                    await stub.HealthCheck(empty_pb2.Empty())

            await asyncio.gather(*(ping() for _ in range(calls)))
            peer_seconds = time.perf_counter() - started
    finally:
        await worker.stop()
        await asyncio.gather(runner, return_exceptions=True)
        await client.close()
        cache.close()
    return engine_seconds, peer_seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--flows", type=int, default=200)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, address = _start_engine(Path(tmp) / "bench.sqlite3")
        try:
            engine_s, peer_s = asyncio.run(_run(ns.flows, address, str(Path(tmp) / "cache")))
        finally:
            proc.terminate()
            proc.wait(15)
    steps = ns.flows * 3
    per_step = engine_s / steps
    per_call = peer_s / steps
    print(f"flows={ns.flows} steps={steps}")
    print(f"engine: {engine_s:.2f}s total, {per_step * 1000:.2f} ms per committed Step "
          f"({steps / engine_s:.0f} steps/s, start+wait included)")
    print(f"peer (bare HealthCheck gRPC round trips, same server, 32 in flight): "
          f"{per_call * 1000:.3f} ms per call")
    print(f"ratio: one durable Step costs {per_step / per_call:.1f}x a bare gRPC round trip")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
