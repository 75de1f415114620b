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
                    # A dropped connection can also surface as EOF; only a live call
                    # that was half-closed by the worker counts as a clean end.
                    clean = not context.cancelled() and not context.done()
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
