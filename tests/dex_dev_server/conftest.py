"""Fixtures: a real engine subprocess, the real SDK AsyncClient and a pull AsyncWorker."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
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
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2

from dex_agents.testing import free_port

from .blob_audit import audit
from .flows import ALL_FLOWS

REPO = Path(__file__).resolve().parents[2]
READY_PREFIX = "dex_dev_server ready on "


class EngineProcess:
    """The engine as a real ``python -m dex_dev_server`` child process."""

    def __init__(self, db: Path, log: Path, args: Sequence[str] = ()) -> None:
        self.db = db
        self.log = log
        self.args = list(args)
        # A port never handed out before in this process (see dex_agents.testing.free_port);
        # restarts of this engine keep it.
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 20.0) -> None:
        log = self.log.open("a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dex_dev_server", "--host", "127.0.0.1",
             "--port", str(self.port), "--db", str(self.db), "--log-level", "info",
             *self.args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if line.startswith(READY_PREFIX) or not line:
                break
        assert line.startswith(READY_PREFIX), f"engine did not start: {line!r}"
        self.port = int(line.strip().rsplit(":", 1)[1])
        wait_reachable(self.address, max(deadline - time.monotonic(), 1.0))

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(15)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_reachable(address: str, timeout: float) -> None:
    """Block until a ``GetServerInfo`` on a new grpc.aio channel to ``address`` succeeds.

    grpc.aio channels of one process share a subchannel per target. While an engine is down,
    a channel this process holds (the ``dex`` worker's, during a kill and restart on the same
    port) keeps reconnecting, and the shared subchannel sits in back-off for up to seconds
    after the new engine listens: a fail-fast call on any channel is refused until then. A
    ``wait_for_ready`` call waits that back-off out, so calls made after this return are not.
    The call runs on its own event loop in a thread, as ``start()`` is called from async tests.

    Raises:
        grpc.RpcError: If the engine does not answer within ``timeout`` seconds.
    """

    async def call() -> None:
        async with grpc.aio.insecure_channel(address) as channel:
            await dex_pb2_grpc.FlowServiceStub(channel).GetServerInfo(
                empty_pb2.Empty(), timeout=timeout, wait_for_ready=True
            )

    failure: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(call())
        except BaseException as error:  # re-raised in the calling thread
            failure.append(error)

    thread = threading.Thread(target=run, name="wait-reachable")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


@pytest.fixture
def engine_args() -> list[str]:
    """Extra ``python -m dex_dev_server`` arguments of the ``engine`` fixture (a test module
    overrides this fixture to change them)."""
    return []


@pytest.fixture
def engine(tmp_path: Path, engine_args: list[str]) -> Iterator[EngineProcess]:
    proc = EngineProcess(tmp_path / "engine.sqlite3", tmp_path / "engine.log", engine_args)
    proc.start()
    yield proc
    proc.stop()
    # Whatever the test did to the engine, no stored blob reference may lack its blob.
    dangling = audit(proc.db).dangling
    assert not dangling, f"blob references without their blob: {sorted(dangling)}"


@dataclass
class DexEnv:
    engine: EngineProcess
    registry: Registry
    client: AsyncClient
    worker: AsyncWorker


def pull_client(registry: Registry, cache: Any, address: str) -> AsyncClient:
    """An ``AsyncClient`` of the engine at ``address`` whose Flows run on pull workers."""
    options = ClientOptions(server_address=address, worker_target=WorkerTarget(pull=True))
    return AsyncClient(registry, cache, options)


@asynccontextmanager
async def engine_client(address: str, cache_dir: Path) -> AsyncIterator[AsyncClient]:
    """A :func:`pull_client` for the test Flows with its own blob cache, closed afterwards."""
    cache = open_blob_cache(BlobCacheConfig(str(cache_dir), 16 * 1024 * 1024))
    client = pull_client(Registry(ALL_FLOWS, allow_async_handlers=True), cache, address)
    try:
        yield client
    finally:
        await client.close()
        cache.close()


@pytest.fixture
async def dex(engine: EngineProcess, tmp_path: Path) -> AsyncIterator[DexEnv]:
    registry = Registry(ALL_FLOWS, allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "blobs"), 16 * 1024 * 1024))
    client = pull_client(registry, cache, engine.address)
    worker = AsyncWorker(
        registry,
        cache,
        WorkerOptions(
            server_address=engine.address,
            pull=PullWorkerOptions(max_concurrent_tasks=32),
        ),
    )
    # AsyncWorker.start() serves until stop(), so it runs as a task. Should the worker not
    # register, the task is still stopped and awaited: a failed task left to the garbage
    # collector logs its traceback from inside whatever code the collection interrupts.
    runner = asyncio.create_task(worker.start())
    try:
        await worker.wait_pull_registered(timeout=20)
        yield DexEnv(engine, registry, client, worker)
    finally:
        await asyncio.wait_for(worker.stop(), 20)
        await asyncio.wait_for(asyncio.gather(runner, return_exceptions=True), 20)
        await client.close()
        cache.close()


async def eventually(predicate, within: float = 10.0, interval: float = 0.05):
    """Poll an async or sync predicate until it returns a truthy value or time runs out."""
    deadline = time.monotonic() + within
    last = None
    while time.monotonic() < deadline:
        last = predicate()
        if asyncio.iscoroutine(last):
            last = await last
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"condition not met within {within}s (last value {last!r})")


os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
