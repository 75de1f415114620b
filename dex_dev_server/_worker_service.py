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
from ._state import WorkerStream

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
                    clean = await self._half_closed_by_worker(stream, context, writer)
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

    async def _half_closed_by_worker(
        self, stream: WorkerStream, context: Any, writer: asyncio.Future[None]
    ) -> bool:
        """Whether the end of ``stream``'s input (EOF) was its worker's half-close, a clean
        end, rather than a dropped connection (spec section 1.4: a task in flight on a lost
        stream failed its attempt; section 9.1 #5: one unanswered at a half-close was not
        delivered). ``writer`` is the stream's :meth:`_stream_writer`.

        A dropped connection (a worker killed, a network cut) ends the input as well, and gRPC
        reports the drop by cancelling this handler a moment after the read returned EOF;
        ``context.cancelled()`` is still False at the EOF. Taking that moment for a half-close
        would send a task that was running out again at the same attempt, and a single-attempt
        write would run twice. So the stream takes no new task from the EOF on, and when a
        silent task is in flight on it (``Dispatcher.stream_input_ended``) one more frame, a
        ``ping``, is written after the frames already queued. gRPC reports a dropped call's
        cancel before any operation started on it after the EOF completes (grpcio 1.85, also
        with the event loop busy: the transport closed the call before it ended the input,
        and its completions arrive in order), so the cancel interrupts the write
        (``asyncio.CancelledError`` leaves this method and the caller ends the stream as
        dropped), or the write fails. A write that completes shows the worker's side is still
        open, as after a half-close; the worker discards frames it reads after its half-close.
        No answer within ``half_close_probe_timeout`` seconds counts as dropped, the side on
        which a single-attempt call is reported as of unknown outcome rather than run twice.

        A stream with no such task (a worker retiring a stream after its task) ends at once.
        """
        if not self.stream_input_ended(stream):
            return not context.cancelled() and not context.done()

        async def probe() -> None:
            stream.out.put_nowait(None)  # the writer returns after the frames queued before
            await writer
            await context.write(pb.PollWorkerTaskResponse(ping=pb.PollWorkerTaskPing()))

        try:
            await asyncio.wait_for(probe(), self.half_close_probe_timeout)
        except Exception:  # a failed write or no answer in time; a cancel is no Exception
            return False
        return not context.cancelled() and not context.done()

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
