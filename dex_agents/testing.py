"""Integration-test kit: a private engine, Worker child processes, gates and logs (seed "Testing
an adapter").

``AgentTestStack`` starts a private ``dex_dev_server`` by default, or ``dexcli dev --engine zd``
when ``DEXCLI`` is set (best effort: the SDK 1.23.0 protocol may not match every Dex release).
Each Worker runs ``python -m <worker_module>`` in its own process group, so a test can SIGKILL
it at an exact moment; the module calls ``run_agent_worker(flows)``.

One piece past 600 lines because adapters import the kit from this one public path (seed,
"Testing an adapter"); its parts (waits, gates, logs, the stack, the worker entry) are small.
"""

from __future__ import annotations

import asyncio
import fcntl
import importlib.util
import inspect
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import grpc
from dex import (
    AsyncClient,
    AsyncWorker,
    BlobCacheConfig,
    ClientOptions,
    Flow,
    PullWorkerOptions,
    Registry,
    WorkerOptions,
    WorkerTarget,
    open_blob_cache,
)
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2

from dex_agents._client import AgentSessionClient
from dex_agents._codecs import AgentCodecRegistry
from dex_agents._flow import AgentSessionFlow
from dex_agents._history import (
    EXECUTE_COMPLETED_EVENT,
    EXECUTE_FAILED_EVENT,
    WAIT_FOR_COMPLETED_EVENT,
    WAIT_FOR_FAILED_EVENT,
    StepHistoryEntry,
    read_flow_step_history,
)
from dex_agents._rpc_records import AgentSnapshot
from dex_agents._worker_tuning import cache_sdk_version

__all__ = [
    "BLOB_CACHE_ENV",
    "DEFAULT_TIMEOUT_SECONDS",
    "DEXCLI_ENV",
    "DEX_SERVER_ZD_BINARY_ENV",
    "EXECUTE_COMPLETED_EVENT",
    "EXECUTE_FAILED_EVENT",
    "SERVER_ADDRESS_ENV",
    "WAIT_FOR_COMPLETED_EVENT",
    "WAIT_FOR_FAILED_EVENT",
    "WORKER_READY_LINE",
    "WORKER_TASK_SLOTS",
    "AgentTestStack",
    "FileGate",
    "InvocationLog",
    "StepHistoryEntry",
    "WorkerProcess",
    "dex_server_zd_binary",
    "read_step_history",
    "run_agent_worker",
    "wait_for_agent_snapshot",
    "wait_until",
]

_T = TypeVar("_T")

#: Environment variable the stack sets for Worker children: the engine's ``host:port``.
SERVER_ADDRESS_ENV = "DEX_SERVER_ADDRESS"
#: Environment variable naming the ``dexcli`` binary; when set the stack runs
#: ``dexcli dev --engine zd`` instead of ``dex_dev_server`` (best effort, not in CI).
DEXCLI_ENV = "DEXCLI"
#: Environment variable overriding the ``dex-server-zd`` binary found next to ``dexcli``.
DEX_SERVER_ZD_BINARY_ENV = "DEX_SERVER_ZD_BINARY"
#: Environment variable naming the Worker's blob cache directory (optional).
BLOB_CACHE_ENV = "DEX_AGENTS_BLOB_CACHE"
#: The line a Worker child prints once every pull queue is registered.
WORKER_READY_LINE = "dex_agents worker ready"
#: Task slots of a test Worker (ARCHITECTURE.md "Worker slots").
WORKER_TASK_SLOTS = 32


DEFAULT_TIMEOUT_SECONDS = 30.0
#: Seconds a Worker child may take to import, warm up and register: longer than the other
#: deadlines, since on a loaded 2-core machine its start-up alone took over 30 s.
WORKER_READY_TIMEOUT_SECONDS = 90.0
_POLL_SECONDS = 0.05
_BLOB_CACHE_BYTES = 64 * 1024 * 1024


# --- polling ----------------------------------------------------------------------------------


async def wait_until(
    description: str,
    probe: Callable[[], _T | Awaitable[_T | None] | None],
    *,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - a polling deadline
    interval: float = _POLL_SECONDS,
) -> _T:
    """Poll ``probe`` (sync or async) until it returns a truthy value, and return that value.

    Raises:
        TimeoutError: After ``timeout`` seconds, naming ``description`` and the last value.
    """
    give_up_at = time.monotonic() + timeout
    last: Any = None
    while True:
        value = probe()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        last = value
        if time.monotonic() >= give_up_at:
            raise TimeoutError(f"timed out after {timeout}s waiting for {description}: {last!r}")
        await asyncio.sleep(interval)


async def wait_for_agent_snapshot(
    sessions: AgentSessionClient,
    session_id: str,
    probe: Callable[[AgentSnapshot], _T | None],
    *,
    description: str,
    timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - a polling deadline
) -> _T:
    """Poll ``get_agent_snapshot`` until ``probe(snapshot)`` is truthy; return that value.

    Raises:
        TimeoutError: After ``timeout`` seconds; the message shows the last snapshot.
    """
    last: list[AgentSnapshot] = []

    async def check() -> _T | None:
        snapshot = await sessions.get_agent_snapshot(session_id)
        last[:] = [snapshot]
        return probe(snapshot)

    try:
        return await wait_until(description, check, timeout=timeout)
    except TimeoutError as error:
        raise TimeoutError(f"{error}; last snapshot: {last[0] if last else None!r}") from None


# --- step history -----------------------------------------------------------------------------


async def read_step_history(server_address: str, flow_id: str) -> list[StepHistoryEntry]:
    """List a Flow's Step events, oldest first, through FlowService ``GetHistoryEvents``.

    Raises:
        grpc.aio.AioRpcError: If the engine rejects the request.
    """
    async with grpc.aio.insecure_channel(server_address) as channel:
        return await read_flow_step_history(
            dex_pb2_grpc.FlowServiceStub(channel), flow_id, page_timeout=DEFAULT_TIMEOUT_SECONDS
        )


# --- cross-process test helpers ---------------------------------------------------------------


class FileGate:
    """A one-shot gate shared by the test process and Worker children through files.

    A tool inside the Worker calls ``reach()`` then awaits ``wait_for_release()``; the test
    awaits ``wait_until_reached()``, acts (for example kills the Worker), then ``release()``.
    """

    def __init__(self, state_dir: str | os.PathLike[str], name: str) -> None:
        self.name = name
        self._reached = Path(state_dir) / f"gate-{name}.reached"
        self._released = Path(state_dir) / f"gate-{name}.released"

    def reach(self) -> None:
        """Mark the gate reached (inside the Worker)."""
        self._reached.parent.mkdir(parents=True, exist_ok=True)
        self._reached.write_text(str(os.getpid()))

    def is_reached(self) -> bool:
        """Whether ``reach()`` was called."""
        return self._reached.exists()

    def is_released(self) -> bool:
        """Whether ``release()`` was called."""
        return self._released.exists()

    async def wait_for_release(self, timeout: float = 300.0) -> None:  # noqa: ASYNC109
        """Wait until the test calls ``release()``.

        Raises:
            TimeoutError: After ``timeout`` seconds.
        """
        await wait_until(f"gate {self.name} released", self.is_released, timeout=timeout)

    async def wait_until_reached(
        self,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,  # noqa: ASYNC109 - the kit's API
    ) -> None:
        """Wait until a Worker calls ``reach()``.

        Raises:
            TimeoutError: After ``timeout`` seconds.
        """
        await wait_until(f"gate {self.name} reached", self.is_reached, timeout=timeout)

    def release(self) -> None:
        """Let every waiter pass."""
        self._released.parent.mkdir(parents=True, exist_ok=True)
        self._released.write_text("released")


class InvocationLog:
    """Counts real tool and model calls across processes: one locked line per ``record``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def record(self, kind: str, name: str) -> None:
        """Append ``kind`` and ``name`` (neither may contain a tab or newline)."""
        if any(character in value for value in (kind, name) for character in "\t\n"):
            raise ValueError("kind and name must not contain tabs or newlines")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                handle.write(f"{kind}\t{name}\n")
                handle.flush()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def entries(self) -> list[tuple[str, str]]:
        """Every recorded ``(kind, name)``, oldest first."""
        if not self.path.exists():
            return []
        with self.path.open("r", encoding="utf-8") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH)
            try:
                lines = handle.read().splitlines()
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)
        pairs = (line.split("\t", 1) for line in lines if line)
        return [(kind, name) for kind, name in pairs]

    def count(self, kind: str | None = None, name: str | None = None) -> int:
        """How many records match ``kind`` and ``name`` (``None`` matches anything)."""
        return sum(
            1
            for entry_kind, entry_name in self.entries()
            if (kind is None or entry_kind == kind) and (name is None or entry_name == name)
        )


# --- processes --------------------------------------------------------------------------------


def _tail(path: Path, lines: int = 40) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


_HANDED_OUT_PORTS: set[int] = set()


def free_port() -> int:
    """A free loopback TCP port that this process has not been handed before.

    gRPC shares one subchannel per target among all channels of a process, and a subchannel to
    a server that went away stays in backoff for a while: a new server that happened to get the
    same port would see its first calls fail with "connection refused". Never reusing a port
    within one test process avoids that.
    Every port a test process picks, including one where nothing is meant to listen, comes
    from here: a port probed elsewhere can be handed out again to an engine.
    """
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port: int = probe.getsockname()[1]
        if port not in _HANDED_OUT_PORTS:
            _HANDED_OUT_PORTS.add(port)
            return port


def _spawn(
    command: list[str], cwd: Path, env: dict[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """Start ``command`` in its own process group with stdout and stderr in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


class WorkerProcess:
    """A Worker child in its own process group."""

    def __init__(self, process: subprocess.Popen[bytes], log_path: Path) -> None:
        self.process = process
        self.log_path = log_path

    @property
    def pid(self) -> int:
        """The child's process ID (also its process group ID)."""
        return self.process.pid

    def kill(self) -> None:
        """SIGKILL the Worker's whole process group and reap it."""
        if self.process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout: float = DEFAULT_TIMEOUT_SECONDS) -> int:
        """SIGTERM the Worker, wait for its clean stop, and return its exit code.

        Raises:
            subprocess.TimeoutExpired: If it does not stop within ``timeout`` seconds.
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout)

    def log(self) -> str:
        """The Worker's combined stdout and stderr so far."""
        return _tail(self.log_path, 10_000)


class AgentTestStack:
    """A private engine, a Client for ``flows``, and Worker children for one test.

    Use as ``async with AgentTestStack(tmp_path, [flow], "tests.my_worker") as stack``. Leaving
    the block kills every Worker and stops the engine.

    ``engine_args`` are extra command-line arguments for the embedded engine
    (``python -m dex_dev_server``, e.g. ``["--sync", "full"]``); ``dexcli`` ignores them.

    Attributes:
        server_address: The engine's ``host:port`` once entered.
        client: An ``AsyncClient`` in pull mode for ``flows``.
    """

    def __init__(
        self,
        tmp_path: str | os.PathLike[str],
        flows: Sequence[Flow[Any]],
        worker_module: str,
        *,
        worker_cwd: str | os.PathLike[str] | None = None,
        worker_env: dict[str, str] | None = None,
        engine_args: Sequence[str] = (),
    ) -> None:
        self.tmp_path = Path(tmp_path)
        self.engine_args = list(engine_args)
        self.flows = list(flows)
        self.worker_module = worker_module
        self.worker_cwd = Path(worker_cwd) if worker_cwd is not None else Path.cwd()
        self.worker_env = dict(worker_env or {})
        self.server_address = ""
        self.registry = Registry(self.flows, AgentCodecRegistry(), allow_async_handlers=True)
        self._engine: subprocess.Popen[bytes] | None = None
        self._engine_log = self.tmp_path / "engine.log"
        self._workers: list[WorkerProcess] = []
        self._client: AsyncClient | None = None

    @property
    def engine_pid(self) -> int:
        """The engine child's process ID.

        Raises:
            RuntimeError: Outside ``async with``.
        """
        if self._engine is None:
            raise RuntimeError("AgentTestStack is not started")
        return self._engine.pid

    @property
    def client(self) -> AsyncClient:
        """The stack's ``AsyncClient``.

        Raises:
            RuntimeError: Outside ``async with``.
        """
        if self._client is None:
            raise RuntimeError("AgentTestStack is not started")
        return self._client

    async def __aenter__(self) -> AgentTestStack:
        self.tmp_path.mkdir(parents=True, exist_ok=True)
        try:
            await self._start_engine()
            cache = open_blob_cache(
                BlobCacheConfig(str(self.tmp_path / "client-cache"), _BLOB_CACHE_BYTES)
            )
            self._client = AsyncClient(
                self.registry,
                cache,
                ClientOptions(
                    server_address=self.server_address, worker_target=WorkerTarget(pull=True)
                ),
            )
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exception_type: type[BaseException] | None,
        exception: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Kill every Worker, close the Client and stop the engine."""
        for worker in self._workers:
            worker.kill()
        if self._client is not None:
            await self._client.close()
            self._client = None
        if self._engine is not None and self._engine.poll() is None:
            self._engine.terminate()
            try:
                await asyncio.to_thread(self._engine.wait, 10)
            except subprocess.TimeoutExpired:
                self._engine.kill()
                self._engine.wait()

    def sessions(self, flow: AgentSessionFlow) -> AgentSessionClient:
        """An ``AgentSessionClient`` for one of the stack's Flows."""
        return AgentSessionClient(self.client, flow)

    async def read_step_history(self, flow_id: str) -> list[StepHistoryEntry]:
        """The Flow's Step events; see the module-level ``read_step_history``."""
        return await read_step_history(self.server_address, flow_id)

    async def start_worker(
        self,
        timeout: float = WORKER_READY_TIMEOUT_SECONDS,  # noqa: ASYNC109 - readiness deadline
    ) -> WorkerProcess:
        """Start ``python -m <worker_module>`` and wait until its pull queues are registered.

        Raises:
            RuntimeError: If the child exits before it is ready (its log is in the message).
            TimeoutError: If it is not ready within ``timeout`` seconds.
        """
        index = len(self._workers) + 1
        log_path = self.tmp_path / f"worker-{index}.log"
        env = dict(os.environ)
        env.update(self.worker_env)
        env[SERVER_ADDRESS_ENV] = self.server_address
        env[BLOB_CACHE_ENV] = str(self.tmp_path / f"worker-{index}-cache")
        env["PYTHONPATH"] = os.pathsep.join(
            [str(self.worker_cwd), *filter(None, [env.get("PYTHONPATH")])]
        )
        env["PYTHONUNBUFFERED"] = "1"
        process = _spawn([sys.executable, "-m", self.worker_module], self.worker_cwd, env, log_path)
        worker = WorkerProcess(process, log_path)
        self._workers.append(worker)

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(
                    f"Worker exited with {process.returncode} before it was ready:\n"
                    f"{_tail(log_path)}"
                )
            return log_path.exists() and WORKER_READY_LINE in log_path.read_text(errors="replace")

        await wait_until(f"Worker {index} ready", ready, timeout=timeout)
        return worker

    async def _start_engine(self) -> None:
        dexcli = os.environ.get(DEXCLI_ENV)
        engine_env = _engine_env()
        if dexcli:
            engine_env[DEX_SERVER_ZD_BINARY_ENV] = dex_server_zd_binary(dexcli, os.environ)
            port = free_port()
            command = [dexcli, "dev", "--engine", "zd", "--port", str(port)]
            self.server_address = f"127.0.0.1:{port}"
        else:
            command = [
                sys.executable,
                "-m",
                "dex_dev_server",
                "--host",
                "127.0.0.1",
                "--port",
                str(free_port()),
                "--db",
                str(self.tmp_path / "dex.sqlite3"),
                *self.engine_args,
            ]
        self._engine = _spawn(command, self.tmp_path, engine_env, self._engine_log)
        engine = self._engine

        def exited() -> None:
            if engine.poll() is not None:
                raise RuntimeError(
                    f"engine exited with {engine.returncode}:\n{_tail(self._engine_log)}"
                )

        if dexcli:

            async def healthy() -> bool:
                exited()
                return await _health_check(self.server_address)

            is_healthy: bool = await wait_until("dexcli dev to serve", healthy, timeout=120.0)
            assert is_healthy
            return

        def ready_address() -> str | None:
            exited()
            for line in self._engine_log.read_text(errors="replace").splitlines():
                if line.startswith("dex_dev_server ready on "):
                    return line.removeprefix("dex_dev_server ready on ").strip()
            return None

        self.server_address = await wait_until("dex_dev_server ready", ready_address)


def dex_server_zd_binary(dexcli: str, environ: Mapping[str, str]) -> str:
    """The ``dex-server-zd`` binary for ``dexcli dev --engine zd`` (seed "Testing an adapter").

    ``DEX_SERVER_ZD_BINARY`` when set, else ``dex-server-zd`` next to ``dexcli``.

    Raises:
        FileNotFoundError: If the chosen binary does not exist.
    """
    configured = environ.get(DEX_SERVER_ZD_BINARY_ENV)
    binary = Path(configured) if configured else Path(dexcli).parent / "dex-server-zd"
    if not binary.is_file():
        source = DEX_SERVER_ZD_BINARY_ENV if configured else f"next to DEXCLI ({dexcli})"
        raise FileNotFoundError(f"dex-server-zd not found at {binary} ({source})")
    return str(binary)


def _engine_env() -> dict[str, str]:
    """The environment for the engine child, able to import ``dex_dev_server`` from here."""
    env = dict(os.environ)
    spec = importlib.util.find_spec("dex_dev_server")
    origin = spec.submodule_search_locations if spec is not None else None
    roots = [str(Path(next(iter(origin))).parent)] if origin else [str(Path.cwd())]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, [env.get("PYTHONPATH")])])
    return env


async def _health_check(server_address: str) -> bool:
    try:
        async with grpc.aio.insecure_channel(server_address) as channel:
            service = dex_pb2_grpc.FlowServiceStub(channel)
            await service.HealthCheck(empty_pb2.Empty(), timeout=2)
            return True
    except grpc.aio.AioRpcError:
        return False


# --- the Worker child -------------------------------------------------------------------------


def run_agent_worker(
    flows: Sequence[Flow[Any]],
    *,
    max_concurrent_tasks: int = WORKER_TASK_SLOTS,
    warm_up: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve ``flows`` from this process until SIGTERM (the Worker child's ``__main__``).

    Reads the engine address from ``DEX_SERVER_ADDRESS``, awaits ``warm_up()`` when given,
    runs an ``AsyncWorker`` in pull mode with
    ``PullWorkerOptions(max_concurrent_tasks=max_concurrent_tasks)`` (32 by default; the SDK
    keeps one of them for RPCs), prints ``WORKER_READY_LINE`` once every pull queue is
    registered, and stops cleanly on SIGTERM or SIGINT. A test that needs a Worker whose Step
    slots are all busy while it still answers RPCs passes ``max_concurrent_tasks=2``.

    ``warm_up`` loads, on this event loop and before the Worker registers, what its first
    Step would otherwise load while serving (a LiteLLM runner passes
    ``agents_app.worker.model_calls.model_calls_warm``, as ``manage.py dexworker`` does). A
    Worker started after a kill otherwise imports LiteLLM inside the retried model Step,
    blocking its event loop for seconds (tens under load): the pull stream that replaces the
    Step's is not opened meanwhile, the engine routes the session's RPCs only to a Flow-type
    stream while the killed Worker is still the sticky one, and answers them "no worker
    available" after 10 s.

    Raises:
        KeyError: If ``DEX_SERVER_ADDRESS`` is not set.
        Exception: Whatever ``warm_up`` raises (the Worker never registers).
    """
    asyncio.run(
        _serve(list(flows), os.environ[SERVER_ADDRESS_ENV], max_concurrent_tasks, warm_up)
    )


async def _serve(
    flows: list[Flow[Any]],
    server_address: str,
    max_concurrent_tasks: int,
    warm_up: Callable[[], Awaitable[None]] | None,
) -> None:
    cache_sdk_version()
    if warm_up is not None:
        await warm_up()
    registry = Registry(flows, AgentCodecRegistry(), allow_async_handlers=True)
    cache_dir = os.environ.get(BLOB_CACHE_ENV) or tempfile.mkdtemp(prefix="dex-agents-cache-")
    cache = open_blob_cache(BlobCacheConfig(cache_dir, _BLOB_CACHE_BYTES))
    worker = AsyncWorker(
        registry,
        cache,
        WorkerOptions(
            server_address=server_address,
            pull=PullWorkerOptions(max_concurrent_tasks=max_concurrent_tasks),
        ),
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop.set)
    serving = asyncio.create_task(worker.start())
    await worker.wait_pull_registered()
    print(WORKER_READY_LINE, flush=True)
    stopping = asyncio.create_task(stop.wait())
    await asyncio.wait((serving, stopping), return_when=asyncio.FIRST_COMPLETED)
    await worker.stop()
    stopping.cancel()
    await serving
