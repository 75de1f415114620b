"""Benchmark of the websocket events relay (``/ws/sessions/<id>/events/``) on one web process.

Starts the platform as real processes (``tests/e2e/relay_stack.py``: embedded engine, demo
model, ``manage.py dexworker``, one uvicorn serving ``dexagents_site.asgi``) on a temporary
database, then measures:

1. Relay latency: the bench appends ``--writes`` AgentEvents to one session's Stream with the
   Dex SDK's ``AsyncClient.write_stream``, one at a time, and times each from the call to the
   arrival of its websocket frame (p50 / p99; goal from issue 9: p99 <= 50 ms). The peer, in
   the same run: a direct Dex ``read_stream`` long poll in the bench process on the same Stream,
   timed the same way. The ratio shows what the web hop (Channels, uvicorn, websocket) adds.
2. ``--sockets`` websockets on the one web process, each on its own session, each receiving a
   streamed demo-model turn (``/slow``) from ``turn_started`` to ``turn_completed``: errors
   (must be 0), frames, the web process's resident memory (before the sockets, peak, after),
   and the frames' latency under that load (Stream ``created_at`` to arrival; the engine and
   the bench share a clock, and ``created_at`` has millisecond resolution).

3. Many watchers of one session (issue 24): for ``--watchers`` (1, 100, 1,000) websockets on
   one session, then ``--open-sockets`` (10,000) on the same session, the bench writes
   ``--fanout-writes`` events one at a time (the next once every socket got the previous
   one) and prints the web process's resident memory per socket (RSS with the sockets open
   minus before, over the count; target <= 50 KB), frame latency p50 / p99 from the
   ``write_stream`` call to each socket's frame (target: 1,000 watchers within 2x of one
   watcher's p99), and the engine Stream reads the web process made
   (``dexagents_event_stream_reads_total`` from its ``/metrics``) per second and per
   written event. The sockets are a minimal websocket client in the bench process (raw
   asyncio protocol, no compression: the client must cost far less than the server);
   the bench raises its soft ``RLIMIT_NOFILE`` to the hard limit, which the web process
   inherits.

Run: ``.venv/bin/python -m bench.relay`` (``--quick`` for a smaller, faster pass), or
``make bench-relay``. Prints figures; nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import resource
import statistics
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench._django import django_setup


def percentile(values: list[float], fraction: float) -> float:
    """The ``fraction`` quantile (nearest rank) of ``values``."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def rss_mib(pid: int) -> float:
    """Resident memory of process ``pid`` in MiB (``VmRSS`` of ``/proc/<pid>/status``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def cpu_ms(pid: int, main_thread_only: bool = False) -> float:
    """Milliseconds on a CPU, to the nanosecond, of the running threads of process ``pid``, or
    of its main thread alone (``/proc/<pid>/task/<tid>/schedstat``, first field). Threads that
    have ended are not counted: read it across a span in which the threads counted live on."""
    tasks = [Path(f"/proc/{pid}/task/{pid}")] if main_thread_only else [
        *Path(f"/proc/{pid}/task").iterdir()
    ]
    total = 0
    for task in tasks:
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # a thread that ended just now
            if main_thread_only:
                raise
    return total / 1e6


async def latency(stack: Any, writes: int) -> tuple[list[float], list[float]]:
    """Write ``writes`` events one by one; time the relay's frame and a direct read of each."""
    from websockets.asyncio.client import connect

    from dex_agents import AgentEvent, AgentEventType
    from tests.e2e.relay_stack import dex_client

    with stack.api() as api:
        session_id = api.post("/api/v1/sessions/", json={"agent": "demo"}).json()["id"]
    relay_ms: list[float] = []
    direct_ms: list[float] = []
    async with dex_client(stack.engine_address) as (client, flow), \
            dex_client(stack.engine_address) as (reader, reader_flow), \
            connect(stack.events_url(session_id),
                    additional_headers=stack.personas["owner"].bearer()) as ws:
        arrivals: asyncio.Queue[float] = asyncio.Queue()

        async def direct() -> None:
            token = ""
            while True:
                message = await reader.read_stream(session_id, reader_flow.agent_events, token,
                                                   datetime.timedelta(seconds=30))
                arrivals.put_nowait(time.perf_counter())
                token = message.resume_token

        direct_task = asyncio.create_task(direct())
        try:
            for index in range(writes + 20):
                event = AgentEvent(AgentEventType.TEXT_DELTA, "turn-bench", "bench", 1,
                                   {"text": f"delta {index} " + "x" * 40})
                started = time.perf_counter()
                await client.write_stream(session_id, flow.agent_events, "bench", event)
                frame = json.loads(await ws.recv())
                framed = time.perf_counter()
                read = await arrivals.get()
                assert frame["event"]["data"]["text"] == event.payload["text"], frame
                if index >= 20:  # the first writes warm connections and caches up
                    relay_ms.append((framed - started) * 1000)
                    direct_ms.append((read - started) * 1000)
        finally:
            direct_task.cancel()
    return relay_ms, direct_ms


@dataclass
class SocketRun:
    """What one of the many sockets saw."""

    frames: int = 0
    completed: bool = False
    error: str = ""
    lag_ms: list[float] = field(default_factory=list)


async def many_sockets(stack: Any, sockets: int, words: int, pause: float) -> dict[str, Any]:
    """``sockets`` websockets, one streamed turn each, on the stack's one web process."""
    import httpx
    from websockets.asyncio.client import connect

    headers = stack.personas["owner"].bearer()
    limit = asyncio.Semaphore(16)
    async with httpx.AsyncClient(base_url=stack.base_url(), headers=headers,
                                 timeout=60) as api:
        async def create() -> str:
            async with limit:
                answer = await api.post("/api/v1/sessions/", json={"agent": "demo"})
                answer.raise_for_status()
                return str(answer.json()["id"])

        session_ids = await asyncio.gather(*(create() for _ in range(sockets)))
        web_pid = stack.web.popen.pid
        rss = {"before": rss_mib(web_pid), "peak": 0.0}
        runs = [SocketRun() for _ in session_ids]
        connected = asyncio.Event()
        ready = 0

        async def watch(session_id: str, run: SocketRun) -> None:
            nonlocal ready
            try:
                async with connect(stack.events_url(session_id), additional_headers=headers,
                                   open_timeout=60, max_queue=None) as ws:
                    ready += 1
                    if ready == sockets:
                        connected.set()
                    async with asyncio.timeout(300):
                        while True:
                            frame = json.loads(await ws.recv())
                            arrived = datetime.datetime.now(datetime.UTC)
                            run.frames += 1
                            if frame["type"] != "event":
                                run.error = f"unexpected frame {frame}"
                                return
                            created = datetime.datetime.fromisoformat(
                                frame["event"]["created_at"].replace("Z", "+00:00"))
                            run.lag_ms.append((arrived - created).total_seconds() * 1000)
                            if frame["event"]["type"] == "turn_failed":
                                run.error = f"turn failed: {frame['event']['data']}"
                                return
                            if frame["event"]["type"] == "turn_completed":
                                run.completed = True
                                return
            except Exception as error:
                run.error = f"{type(error).__name__}: {error}"
                ready += 1
                if ready == sockets:
                    connected.set()

        async def sample() -> None:
            while True:
                rss["peak"] = max(rss["peak"], rss_mib(web_pid))
                await asyncio.sleep(0.1)

        sampler = asyncio.create_task(sample())
        watchers = [asyncio.create_task(watch(session_id, run))
                    for session_id, run in zip(session_ids, runs, strict=True)]
        await asyncio.wait_for(connected.wait(), 120)
        rss["connected"] = rss_mib(web_pid)
        message = f"/slow {pause}\n" + " ".join(f"word{index}" for index in range(words))
        started = time.perf_counter()

        busy = {"answers": 0}

        async def send(session_id: str) -> None:
            # The message RPC runs on a worker slot; while every slot streams a turn the API
            # may answer 503 after DEXAGENTS_ENGINE_TIMEOUT. Ask again, as a client would.
            async with limit:
                for _ in range(30):
                    answer = await api.post(f"/api/v1/sessions/{session_id}/messages/",
                                            json={"text": message})
                    if answer.status_code != 503:
                        answer.raise_for_status()
                        return
                    busy["answers"] += 1
                    await asyncio.sleep(1)
                answer.raise_for_status()

        await asyncio.gather(*(send(session_id) for session_id in session_ids))
        await asyncio.gather(*watchers)
        elapsed = time.perf_counter() - started
        sampler.cancel()
        rss["after"] = rss_mib(web_pid)
    errors = [run.error for run in runs if run.error or not run.completed]
    lags = [lag for run in runs for lag in run.lag_ms]
    return {"runs": runs, "errors": errors, "rss": rss, "elapsed": elapsed, "lags": lags,
            "busy": busy["answers"]}


class Watcher(asyncio.Protocol):
    """A minimal websocket client (RFC 6455) that records the arrival time of each text frame.

    It sends the upgrade request, answers pings, and parses unmasked server frames without
    decoding them: the bench only needs to know when the n-th frame came.
    """

    def __init__(self, request: bytes, arrived: Any) -> None:
        self.request = request
        self.arrived = arrived
        self.buffer = bytearray()
        self.upgraded = asyncio.get_running_loop().create_future()
        self.closed = asyncio.get_running_loop().create_future()
        self.frames = 0
        self.close_code: int | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.upgraded.done():
            self.upgraded.set_exception(ConnectionError(f"closed before the upgrade: {exc}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buffer += data
        if not self.upgraded.done():
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end])
            del self.buffer[:end + 4]
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                self.upgraded.set_exception(ConnectionError(head.decode("latin-1")))
                return
            self.upgraded.set_result(None)
        buffer = self.buffer
        while len(buffer) >= 2:
            opcode, length, offset = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
            if length == 126:
                if len(buffer) < 4:
                    return
                length, offset = struct.unpack_from("!H", buffer, 2)[0], 4
            elif length == 127:
                if len(buffer) < 10:
                    return
                length, offset = struct.unpack_from("!Q", buffer, 2)[0], 10
            if len(buffer) < offset + length:
                return
            payload = bytes(buffer[offset:offset + length])
            del buffer[:offset + length]
            if opcode == 0x1:
                self.frames += 1
                self.arrived(self, now)
            elif opcode == 0x9 and self.transport is not None:  # ping: a masked pong
                self.transport.write(bytes([0x8A, 0x80 | len(payload)]) + b"\0\0\0\0"
                                     + payload)
            elif opcode == 0x8:
                self.close_code = struct.unpack_from("!H", payload)[0] if payload else 1005
                if self.transport is not None:
                    self.transport.close()

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(b"\x88\x82\0\0\0\0\x03\xe8")  # masked close 1000
            self.transport.close()


def engine_reads(stack: Any) -> float:
    """The web process's ``dexagents_event_stream_reads_total`` from its ``/metrics``."""
    with stack.api() as api:
        for line in api.get("/metrics").text.splitlines():
            if line.startswith("dexagents_event_stream_reads_total "):
                return float(line.split()[1])
    return 0.0


@dataclass
class FanoutRun:
    """Figures of one count of watchers of one session."""

    sockets: int
    opened: int = 0
    failed: str = ""
    rss_before: float = 0.0
    rss_open: float = 0.0
    open_seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    reads: float = 0.0
    writes: int = 0
    write_seconds: float = 0.0


async def fanout(stack: Any, sockets: int, writes: int) -> FanoutRun:
    """``sockets`` watchers of one new session on the web process; ``writes`` events, each
    written once every watcher got the one before."""
    from dex_agents import AgentEvent, AgentEventType
    from tests.e2e.relay_stack import dex_client

    run = FanoutRun(sockets)
    with stack.api() as api:
        session_id = api.post("/api/v1/sessions/", json={"agent": "demo"}).json()["id"]
    token = stack.personas["owner"].token
    web_pid = stack.web.popen.pid
    loop = asyncio.get_running_loop()
    async with dex_client(stack.engine_address) as (client, flow):
        def event(index: int) -> Any:
            return AgentEvent(AgentEventType.TEXT_DELTA, "turn-bench", "bench", 1,
                              {"text": f"delta {index} " + "x" * 40})

        await client.write_stream(session_id, flow.agent_events, "bench", event(-1))
        page = await client.list_stream_messages(session_id, flow.agent_events, 1)
        after = page.messages[0].resume_token
        request = (f"GET /ws/sessions/{session_id}/events/?after={after} HTTP/1.1\r\n"
                   f"Host: 127.0.0.1:{stack.web_port}\r\nUpgrade: websocket\r\n"
                   f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                   f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                   f"Authorization: Bearer {token}\r\n\r\n").encode()
        # Per write: the arrival times, and a future set once every watcher has a frame.
        state: dict[str, Any] = {"times": [], "want": 0, "done": None}

        def arrived(watcher: Watcher, at: float) -> None:
            if watcher.frames == state["want"]:
                state["times"].append(at)
                if len(state["times"]) == run.opened and not state["done"].done():
                    state["done"].set_result(None)

        run.rss_before = rss_mib(web_pid)
        watchers: list[Watcher] = []
        limit = asyncio.Semaphore(64)
        started = time.perf_counter()

        async def open_one() -> None:
            async with limit:
                try:
                    _, watcher = await loop.create_connection(
                        lambda: Watcher(request, arrived), "127.0.0.1", stack.web_port)
                    await asyncio.wait_for(watcher.upgraded, 120)
                except Exception as error:
                    run.failed = run.failed or f"{type(error).__name__}: {error}"
                    return
                watchers.append(watcher)

        await asyncio.gather(*(open_one() for _ in range(sockets)))
        run.opened = len(watchers)
        run.open_seconds = time.perf_counter() - started
        try:
            async def write(index: int, within: float) -> float:
                state["times"], state["want"] = [], index + 1
                state["done"] = loop.create_future()
                at = time.perf_counter()
                await client.write_stream(session_id, flow.agent_events, "bench", event(index))
                await asyncio.wait_for(state["done"], within)
                return at

            # Every watcher has joined the session's reader once each has the first frame.
            await write(0, 300)
            run.rss_open = rss_mib(web_pid)
            reads_before, began = engine_reads(stack), time.perf_counter()
            for index in range(1, writes + 1):
                at = await write(index, 120)
                run.latencies_ms.extend((arrival - at) * 1000 for arrival in state["times"])
            run.write_seconds = time.perf_counter() - began
            run.reads = engine_reads(stack) - reads_before
            run.writes = writes
        except TimeoutError:
            got = len(state["times"])
            run.failed = run.failed or f"only {got} of {run.opened} watchers got a frame"
            closes = {w.close_code for w in watchers if w.close_code is not None}
            if closes:
                run.failed += f" (close codes {sorted(closes)})"
        finally:
            for watcher in watchers:
                watcher.close()
            await asyncio.gather(*(w.closed for w in watchers), return_exceptions=True)
    return run


def fanout_table(runs: list[FanoutRun]) -> None:
    """Print one row per run, latency ratios against the one-watcher run."""
    base = next((run for run in runs if run.sockets == 1 and run.latencies_ms), None)
    base_p99 = percentile(base.latencies_ms, 0.99) if base else 0.0
    print("| watchers of one session | opened | KiB per socket (web RSS) | frame p50 | frame p99 "
          "| p99 / 1 watcher | engine reads/s | reads per event |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        if not run.latencies_ms:
            print(f"| {run.sockets:,} | {run.opened:,} | - | - | - | - | - | - |"
                  f" failed: {run.failed}")
            continue
        per_socket = (run.rss_open - run.rss_before) * 1024 / max(1, run.opened)
        p50, p99 = percentile(run.latencies_ms, 0.5), percentile(run.latencies_ms, 0.99)
        ratio = f"x{p99 / base_p99:.1f}" if base_p99 else "-"
        print(f"| {run.sockets:,} | {run.opened:,} | {per_socket:.1f} | {p50:.1f} ms "
              f"| {p99:.1f} ms | {ratio} | {run.reads / run.write_seconds:.1f} "
              f"| {run.reads / run.writes:.2f} |")
        if run.failed:
            print(f"  ({run.failed})")
    sys.stdout.flush()


async def measure(stack: Any, args: argparse.Namespace) -> None:
    # First sockets pay one-off costs (imports, the web side's engine connection, caches).
    await fanout(stack, 10, 3)
    fanouts: list[FanoutRun] = []
    for count in [*args.watchers, args.open_sockets]:
        if not count:
            continue
        print(f"{count} watchers of one session ...", flush=True)
        one = await fanout(stack, count, args.fanout_writes if count <= 1000
                           else max(5, args.fanout_writes // 4))
        print(f"  opened {one.opened} sockets in {one.open_seconds:.1f} s"
              + (f"; {one.failed}" if one.failed else ""), flush=True)
        fanouts.append(one)
    fanout_table(fanouts)

    relay_ms, direct_ms = await latency(stack, args.writes)
    relay_p50, relay_p99 = percentile(relay_ms, 0.5), percentile(relay_ms, 0.99)
    direct_p50, direct_p99 = percentile(direct_ms, 0.5), percentile(direct_ms, 0.99)
    print(f"relay latency, write_stream -> websocket frame, {len(relay_ms)} writes: "
          f"p50 {relay_p50:.2f} ms, p99 {relay_p99:.2f} ms, mean "
          f"{statistics.fmean(relay_ms):.2f} ms (goal p99 <= 50 ms)")
    print(f"peer, write_stream -> direct Dex read_stream long poll: p50 {direct_p50:.2f} ms, "
          f"p99 {direct_p99:.2f} ms; relay / peer: p50 x{relay_p50 / direct_p50:.2f}, "
          f"p99 x{relay_p99 / direct_p99:.2f}")
    sys.stdout.flush()

    result = await many_sockets(stack, args.sockets, args.words, args.pause)
    runs, rss = result["runs"], result["rss"]
    frames = sum(run.frames for run in runs)
    completed = sum(run.completed for run in runs)
    print(f"{args.sockets} sockets on one web process: {completed} streamed turns completed "
          f"in {result['elapsed']:.1f} s, {frames} frames, errors {len(result['errors'])}")
    if result["busy"]:
        print(f"  (the messages API answered 503 {result['busy']} times while the worker's "
              f"slots were busy; those sends were repeated)")
    for error in result["errors"][:5]:
        print(f"  error: {error}")
    per_socket = (rss["connected"] - rss["before"]) / max(1, args.sockets) * 1024
    print(f"web process RSS: {rss['before']:.0f} MiB before the sockets, "
          f"{rss['connected']:.0f} MiB with {args.sockets} idle sockets "
          f"(~{per_socket:.0f} KiB each), peak {rss['peak']:.0f} MiB while streaming, "
          f"{rss['after']:.0f} MiB after")
    lags = result["lags"]
    if lags:
        print(f"frame latency under that load, Stream created_at -> arrival (ms clock): "
              f"p50 {percentile(lags, 0.5):.1f} ms, p99 {percentile(lags, 0.99):.1f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--writes", type=int, default=500)
    parser.add_argument("--sockets", type=int, default=200)
    parser.add_argument("--words", type=int, default=60, help="words per streamed reply")
    parser.add_argument("--pause", type=float, default=0.05,
                        help="demo model pause between 3-word chunks (s)")
    parser.add_argument("--worker-slots", type=int, default=64)
    parser.add_argument("--watchers", type=int, nargs="*", default=[1, 100, 1000],
                        help="watcher counts of one session")
    parser.add_argument("--open-sockets", type=int, default=10_000,
                        help="the large count of sockets on one session (0: skip)")
    parser.add_argument("--fanout-writes", type=int, default=100,
                        help="events written per watcher count (a quarter past 1,000)")
    parser.add_argument("--quick", action="store_true",
                        help="100 writes, 50 sockets, 30 fan-out writes, no 10,000 sockets")
    args = parser.parse_args()
    if args.quick:
        args.writes, args.sockets, args.fanout_writes = 100, 50, 30
        args.open_sockets = 0
    # Each socket is a file descriptor here and in the web process (which inherits this).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * max([*args.watchers, args.open_sockets]) + 1024
    if soft < wanted:
        soft = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    print(f"file descriptors: soft limit {soft}, hard {hard}", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-relay-") as root:
        django_setup(Path(root))
        from tests.e2e.relay_stack import running_stack

        print("starting engine, demo model, worker and web ...", flush=True)
        with running_stack(Path(root) / "stack", worker_slots=args.worker_slots) as stack:
            asyncio.run(measure(stack, args))


if __name__ == "__main__":
    main()
