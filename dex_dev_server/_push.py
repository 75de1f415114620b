"""Push (listen) mode: the engine calls the worker's ``WorkerService`` (spec section 1.5)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.rpc import status_pb2

from ._model import Run, StepExec

if TYPE_CHECKING:
    from ._engine import EngineState, Inflight

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


async def run_step(
    engine: EngineState,
    run: Run,
    st: StepExec,
    inflight: Inflight,
    task: pb.PollWorkerTask,
    seconds: float,
) -> None:
    """Invoke one Step method on a listening worker and feed its outputs to the engine."""
    stub = engine.push.stub(run.config.worker_target.address)
    kind = task.WhichOneof("request")
    try:
        if kind == "wait_for":
            call = stub.InvokeWaitForMethod(task.wait_for, timeout=seconds)
        else:
            call = stub.InvokeExecuteMethod(task.execute, timeout=seconds)
        async for output in call:
            frame = pb.PollWorkerTaskFrame(task_id=inflight.task_id)
            getattr(frame, kind).CopyFrom(output)
            engine.push_frame(inflight, frame)
            if output.WhichOneof("output") == "result":
                return
        engine.push_failed(inflight, "worker call ended without a result", None, False)
    except asyncio.CancelledError:
        raise
    except grpc.aio.AioRpcError as error:
        code = error.code()
        if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
            engine.push_failed(inflight, "worker is at capacity", None, True)
            return
        message = error.details() or code.name
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            message = f"{st.phase} method timeout after {int(seconds)}s"
        engine.push_failed(inflight, message, worker_error_of(error), False)
    except Exception as exc:
        _LOG.exception("push invocation failed")
        engine.push_failed(inflight, f"push invocation failed: {exc}", None, False)


async def run_rpc(
    engine: EngineState, run: Run, request: pb.InvokeWorkerRPCRequest, budget: float
) -> pb.InvokeWorkerRPCResponse:
    """Invoke an RPC on a listening worker; raises ``WorkerFailed`` / ``WorkerLost``."""
    from ._engine import WorkerFailed, WorkerLost

    stub = engine.push.stub(run.config.worker_target.address)
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
