"""How a pull stream's end decides the fate of a task in flight on it
(``dex_dev_server._worker_service``, spec sections 1.4 and 9.1 #5): the worker's half-close
hands an unanswered task out again at the same attempt; a dropped connection (a worker
killed while its Step ran) fails the attempt, so a single-attempt write never runs twice.

gRPC ends a dropped call's input (EOF) before it reports the cancel, so some tests here stand
in for gRPC's server call object (the transport, outside the process) to put the two events in
that order on purpose; the last one kills a real stream process.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
from dex import AsyncClient
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_dev_server._server import EngineServer
from dex_dev_server._service import Engine
from dex_dev_server._worker_service import WorkerTaskServicer

from . import flows
from .conftest import REPO, EngineProcess, engine_client
from .silent_stream_main import attempt_of

FLOW_TYPE = "SignalFlow"


class ServerCall:
    """The server side of one ``PollWorkerTask`` call, as grpc.aio hands it to the handler.

    The test plays both the worker (the frames it sends, the end of its input) and the
    transport (a dropped connection, whose cancel gRPC delivers by cancelling the handler's
    task). As grpc.aio does between a dropped connection's EOF and its cancel, ``cancelled()``
    and ``done()`` answer False, and a write after the drop does not complete.
    """

    def __init__(self, worker: str) -> None:
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()
        self.outgoing: asyncio.Queue[pb.PollWorkerTaskResponse] = asyncio.Queue()
        self.input_ended = asyncio.Event()
        self.dropped = False
        self.incoming.put_nowait(pb.PollWorkerTaskRequest(register=pb.PollWorkerTaskRegister(
            queue=FLOW_TYPE, app_worker_id=worker, flow_types=[FLOW_TYPE])))

    async def read(self) -> Any:
        frame = await self.incoming.get()
        if frame is grpc.aio.EOF:
            self.input_ended.set()
        return frame

    async def write(self, frame: pb.PollWorkerTaskResponse) -> None:
        if self.dropped:
            await asyncio.Event().wait()  # until the cancel (or a timeout) ends the wait
        self.outgoing.put_nowait(frame)

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def half_close(self) -> None:
        """The worker's half-close: the end of its input, the call still open."""
        self.incoming.put_nowait(grpc.aio.EOF)

    def drop(self) -> None:
        """The first sign of a dropped connection: the end of its input (the cancel is the
        test's to deliver)."""
        self.dropped = True
        self.incoming.put_nowait(grpc.aio.EOF)

    async def next_task(self, within: float = 10.0) -> pb.PollWorkerTask:
        """The next task the engine sends on this call."""
        async def first_task() -> pb.PollWorkerTask:
            while True:
                frame = await self.outgoing.get()
                if frame.WhichOneof("frame") == "task":
                    return frame.task
        return await asyncio.wait_for(first_task(), within)


@asynccontextmanager
async def in_process_engine(tmp_path: Path) -> AsyncIterator[tuple[Engine, AsyncClient]]:
    """An engine serving on a free port in this event loop, and a client of it."""
    server = EngineServer(tmp_path / "engine.sqlite3", port=0)
    await server.start()
    assert server.engine is not None
    try:
        async with engine_client(server.address, tmp_path / "blobs") as client:
            yield server.engine, client
    finally:
        await server.stop(grace=0)


def open_stream(engine: Engine, call: ServerCall) -> asyncio.Task[None]:
    """Run the engine's ``PollWorkerTask`` handler for ``call`` as gRPC does: in a task."""
    return asyncio.ensure_future(WorkerTaskServicer(engine).PollWorkerTask(None, call))


async def finished(handler: asyncio.Task[None]) -> None:
    await asyncio.wait_for(asyncio.gather(handler, return_exceptions=True), 10)


async def test_a_connection_dropped_after_its_end_of_input_fails_the_running_attempt(
    tmp_path: Path,
) -> None:
    async with in_process_engine(tmp_path) as (engine, client):
        # The cancel decides, not a timeout.
        engine.half_close_probe_timeout = 60.0
        lost = ServerCall("lost")
        lost_handler = open_stream(engine, lost)
        await client.start_flow(flows.SIGNAL, "dropped-1", None)
        first = await lost.next_task()
        assert attempt_of(first) == 1
        other = ServerCall("other")
        other_handler = open_stream(engine, other)

        lost.drop()
        await lost.input_ended.wait()
        lost_handler.cancel()  # gRPC's report of the dropped connection
        await finished(lost_handler)

        again = await other.next_task()
        assert again.task_id != first.task_id
        assert attempt_of(again) == 2
        other_handler.cancel()
        await finished(other_handler)


async def test_a_half_close_with_a_task_unanswered_sends_it_again_at_the_same_attempt(
    tmp_path: Path,
) -> None:
    async with in_process_engine(tmp_path) as (engine, client):
        retiring = ServerCall("retiring")
        retiring_handler = open_stream(engine, retiring)
        await client.start_flow(flows.SIGNAL, "half-closed-1", None)
        first = await retiring.next_task()
        other = ServerCall("other")
        other_handler = open_stream(engine, other)

        retiring.half_close()
        await finished(retiring_handler)
        assert retiring_handler.exception() is None

        again = await other.next_task()
        assert again.task_id != first.task_id
        assert attempt_of(again) == 1
        other_handler.cancel()
        await finished(other_handler)


async def test_an_end_of_input_not_confirmed_in_time_counts_as_a_drop(tmp_path: Path) -> None:
    """Neither the half-close confirmed nor a cancel within the bound (a worker frozen as its
    connection went): the attempt fails, so a single-attempt call is not run twice."""
    async with in_process_engine(tmp_path) as (engine, client):
        engine.half_close_probe_timeout = 0.2
        frozen = ServerCall("frozen")
        frozen_handler = open_stream(engine, frozen)
        await client.start_flow(flows.SIGNAL, "unconfirmed-1", None)
        first = await frozen.next_task()
        other = ServerCall("other")
        other_handler = open_stream(engine, other)

        frozen.drop()
        await finished(frozen_handler)

        again = await other.next_task()
        assert again.task_id != first.task_id
        assert attempt_of(again) == 2
        other_handler.cancel()
        await finished(other_handler)


async def test_a_stream_half_closed_without_a_task_ends_at_once(tmp_path: Path) -> None:
    """The SDK's pull worker retires a stream right after its task (spec 9.2 "Stream
    churn"): with nothing in flight there is nothing to decide, and the call ends without
    waiting for a cancel."""
    async with in_process_engine(tmp_path) as (engine, client):
        engine.half_close_probe_timeout = 60.0
        serving = ServerCall("serving")
        serving_handler = open_stream(engine, serving)
        await client.start_flow(flows.SIGNAL, "retired-1", None)
        await serving.next_task()
        spare = ServerCall("serving")
        spare_handler = open_stream(engine, spare)
        await asyncio.wait_for(spare.outgoing.get(), 10)  # registered

        spare.half_close()
        await finished(spare_handler)
        assert spare_handler.exception() is None
        serving_handler.cancel()
        await finished(serving_handler)


def spawn_silent_stream(address: str) -> subprocess.Popen[str]:
    """A ``silent_stream_main`` process on :data:`FLOW_TYPE`'s queue of the engine at
    ``address``."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.dex_dev_server.silent_stream_main", address, FLOW_TYPE],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


async def test_a_stream_process_killed_with_a_task_fails_its_attempt(
    engine: EngineProcess, tmp_path: Path
) -> None:
    """A real stream whose process is SIGKILLed while it holds a task it has not answered (a
    Step running that wrote nothing yet). gRPC reads the end of its input before it reports
    the cancel; the task used to go out again at attempt 1."""
    silent = spawn_silent_stream(engine.address)
    try:
        async with engine_client(engine.address, tmp_path / "blobs") as client, \
                grpc.aio.insecure_channel(engine.address) as channel:
            await client.start_flow(flows.SIGNAL, "killed-1", None)
            assert silent.stdout is not None
            line = await asyncio.wait_for(asyncio.to_thread(silent.stdout.readline), 20)
            assert line.strip() == "task 1"
            stream = dex_pb2_grpc.WorkerTaskServiceStub(channel).PollWorkerTask()
            await stream.write(pb.PollWorkerTaskRequest(register=pb.PollWorkerTaskRegister(
                queue=FLOW_TYPE, app_worker_id="next", flow_types=[FLOW_TYPE])))
            assert (await stream.read()).WhichOneof("frame") == "registered"

            await asyncio.to_thread(kill, silent)
            again = await asyncio.wait_for(stream.read(), 10)
            assert again.WhichOneof("frame") == "task"
            assert attempt_of(again.task) == 2
            stream.cancel()
    finally:
        await asyncio.to_thread(kill, silent)
