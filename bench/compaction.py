# mypy: disable-error-code="override"
"""Benchmark of context compaction and retention: what a model call and a snapshot cost in a
long session.

Against ``python -m dex_dev_server`` on a temporary database, with the real SDK and an
in-process pull worker, two ``AgentSessionFlow`` types share one deterministic runner (no model,
no network): one with ``AgentSessionOptions.compaction`` (an 8,000-token window, four characters
a token) and, as the peer measured in the same run, the seed's behaviour (``compaction=None``:
RunModel and the snapshot load the whole AgentMessages map). For each, one session holds 100
messages and one 10,000 (about 100 characters each, stored by one bulk turn; the compacting
session then compacts once). Measured, as medians over ``--samples`` runs:

1. RunModel input build: from ``send_user_message`` to the runner's ``run_model_step`` entry
   (the engine builds the Step's task with its loaded messages, the worker decodes them and the
   session hands them over; for the compacting Flow this includes counting the input's tokens);
2. snapshot: ``AgentSessionClient.get_agent_snapshot`` (the compacting Flow loads only the last
   page).

Prints each time at 10,000 messages as a ratio of the same time at 100 (goal for the compacting
Flow: <= 1.5), next to the seed's ratio. Never asserted.

Run: ``.venv/bin/python -m bench.compaction`` (``--quick``: 2,000 messages, fewer samples).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dex import (
    AsyncClient,
    AsyncWorker,
    BlobCacheConfig,
    ClientOptions,
    PullWorkerOptions,
    Registry,
    WorkerOptions,
    WorkerTarget,
    open_blob_cache,
)

from bench.engine import start_engine
from dex_agents import (
    AgentMessage,
    AgentSessionClient,
    AgentSessionFlow,
    AgentSessionOptions,
    AgentTurnContext,
    AgentTurnOutcome,
    AgentUsage,
    CompactionOptions,
    DeferredToolExecution,
    FrameworkMessage,
    MessageRole,
    SummarizeRequest,
    ToolExecutionResult,
    TurnCompleted,
    render_summary,
)

REPO = Path(__file__).resolve().parents[1]
WINDOW = 8000
AGENT_CONFIG = {"context_window": WINDOW}
MESSAGE_TEXT = (
    "a stored assistant message of about one hundred characters, numbered {n:06d}, to fill the map"
)

# When run_model_step was entered, per session (the worker runs in this process's loop).
_ENTERED: dict[str, float] = {}
_ENTRY_SEEN: dict[str, asyncio.Event] = {}


def _tokens(text: str) -> int:
    return len(text) // 4 + 1


class BenchRunner:
    """A deterministic ``AgentFrameworkRunner`` and ``CompactingRunner``: ``"many: n"`` answers
    with ``n`` messages, anything else with ``"ok"``."""

    def build_user_message(self, text: str) -> FrameworkMessage:
        return FrameworkMessage(MessageRole.USER, {"role": "user", "content": text}, text)

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        _ENTERED[turn.flow_id] = time.perf_counter()
        _ENTRY_SEEN.setdefault(turn.flow_id, asyncio.Event()).set()
        script = turn.messages[-1].text if turn.messages else ""
        if script.startswith("many:"):
            count = int(script.removeprefix("many:"))
            answers = [MESSAGE_TEXT.format(n=n) for n in range(count)]
        else:
            answers = ["ok"]
        return TurnCompleted(
            [FrameworkMessage(MessageRole.ASSISTANT, {"content": a}, a) for a in answers],
            AgentUsage(requests=1),
        )

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        raise RuntimeError("the benchmark calls no tools")

    def context_window(self, agent_config: dict[str, Any] | None) -> int | None:
        return WINDOW

    def count_message_tokens(
        self, message: AgentMessage, agent_config: dict[str, Any] | None
    ) -> int:
        return _tokens(message.text)

    def count_input_tokens(self, turn: AgentTurnContext) -> int:
        summary = _tokens(render_summary(turn.summary)) if turn.summary is not None else 0
        return summary + sum(_tokens(message.text) for message in turn.messages)

    async def summarize(self, request: SummarizeRequest) -> str:
        first, last = request.messages[0].sequence, request.messages[-1].sequence
        folded = f"{request.previous_summary} [{first}-{last}]".strip()
        return folded[-request.summary_budget_tokens * 4 :]


@dataclass
class Figures:
    build: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    snapshot: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    tail: dict[tuple[str, int], int] = field(default_factory=dict)


async def _settled(sessions: AgentSessionClient, session_id: str, last: int) -> None:
    """Wait until the session stored message ``last`` and waits for the next one."""
    deadline = time.monotonic() + 600
    while True:
        known = await sessions.get_message_range(session_id)
        if known.last_sequence >= last:
            snapshot = await sessions.get_agent_snapshot(session_id)
            if snapshot.state is not None and snapshot.state.turn_id is None:
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{session_id} did not settle at {last} messages")
        await asyncio.sleep(0.02)


async def _measure(ns: argparse.Namespace, address: str, cache_dir: str) -> Figures:
    flows = {
        "compacting": AgentSessionFlow(
            BenchRunner(),
            flow_type="BenchCompacting",
            options=AgentSessionOptions(compaction=CompactionOptions()),
        ),
        "seed": AgentSessionFlow(BenchRunner(), flow_type="BenchSeed"),
    }
    registry = Registry(list(flows.values()), allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(cache_dir, 1 << 28))
    client = AsyncClient(
        registry, cache,
        ClientOptions(server_address=address, worker_target=WorkerTarget(pull=True)),
    )
    worker = AsyncWorker(
        registry, cache,
        WorkerOptions(server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=32)),
    )
    running = asyncio.create_task(worker.start())
    await worker.wait_pull_registered(timeout=30)
    figures = Figures()
    try:
        for name, flow in flows.items():
            sessions = AgentSessionClient(client, flow)
            for size in (100, ns.messages):
                session_id = f"{name}-{size}"
                await sessions.start_session(
                    session_id, f"many:{size - 1}", agent_config=AGENT_CONFIG
                )
                await _settled(sessions, session_id, size)
                # One turn settles compaction and retention before anything is measured.
                assert await sessions.send_user_message(session_id, "warm up")
                last = size + 2
                await _settled(sessions, session_id, last)
                builds: list[float] = []
                for _ in range(ns.samples):
                    entered = _ENTRY_SEEN.setdefault(session_id, asyncio.Event())
                    entered.clear()
                    started = time.perf_counter()
                    assert await sessions.send_user_message(session_id, "hello")
                    await asyncio.wait_for(entered.wait(), timeout=600)
                    builds.append(_ENTERED[session_id] - started)
                    last += 2
                    await _settled(sessions, session_id, last)
                snapshots: list[float] = []
                for _ in range(ns.samples):
                    started = time.perf_counter()
                    snapshot = await sessions.get_agent_snapshot(session_id)
                    snapshots.append(time.perf_counter() - started)
                known = await sessions.get_message_range(session_id)
                figures.build[(name, size)] = builds
                figures.snapshot[(name, size)] = snapshots
                figures.tail[(name, size)] = known.last_sequence - known.summarized_through_sequence
                assert len(snapshot.messages) == min(200, known.last_sequence)
    finally:
        await worker.stop()
        await asyncio.gather(running, return_exceptions=True)
        await client.close()
        cache.close()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--samples", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="2,000 messages, 5 samples")
    ns = parser.parse_args()
    if ns.quick:
        ns.messages, ns.samples = 2000, 5
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        proc, address = start_engine(tmp / "bench.sqlite3")
        try:
            fig = asyncio.run(_measure(ns, address, str(tmp / "cache")))
        finally:
            proc.terminate()
            proc.wait(30)

    ms = 1000.0
    big = ns.messages
    print(f"sessions of 100 and {big:,} stored messages (median of {ns.samples}; "
          f"in-process worker, real SDK, dex_dev_server):")
    for label, table in (("RunModel input build", fig.build), ("snapshot", fig.snapshot)):
        print(f"{label}:")
        for name in ("compacting", "seed"):
            small_time = statistics.median(table[(name, 100)])
            big_time = statistics.median(table[(name, big)])
            goal = "  (goal <= 1.5)" if name == "compacting" else "  (peer: the seed's whole map)"
            print(f"  {name:<10} 100: {small_time * ms:7.2f} ms   {big:,}: {big_time * ms:7.2f} ms"
                  f"   ratio {big_time / small_time:5.2f}{goal}")
    print("unsummarized messages RunModel loads: "
          + ", ".join(f"{name} {size:,} -> {fig.tail[(name, size)]}"
                      for name in ("compacting", "seed") for size in (100, big)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
