# mypy: disable-error-code="override"
# (dex-python-sdk 1.23.0 types Step handlers as synchronous; async handlers are valid
# with Registry(allow_async_handlers=True) but do not match those stubs.)
"""Benchmark of the embedded Dex engine with the real SDK and a pull worker.

Measures, against ``python -m dex_dev_server`` on a temporary database:

1. step-transition latency (p50 / p99) over one flow's chain of ``--chain`` no-op Steps,
   and its per-Step time;
2. aggregate Steps per second with ``--flows`` concurrent flows of ``--flow-steps`` Steps;
3. the engine's resident memory with ``--idle`` flows parked on a channel wait;

and, in the same run, the peer: the same chain as ``--chain`` durable steps of one DBOS
workflow on SQLite (``bench/dbos_peer.py``, own process). Prints our per-Step time as a
ratio of DBOS's. Targets from issue 3: ratio <= 1.5, p99 < 10 ms, idle RSS < 300 MB.

Run: ``.venv/bin/python -m bench.engine`` (``--quick`` for a smaller, faster pass).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from dex import (
    AsyncClient,
    AsyncContext,
    AsyncWorker,
    BlobCacheConfig,
    Channel,
    ClientOptions,
    Flow,
    PersistenceSchema,
    PullWorkerOptions,
    Registry,
    Step,
    StepDecision,
    StepList,
    Wait,
    WorkerOptions,
    WorkerTarget,
    go_to,
    graceful_complete,
    open_blob_cache,
)

from dex_agents._worker_tuning import cache_sdk_version

REPO = Path(__file__).resolve().parents[1]

# Invocation times of ChainStep per flow ID, recorded by the in-process worker.
_MARKS: dict[str, list[float]] = {}


class ChainStep(Step[int]):
    """A no-op Step that counts down to zero."""

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:
        _MARKS.setdefault(context.flow_id, []).append(time.perf_counter())
        if input <= 1:
            return graceful_complete(0)
        return go_to(ChainStep, input - 1)


class ChainFlow(Flow[int]):
    def get_steps(self) -> StepList[int]:
        return StepList.start_step(ChainStep())


parked = Channel("parked", str)


class Park(Step[None]):
    async def wait_for(self, context: AsyncContext, input: None) -> Wait:
        return Wait.until(parked.for_one())

    async def execute(self, context: AsyncContext, input: None) -> StepDecision:
        return graceful_complete(parked.results(context)[0])


class IdleFlow(Flow[None]):
    def get_steps(self) -> StepList[None]:
        return StepList.start_step(Park())

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(parked)


@dataclass
class Figures:
    chain_steps: int = 0
    chain_total: float = 0.0
    deltas: list[float] = field(default_factory=list)
    flows: int = 0
    flow_steps: int = 0
    concurrent_total: float = 0.0
    idle: int = 0
    idle_rss_mb: float = 0.0
    base_rss_mb: float = 0.0


def start_engine(db: Path) -> tuple[subprocess.Popen[str], str]:
    """Start ``python -m dex_dev_server`` on a free port with ``db``; return it and its
    address once it printed its ready line."""
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


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _bounded(n: int, limit: int, make: object) -> list[object]:
    semaphore = asyncio.Semaphore(limit)

    async def one(i: int) -> object:
        async with semaphore:
            return await make(i)  # type: ignore[operator]

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def _measure(ns: argparse.Namespace, address: str, pid: int, cache_dir: str) -> Figures:
    chain, idle = ChainFlow(), IdleFlow()
    registry = Registry([chain, idle], allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(cache_dir, 1 << 24))
    client = AsyncClient(
        registry, cache,
        ClientOptions(server_address=address, worker_target=WorkerTarget(pull=True)),
    )
    # As every Worker of the platform does (dex_agents._worker_tuning): the SDK would read
    # its own package metadata for each task stream, about a Step transition's worth of CPU.
    cache_sdk_version()
    worker = AsyncWorker(
        registry, cache,
        WorkerOptions(server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=32)),
    )
    runner = asyncio.create_task(worker.start())
    await worker.wait_pull_registered(timeout=30)
    fig = Figures(chain_steps=ns.chain, flows=ns.flows, flow_steps=ns.flow_steps, idle=ns.idle)
    try:
        # Warm-up: connections, first dispatch.
        await client.start_flow(chain, "warm", 5)
        await client.wait_for_flow("warm")

        # 1. One long chain: per-transition latency.
        started = time.perf_counter()
        await client.start_flow(chain, "chain", ns.chain)
        await client.wait_for_flow("chain")
        fig.chain_total = time.perf_counter() - started
        marks = _MARKS["chain"]
        assert len(marks) == ns.chain
        fig.deltas = [b - a for a, b in itertools.pairwise(marks)]

        # 2. Concurrent flows: aggregate throughput.
        started = time.perf_counter()
        await asyncio.gather(
            *(client.start_flow(chain, f"many-{i}", ns.flow_steps) for i in range(ns.flows))
        )
        await asyncio.gather(*(client.wait_for_flow(f"many-{i}") for i in range(ns.flows)))
        fig.concurrent_total = time.perf_counter() - started
        assert sum(len(_MARKS[f"many-{i}"]) for i in range(ns.flows)) == ns.flows * ns.flow_steps

        # 3. Idle flows parked on a channel wait: resident memory.
        fig.base_rss_mb = _rss_mb(pid)
        await _bounded(ns.idle, 64, lambda i: client.start_flow(idle, f"idle-{i}", None))
        deadline = time.monotonic() + 600
        while not await _all_parked(address, ns.idle):
            if time.monotonic() > deadline:
                raise RuntimeError("idle flows did not all reach their channel wait")
            await asyncio.sleep(0.5)
        fig.idle_rss_mb = _rss_mb(pid)
    finally:
        await worker.stop()
        await asyncio.gather(runner, return_exceptions=True)
        await client.close()
        cache.close()
    return fig


async def _all_parked(address: str, count: int) -> bool:
    """True once every idle flow's Step reached its channel wait (via GetFlowState)."""
    import grpc
    from dex.dexpb import dex_pb2 as pb
    from dex.dexpb import dex_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        for i in range(count - 1, -1, -max(1, count // 20)):
            state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id=f"idle-{i}"))
            steps = state.active_step_executions
            if not steps or not steps[0].HasField("waiting_condition"):
                return False
    return True


def _dbos(steps: int, tmp: Path) -> tuple[float, list[float]]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.dbos_peer", str(steps), str(tmp / "dbos.sqlite3")],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    data = json.loads(out.strip().splitlines()[-1])
    return float(data["total"]), [float(d) for d in data["deltas"]]


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chain", type=int, default=1000)
    parser.add_argument("--flows", type=int, default=100)
    parser.add_argument("--flow-steps", type=int, default=50)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true", help="200-step chain, 20x20, 1,000 idle")
    ns = parser.parse_args()
    if ns.quick:
        ns.chain, ns.flows, ns.flow_steps, ns.idle = 200, 20, 20, 1000
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proc, address = start_engine(tmp / "bench.sqlite3")
        try:
            fig = asyncio.run(_measure(ns, address, proc.pid, str(tmp / "cache")))
        finally:
            proc.terminate()
            proc.wait(30)
        dbos_total, dbos_deltas = _dbos(ns.chain, tmp)

    ours = fig.chain_total / fig.chain_steps
    theirs = dbos_total / fig.chain_steps
    ms = 1000.0
    print(f"chain of {fig.chain_steps} no-op Steps (one flow, pull worker, real SDK):")
    print(f"  dex_dev_server: {ours * ms:.2f} ms/Step; transition p50 "
          f"{statistics.median(fig.deltas) * ms:.2f} ms, p99 {_pct(fig.deltas, 0.99) * ms:.2f} ms")
    print(f"  DBOS (SQLite):  {theirs * ms:.2f} ms/step; transition p50 "
          f"{statistics.median(dbos_deltas) * ms:.2f} ms, "
          f"p99 {_pct(dbos_deltas, 0.99) * ms:.2f} ms")
    print(f"  ratio (ours / DBOS per step): {ours / theirs:.2f}  (target <= 1.5)")
    total_steps = fig.flows * fig.flow_steps
    print(f"{fig.flows} concurrent flows x {fig.flow_steps} Steps: "
          f"{total_steps / fig.concurrent_total:.0f} Steps/s ({fig.concurrent_total:.2f} s)")
    print(f"{fig.idle} flows idle on a channel wait: engine RSS {fig.idle_rss_mb:.0f} MB "
          f"(before: {fig.base_rss_mb:.0f} MB; target < 300 MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
