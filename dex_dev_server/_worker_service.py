"""WorkerTaskService: the pull workers' bidirectional ``PollWorkerTask`` stream (spec 1.4)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from ._errors import ServiceError, invalid
from ._runs import RunEngine

_LOG = logging.getLogger("dex_dev_server")

#: How long after a stream's end of input the engine waits for the transport to report a
#: dropped connection before it takes the end for the worker's own half-close.
HALF_CLOSE_GRACE_SECONDS = 0.5


async def half_closed_by_worker(context: Any, grace: float = HALF_CLOSE_GRACE_SECONDS) -> bool:
    """Whether the end of a worker stream's input was the worker's half-close (a clean end,
    spec sections 8 and 9.1 #5: its unanswered task was not delivered) rather than a dropped
    connection (its task was running: the attempt fails).

    A dropped connection (a worker killed, a network cut) also ends the input, and gRPC
    reports the call cancelled as a separate event that may come a moment later, on a busy
    machine after the end of input. Taking that moment for a half-close would hand a task
    that was running out again at the same attempt, and a single-attempt write would run
    twice; so the end counts as clean only while the call stays live for ``grace`` seconds.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while not (context.cancelled() or context.done()):
        if loop.time() >= deadline:
            return True
        await asyncio.sleep(0.02)
    return False


class WorkerTaskService(RunEngine):
    """The PollWorkerTask handler: registers a stream and relays its frames."""

    # Pull workers -------------------------------------------------------------------------------

    async def PollWorkerTask(self, request_iterator: Any, context: Any) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        if first.WhichOneof("frame") != "register":
            raise invalid("the first frame must be register")
        reg = first.register
        if not reg.queue or not reg.app_worker_id:
            raise invalid("register needs queue and app_worker_id")
        if reg.queue != reg.app_worker_id and reg.queue not in reg.flow_types:
            raise invalid("queue must be the app_worker_id or one of flow_types")
        await context.write(
            pb.PollWorkerTaskResponse(
                registered=pb.PollWorkerTaskRegistered(supports_unknown_name_rejection=True)
            )
        )
        stream = self.register_stream(reg.queue, reg.app_worker_id, reg.flow_types)
        writer = asyncio.ensure_future(self._stream_writer(stream, context))
        clean = False
        try:
            while True:
                frame = await context.read()
                if frame is grpc.aio.EOF:
                    clean = await half_closed_by_worker(context)
                    break
                try:
                    self.on_frame(stream, frame)
                except Exception:
                    _LOG.exception("failed to handle a worker frame")
        finally:
            self.stream_ended(stream, clean=clean)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await writer

    async def _stream_writer(self, stream: Any, context: Any) -> None:
        while True:
            frame = await stream.out.get()
            if frame is None:
                return
            if frame.WhichOneof("frame") == "task" and stream.half_closed:
                continue
            await context.write(frame)


class WorkerTaskServicer(dex_pb2_grpc.WorkerTaskServiceServicer):
    """The gRPC servicer of WorkerTaskService, delegating to an engine's ``PollWorkerTask``."""

    def __init__(self, engine: WorkerTaskService) -> None:
        self._engine = engine

    async def PollWorkerTask(self, request_iterator: Any, context: Any) -> None:
        try:
            await self._engine.PollWorkerTask(request_iterator, context)
        except ServiceError as err:
            await context.abort(err.code, err.message, trailing_metadata=err.trailing_metadata())
