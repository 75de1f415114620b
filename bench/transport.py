"""What the agent turn's gRPC messages cost on their own: a lower bound under ``bench/turn.py``.

A Dex turn crosses process boundaries as gRPC messages, and the unchanged ``dex-python-sdk``
pull worker fixes how many: each Step task and RPC task is a task frame and a final frame on a
``PollWorkerTask`` stream; the worker opens a fresh stream for every task it takes and closes a
surplus one when the task ends (spec 1.4); every Stream write and heartbeat is a frame of its
own; the client's ``StartFlow``, completion long poll and snapshot ``InvokeRPC`` are unary calls.
This benchmark times those four message patterns between two Python processes with grpc.aio
(the engine's and the SDK's transport) and nothing else behind them: a child process serves
``WorkerTaskService`` with the real Dex protobuf messages, answering without any engine work,
and this process plays the worker and the client.

For each pattern it prints the wall time and the CPU of each side per operation (client
``time.process_time``, server ``bench.relay.cpu_ms``: every thread, to the nanosecond), then
multiplies by the counts of one agent turn, as ``python -m bench.turn`` reports them in its
breakdown (``TURN_COUNTS``), and sets the result beside LangGraph + ``SqliteSaver`` running the
same turn in this process (``bench/langgraph_peer.py``). Two lower bounds for our turn follow,
before the engine commits anything or the SDK and ``dex_agents`` run a line:

* CPU: the transport CPU of one turn, spread perfectly over the machine's cores;
* latency: the turn's critical path, which waits for ``CRITICAL_PATH_ROUND_TRIPS`` task round
  trips and its three unary calls one after another.

Run: ``.venv/bin/python -m bench.transport`` (``--quick`` for a short pass). Nothing is
asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from bench._cli import positive_int
from bench.relay import cpu_ms, percentile

REPO = Path(__file__).resolve().parents[1]
#: The unary method the child serves next to ``WorkerTaskService`` (bytes in, bytes out).
UNARY_METHOD = "/dexagents.bench.Transport/Echo"
#: Messages of one agent turn (3 parallel READ tools, ``bench/turn.py``), from its breakdown
#: (rounded down): ``PollWorkerTask`` streams opened and closed (``register_stream``, 9.2 per
#: turn); Step tasks and the snapshot RPC task, each a task frame and a final frame (7 execute,
#: 2 wait_for and 1 RPC result); Stream writes and heartbeats (15 + 3 frames with no answer);
#: the client's unary calls (StartFlow, WaitForStepCompletion, InvokeRPC). Rejected and resent
#: tasks are left out, so the counts are a lower bound.
TURN_COUNTS = {"stream": 9, "round_trip": 10, "one_way": 18, "unary": 3}
#: Task round trips one after another on the turn's path: StartAgentSession, RunModel, the
#: last CallTool, ResumeTurn, RunModel, the snapshot RPC. The other tools and the waits
#: overlap them; the streams the worker opens at the fan-out are left out too, so the latency
#: bound is low.
CRITICAL_PATH_ROUND_TRIPS = 6
#: Payload sizes in bytes, about those of the turn: a task's request, a Step result, a Stream
#: write (one AgentEvent), a unary request and answer.
TASK_BYTES, RESULT_BYTES, WRITE_BYTES, UNARY_BYTES = 1500, 600, 250, 200


def _value(size: int) -> pb.Value:
    return pb.Value(string_value="x" * size)


def _task() -> pb.PollWorkerTaskResponse:
    return pb.PollWorkerTaskResponse(
        task=pb.PollWorkerTask(
            task_id="t" * 36,
            execute=pb.InvokeExecuteMethodRequest(
                flow_type="ScriptedAgent", step_type="RunModel", step_input=_value(TASK_BYTES)
            ),
        )
    )


def _frame(kind: str) -> pb.PollWorkerTaskRequest:
    if kind == "result":
        output = pb.InvokeExecuteMethodOutput(
            result=pb.InvokeExecuteMethodResponse(
                step_decision=pb.StepDecision(),
                record_events=[pb.KV(key="r", value=_value(RESULT_BYTES))],
            )
        )
    else:
        output = pb.InvokeExecuteMethodOutput(
            stream_write=pb.StepStreamWrite(stream_name="AgentEvents", value=_value(WRITE_BYTES))
        )
    return pb.PollWorkerTaskRequest(
        task_frame=pb.PollWorkerTaskFrame(task_id="t" * 36, execute=output)
    )


REGISTER = pb.PollWorkerTaskRequest(
    register=pb.PollWorkerTaskRegister(
        queue="ScriptedAgent", app_worker_id="bench-worker", flow_types=["ScriptedAgent"],
        sdk_name="python", sdk_version="1.23.0",
    )
)


class _Servicer(dex_pb2_grpc.WorkerTaskServiceServicer):
    """Answers register with registered and a Step result with the next task; nothing else."""

    def __init__(self) -> None:
        self._registered = pb.PollWorkerTaskResponse(
            registered=pb.PollWorkerTaskRegistered(supports_unknown_name_rejection=True)
        )
        self._task = _task()

    async def PollWorkerTask(self, request_iterator: Any, context: Any) -> None:
        while True:
            frame = await context.read()
            if frame is grpc.aio.EOF:
                return
            which = frame.WhichOneof("frame")
            if which == "register":
                await context.write(self._registered)
            elif which == "task_frame" and frame.task_frame.execute.HasField("result"):
                await context.write(self._task)


async def _serve() -> None:
    """Serve on a free loopback port, print ``ready <port>``, stop when stdin is closed (the
    parent ended, however it ended)."""
    server = grpc.aio.server()
    dex_pb2_grpc.add_WorkerTaskServiceServicer_to_server(_Servicer(), server)

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    handler = grpc.method_handlers_generic_handler(
        "dexagents.bench.Transport",
        {"Echo": grpc.unary_unary_rpc_method_handler(echo)},
    )
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"ready {port}", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    await server.stop(None)


@dataclass
class Pattern:
    """One message pattern's figures per operation."""

    name: str
    wall_ms: list[float]
    client_cpu_ms: float
    server_cpu_ms: float

    @property
    def cpu_ms(self) -> float:
        return self.client_cpu_ms + self.server_cpu_ms


async def _measure(
    name: str, server_pid: int, ops: int, op: Callable[[], Awaitable[None]]
) -> Pattern:
    """Run ``op`` ``ops`` times after a warm-up; per-operation wall times and CPU of each side."""
    for _ in range(max(20, ops // 10)):
        await op()
    walls: list[float] = []
    # The server child's threads live as long as it does, so cpu_ms counts all of its work.
    client_before, server_before = time.process_time(), cpu_ms(server_pid)
    for _ in range(ops):
        started = time.perf_counter()
        await op()
        walls.append((time.perf_counter() - started) * 1000)
    client = (time.process_time() - client_before) * 1000 / ops
    server = (cpu_ms(server_pid) - server_before) / ops
    return Pattern(name, walls, client, server)


async def _patterns(port: int, server_pid: int, ops: int) -> dict[str, Pattern]:
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    await asyncio.wait_for(channel.channel_ready(), 30)
    stub = dex_pb2_grpc.WorkerTaskServiceStub(channel)
    echo = channel.unary_unary(UNARY_METHOD)
    unary_payload = b"u" * UNARY_BYTES

    async def unary() -> None:
        await echo(unary_payload)

    async def stream() -> None:
        # What the SDK does per task stream: register, wait for registered, retire, wait for EOF.
        call = stub.PollWorkerTask()
        await call.write(REGISTER)
        await call.read()
        await call.done_writing()
        end = await call.read()
        if end is not grpc.aio.EOF:
            raise RuntimeError(f"the retired stream answered {end!r}")

    held = stub.PollWorkerTask()
    await held.write(REGISTER)
    await held.read()
    result, write = _frame("result"), _frame("write")

    async def round_trip() -> None:
        await held.write(result)
        await held.read()

    async def one_way() -> None:
        await held.write(write)

    try:
        found = {
            "unary": await _measure("unary call", server_pid, ops, unary),
            "stream": await _measure("task stream opened and closed", server_pid, ops, stream),
            "round_trip": await _measure("task round trip on a stream", server_pid, ops,
                                         round_trip),
            "one_way": await _measure("frame with no answer", server_pid, ops, one_way),
        }
    finally:
        await held.done_writing()
        await channel.close()
    return found


def _peer_turns(turns: int) -> list[float]:
    """LangGraph + SqliteSaver turns in this process, in ms (``bench/langgraph_peer.py``)."""
    from bench.langgraph_peer import build_graph, run_turn

    with tempfile.TemporaryDirectory(prefix="dexagents-bench-transport-") as root:
        graph, connection = build_graph(Path(root) / "peer.sqlite3", Path(root) / "peer.log")
        assert connection is not None
        try:
            seconds = []
            for index in range(turns + max(5, turns // 10)):
                started = time.perf_counter()
                run_turn(graph, f"turn-{index}")
                seconds.append((time.perf_counter() - started) * 1000)
        finally:
            connection.close()
    return seconds[-turns:]


async def run(ops: int, turns: int) -> None:
    """Start the child server, measure the patterns and the peer, print the bounds."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.transport", "--serve",
        cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert child.stdout is not None
        ready, _, port = (await asyncio.wait_for(child.stdout.readline(), 60)).partition(b" ")
        if ready != b"ready":
            raise RuntimeError("the server child did not start")
        patterns = await _patterns(int(port), child.pid, ops)
    finally:
        if child.returncode is None:
            assert child.stdin is not None
            child.stdin.close()
            try:
                await asyncio.wait_for(child.wait(), 10)
            except TimeoutError:
                child.kill()
                await child.wait()
    peer = _peer_turns(turns)
    peer_p50 = percentile(peer, 0.5)
    cores = len(os.sched_getaffinity(0))

    print(f"gRPC messages between two Python processes (grpc.aio {grpc.__version__}),"
          f" {ops} operations per pattern; load average {os.getloadavg()[0]:.1f}:")
    print(f"  {'pattern':<32} {'wall p50':>9} {'wall p99':>9} {'CPU client':>11}"
          f" {'CPU server':>11} {'count/turn':>11} {'CPU/turn':>9}")
    cpu_per_turn = 0.0
    for key, pattern in patterns.items():
        count = TURN_COUNTS[key]
        cpu_per_turn += count * pattern.cpu_ms
        print(f"  {pattern.name:<32} {percentile(pattern.wall_ms, 0.5):7.3f}ms"
              f" {percentile(pattern.wall_ms, 0.99):7.3f}ms {pattern.client_cpu_ms:9.3f}ms"
              f" {pattern.server_cpu_ms:9.3f}ms {count:>11} {count * pattern.cpu_ms:7.2f}ms")
    print("  (wall: until the client's call returns; for a frame with no answer that is its"
          " write, not its delivery)")
    latency = (CRITICAL_PATH_ROUND_TRIPS * percentile(patterns["round_trip"].wall_ms, 0.5)
               + TURN_COUNTS["unary"] * percentile(patterns["unary"].wall_ms, 0.5))
    cpu_bound = cpu_per_turn / cores
    print(f"\nLangGraph + SqliteSaver, the whole turn in one process: p50 {peer_p50:.2f} ms"
          f" ({turns} turns); issue 13's 2.0x is {2 * peer_p50:.2f} ms.")
    print(f"One turn's messages (counts above, from python -m bench.turn): {cpu_per_turn:.2f} ms"
          " of CPU in the two processes.")
    print(f"  CPU bound: {cpu_per_turn:.2f} ms over {cores} cores = {cpu_bound:.2f} ms"
          f" = {cpu_bound / peer_p50:.2f}x LangGraph")
    print(f"  latency bound: {CRITICAL_PATH_ROUND_TRIPS} task round trips + "
          f"{TURN_COUNTS['unary']} unary calls one after another = {latency:.2f} ms"
          f" = {latency / peer_p50:.2f}x LangGraph")
    print("  (both before the engine commits anything and before the SDK or dex_agents run;"
          " bench/turn.py's floor line measures them with the engine and SDK)")


def main() -> None:
    """Parse the command line and run the benchmark (or, with ``--serve``, the child)."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.transport", description=__doc__.split("\n\n")[0],
    )
    parser.add_argument("--ops", type=positive_int, default=None,
                        help="operations per message pattern (3000; 300 with --quick)")
    parser.add_argument("--turns", type=positive_int, default=None,
                        help="LangGraph turns (300; 50 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a short pass")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    ops = args.ops or (300 if args.quick else 3000)
    turns = args.turns or (50 if args.quick else 300)
    asyncio.run(run(ops, turns))


if __name__ == "__main__":
    main()
