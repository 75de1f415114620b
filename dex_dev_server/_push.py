"""Push (listen) mode: the engine calls the worker's ``WorkerService`` (spec section 1.5)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.rpc import status_pb2

from ._errors import WorkerFailed, WorkerLost
from ._model import Run

_LOG = logging.getLogger("dex_dev_server")
_DETAILS_KEY = "grpc-status-details-bin"


def is_push(run: Run) -> bool:
    """Whether a run's tasks go to a listening worker instead of pull streams."""
    target = run.config.worker_target
    return bool(target.address) and not target.is_pull_mode


def worker_error_of(error: grpc.aio.AioRpcError) -> pb.WorkerErrorResponse | None:
    """The ``WorkerErrorResponse`` carried in a failed call's status details, if any."""
    for key, value in error.trailing_metadata() or ():
        if key != _DETAILS_KEY or not isinstance(value, bytes):
            continue
        with contextlib.suppress(Exception):
            status = status_pb2.Status.FromString(value)
            for packed in status.details:
                candidate = pb.WorkerErrorResponse()
                if packed.Is(candidate.DESCRIPTOR):
                    packed.Unpack(candidate)
                    return candidate
    return None


class PushClient:
    """gRPC channels to listening workers, one per address."""

    def __init__(self) -> None:
        self._channels: dict[str, grpc.aio.Channel] = {}

    def stub(self, address: str) -> Any:
        """A ``WorkerServiceStub`` for ``address`` (plaintext)."""
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                    ("grpc.max_send_message_length", 64 * 1024 * 1024),
                ],
            )
        return dex_pb2_grpc.WorkerServiceStub(channel)

    async def close(self) -> None:
        """Close every channel."""
        for channel in self._channels.values():
            await channel.close(grace=None)
        self._channels.clear()


#: Receives each output of a push call as a pull-style task frame.
FrameSink = Callable[[pb.PollWorkerTaskFrame], None]
#: Receives a push call's failure: ``(message, worker error or None, retry_free)``;
#: ``retry_free`` is true when the worker was at capacity and the attempt does not count.
FailureSink = Callable[[str, pb.WorkerErrorResponse | None, bool], None]


async def run_step(
    stub: Any,
    task: pb.PollWorkerTask,
    seconds: float,
    on_frame: FrameSink,
    on_failed: FailureSink,
) -> None:
    """Invoke one Step method on a listening worker and feed its outputs to the engine.

    ``stub`` is a ``WorkerServiceStub`` (:meth:`PushClient.stub`), ``seconds`` the method
    timeout. Every output goes to ``on_frame`` under ``task.task_id``; a call that fails or
    ends without a result goes to ``on_failed`` once. Never raises except on cancellation.
    """
    kind = task.WhichOneof("request")
    try:
        if kind == "wait_for":
            call = stub.InvokeWaitForMethod(task.wait_for, timeout=seconds)
        else:
            call = stub.InvokeExecuteMethod(task.execute, timeout=seconds)
        async for output in call:
            frame = pb.PollWorkerTaskFrame(task_id=task.task_id)
            getattr(frame, kind).CopyFrom(output)
            on_frame(frame)
            if output.WhichOneof("output") == "result":
                return
        on_failed("worker call ended without a result", None, False)
    except asyncio.CancelledError:
        raise
    except grpc.aio.AioRpcError as error:
        code = error.code()
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            on_failed("worker is at capacity", None, True)
            return
        message = error.details() or code.name
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            message = f"{kind} method timeout after {int(seconds)}s"
        on_failed(message, worker_error_of(error), False)
    except Exception as exc:
        _LOG.exception("push invocation failed")
        on_failed(f"push invocation failed: {exc}", None, False)


async def run_rpc(
    stub: Any, request: pb.InvokeWorkerRPCRequest, budget: float
) -> pb.InvokeWorkerRPCResponse:
    """Invoke an RPC on a listening worker (``stub`` from :meth:`PushClient.stub`).

    Raises ``WorkerFailed`` / ``WorkerLost``, or ``TimeoutError`` after ``budget`` seconds.
    """
    try:
        response: pb.InvokeWorkerRPCResponse = await stub.InvokeWorkerRPC(request, timeout=budget)
        return response
    except grpc.aio.AioRpcError as error:
        worker = worker_error_of(error)
        if worker is not None:
            raise WorkerFailed(worker) from None
        if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
            raise TimeoutError from None
        raise WorkerLost(pb.DISPATCH_TASK_ERROR_REASON_NO_WORKER_AVAILABLE) from None
