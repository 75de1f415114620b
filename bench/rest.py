"""Benchmark of concurrent snapshot reads (``GET /api/v1/sessions/<id>/``) on web processes.

Starts the platform as real processes (``tests/e2e/relay_stack.py``: embedded engine, demo
model, ``manage.py dexworker``, uvicorn serving ``dexagents_site.asgi``) on a temporary SQLite
database, gives ``--sessions`` sessions one demo turn each, then has ``--concurrency`` clients
read their snapshots back to back for ``--seconds`` per figure, against:

- before: one web process running the code of ``--baseline`` (a git revision; default the
  last commit whose snapshot view was a synchronous DRF view, which waited for each Dex call
  on the request's thread through ``dex_gateway.run``), exported with ``git archive`` and
  served on the same database and engine;
- after: one web process of this tree (async views awaiting ``dex_gateway.call``);
- after, no short path: one web process of this tree with ``DEXAGENTS_SNAPSHOT_SHORT_PATH``
  off (every read through Django and DRF);
- after, 2 web processes: two of them, the clients split evenly;
- the peer, in the same run: the same reads straight from the bench process with the Dex SDK
  (``AgentSessionClient.get_agent_snapshot``), the ceiling the engine and worker allow;
- the LangGraph Agent Server's thread-state reads (``GET /threads/<id>/state``) on
  ``--sessions`` threads that ran the turn of ``bench/langgraph_server_graph.py`` once, at the
  same concurrency, from the server ``bench/peer_server.py`` starts (its own virtualenv, made on
  first use; ``--no-langgraph-server`` leaves it out). Measured with the engine next door only,
  as one server process: issue 24's target is our snapshot reads per web process >= 1.0x its
  reads. Its state lives in memory (nothing survives its restart); ours is read from Dex.

Each figure is measured once with the engine next door and once behind a TCP proxy in the
bench process that delays every chunk by half of ``--engine-rtt-ms`` each way (a Dex server
on another host): there a process that waited for Dex calls one at a time would show it.
Prints reads per second, p50 / p99 latency, errors, the server's CPU per read (our web
processes', every thread, ``/proc/<pid>/task/*/schedstat``; the LangGraph server's process
tree) and the ratios; nothing is asserted. The web
processes keep their per-user read throttle on (``READ_THROTTLE_RATE``). On a
machine with few cores the web process and the bench share them, so CPU, not waiting, bounds
the figures without added latency.

Run: ``.venv/bin/python -m bench.rest`` (``--quick`` for a shorter pass), or ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench._django import REPO, django_setup
from bench.relay import percentile

if TYPE_CHECKING:
    from bench.peer_server import PeerServer

#: The web processes' read budget per user (``DEXAGENTS_THROTTLE_READS``): on, never reached.
READ_THROTTLE_RATE = "100000/s"

#: The last commit whose Dex-reading views were synchronous (issue 12's "before").
BASELINE_REVISION = "a07eef7f62b47c54063652a861c25e903e002016"


class LatencyProxy:
    """A TCP proxy on its own thread and loop that delays every chunk by ``one_way`` seconds
    in both directions, keeping order (gRPC's HTTP/2 stream survives it unchanged)."""

    def __init__(self, target_port: int, one_way: float) -> None:
        self.target_port = target_port
        self.one_way = one_way
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve_forever, daemon=True,
                                        name="latency-proxy")

    def start(self) -> str:
        """Start serving; return the proxy's ``host:port``."""
        self._thread.start()
        self._ready.wait(10)
        return f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)

    def _serve_forever(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        chunks: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, chunk = await chunks.get()
                if not chunk:
                    break
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                writer.write(chunk)
                await writer.drain()
            writer.close()

        delivery = asyncio.create_task(deliver())
        try:
            while chunk := await reader.read(65536):
                chunks.put_nowait((time.monotonic() + self.one_way, chunk))
        except OSError:
            pass
        chunks.put_nowait((0.0, b""))
        await asyncio.gather(delivery, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(
                "127.0.0.1", self.target_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(self._pipe(reader, upstream_writer),
                             self._pipe(upstream_reader, writer), return_exceptions=True)


def process_cpu_seconds(pids: list[int]) -> float:
    """CPU seconds the processes ``pids`` ran so far, every thread counted
    (``/proc/<pid>/task/*/schedstat``, nanoseconds); a process that is gone counts 0."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int((task / "schedstat").read_text().split()[0])
    return total / 1e9


@dataclass
class Figure:
    """One measured configuration; ``cpu_seconds``: the web processes' CPU during it (None
    when not measured)."""

    label: str
    reads: int = 0
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    cpu_seconds: float | None = None

    @property
    def rate(self) -> float:
        return self.reads / self.seconds if self.seconds else 0.0

    @property
    def cpu_per_read(self) -> float:
        """Server CPU seconds per read (NaN when not measured)."""
        if self.cpu_seconds is None or not self.reads:
            return float("nan")
        return self.cpu_seconds / self.reads

    def line(self) -> str:
        if not self.latencies:
            return f"{self.label}: no successful read, errors {len(self.errors)}"
        cpu = ("" if self.cpu_seconds is None or not self.reads else
               f", server CPU {self.cpu_per_read * 1000:5.2f} ms/read")
        return (f"{self.label}: {self.rate:7.1f} reads/s, p50 "
                f"{percentile(self.latencies, 0.5) * 1000:6.1f} ms, p99 "
                f"{percentile(self.latencies, 0.99) * 1000:6.1f} ms, errors {len(self.errors)}"
                f"{cpu}")


async def closed_loop(label: str, read: Any, clients: int, ids: list[str],
                      seconds: float) -> Figure:
    """``clients`` concurrent readers, each calling ``read(client_index, session_id)`` back to
    back over ``ids`` for ``seconds``."""
    figure = Figure(label)
    stop_at = time.perf_counter() + seconds

    async def reader(number: int) -> None:
        index = number
        while time.perf_counter() < stop_at:
            session_id = ids[index % len(ids)]
            index += clients
            started = time.perf_counter()
            try:
                await read(number, session_id)
            except Exception as error:
                figure.errors.append(f"{type(error).__name__}: {error}"[:300])
                continue
            figure.latencies.append(time.perf_counter() - started)

    began = time.perf_counter()
    await asyncio.gather(*(reader(number) for number in range(clients)))
    figure.seconds = time.perf_counter() - began
    figure.reads = len(figure.latencies)
    return figure


async def http_figure(label: str, ports: list[int], bearer: dict[str, str], clients: int,
                      ids: list[str], seconds: float, pids: list[int] | None = None) -> Figure:
    """Snapshot reads over HTTP, the clients spread over the web processes on ``ports``
    (whose CPU is measured when their ``pids`` are given)."""
    import httpx

    # Expire idle connections before uvicorn's 5 s keep-alive does (see bench/scale.py).
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients,
                          keepalive_expiry=2.0)
    pools = [httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=bearer,
                               timeout=60, limits=limits) for port in ports]

    async def read(number: int, session_id: str) -> None:
        answer = await pools[number % len(pools)].get(f"/api/v1/sessions/{session_id}/")
        if answer.status_code != 200:
            raise RuntimeError(f"{answer.status_code} {answer.text[:200]}")

    try:
        began = process_cpu_seconds(pids or [])
        figure = await closed_loop(label, read, clients, ids, seconds)
        if pids:
            figure.cpu_seconds = process_cpu_seconds(pids) - began
        return figure
    finally:
        for pool in pools:
            await pool.aclose()


async def direct_figure(label: str, address: str, clients: int, ids: list[str],
                        seconds: float) -> Figure:
    """The peer: the same snapshots read with the Dex SDK from this process."""
    from dex_agents import AgentSessionClient
    from tests.e2e.relay_stack import dex_client

    async with dex_client(address) as (client, flow):
        sessions = AgentSessionClient(client, flow)

        async def read(number: int, session_id: str) -> None:
            await sessions.get_agent_snapshot(session_id)

        return await closed_loop(label, read, clients, ids, seconds)


async def langgraph_figure(label: str, server: PeerServer, clients: int,
                           thread_ids: list[str], seconds: float) -> Figure:
    """The LangGraph Agent Server's thread-state reads (``GET /threads/<id>/state``) over HTTP,
    with the connection limits of ``http_figure``; its CPU is its process tree's."""
    import httpx

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients,
                          keepalive_expiry=2.0)
    async with httpx.AsyncClient(base_url=server.url, timeout=60, limits=limits) as pool:

        async def read(number: int, thread_id: str) -> None:
            answer = await pool.get(f"/threads/{thread_id}/state")
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code} {answer.text[:200]}")

        began = server.cpu_seconds()
        figure = await closed_loop(label, read, clients, thread_ids, seconds)
        figure.cpu_seconds = server.cpu_seconds() - began
        return figure


async def sessions_with_a_turn(stack: Any, count: int) -> list[str]:
    """Start ``count`` demo sessions with one message each; return them once all answered."""
    import httpx

    async with httpx.AsyncClient(base_url=stack.base_url(), timeout=60,
                                 headers=stack.personas["owner"].bearer()) as api:
        ids = []
        for number in range(count):
            answer = await api.post("/api/v1/sessions/",
                                    json={"agent": "demo", "message": f"hello {number}"})
            answer.raise_for_status()
            ids.append(str(answer.json()["id"]))
        give_up_at = time.monotonic() + 180
        for session_id in ids:
            while True:
                snapshot = (await api.get(f"/api/v1/sessions/{session_id}/")).json()
                if snapshot.get("status") == "waiting_for_user_message" and \
                        len(snapshot.get("messages", [])) >= 2:
                    break
                if time.monotonic() > give_up_at:
                    raise TimeoutError(f"{session_id} did not answer: {snapshot}")
                await asyncio.sleep(0.2)
    return ids


def baseline_tree(revision: str, into: Path) -> Path:
    """Export ``revision`` of this repository into ``into`` (``git archive``)."""
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def web_start(stack: Any, name: str, engine: str, tree: Path | None = None,
              extra_env: dict[str, str] | None = None) -> tuple[Any, int]:
    """One more uvicorn on the stack's database, reaching Dex at ``engine``, serving this tree
    or ``tree`` (with ``extra_env`` added); waits for it to serve."""
    from dex_agents.testing import free_port
    from tests.e2e.conftest import PYTHON

    port = free_port()
    argv = [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application", "--host", "127.0.0.1",
            "--port", str(port), "--no-access-log"]
    if tree is not None:
        argv[3:3] = ["--app-dir", str(tree)]
    env = {"DEX_SERVER_ADDRESS": engine, "LOG_LEVEL": "WARNING",
           # The read throttles stay on (they are by default), at a budget this one user's
           # reads stay under: DRF keeps one timestamp per request of the last period, so a
           # one-second period keeps their history (and its cost) near a real user's.
           "DEXAGENTS_THROTTLE_READS": READ_THROTTLE_RATE, **(extra_env or {})}
    if tree is not None:
        env["PYTHONPATH"] = str(tree)
    # uvicorn puts --app-dir first on sys.path, so the tree's modules are the ones imported.
    shared = stack.processes.env
    stack.processes.env = {**shared, **env}
    try:
        proc = stack.processes.start(name, argv)
    finally:
        stack.processes.env = shared
    proc.wait_for_line("Application startup complete", timeout=120)
    return proc, port


async def measure(stack: Any, args: argparse.Namespace, baseline: Path,
                  langgraph: PeerServer | None = None) -> None:
    """Every figure, with the engine next door and behind the latency proxy; ``langgraph`` is
    running LangGraph Agent Server (``bench.peer_server.peer_server``), or None to leave it
    out."""
    from bench.peer_server import peer_threads_with_a_turn

    ids = await sessions_with_a_turn(stack, args.sessions)
    threads = (await peer_threads_with_a_turn(langgraph.url, args.sessions)
               if langgraph is not None else [])
    bearer = stack.personas["owner"].bearer()
    print(f"{len(ids)} sessions with one turn each; {args.concurrency} concurrent clients, "
          f"{args.seconds:g} s per figure", flush=True)
    for rtt_ms in (0.0, args.engine_rtt_ms):
        proxy = None
        engine = stack.engine_address
        if rtt_ms:
            proxy = LatencyProxy(stack.engine_port, rtt_ms / 2000)
            engine = proxy.start()
        print(f"\nengine round trip +{rtt_ms:g} ms:", flush=True)
        started: list[Any] = []
        try:
            before, before_port = web_start(stack, "web-before", engine, baseline)
            started.append(before)
            after, after_port = web_start(stack, "web-after", engine)
            started.append(after)
            second, second_port = web_start(stack, "web-after-2", engine)
            started.append(second)
            django, django_port = web_start(stack, "web-django-path", engine,
                                            extra_env={"DEXAGENTS_SNAPSHOT_SHORT_PATH": "false"})
            started.append(django)
            pid = {before_port: before.popen.pid, after_port: after.popen.pid,
                   second_port: second.popen.pid, django_port: django.popen.pid}
            figures: dict[str, Figure] = {}
            for clients in (1, args.concurrency):
                # Warm both up (connections, first imports), then measure.
                for port in (before_port, after_port, second_port, django_port):
                    await http_figure("warm-up", [port], bearer, 4, ids, 1)
                runs = [
                    ("before, 1 process", [before_port]),
                    ("after, 1 process", [after_port]),
                    ("after, no short path", [django_port]),
                    ("after, 2 processes", [after_port, second_port]),
                ]
                for label, ports in runs:
                    figure = await http_figure(f"  c={clients:<3} {label:<20}", ports, bearer,
                                               clients, ids, args.seconds,
                                               [pid[port] for port in ports])
                    figures[f"{clients} {label}"] = figure
                    print(figure.line(), flush=True)
                    for error in figure.errors[:3]:
                        print(f"      error: {error}")
                peer = await direct_figure(f"  c={clients:<3} {'peer: Dex SDK direct':<20}",
                                           engine, clients, ids, args.seconds)
                figures[f"{clients} peer"] = peer
                print(peer.line(), flush=True)
                if langgraph is not None and not rtt_ms:
                    await langgraph_figure("warm-up", langgraph, 4, threads, 1)
                    state = await langgraph_figure(
                        f"  c={clients:<3} {'LangGraph server':<20}", langgraph, clients,
                        threads, args.seconds)
                    figures[f"{clients} langgraph"] = state
                    print(state.line(), flush=True)
                    for error in state.errors[:3]:
                        print(f"      error: {error}")
            for clients in (1, args.concurrency):
                rates = {label: figures[f"{clients} {label}"].rate or float("nan")
                         for label in ("before, 1 process", "after, 1 process",
                                       "after, no short path", "after, 2 processes", "peer")}
                print(f"  c={clients}: after / before "
                      f"x{rates['after, 1 process'] / rates['before, 1 process']:.2f}, "
                      f"2 processes / 1 "
                      f"x{rates['after, 2 processes'] / rates['after, 1 process']:.2f}, "
                      f"after / peer x{rates['after, 1 process'] / rates['peer']:.2f}, "
                      f"short path / Django path "
                      f"x{rates['after, 1 process'] / rates['after, no short path']:.2f}")
                if f"{clients} langgraph" in figures:
                    peer_state = figures[f"{clients} langgraph"]
                    ours = figures[f"{clients} after, 1 process"]
                    theirs = peer_state.rate or float("nan")
                    print(f"  c={clients}: after, 1 process / LangGraph server thread-state "
                          f"reads x{rates['after, 1 process'] / theirs:.2f} (issue 24: >= 1.0x "
                          f"per web process); server CPU per read x"
                          f"{ours.cpu_per_read / peer_state.cpu_per_read:.2f}")
            for label in ("before, 1 process", "after, 1 process"):
                scale = figures[f"{args.concurrency} {label}"].rate / (
                    figures[f"1 {label}"].rate or float("nan"))
                print(f"  {label}: c={args.concurrency} / c=1 x{scale:.2f} (a process that "
                      f"waited for Dex one call at a time would stay near x1)")
        finally:
            for proc in reversed(started):
                proc.stop()
            if proxy is not None:
                proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--engine-rtt-ms", type=float, default=20.0)
    parser.add_argument("--baseline", default=BASELINE_REVISION,
                        help="git revision served as 'before'")
    parser.add_argument("--quick", action="store_true", help="3 s per figure, 8 sessions")
    parser.add_argument("--no-langgraph-server", action="store_true",
                        help="leave out the LangGraph Agent Server's thread-state reads")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.sessions = 3.0, 8

    from bench.peer_server import peer_server, peer_venv

    python = None if args.no_langgraph_server else peer_venv()
    with tempfile.TemporaryDirectory(prefix="bench-rest-") as root:
        django_setup(Path(root))
        from tests.e2e.relay_stack import running_stack

        baseline = baseline_tree(args.baseline, Path(root) / "baseline")
        print(f"before = {args.baseline[:12]} (git archive); starting engine, demo model, "
              "worker and web ...", flush=True)
        with contextlib.ExitStack() as running:
            langgraph = None
            if python is not None:
                langgraph = running.enter_context(peer_server(Path(root) / "langgraph",
                                                              python=python))
                print(f"LangGraph Agent Server at {langgraph.url} (in-memory runtime)",
                      flush=True)
            stack = running.enter_context(
                running_stack(Path(root) / "stack", extra_env={"LOG_LEVEL": "WARNING"}))
            asyncio.run(measure(stack, args, baseline, langgraph))


if __name__ == "__main__":
    main()
