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

``--long-session`` measures instead a long agent session's snapshot read (issue 26): one
session each of 100, 2,000 and 20,000 messages (``bench/long_session.py`` stores them in
batches through a bench-only RPC of the platform's session Flow), on one engine per
``--blob-thresholds`` value (the default 1024, the Dex server's, and 64 KiB; each engine a
``python -m dex_dev_server`` child with a Worker child), read through
``AgentSessionClient.get_agent_snapshot`` as the platform reads it (``get_message_range``, then
``get_agent_snapshot_page`` loading the newest 200 messages' instances), the engines taking
turns read by read. Prints p50 / p99 per read for each size and threshold, "flat?" (the
largest session's p50 over the smallest's, and over the middle one's, which shows as many
messages), the ratio of the thresholds, and CPU per read of the engine, the Worker and the
bench client.

Run: ``.venv/bin/python -m bench.engine`` (``--quick`` for a smaller, faster pass), and
``.venv/bin/python -m bench.engine --long-session`` (``--quick``: 100, 1,000 and 5,000
messages, 30 reads) or ``make bench-long-session``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
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
    DexServiceError,
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

from bench._cli import byte_counts
from bench.long_session import LongSessionFlow, SeedBatch, build_flow
from bench.relay import cpu_ms, percentile
from dex_agents import AgentSessionClient
from dex_agents._worker_tuning import cache_sdk_version
from dex_agents.testing import AgentTestStack
from dex_dev_server._blobs import DEFAULT_BLOB_THRESHOLD

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


# --- a long agent session's snapshot reads (--long-session) ----------------------------------

#: The session sizes of ``--long-session`` (``--quick``: the same shape, smaller).
LONG_SESSION_SIZES = (100, 2_000, 20_000)
QUICK_LONG_SESSION_SIZES = (100, 1_000, 5_000)
#: The engine thresholds compared: the default, and the Dex server's.
LONG_SESSION_THRESHOLDS = (DEFAULT_BLOB_THRESHOLD, 64 * 1024)
#: Bytes of messages per ``seed_messages`` commit (a Step or RPC result stays under 4 MiB).
_SEED_BATCH_BYTES = 1_000_000


@dataclass
class SnapshotCell:
    """One (threshold, session size) pair's reads."""

    build_seconds: float = 0.0
    seconds: list[float] = field(default_factory=list)
    #: Messages the snapshot showed.
    shown: int = 0
    #: Why the engine refused the reads, if it did.
    error: str = ""
    #: CPU milliseconds per read of the engine, the Worker and the bench client.
    engine_ms: float = 0.0
    worker_ms: float = 0.0
    client_ms: float = 0.0

    @property
    def cpu_ms(self) -> float:
        """CPU milliseconds per read, all three processes."""
        return self.engine_ms + self.worker_ms + self.client_ms


def _stack_cpu_ms(stack: AgentTestStack, worker_pid: int) -> tuple[float, float]:
    """CPU milliseconds of a stack's engine and of its Worker so far, every thread."""
    return cpu_ms(stack.engine_pid), cpu_ms(worker_pid)


async def _seed(
    sessions: AgentSessionClient, flow: LongSessionFlow, session_id: str, size: int, chars: int
) -> float:
    """Start session ``session_id`` and store ``size`` messages; return the seconds taken."""
    started = time.perf_counter()
    await sessions.start_session(session_id)
    stored = 0
    batch = max(1, _SEED_BATCH_BYTES // (2 * chars + 100))
    while stored < size:
        count = min(batch, size - stored)
        stored = await sessions.client.invoke_rpc(
            flow.seed_messages, session_id, SeedBatch(stored + 1, count, chars)
        )
    return time.perf_counter() - started


async def _read_snapshot(
    sessions: AgentSessionClient, session_id: str, size: int
) -> tuple[float, float, int]:
    """One snapshot read through ``AgentSessionClient``: ``(seconds, client CPU seconds,
    messages shown)``; a snapshot shows the newest 200 messages, fewer when they pass its
    byte budget (``dex_agents._views.SNAPSHOT_MESSAGES_BYTES``).

    Raises:
        AssertionError: If the snapshot does not end with the session's newest message.
    """
    cpu_before = time.process_time()
    started = time.perf_counter()
    snapshot = await sessions.get_agent_snapshot(session_id)
    elapsed = time.perf_counter() - started
    assert snapshot.messages[-1].sequence == size, (snapshot.messages[-1].sequence, size)
    assert 0 < len(snapshot.messages) <= min(size, 200), len(snapshot.messages)
    return elapsed, time.process_time() - cpu_before, len(snapshot.messages)


async def _long_session(
    sizes: tuple[int, ...], thresholds: tuple[int, ...], reads: int, chars: int, root: Path
) -> dict[tuple[int, int], SnapshotCell]:
    """Build one session per size on one engine per threshold; read each snapshot ``reads``
    times, the thresholds taking turns read by read. A read the engine refuses (a task too
    large for one gRPC message) marks its cell failed, and that cell is read no more."""
    flow = build_flow()
    stacks: list[AgentTestStack] = []
    worker_pids: list[int] = []
    cells = {(t, size): SnapshotCell() for t in thresholds for size in sizes}

    async def read(threshold: int, stack: AgentTestStack, size: int) -> float:
        """One read into its cell; the client CPU it took (0 when the cell failed)."""
        cell = cells[threshold, size]
        if cell.error:
            return 0.0
        try:
            seconds, cpu, cell.shown = await _read_snapshot(
                stack.sessions(flow), f"long-{size}", size
            )
        except DexServiceError as error:
            cell.error = str(error)
            return 0.0
        cell.seconds.append(seconds)
        return cpu

    try:
        for threshold in thresholds:
            stack = AgentTestStack(
                root / f"threshold-{threshold}", [flow], "bench.long_session", worker_cwd=REPO,
                engine_args=["--blob-threshold", str(threshold), "--log-level", "warning"],
            )
            stacks.append(stack)
            await stack.__aenter__()
            worker_pids.append((await stack.start_worker()).pid)
        for size in sizes:
            for threshold, stack in zip(thresholds, stacks, strict=True):
                cells[threshold, size].build_seconds = await _seed(
                    stack.sessions(flow), flow, f"long-{size}", size, chars
                )
        for size in sizes:
            # Warm-up: the first read of a session hydrates its blobs into the Worker's cache.
            for _ in range(5):
                for threshold, stack in zip(thresholds, stacks, strict=True):
                    await read(threshold, stack, size)
            for threshold in thresholds:
                cells[threshold, size].seconds.clear()
            before = [_stack_cpu_ms(stack, pid) for stack, pid in zip(stacks, worker_pids,
                                                                         strict=True)]
            client_cpu = [0.0] * len(stacks)
            for _ in range(reads):
                for index, (threshold, stack) in enumerate(zip(thresholds, stacks, strict=True)):
                    client_cpu[index] += await read(threshold, stack, size)
            for index, (threshold, stack) in enumerate(zip(thresholds, stacks, strict=True)):
                engine_ms, worker_ms = _stack_cpu_ms(stack, worker_pids[index])
                cell = cells[threshold, size]
                cell.engine_ms = (engine_ms - before[index][0]) / reads
                cell.worker_ms = (worker_ms - before[index][1]) / reads
                cell.client_ms = client_cpu[index] * 1000 / reads
    finally:
        for stack in stacks:
            await stack.close()
    return cells


def _ratio(numerator: SnapshotCell, denominator: SnapshotCell, fraction: float) -> str:
    """``numerator``'s quantile over ``denominator``'s, or "-" when either failed."""
    if numerator.error or denominator.error:
        return "-"
    value = percentile(numerator.seconds, fraction) / percentile(denominator.seconds, fraction)
    return f"{value:.2f}x"


def _print_long_session(
    cells: dict[tuple[int, int], SnapshotCell], sizes: tuple[int, ...],
    thresholds: tuple[int, ...], reads: int, chars: int,
) -> None:
    """The snapshot read table: p50 / p99 per size for each threshold, and "flat?"."""
    first, last = sizes[0], sizes[-1]
    middle = sizes[len(sizes) // 2]
    print(f"Snapshot read of one long agent session (AgentSessionClient.get_agent_snapshot:"
          f" get_message_range, then\nget_agent_snapshot_page loading the newest 200 messages),"
          f" {reads} reads per cell after 5 warm-up reads,\nthe thresholds taking turns read by"
          f" read; each message {chars:,} characters (~{2 * chars + 100:,} bytes stored).\n"
          f"Load average {os.getloadavg()[0]:.1f}.")
    header = "".join(f" {f'{size:,} msgs p50 / p99 ms':>24}" for size in sizes)
    print(f"  {'--blob-threshold':<18}{header} {f'flat? ({last:,}/{first:,})':>22}"
          f" {f'({last:,}/{middle:,})':>16}")

    def times(cell: SnapshotCell) -> str:
        if cell.error:
            return f" {'fails':>24}"
        return (f" {percentile(cell.seconds, 0.5) * 1000:11.2f} /"
                f" {percentile(cell.seconds, 0.99) * 1000:10.2f}")

    for threshold in thresholds:
        row = "".join(times(cells[threshold, size]) for size in sizes)
        print(f"  {threshold:<18}{row}"
              f" {_ratio(cells[threshold, last], cells[threshold, first], 0.5):>22}"
              f" {_ratio(cells[threshold, last], cells[threshold, middle], 0.5):>16}")
    base = thresholds[0]
    for other in thresholds[1:]:
        row = "".join(
            f" {_ratio(cells[other, size], cells[base, size], 0.5):>11} /"
            f" {_ratio(cells[other, size], cells[base, size], 0.99):>10}"
            for size in sizes
        )
        print(f"  {f'{other} / {base}':<18}{row}")
    print("  CPU per read (ms): engine + Worker + bench client = total; seconds to build the"
          " session:")
    print(f"  {'--blob-threshold':<18} {'messages':>8} {'engine':>8} {'Worker':>8} {'client':>8}"
          f" {'total':>8} {'build s':>8}")
    for threshold in thresholds:
        for size in sizes:
            cell = cells[threshold, size]
            figures = (f" {'fails':>35}" if cell.error else
                       f" {cell.engine_ms:8.2f} {cell.worker_ms:8.2f} {cell.client_ms:8.2f}"
                       f" {cell.cpu_ms:8.2f}")
            print(f"  {threshold:<18} {size:8,}{figures} {cell.build_seconds:8.2f}")
        low, mid, high = (cells[threshold, size] for size in (first, middle, last))
        if not (low.error or mid.error or high.error):
            print(f"  {'':<18} {'flat?':>8} {'':>35} {high.cpu_ms / low.cpu_ms:7.2f}x"
                  f" ({last:,}/{first:,}), {high.cpu_ms / mid.cpu_ms:.2f}x ({last:,}/{middle:,})")
    shown = ", ".join(
        f"{size:,}: {max(cells[t, size].shown for t in thresholds)}" for size in sizes
    )
    print(f"  (messages a snapshot showed, by session size: {shown}; the {last:,}/{middle:,}"
          " column compares equal snapshots)")
    failures = sorted({cell.error for cell in cells.values() if cell.error})
    for error in failures:
        print(f"  fails: {error}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chain", type=int, default=1000)
    parser.add_argument("--flows", type=int, default=100)
    parser.add_argument("--flow-steps", type=int, default=50)
    parser.add_argument("--idle", type=int, default=10_000)
    parser.add_argument("--quick", action="store_true",
                        help="200-step chain, 20x20, 1,000 idle; with --long-session: sessions"
                             " of 100, 1,000 and 5,000 messages, 30 reads")
    parser.add_argument(
        "--long-session", action="store_true",
        help="measure only a long agent session's snapshot reads (100, 2,000 and 20,000"
             " messages) at each --blob-thresholds value (a few minutes)")
    parser.add_argument("--blob-thresholds", type=byte_counts,
                        default=LONG_SESSION_THRESHOLDS, metavar="BYTES,BYTES",
                        help="the engine thresholds --long-session compares (default"
                             f" {DEFAULT_BLOB_THRESHOLD},65536; the first is the base of ratios)")
    parser.add_argument("--reads", type=int, default=None,
                        help="--long-session reads per session and threshold (200; 30 with"
                             " --quick)")
    parser.add_argument("--message-chars", type=int, default=1000,
                        help="--long-session: characters of each message's text (1,000)")
    ns = parser.parse_args()
    if ns.long_session:
        sizes = QUICK_LONG_SESSION_SIZES if ns.quick else LONG_SESSION_SIZES
        reads = ns.reads or (30 if ns.quick else 200)
        with tempfile.TemporaryDirectory() as tmp_name:
            cells = asyncio.run(_long_session(
                sizes, ns.blob_thresholds, reads, ns.message_chars, Path(tmp_name)
            ))
        _print_long_session(cells, sizes, ns.blob_thresholds, reads, ns.message_chars)
        return 0
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
