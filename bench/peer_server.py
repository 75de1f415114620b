"""Benchmark: the platform against the LangGraph Agent Server at 1, 20 and 100 concurrent clients.

Issue 24. Both sides serve one agent turn of three parallel READ tool calls to ``--clients``
concurrent clients, each client running turns back to back, each turn on a fresh session or
thread, for ``--seconds`` per figure:

- ours: the platform as real processes, started as ``bench/scale.py`` and ``bench/rest.py``
  start it (``tests/e2e/relay_stack.py``: the embedded engine on SQLite, the demo model, one
  uvicorn, a Celery worker and a ``manage.py dexworker``; ``--workers N`` runs N dexworkers).
  A turn is ``POST /api/v1/sessions/`` ``{"agent": "demo", "message": OUR_TURN_MESSAGE}``: the
  demo model calls ``search__web_search`` three times in one response (a READ tool on the demo
  search server, which one process serves for every session), then answers with the results.
  The client then waits as a REST client would (``--wait``, one of ``TURN_WAITS``): by
  default it follows the session's websocket ``/ws/sessions/<id>/events/`` until
  ``turn_completed``; ``--wait sse`` follows Server-Sent Events; ``--wait wait`` sends and
  waits in one request (``POST /api/v1/sessions/?wait=``, as the peer's ``runs.wait``). Each
  checks that the three calls succeeded.
- the peer: the LangGraph Agent Server (``langgraph-api`` on its in-memory runtime,
  ``langgraph-runtime-inmem``, pinned in ``bench/langgraph-server-requirements.txt``) in a
  virtualenv of its own (``PEER_VENV``, made on first use: langgraph-api's grpcio and protobuf
  pins conflict with ours), started with ``langgraph_api.cli.run_server`` and ``--peer-jobs``
  runs at once (``n_jobs_per_worker``), serving the same graph shape
  (``bench/langgraph_server_graph.py``: model → three tools via ``Send`` → model). A turn is
  ``client.threads.create()`` then ``client.runs.wait(thread, "agent", input=...)`` with
  ``langgraph-sdk``, checked against the expected answer.

Interleaved: for each level, ours then the peer, ``--rounds`` times, so noise on the machine
hits both. Each side warms up first (not measured).

Prints, per side and level: turns/s, latency p50 / p99 (from the first request of a turn to
its answer), errors, and the CPU per turn of every process of the side
(``process_tree_cpu_seconds``: ours the engine, each dexworker with the MCP servers it started,
uvicorn, Celery and the demo model; the peer its server process tree), plus the bench client's
own CPU per turn (this process, in neither total); then ours / peer for turns/s (issue 24: at
100 clients with one worker >= 0.8x, goal >= 1.0x; more ``--workers`` should never lower it)
and for CPU per turn.

The two sides do not do the same work; the output says so:

- durability: ours commits every Step (each model call, each tool call) to SQLite before the
  next one runs (the engine's default ``--sync normal``: a commit survives a killed process,
  ``docs/engine-durability.md``); the peer runs with ``disable_persistence``, so nothing it
  holds survives a restart (by default its in-memory runtime pickles its state to
  ``./.langgraph_api`` every 10 s, which is no durability per Step either);
- ours calls a model over HTTP through LiteLLM and a tool over MCP stdio; the peer's model and
  tools are Python functions inside its server;
- the in-memory runtime looks for queued runs every 0.5 s when its last look found none, so at
  low load its latency is mostly that wait: turns/s and CPU per turn are the fair comparisons.

Run: ``.venv/bin/python -m bench.peer_server`` (``--quick``: 8 s at 1 and 20 clients;
``--workers 2``), or ``make bench-peer-server``. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench._cli import positive_float, positive_int
from bench._django import REPO, django_setup
from bench.langgraph_server_graph import EXPECTED_ANSWER, turn_answer, turn_input
from bench.relay import percentile

#: The pinned requirements of the peer's virtualenv (not in requirements.txt or pyproject).
PEER_REQUIREMENTS = REPO / "bench" / "langgraph-server-requirements.txt"
#: The peer's virtualenv (``var/`` is not under version control).
PEER_VENV = REPO / "var" / "bench" / "langgraph-server-venv"
#: The graph file the peer serves, as ``<path>:graph``.
PEER_GRAPH = REPO / "bench" / "langgraph_server_graph.py"
#: The graph's ID on the server, also its assistant ID.
PEER_ASSISTANT = "agent"
#: ``n_jobs_per_worker``: runs the server executes at once (issue 24's figure).
DEFAULT_PEER_JOBS = 32
#: Holds the SHA-256 of ``PEER_REQUIREMENTS`` that the virtualenv was made from.
STAMP_NAME = ".requirements-sha256"

#: The server, started by the peer virtualenv's Python: port, graph spec and jobs as arguments.
PEER_SERVER_CODE = """\
import sys
from langgraph_api.cli import run_server
run_server(host="127.0.0.1", port=int(sys.argv[1]), graphs={"agent": sys.argv[2]},
           n_jobs_per_worker=int(sys.argv[3]), open_browser=False, disable_persistence=True)
"""

#: Environment of the peer server: no tracing, no analytics, no version check, no keys, and
#: its log at WARNING (ours runs at WARNING too).
PEER_OFFLINE_ENV = {
    "LANGSMITH_TRACING": "false",
    "LANGCHAIN_TRACING_V2": "false",
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGSMITH_API_KEY": "",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LOG_LEVEL": "WARNING",
    "LOG_COLOR": "false",
    "PYTHONUNBUFFERED": "1",
}

#: Three READ tool calls in one demo-model response (``agents_app.demo.script``, ``/tool``).
OUR_TURN_MESSAGE = "\n".join(
    f"/tool search__web_search {json.dumps({'query': query})}"
    for query in ("durable agents", "agent servers", "benchmarks")
)
#: Seconds one turn may take before it counts as an error.
TURN_TIMEOUT = 120.0
#: Seconds a client pauses after an error before its next turn (no tight loop of failures).
ERROR_PAUSE = 0.5


# --- the peer's virtualenv and server ---------------------------------------------------


def peer_venv(*, venv: Path = PEER_VENV, requirements: Path = PEER_REQUIREMENTS,
              base_python: str = "python3") -> Path:
    """The Python of the LangGraph Agent Server's virtualenv, made first when needed.

    The virtualenv is reused while its stamp file holds the SHA-256 of ``requirements``;
    otherwise it is deleted, made again with ``<base_python> -m venv`` and ``pip install -r
    <requirements>`` (minutes, over the package index), then stamped. A lock file next to it
    keeps two benches from making it at once.

    Returns:
        The path of the virtualenv's ``bin/python``.

    Raises:
        subprocess.CalledProcessError: If ``venv`` or ``pip`` failed (pip's output is printed).
    """
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    python = venv / "bin" / "python"
    stamp = venv / STAMP_NAME
    venv.parent.mkdir(parents=True, exist_ok=True)
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text().strip() == digest:
            return python
        print(f"making the LangGraph Agent Server's virtualenv at {venv} from "
              f"{requirements.name} (once; a few minutes) ...", flush=True)
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
        done = subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "-r", str(requirements)],
            capture_output=True, text=True, check=False,
        )
        if done.returncode != 0:
            print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
            done.check_returncode()
        stamp.write_text(f"{digest}\n")
    return python


def _proc_stats() -> dict[int, tuple[int, float]]:
    """Every process's parent and CPU seconds: ``{pid: (ppid, utime + stime + cutime +
    cstime)}`` from ``/proc/<pid>/stat``."""
    ticks = os.sysconf("SC_CLK_TCK")
    found: dict[int, tuple[int, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # ended while listing
            continue
        found[int(entry.name)] = (int(fields[1]),
                                  sum(int(value) for value in fields[11:15]) / ticks)
    return found


def process_tree_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` and its live descendants so far.

    Each process counts with its ended, reaped children (``/proc/<pid>/stat`` utime, stime,
    cutime, cstime), so a child that ended between two readings still counts once. A process
    that is gone counts 0.0.
    """
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in stats.items():
        children.setdefault(parent, []).append(child)
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        if current in stats:
            total += stats[current][1]
        pending.extend(children.get(current, []))
    return total


@dataclass
class PeerServer:
    """A running LangGraph Agent Server.

    Attributes:
        url: Its base URL, ``http://127.0.0.1:<port>``.
        process: The server process (a process group of its own).
        log_path: Where its stdout and stderr go.
        jobs: Its ``n_jobs_per_worker``.
    """

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path
    jobs: int

    def cpu_seconds(self) -> float:
        """CPU seconds of the server's process tree so far (``process_tree_cpu_seconds``)."""
        return process_tree_cpu_seconds(self.process.pid)

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the server's output."""
        return self.log_path.read_text(errors="replace")[-chars:]


def peer_environment() -> dict[str, str]:
    """This process's environment without LangSmith, LangChain or LangGraph settings, plus
    ``PEER_OFFLINE_ENV``."""
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("LANGSMITH_", "LANGCHAIN_", "LANGGRAPH_", "LANGSERVE_"))}
    env.update(PEER_OFFLINE_ENV)
    return env


@contextlib.contextmanager
def peer_server(workdir: Path, *, jobs: int = DEFAULT_PEER_JOBS, python: Path | None = None,
                ready_timeout: float = 120.0) -> Iterator[PeerServer]:
    """Start the LangGraph Agent Server serving ``PEER_GRAPH`` as ``agent``; stop it on exit.

    It runs offline (``PEER_OFFLINE_ENV``) from ``python`` (default: ``peer_venv()``, made
    first when needed) in ``workdir``, on a free port of 127.0.0.1, with ``jobs`` runs at once
    and ``disable_persistence`` (nothing is written to disk). Ready when ``GET /ok`` answers
    200. On exit: SIGTERM to its process group, SIGKILL after 15 s.

    Raises:
        RuntimeError: If the server exited or did not answer ``/ok`` within ``ready_timeout``
            seconds (with the end of its output).
    """
    import httpx

    from dex_agents.testing import free_port

    python = python or peer_venv()
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = workdir / "langgraph-server.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(python), "-c", PEER_SERVER_CODE, str(port), f"{PEER_GRAPH}:graph", str(jobs)],
            cwd=workdir, env=peer_environment(), stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )
    server = PeerServer(f"http://127.0.0.1:{port}", process, log_path, jobs)
    try:
        deadline = time.monotonic() + ready_timeout
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"the LangGraph Agent Server exited ({process.returncode}):\n"
                                   + server.log_tail())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{server.url}/ok", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the LangGraph Agent Server did not answer /ok within "
                                   f"{ready_timeout:g} s:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()


async def peer_threads_with_a_turn(url: str, count: int) -> list[str]:
    """Create ``count`` threads on the peer server at ``url`` and run one turn on each.

    Returns:
        The thread IDs.

    Raises:
        TurnError: If a turn did not give the expected answer.
    """
    from langgraph_sdk import get_client

    client = get_client(url=url, api_key=None)
    try:
        ids = []
        for _ in range(count):
            thread = await client.threads.create()
            state = await client.runs.wait(thread["thread_id"], PEER_ASSISTANT,
                                           input=turn_input())
            _check_peer_answer(state)
            ids.append(str(thread["thread_id"]))
        return ids
    finally:
        await client.aclose()


# --- the turns ------------------------------------------------------------------------


class TurnError(Exception):
    """A turn ended without the expected answer (failed, stopped, or other results)."""


@dataclass
class Phase:
    """One side at one concurrency level for one round.

    Attributes:
        side: ``"ours"`` or ``"peer"``.
        clients: Concurrent clients.
        seconds: Wall time from the first turn's start to the last turn's end.
        latencies: Seconds of each turn that gave the expected answer.
        errors: One line per turn that did not.
        retries: 503 answers a client repeated (ours only).
        cpu: CPU seconds in the phase per process label.
        client_cpu: CPU seconds of this bench process in the phase.
    """

    side: str
    clients: int
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    retries: int = 0
    cpu: dict[str, float] = field(default_factory=dict)
    client_cpu: float = 0.0


class TurnClient(Protocol):
    """One simulated client of a side: its own connections, one turn at a time."""

    async def turn(self, phase: Phase) -> None:
        """Run one turn on a fresh session or thread; raise if it did not answer as expected."""

    async def aclose(self) -> None:
        """Close the client's connections."""


class Side(Protocol):
    """One side of the comparison."""

    name: str

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds so far of each of the side's processes (with descendants), by label."""

    def client(self) -> TurnClient:
        """A new client with its own connections."""


class OurClient:
    """A REST client of the platform: its own connection pool; ``turn`` starts a session with
    ``OUR_TURN_MESSAGE`` and waits for its turn with the side's ``wait``."""

    def __init__(self, side: OurSide) -> None:
        import httpx

        self.side = side
        self.bearer = side.stack.personas["owner"].bearer()
        # Idle connections expire before uvicorn's 5 s keep-alive does (see bench/scale.py).
        self.api = httpx.AsyncClient(
            base_url=side.stack.base_url(), headers=self.bearer, timeout=TURN_TIMEOUT,
            limits=httpx.Limits(max_connections=2, keepalive_expiry=2.0),
        )

    async def session_start(self, phase: Phase) -> str:
        """``POST /api/v1/sessions/`` with the turn's message, repeating a 503 (the engine or
        every worker slot busy) after 1 s as ``bench/scale.py`` does; the new session's ID.

        Raises:
            TurnError: If the answer is not 201 (after 30 repeated 503s at most).
        """
        path = "/api/v1/sessions/" if self.side.wait is not None else \
            f"/api/v1/sessions/?wait={int(TURN_TIMEOUT) - 10}"
        for _ in range(30):
            answer = await self.api.post(
                path, json={"agent": "demo", "message": OUR_TURN_MESSAGE})
            if answer.status_code != 503:
                break
            phase.retries += 1
            await asyncio.sleep(1)
        if answer.status_code != 201:
            raise TurnError(f"POST /api/v1/sessions/: {answer.status_code} {answer.text[:200]}")
        body = answer.json()
        if self.side.wait is None:
            wait_in_the_request(body)
        return str(body["id"])

    async def turn(self, phase: Phase) -> None:
        session_id = await self.session_start(phase)
        if self.side.wait is not None:
            await self.side.wait(self, session_id)

    async def aclose(self) -> None:
        await self.api.aclose()


async def wait_on_websocket(client: OurClient, session_id: str) -> None:
    """Follow ``/ws/sessions/<id>/events/`` from the Stream's first event until
    ``turn_completed``, as a REST client that wants the answer would.

    Raises:
        TurnError: On ``turn_failed`` or ``session_stopped``, if the socket closed first, or if
            the turn's tool calls did not finish ``succeeded`` three times.
    """
    from websockets.asyncio.client import connect

    statuses: list[str] = []
    async with connect(client.side.stack.events_url(session_id),
                       additional_headers=client.bearer, open_timeout=60, max_queue=None) as ws:
        async for raw in ws:
            if _turn_event(json.loads(raw).get("event") or {}, statuses):
                return
    raise TurnError("the websocket closed before turn_completed")


def _turn_event(event: dict[str, Any], statuses: list[str]) -> bool:
    """Track one event of the turn; True once it completed as expected.

    Raises:
        TurnError: On ``turn_failed`` or ``session_stopped``, or a completed turn whose tool
            calls did not all succeed.
    """
    kind = event.get("type")
    if kind == "tool_call_finished":
        statuses.append(str(event.get("data", {}).get("status")))
    elif kind == "turn_completed":
        if statuses != ["succeeded"] * 3:
            raise TurnError(f"turn completed with tool calls {statuses}")
        return True
    elif kind in ("turn_failed", "session_stopped"):
        raise TurnError(f"{kind}: {json.dumps(event.get('data'))[:200]}")
    return False


async def wait_on_server_sent_events(client: OurClient, session_id: str) -> None:
    """Follow ``GET /api/v1/sessions/<id>/events/`` (Server-Sent Events) from the Stream's
    first event until ``turn_completed``, as a client without websockets would.

    Raises:
        TurnError: As ``wait_on_websocket``.
    """
    statuses: list[str] = []
    async with client.api.stream("GET", f"/api/v1/sessions/{session_id}/events/",
                                 headers={"Accept": "text/event-stream"}) as stream:
        if stream.status_code != 200:
            raise TurnError(f"GET .../events/: {stream.status_code}")
        async for line in stream.aiter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line.removeprefix("data: ")).get("event") or {}
            if _turn_event(event, statuses):
                return
    raise TurnError("the event stream ended before turn_completed")


def wait_in_the_request(answer: dict[str, Any]) -> None:
    """Check the answer of ``POST /api/v1/sessions/?wait=`` (send and wait, as
    ``runs.wait`` does on the peer): the first turn completed with three search results
    (the snapshot keeps a turn's tool results as ``tool`` messages).

    Raises:
        TurnError: If the turn did not complete or a tool call did not return results.
    """
    turn = answer.get("turn") or {}
    if turn.get("status") != "completed":
        raise TurnError(f"turn {json.dumps(turn)[:200]}")
    messages = (answer.get("session") or {}).get("messages") or []
    results = [str(message.get("text", ""))[:40] for message in messages
               if message.get("role") == "tool"]
    if len(results) != 3 or not all(text.startswith("Search results for") for text in results):
        raise TurnError(f"turn completed with tool results {results}")


#: How a client of ours waits for the turn it started (``--wait``): a function of the client
#: and the session ID that returns once the turn answered as expected, else raises; ``wait``
#: (None here) holds the request that starts the session until the turn ends
#: (``POST /api/v1/sessions/?wait=``, ``wait_in_the_request``).
TurnWait = Callable[[OurClient, str], Awaitable[None]]
WAIT_DESCRIPTIONS = {
    "websocket": "/ws/sessions/<id>/events/ until turn_completed",
    "sse": "GET /api/v1/sessions/<id>/events/ as Server-Sent Events until turn_completed",
    "wait": "POST /api/v1/sessions/?wait= answers when the turn ended",
}
TURN_WAITS: dict[str, TurnWait | None] = {
    "websocket": wait_on_websocket,
    "sse": wait_on_server_sent_events,
    "wait": None,
}


class OurSide:
    """The platform's processes (a ``tests.e2e.relay_stack.Stack``) and its clients."""

    name = "ours"

    def __init__(self, stack: Any, wait: TurnWait | None) -> None:
        self.stack = stack
        self.wait = wait

    def processes(self) -> dict[str, int]:
        """The stack's processes by label: ``{label: pid}``."""
        labels = {"web": "uvicorn", "model": "demo model", "worker": "dexworker"}
        return {labels.get(proc.name, proc.name.replace("worker-", "dexworker-")):
                proc.popen.pid for proc in self.stack.processes.started}

    def cpu_seconds(self) -> dict[str, float]:
        return {label: process_tree_cpu_seconds(pid) for label, pid in self.processes().items()}

    def client(self) -> OurClient:
        return OurClient(self)


def _check_peer_answer(state: Any) -> None:
    """Raise ``TurnError`` unless ``state`` is a finished turn with ``EXPECTED_ANSWER``."""
    try:
        answer = turn_answer(state)
    except (ValueError, AttributeError) as error:
        raise TurnError(str(error)[:300]) from None
    if answer != EXPECTED_ANSWER:
        raise TurnError(f"answer {answer[:200]!r}")


class PeerClient:
    """A ``langgraph-sdk`` client of the peer server (its own connection pool); ``turn`` runs
    the graph on a fresh thread with ``runs.wait``."""

    def __init__(self, url: str) -> None:
        from langgraph_sdk import get_client

        self.client = get_client(url=url, api_key=None)

    async def turn(self, phase: Phase) -> None:
        thread = await self.client.threads.create()
        state = await self.client.runs.wait(thread["thread_id"], PEER_ASSISTANT,
                                            input=turn_input())
        _check_peer_answer(state)

    async def aclose(self) -> None:
        await self.client.aclose()


class PeerSide:
    """The LangGraph Agent Server and its clients."""

    name = "peer"

    def __init__(self, server: PeerServer) -> None:
        self.server = server

    def cpu_seconds(self) -> dict[str, float]:
        return {"langgraph server": self.server.cpu_seconds()}

    def client(self) -> PeerClient:
        return PeerClient(self.server.url)


# --- measuring ------------------------------------------------------------------------


async def measure(side: Side, clients: int, seconds: float) -> Phase:
    """``clients`` clients of ``side`` each running turns back to back; a turn started before
    ``seconds`` passed is waited for. Returns the phase's figures."""
    phase = Phase(side.name, clients)
    pool = [side.client() for _ in range(clients)]
    cpu_before = side.cpu_seconds()
    client_before = time.process_time()
    began = time.perf_counter()
    stop_at = began + seconds

    async def run(client: TurnClient) -> None:
        while time.perf_counter() < stop_at:
            started = time.perf_counter()
            try:
                async with asyncio.timeout(TURN_TIMEOUT):
                    await client.turn(phase)
            except Exception as error:
                phase.errors.append(f"{type(error).__name__}: {error}"[:300])
                await asyncio.sleep(ERROR_PAUSE)
                continue
            phase.latencies.append(time.perf_counter() - started)

    try:
        await asyncio.gather(*(run(client) for client in pool))
        phase.seconds = time.perf_counter() - began
        phase.client_cpu = time.process_time() - client_before
        cpu_after = side.cpu_seconds()
        phase.cpu = {label: cpu_after[label] - cpu_before.get(label, 0.0)
                     for label in cpu_after}
    finally:
        for client in pool:
            await client.aclose()
    return phase


async def warm_up(side: Side, clients: int) -> None:
    """A few turns not measured: one client alone, then ``clients`` at once (first imports,
    connections, the demo search server's start).

    Raises:
        TurnError: If a warm-up turn failed (the side does not work; no point measuring).
    """
    for concurrency in (1, clients):
        phase = await measure(side, concurrency, 0.5)
        if phase.errors:
            raise TurnError(f"{side.name} failed its warm-up: {phase.errors[0]}")


@dataclass
class Totals:
    """One side at one level, over its rounds."""

    phases: list[Phase] = field(default_factory=list)

    @property
    def turns(self) -> int:
        return sum(len(phase.latencies) for phase in self.phases)

    @property
    def rate(self) -> float:
        seconds = sum(phase.seconds for phase in self.phases)
        return self.turns / seconds if seconds else 0.0

    @property
    def latencies(self) -> list[float]:
        return [seconds for phase in self.phases for seconds in phase.latencies]

    @property
    def errors(self) -> int:
        return sum(len(phase.errors) for phase in self.phases)

    def cpu_ms_per_turn(self) -> dict[str, float]:
        """CPU milliseconds per answered turn, by process label."""
        labels = {label: 0.0 for phase in self.phases for label in phase.cpu}
        for phase in self.phases:
            for label, seconds in phase.cpu.items():
                labels[label] += seconds
        return {label: seconds * 1000 / max(self.turns, 1) for label, seconds in labels.items()}

    def client_cpu_ms_per_turn(self) -> float:
        return sum(phase.client_cpu for phase in self.phases) * 1000 / max(self.turns, 1)


def phase_lines(phase: Phase) -> list[str]:
    """The printed lines of one phase."""
    turns = len(phase.latencies)
    rate = turns / phase.seconds if phase.seconds else 0.0
    head = f"  {phase.side:<4} c={phase.clients:<3} {rate:7.1f} turns/s ({turns} in " \
           f"{phase.seconds:.1f} s)"
    if phase.latencies:
        head += (f", p50 {percentile(phase.latencies, 0.5) * 1000:7.1f} ms, "
                 f"p99 {percentile(phase.latencies, 0.99) * 1000:7.1f} ms")
    head += f", errors {len(phase.errors)}"
    if phase.retries:
        head += f" (503 repeated: {phase.retries})"
    per_turn = max(turns, 1)
    cpu = ", ".join(f"{label} {seconds * 1000 / per_turn:.1f}"
                    for label, seconds in phase.cpu.items())
    total = sum(phase.cpu.values()) * 1000 / per_turn
    lines = [head, f"       CPU ms/turn: {cpu}; total {total:.1f} "
                   f"(bench client {phase.client_cpu * 1000 / per_turn:.1f}, in neither total)"]
    lines += [f"       error: {error}" for error in phase.errors[:3]]
    return lines


def _latency(totals: Totals) -> str:
    latencies = totals.latencies
    if not latencies:
        return f"{'-':>15}"
    return (f"{percentile(latencies, 0.5) * 1000:7.0f}/"
            f"{percentile(latencies, 0.99) * 1000:<7.0f}")


def summary_lines(levels: list[int], ours: dict[int, Totals], peer: dict[int, Totals],
                  workers: int) -> list[str]:
    """The closing table: per level, both sides' figures and ours / peer."""
    lines = [
        "",
        f"Summary ({workers} dexworker{'s' if workers > 1 else ''}; latency p50/p99 in ms; "
        "CPU = every process of the side, ms per turn):",
        f"  {'clients':>7} {'ours t/s':>9} {'peer t/s':>9} {'ours/peer':>9}   "
        f"{'ours p50/p99':>15} {'peer p50/p99':>15}   {'ours CPU':>8} {'peer CPU':>8} "
        f"{'ours/peer':>9}   {'errors':>9}",
    ]
    for level in levels:
        mine, theirs = ours[level], peer[level]
        rate = mine.rate / theirs.rate if theirs.rate else float("nan")
        my_cpu = sum(mine.cpu_ms_per_turn().values())
        their_cpu = sum(theirs.cpu_ms_per_turn().values())
        cpu = my_cpu / their_cpu if their_cpu else float("nan")
        lines.append(
            f"  {level:>7} {mine.rate:9.1f} {theirs.rate:9.1f} {rate:8.2f}x   "
            f"{_latency(mine):>15} {_latency(theirs):>15}   {my_cpu:8.1f} {their_cpu:8.1f} "
            f"{cpu:8.2f}x   {mine.errors:>4}/{theirs.errors:<4}")
    return lines


def header_lines(args: argparse.Namespace, server: PeerServer) -> list[str]:
    """What is compared, printed before the figures."""
    return [
        f"ours: the platform (embedded engine on SQLite, demo model, uvicorn, Celery, "
        f"{args.workers} dexworker{'s' if args.workers > 1 else ''} x {args.worker_slots} "
        f"slots); a turn = POST /api/v1/sessions/ whose message makes the demo model call "
        f"search__web_search (READ) 3 times in parallel, then answer; wait: {args.wait} "
        f"({WAIT_DESCRIPTIONS[args.wait]})",
        f"peer: LangGraph Agent Server (langgraph-api, in-memory runtime) at {server.url}, "
        f"n_jobs_per_worker={server.jobs}; a turn = threads.create + runs.wait of "
        "model -> 3 tools (Send) -> model",
        "durability: ours commits every Step to SQLite before the next runs (engine default "
        "--sync normal: survives a killed process); the peer runs with disable_persistence: "
        "nothing it holds survives a restart",
        "work: ours calls the demo model over HTTP (LiteLLM) and the tool over MCP stdio; the "
        "peer's model and tools are Python functions in its server",
        "latency: the peer's in-memory runtime looks for queued runs every 0.5 s when its last "
        "look found none, so its latency is printed as served but is mostly that wait at low "
        "load; turns/s and CPU per turn are the fair comparisons",
        f"{args.seconds:g} s per figure, levels {','.join(map(str, args.levels))}, "
        f"{args.rounds} round(s), interleaved (ours, then the peer, per level); load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs",
    ]


async def run(args: argparse.Namespace, stack: Any, server: PeerServer) -> None:
    """Warm both sides up, measure every level interleaved, print everything."""
    sides: list[Side] = [OurSide(stack, TURN_WAITS[args.wait]), PeerSide(server)]
    for line in header_lines(args, server):
        print(line)
    print("\nwarming up ...", flush=True)
    for side in sides:
        await warm_up(side, min(max(args.levels), 8))
    totals: dict[str, dict[int, Totals]] = {side.name: {} for side in sides}
    for level in args.levels:
        print(f"\n{level} client{'s' if level > 1 else ''}:", flush=True)
        for _ in range(args.rounds):
            for side in sides:
                phase = await measure(side, level, args.seconds)
                totals[side.name].setdefault(level, Totals()).phases.append(phase)
                print("\n".join(phase_lines(phase)), flush=True)
        mine, theirs = totals["ours"][level], totals["peer"][level]
        ratio = mine.rate / theirs.rate if theirs.rate else float("nan")
        print(f"  ours / peer turns/s: x{ratio:.2f}", flush=True)
    for line in summary_lines(args.levels, totals["ours"], totals["peer"], args.workers):
        print(line)
    print("  (issue 24: ours/peer turns/s at 100 clients with one dexworker >= 0.8x, goal "
          ">= 1.0x; with more --workers it should never be lower)")


def _levels(text: str) -> list[int]:
    """An ``argparse`` type: comma-separated client counts, each at least 1."""
    return [positive_int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    """Parse the command line, start both sides, run the benchmark."""
    parser = argparse.ArgumentParser(prog="python -m bench.peer_server",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=_levels, default=None,
                        help="concurrency levels, comma-separated (default 1,20,100; "
                        "--quick: 1,20)")
    parser.add_argument("--seconds", type=positive_float, default=None,
                        help="seconds per figure (default 20; --quick: 8)")
    parser.add_argument("--rounds", type=positive_int, default=1,
                        help="measure each level this many times per side, interleaved")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="dexworker processes on our side")
    parser.add_argument("--worker-slots", type=positive_int, default=32,
                        help="--max-concurrent-tasks of each dexworker")
    parser.add_argument("--peer-jobs", type=positive_int, default=DEFAULT_PEER_JOBS,
                        help="n_jobs_per_worker of the LangGraph Agent Server")
    parser.add_argument("--wait", choices=sorted(TURN_WAITS), default="websocket",
                        help="how a client of ours waits for its turn's answer")
    parser.add_argument("--quick", action="store_true", help="8 s per figure, 1 and 20 clients")
    args = parser.parse_args()
    if args.clients is None:
        args.clients = [1, 20] if args.quick else [1, 20, 100]
    if args.seconds is None:
        args.seconds = 8.0 if args.quick else 20.0
    args.levels = args.clients

    python = peer_venv()
    with tempfile.TemporaryDirectory(prefix="bench-peer-server-") as root:
        django_setup(Path(root))
        from bench.scale import workers_add
        from tests.e2e.relay_stack import running_stack

        print(f"starting the LangGraph Agent Server, then our engine, demo model, web and "
              f"{args.workers} dexworker(s) ...", flush=True)
        with peer_server(Path(root) / "peer", jobs=args.peer_jobs, python=python) as server, \
                running_stack(Path(root) / "stack", extra_env={"LOG_LEVEL": "WARNING"},
                              worker_slots=args.worker_slots) as stack:
            workers_add(stack, args.workers, args.worker_slots)
            asyncio.run(run(args, stack, server))


if __name__ == "__main__":
    main()
