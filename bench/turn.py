"""Benchmark of one durable agent turn: ``dex_agents`` on the embedded engine against LangGraph.

The turn (issue 13): a user message → RunModel asking for three READ tools → three parallel
CallTool Steps → ResumeTurn → RunModel with the final answer. Ours runs on
``python -m dex_dev_server`` with one pull worker (``tests/dex_agents/scripted_worker.py``, the
scripted runner, no network), each turn a fresh session, timed from ``start_session`` until the
snapshot shows the final answer: the bench waits for the turn's final RunModel Step to complete
(one ``WaitForStepCompletion`` long poll), then reads the snapshot. ``--observe stream`` follows
the session's AgentEvents Stream until ``turn_completed`` instead, one ``ReadStream`` per event
as a page does (that event is written just before the Step's commit, so the snapshot is read
until it holds the answer).

The peers, in the same run and interleaved turn by turn: the same graph in LangGraph
(model → three tools via ``Send`` → model) checkpointed by ``SqliteSaver`` on a file
(``bench/langgraph_peer.py``), each turn a fresh thread; LangGraph without a checkpointer, as
the floor of the graph itself; and the same turn as a DBOS workflow of five durable steps (the
three tool steps concurrent) on DBOS's SQLite system database at its defaults, in its own
process (``bench/dbos_turn_peer.py``), each turn a fresh workflow.

Equal durability: the engine runs SQLite in WAL with ``synchronous=NORMAL`` by default (safe
across a killed process, not across a power loss); ``SqliteSaver`` keeps SQLite's default
``synchronous=FULL``; DBOS keeps SQLite's rollback journal (``journal_mode=DELETE``) with
``synchronous=FULL``, which survives a power loss as WAL with FULL does, at more fsyncs per
commit. So ours is measured at both settings (``--sync normal`` and ``--sync full``), each on
its own engine and worker, and ``--sync full`` is the one compared with DBOS (issue 24).

CPU per turn is printed for every side with all of its processes: ours is the engine, the
worker and the bench client (``/proc/<pid>/stat``, every thread, over the measured turns);
DBOS its own process; LangGraph the bench process's CPU inside its turns.

Prints p50 / p99 per side, ours as a ratio of LangGraph + SqliteSaver (goal <= 1.0, issue 13
resolves at <= 2.0) and of DBOS (issue 24: turn p50 at ``--sync full`` <= 1.2x DBOS, CPU per
turn <= 1.5x DBOS; goal 1.0x), and a per-turn cost breakdown of ours from the engine's profile
(``python -m dex_dev_server --profile``): wall time, CPU of the engine, the worker and the bench
client, SQLite commits, and calls and time per gRPC method and per worker frame kind
(Step results, heartbeats, Stream writes, RPC answers). It also prints the CPU that the
worker's main thread, where the SDK runs every Step and frame, spends inside each turn, for ours
and for the floor: no turn can be shorter (docs/engine-durability.md, "Two lower bounds").

Each ``--sync`` setting is measured at every ``--blob-thresholds`` value (default: the engine's
1024, what the Dex server does, and 64 KiB, its default before), each on its own engine and
worker, and a table puts them side by side with p50 / p99, CPU per turn, the worker thread's CPU
and LoadBlobs calls per turn, as a ratio of the first threshold (issue 26). The turn's own
values are small; with ``--agent-config-bytes`` each of our sessions carries an agent config of
that size, as the platform's sessions do (a system prompt and the tools' specs), which every
task of the session receives: inline below the threshold, else as a blob the worker loads once
per session.

Run: ``.venv/bin/python -m bench.turn`` (``--quick`` for a short pass), or ``make bench-turn``.
Nothing is asserted beyond each turn's answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from bench._cli import byte_counts, positive_int
from bench.relay import cpu_ms, percentile
from dex_dev_server._blobs import DEFAULT_BLOB_THRESHOLD

REPO = Path(__file__).resolve().parents[1]
WORKER_MODULE = "tests.dex_agents.scripted_worker"
FLOOR_WORKER_MODULE = "bench.turn_floor"
#: The final answer the scripted runner gives for ``bench.langgraph_peer.TURN_MESSAGE``.
EXPECTED_ANSWER = "; ".join(["lookup=succeeded: lookup ok"] * 3)


def _process_cpu(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def thread_cpu_ms(pid: int) -> float:
    """Milliseconds on a CPU of the main thread of process ``pid`` (``bench.relay.cpu_ms``; the
    threads gRPC starts for its own I/O are not in it)."""
    return cpu_ms(pid, main_thread_only=True)


@dataclass
class Reading:
    """One side's cumulative counters at a moment."""

    profile: dict[str, Any]
    engine_cpu: float
    worker_cpu: float
    client_cpu: float


class DbosSide:
    """The DBOS peer process (``bench.dbos_turn_peer``) and its turns."""

    def __init__(self, root: Path) -> None:
        import subprocess
        import sys

        self.log_path = root / "dbos.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bench.dbos_turn_peer", str(root / "dbos.sqlite3"),
             str(self.log_path)],
            cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        self.seconds: list[float] = []
        line = self._line()
        if line != "ready":
            raise RuntimeError(f"the DBOS peer did not start: {line!r}")

    def _line(self) -> str:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the DBOS peer exited ({self.process.wait()})")
        return line.strip()

    def cpu(self) -> float:
        """CPU seconds of the peer process so far, every thread."""
        return _process_cpu(self.process.pid)

    def turn(self, workflow_id: str) -> float:
        """Run one turn as a fresh workflow; return its seconds as the peer measured them.

        Raises:
            AssertionError: If the workflow's answer is not the expected one.
        """
        assert self.process.stdin is not None
        self.process.stdin.write(f"turn {workflow_id}\n")
        self.process.stdin.flush()
        result = json.loads(self._line())
        assert result["answer"] == EXPECTED_ANSWER, result
        self.seconds.append(result["seconds"])
        return float(result["seconds"])

    def close(self) -> None:
        """End the peer (end of its input) and wait for it."""
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except Exception:
            self.process.kill()
            self.process.wait()


@dataclass
class OurSide:
    """One engine + worker at a given ``--sync`` setting, and its turns."""

    sync: str
    stack: Any
    worker_pid: int
    profile_path: Path
    observe: str = "step"
    #: The engine's ``--blob-threshold`` in bytes.
    threshold: int = DEFAULT_BLOB_THRESHOLD
    #: Each session's ``agent_config`` (``agent_config_for``), or ``None``.
    agent_config: dict[str, Any] | None = None
    seconds: list[float] = field(default_factory=list)
    client_cpu: float = 0.0
    snapshot_retries: int = 0
    #: CPU of the worker's main thread inside each turn's window, in ms (``thread_cpu_ms``).
    worker_thread_ms: list[float] = field(default_factory=list)
    #: The bench client's events of the last turn: ``(unix time, label)``.
    marks: list[tuple[float, str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        """The side's settings, as the tables name it."""
        return f"--sync {self.sync}, blobs > {self.threshold}"

    def cpu(self) -> float:
        """CPU seconds of the engine, the worker and this side's bench client so far."""
        return (_process_cpu(self.stack.engine_pid) + _process_cpu(self.worker_pid)
                + self.client_cpu)

    async def reading(self) -> Reading:
        """Ask the engine for its profile (SIGUSR1) and read the CPU counters."""
        self.profile_path.unlink(missing_ok=True)
        os.kill(self.stack.engine_pid, signal.SIGUSR1)
        deadline = time.monotonic() + 10
        while not self.profile_path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the engine wrote no profile")
            await asyncio.sleep(0.01)
        return Reading(
            json.loads(self.profile_path.read_text()),
            _process_cpu(self.stack.engine_pid),
            _process_cpu(self.worker_pid),
            self.client_cpu,
        )

    async def turn(self, flow: Any, session_id: str) -> float:
        """Run one turn on a fresh session; return its seconds.

        Raises:
            AssertionError: If the snapshot does not end with the expected answer.
        """
        from dex import StepExecutionId, WaitForStepCompletionOptions

        from dex_agents import AgentEventType

        sessions = self.stack.sessions(flow)
        client = self.stack.client
        cpu_before = time.process_time()
        thread_before = thread_cpu_ms(self.worker_pid)
        self.marks = [(time.time(), "client: start_session")]
        started = time.perf_counter()
        await sessions.start_session(
            session_id, "tools: lookup, lookup, lookup", agent_config=self.agent_config
        )
        self.marks.append((time.time(), "client: started"))
        if self.observe == "stream":
            token = ""
            while True:
                message = await client.read_stream(
                    session_id, flow.agent_events, token, timeout=timedelta(seconds=30)
                )
                token = message.resume_token
                self.marks.append((time.time(), f"client: event {message.value.type}"))
                if message.value.type == AgentEventType.TURN_COMPLETED:
                    break
        else:
            # The turn's second model call gives the final answer.
            await client.wait_for_step_completion(
                session_id,
                StepExecutionId("RunModel", 2),
                WaitForStepCompletionOptions(request_timeout=timedelta(seconds=30)),
            )
            self.marks.append((time.time(), "client: RunModel #2 completed"))
        # The Stream write comes before the Step's commit: read until the commit shows.
        deadline = time.monotonic() + 30
        while True:
            snapshot = await sessions.get_agent_snapshot(session_id)
            answer = snapshot.messages[-1].text
            self.marks.append((time.time(), "client: snapshot"))
            if answer == EXPECTED_ANSWER or time.monotonic() > deadline:
                break
            self.snapshot_retries += 1
        elapsed = time.perf_counter() - started
        self.worker_thread_ms.append(thread_cpu_ms(self.worker_pid) - thread_before)
        self.client_cpu += time.process_time() - cpu_before
        assert answer == EXPECTED_ANSWER, answer
        self.seconds.append(elapsed)
        return elapsed


def agent_config_for(size: int) -> dict[str, Any] | None:
    """An ``agent_config`` of about ``size`` bytes of JSON shaped as the platform's
    (``agents_app.models.AgentDefinition.agent_config``: the model, a system prompt and the
    tools' specs with their JSON Schemas), or ``None`` for 0. The platform's session carries it
    in its start input and ``AGENT_CONFIG``, which every task of the session receives; the
    scripted runner ignores it."""
    if size <= 0:
        return None
    tool = {
        "name": "docs__lookup", "server": "docs", "tool": "lookup",
        "description": "Look a term up in the project's documentation and return the passage.",
        "parameters": {"type": "object", "properties": {"term": {"type": "string"},
                                                        "limit": {"type": "integer"}},
                       "required": ["term"]},
        "effect": "read", "requires_approval": False, "approval_deadline_seconds": None,
        "timeout_seconds": 60, "retries": 2, "step_timeout_seconds": 190,
    }
    config: dict[str, Any] = {"agent": "bench", "model": "scripted", "api_base": None,
                              "api_key_env": None, "system_prompt": "", "tools": []}
    while len(json.dumps(config)) + len(json.dumps(tool)) < size * 3 // 4:
        config["tools"].append({**tool, "name": f"docs__lookup_{len(config['tools'])}"})
    sentence = "Answer from the documentation and name the page you used. "
    room = max(0, size - len(json.dumps(config)))
    config["system_prompt"] = (sentence * (room // len(sentence) + 1))[:room]
    return config


def _diff(before: Reading, after: Reading, turns: int) -> dict[str, Any]:
    """Per-turn costs between two readings."""
    methods: dict[str, tuple[float, float]] = {}
    old = before.profile["methods"]
    for name, entry in after.profile["methods"].items():
        calls = entry["calls"] - old.get(name, {}).get("calls", 0)
        seconds = entry["seconds"] - old.get(name, {}).get("seconds", 0.0)
        if calls:
            methods[name] = (calls / turns, seconds * 1000 / turns)
    return {
        "engine_cpu_ms": (after.engine_cpu - before.engine_cpu) * 1000 / turns,
        "worker_cpu_ms": (after.worker_cpu - before.worker_cpu) * 1000 / turns,
        "client_cpu_ms": (after.client_cpu - before.client_cpu) * 1000 / turns,
        "commits": (after.profile["commits"] - before.profile["commits"]) / turns,
        "commit_ms": (after.profile["commit_seconds"] - before.profile["commit_seconds"])
        * 1000
        / turns,
        "methods": methods,
        "slow_commits": after.profile["slow_commits"] - before.profile["slow_commits"],
        "commit_longest_ms": after.profile["commit_longest_seconds"] * 1000,
        "gc_ms": (after.profile["gc_seconds"] - before.profile["gc_seconds"]) * 1000 / turns,
        "gc_longest_ms": after.profile["gc_longest_seconds"] * 1000,
    }


def _print_timeline(side: OurSide, reading: Reading) -> None:
    """The last turn's events, engine and client merged, in ms from its start."""
    start = side.marks[0][0]
    events = [(at, f"{label}") for at, label in side.marks]
    events += [
        (at, f"engine: {label} ({seconds * 1000:.2f} ms)")
        for at, seconds, label in reading.profile["trace"]
        if start <= at <= side.marks[-1][0]
    ]
    print(f"\nTimeline of the last turn, {side.label} (ms from start_session):")
    for at, label in sorted(events):
        print(f"  {(at - start) * 1000:8.2f}  {label}")


def _thread_line(name: str, thread_ms: list[float], peer_p50: float) -> str:
    """The worker main thread's CPU inside each turn, p50, as a ratio of the peer's p50."""
    p50 = percentile(thread_ms, 0.5)
    return (f"  {name:<44} p50 {p50:7.2f} ms   p99 {percentile(thread_ms, 0.99):7.2f} ms"
            f"  {p50 / peer_p50:5.2f}x")


def _summary(name: str, seconds: list[float], peer_p50: float | None) -> str:
    p50 = percentile(seconds, 0.5) * 1000
    p99 = percentile(seconds, 0.99) * 1000
    ratio = f"  {p50 / peer_p50:5.2f}x" if peer_p50 else ""
    return f"  {name:<44} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms{ratio}"


def _floor_cpu(stack: Any, worker_pid: int) -> float:
    """CPU seconds of the floor's engine and worker so far (0.0 without a floor)."""
    if stack is None:
        return 0.0
    return _process_cpu(stack.engine_pid) + _process_cpu(worker_pid)


def _print_dbos_comparison(
    sides: list[OurSide], cpu_ms: list[float], dbos: DbosSide, dbos_cpu_ms: float,
    langgraph_cpu_ms: float, floor_seconds: list[float], floor_cpu_ms: float,
    floor_sync: str = "normal",
) -> None:
    """Turn p50 / p99 and CPU per turn of every side against DBOS (issue 24's targets), and
    of the floor (the same Step tasks with empty handlers) when it ran: the part of our CPU
    and latency that the engine's and the unchanged SDK's messages take before any handler."""
    dbos_p50 = percentile(dbos.seconds, 0.5) * 1000
    print("\nAgainst DBOS (issue 24; durability: ours --sync full = SQLite WAL + synchronous FULL,"
          " DBOS = rollback\n journal + synchronous FULL: both survive a power loss; --sync"
          " normal survives a killed process only):")
    print(f"  {'side':<44} {'p50 ms':>8} {'x DBOS':>7} {'p99 ms':>8} {'p99/p50':>8}"
          f" {'CPU ms/turn':>12} {'x DBOS':>7}")
    rows = [("DBOS", dbos.seconds, dbos_cpu_ms)]
    rows += [(f"dex_agents {side.label}", side.seconds, cpu)
             for side, cpu in zip(sides, cpu_ms, strict=True)]
    if floor_seconds:
        rows.append((f"floor: empty handlers, --sync {floor_sync}", floor_seconds, floor_cpu_ms))
    for name, seconds, cpu in rows:
        p50 = percentile(seconds, 0.5) * 1000
        p99 = percentile(seconds, 0.99) * 1000
        print(f"  {name:<44} {p50:8.2f} {p50 / dbos_p50:6.2f}x {p99:8.2f} {p99 / p50:7.2f}x"
              f" {cpu:12.2f} {cpu / dbos_cpu_ms:6.2f}x")
    print(f"  {'LangGraph + SqliteSaver (in-process)':<44} {'':>8} {'':>7} {'':>8} {'':>8}"
          f" {langgraph_cpu_ms:12.2f} {langgraph_cpu_ms / dbos_cpu_ms:6.2f}x")
    print("  (targets: --sync full p50 <= 1.2x DBOS, p99 <= 2x its own p50, CPU per turn <= 1.5x"
          " DBOS;\n   goal 1.0x. CPU: ours = engine + worker + bench client, DBOS = its process,"
          " every thread)")


def _print_thresholds(
    sides: list[OurSide], cpu_ms: list[float], costs: list[dict[str, Any]]
) -> None:
    """The turn at each blob threshold side by side, per ``--sync``, and as a ratio of the
    first threshold's (the engine's default unless ``--blob-thresholds`` says otherwise);
    ``costs`` (the profile's, empty without one) adds LoadBlobs calls per turn."""
    print("\nThe blob threshold (engine --blob-threshold: larger values are stored as blobs"
          " the worker loads\nwith LoadBlobs and caches; 1024 is what the Dex server does);"
          " ratio = this threshold / the first:")
    print(f"  {'side':<34} {'p50 ms':>8} {'p99 ms':>8} {'CPU ms/turn':>12}"
          f" {'worker thread p50':>18} {'LoadBlobs/turn':>15}")
    by_sync: dict[str, list[int]] = {}
    for index, side in enumerate(sides):
        by_sync.setdefault(side.sync, []).append(index)
    for indexes in by_sync.values():
        figures = []
        for index in indexes:
            side = sides[index]
            load_blobs = (costs[index]["methods"].get("LoadBlobs", (0.0, 0.0))[0]
                          if costs else float("nan"))
            figures.append((
                percentile(side.seconds, 0.5) * 1000, percentile(side.seconds, 0.99) * 1000,
                cpu_ms[index], percentile(side.worker_thread_ms, 0.5), load_blobs,
            ))
            p50, p99, cpu, thread, loads = figures[-1]
            print(f"  {side.label:<34} {p50:8.2f} {p99:8.2f} {cpu:12.2f} {thread:18.2f}"
                  f" {loads:15.1f}")
        base = figures[0]
        for index, (p50, p99, cpu, thread, _) in zip(indexes[1:], figures[1:], strict=True):
            name = f"ratio {sides[index].threshold} / {sides[indexes[0]].threshold}"
            print(f"  {name:<34} {p50 / base[0]:7.2f}x {p99 / base[1]:7.2f}x"
                  f" {cpu / base[2]:11.2f}x {thread / base[3]:17.2f}x")


def _print_breakdown(label: str, wall_ms: float, costs: dict[str, Any]) -> None:
    print(f"\nPer-turn cost of ours, {label} (wall p50 {wall_ms:.1f} ms):")
    print(f"  CPU: engine {costs['engine_cpu_ms']:.1f} ms, worker {costs['worker_cpu_ms']:.1f} ms,"
          f" bench client {costs['client_cpu_ms']:.1f} ms")
    print(f"  SQLite commits: {costs['commits']:.1f} per turn, {costs['commit_ms']:.2f} ms;"
          f" {costs['slow_commits']} over 5 ms in the run, longest {costs['commit_longest_ms']:.1f}"
          " ms")
    print(f"  engine garbage collection: {costs['gc_ms']:.2f} ms per turn, longest pause"
          f" {costs['gc_longest_ms']:.1f} ms")
    print("  engine, per gRPC method and per worker frame kind (calls / ms per turn; the bench's"
          " own wait is WaitForStepCompletion or ReadStream; send:, register_stream,"
          " closed_with_task and PollWorkerTask are counts; frame:reject is a task a worker"
          " refused, closed_with_task one unanswered when its stream ended, nearly always one"
          " sent to a stream the worker was retiring: each is sent again):")
    ranked = sorted(costs["methods"].items(), key=lambda item: -item[1][1])
    for name, (calls, ms) in ranked:
        print(f"    {name:<48} {calls:6.1f} {ms:8.2f}")


async def run(
    turns: int,
    warmup: int,
    syncs: list[str],
    trace: bool,
    observe: str,
    profile: bool,
    floor: bool = True,
    dbos: bool = True,
    floor_sync: str = "normal",
    thresholds: tuple[int, ...] = (DEFAULT_BLOB_THRESHOLD,),
    agent_config_bytes: int = 0,
) -> None:
    """Start one engine + worker per ``--sync`` value (and one for the floor), interleave the
    sides, print figures."""
    from bench.langgraph_peer import build_graph, run_turn
    from bench.turn_floor import FloorFlow, floor_turn
    from dex_agents.testing import AgentTestStack
    from tests.dex_agents.scripted_agent import (
        FLOW_TYPE,
        STATE_DIR_ENV,
        WORKER_FLOW_TYPES_ENV,
        build_flows,
    )

    flows = build_flows()
    flow = next(f for f in flows if f.get_flow_type() == FLOW_TYPE)
    root = Path(tempfile.mkdtemp(prefix="dexagents-bench-turn-"))
    sides: list[OurSide] = []
    floor_stack: Any = None
    floor_flow = FloorFlow()
    floor_seconds: list[float] = []
    floor_thread_ms: list[float] = []
    floor_worker_pid = 0
    floor_client_cpu = [0.0]
    dbos_side: DbosSide | None = None
    try:
        if dbos:
            dbos_side = DbosSide(root)
        for sync, threshold in [(sync, threshold) for sync in syncs for threshold in thresholds]:
            home = root / f"sync-{sync}-blobs-{threshold}"
            (home / "state").mkdir(parents=True)
            profile_path = home / "profile.json"
            stack = AgentTestStack(
                home,
                flows,
                WORKER_MODULE,
                worker_cwd=REPO,
                worker_env={STATE_DIR_ENV: str(home / "state"), WORKER_FLOW_TYPES_ENV: FLOW_TYPE},
                engine_args=[
                    "--sync", sync, "--blob-threshold", str(threshold),
                    *(["--profile", str(profile_path)] if profile else []),
                ],
            )
            await stack.__aenter__()
            worker = await stack.start_worker()
            sides.append(OurSide(sync, stack, worker.pid, profile_path, observe, threshold,
                                 agent_config_for(agent_config_bytes)))
        if floor:
            floor_stack = AgentTestStack(
                root / "floor", [floor_flow], FLOOR_WORKER_MODULE, worker_cwd=REPO,
                engine_args=["--sync", floor_sync],
            )
            await floor_stack.__aenter__()
            floor_worker_pid = (await floor_stack.start_worker()).pid

        async def floor_run(flow_id: str) -> None:
            if floor_stack is None:
                return
            thread_before = thread_cpu_ms(floor_worker_pid)
            client_before = time.process_time()
            started = time.perf_counter()
            await floor_turn(floor_stack.client, floor_flow, flow_id)
            floor_seconds.append(time.perf_counter() - started)
            floor_client_cpu[0] += time.process_time() - client_before
            floor_thread_ms.append(thread_cpu_ms(floor_worker_pid) - thread_before)

        graph, connection = build_graph(root / "langgraph.sqlite3", root / "langgraph.log")
        bare, _ = build_graph(None, root / "langgraph-bare.log")
        peer: list[float] = []
        bare_seconds: list[float] = []
        peer_cpu = [0.0]

        def peer_turn(index: int) -> None:
            cpu_before = time.process_time()
            started = time.perf_counter()
            run_turn(graph, f"turn-{index}")
            peer.append(time.perf_counter() - started)
            peer_cpu[0] += time.process_time() - cpu_before
            if dbos_side is not None:
                dbos_side.turn(f"turn-{index}")
            started = time.perf_counter()
            run_turn(bare, f"turn-{index}")
            bare_seconds.append(time.perf_counter() - started)

        for index in range(warmup):
            for side in sides:
                await side.turn(flow, f"warmup-{index}")
            await floor_run(f"warmup-{index}")
            peer_turn(-index - 1)
        for side in sides:
            side.seconds.clear()
            side.worker_thread_ms.clear()
        floor_thread_ms.clear()
        peer.clear()
        bare_seconds.clear()
        floor_seconds.clear()
        floor_client_cpu[0] = 0.0
        peer_cpu[0] = 0.0
        if dbos_side is not None:
            dbos_side.seconds.clear()
        cpu_before = [side.cpu() for side in sides]
        dbos_cpu_before = dbos_side.cpu() if dbos_side is not None else 0.0
        floor_cpu_before = _floor_cpu(floor_stack, floor_worker_pid)
        before = [await side.reading() for side in sides] if profile else []
        for index in range(turns):
            for side in sides:
                await side.turn(flow, f"turn-{index}")
            await floor_run(f"turn-{index}")
            peer_turn(index)
        cpu_ms = [(side.cpu() - first) * 1000 / turns
                  for side, first in zip(sides, cpu_before, strict=True)]
        dbos_cpu_ms = ((dbos_side.cpu() - dbos_cpu_before) * 1000 / turns
                       if dbos_side is not None else 0.0)
        floor_cpu_ms = ((_floor_cpu(floor_stack, floor_worker_pid) - floor_cpu_before
                         + floor_client_cpu[0]) * 1000 / turns if floor_stack is not None
                        else None)
        after = [await side.reading() for side in sides] if profile else []
        if connection is not None:
            connection.close()

        peer_p50 = percentile(peer, 0.5) * 1000
        print(f"One agent turn (3 parallel READ tools), {turns} turns per side, interleaved,"
              f" after {warmup} warm-up turns; ratio = p50 / LangGraph + SqliteSaver p50:")
        if agent_config_bytes:
            print(f"  (each of our sessions carries an agent_config of"
                  f" {len(json.dumps(agent_config_for(agent_config_bytes))):,} bytes, as the"
                  " platform's do; the peers carry none)")
        print(f"  (goal, issue 13: ours <= 1.0x; acceptable <= 2.0x. Load average"
              f" {os.getloadavg()[0]:.1f}: other work on the machine slows both sides unevenly."
              f"{' With few turns p99 is close to the maximum.' if turns < 100 else ''})")
        print(_summary("LangGraph + SqliteSaver", peer, peer_p50))
        print(_summary("LangGraph, no checkpointer", bare_seconds, peer_p50))
        if dbos_side is not None:
            print(_summary("DBOS, SQLite DELETE+FULL", dbos_side.seconds, peer_p50))
        for side in sides:
            print(_summary(f"dex_agents + engine {side.label}", side.seconds, peer_p50))
        if floor_seconds:
            print(_summary("floor: same Steps, empty handlers", floor_seconds, peer_p50))
            print("  (the floor is the turn's nine Step tasks and one RPC on the same engine, SDK"
                  f" and pull worker\n   at --sync {floor_sync}, with handlers that do nothing:"
                  " bench/turn_floor.py)")
        if dbos_side is not None:
            _print_dbos_comparison(sides, cpu_ms, dbos_side, dbos_cpu_ms,
                                   peer_cpu[0] * 1000 / turns,
                                   floor_seconds if floor_cpu_ms is not None else [],
                                   floor_cpu_ms or 0.0, floor_sync)
        print("CPU of the worker's main thread inside each turn (from start_session to the"
              " snapshot; ratio = p50 / LangGraph + SqliteSaver p50):")
        for side in sides:
            print(_thread_line(f"dex_agents, {side.label}", side.worker_thread_ms, peer_p50))
        if floor_thread_ms:
            print(_thread_line("floor", floor_thread_ms, peer_p50))
        print("  (that thread runs the unchanged dex-python-sdk's event loop: the Python side of"
              " the worker's gRPC\n   messages, the SDK's decoding and encoding, and every Step"
              " handler, one after another;\n   a turn cannot be shorter than the CPU this"
              " thread spends inside it)")
        costs = [_diff(first, last, turns) for first, last in zip(before, after, strict=True)]
        if len(thresholds) > 1:
            _print_thresholds(sides, cpu_ms, costs)
        for side, side_costs, last in zip(sides, costs, after, strict=False):
            _print_breakdown(side.label, percentile(side.seconds, 0.5) * 1000, side_costs)
            if trace:
                _print_timeline(side, last)
    finally:
        for side in sides:
            await side.stack.close()
        if floor_stack is not None:
            await floor_stack.close()
        if dbos_side is not None:
            dbos_side.close()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    """Parse the command line and run the benchmark."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.turn", description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--turns", type=positive_int, default=None,
                        help="measured turns per side (200; 40 with --quick)")
    parser.add_argument("--warmup", type=positive_int, default=None,
                        help="turns per side before measuring (20; 5 with --quick)")
    parser.add_argument("--sync", choices=["normal", "full", "both"], default="both",
                        help="the engine's --sync setting(s) to measure ours at (default: both)")
    parser.add_argument("--quick", action="store_true", help="40 turns, 5 warm-up")
    parser.add_argument(
        "--observe", choices=["step", "stream"], default="step",
        help="how the bench sees the turn end: a WaitForStepCompletion long poll on the final"
             " RunModel (the default, step), or every AgentEvents Stream message as a page reads"
             " them (stream)")
    parser.add_argument("--no-profile", action="store_true",
                        help="no cost breakdown (for an engine without --profile)")
    parser.add_argument("--no-floor", action="store_true",
                        help="do not measure the floor (the same Steps with empty handlers)")
    parser.add_argument("--floor-sync", choices=["normal", "full"], default="normal",
                        help="the floor engine's --sync setting (default: normal)")
    parser.add_argument("--no-dbos", action="store_true",
                        help="do not measure the DBOS peer (bench/dbos_turn_peer.py)")
    parser.add_argument(
        "--blob-thresholds", type=byte_counts, default=(DEFAULT_BLOB_THRESHOLD, 64 * 1024),
        metavar="BYTES,BYTES",
        help=f"the engine --blob-threshold values to measure ours at, each on its own engine and"
             f" worker (default {DEFAULT_BLOB_THRESHOLD},65536: the engine's default, what the"
             " Dex server does, and the 64 KiB it replaced; the first is the base of the ratios)")
    parser.add_argument("--blob-threshold", type=int, default=None, metavar="BYTES",
                        help="measure ours at this one threshold only (same as"
                             " --blob-thresholds BYTES)")
    parser.add_argument(
        "--agent-config-bytes", type=int, default=0, metavar="BYTES",
        help="start each of our sessions with an agent_config of about BYTES of JSON (a system"
             " prompt and tool specs, as the platform's sessions carry; the peers carry none)."
             " Default 0: the turn the peers run")
    parser.add_argument("--trace", action="store_true",
                        help="also print the last turn's timeline (engine and client events)")
    args = parser.parse_args()
    # --quick lowers the defaults; a figure given on the command line wins.
    if args.turns is None:
        args.turns = 40 if args.quick else 200
    if args.warmup is None:
        args.warmup = 5 if args.quick else 20
    syncs = ["normal", "full"] if args.sync == "both" else [args.sync]
    thresholds = ((args.blob_threshold,) if args.blob_threshold is not None
                  else args.blob_thresholds)
    asyncio.run(
        run(args.turns, args.warmup, syncs, args.trace, args.observe, not args.no_profile,
            not args.no_floor, not args.no_dbos, args.floor_sync, thresholds,
            args.agent_config_bytes)
    )


if __name__ == "__main__":
    main()
