"""gRPC error statuses carrying ``dex.ServiceErrorResponse`` details (Dex spec section 5)."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from dex.dexpb import dex_pb2 as pb
from google.protobuf import any_pb2
from google.rpc import status_pb2

_DETAILS_KEY = "grpc-status-details-bin"
# gRPC clients reject response metadata over 8 KiB (their default soft limit), and the
# status message travels twice (percent-encoded, and inside the details trailer). Engine
# messages quote request fields such as flow IDs, which may be arbitrarily long, so the
# message and the stack trace are clipped to keep every error deliverable.
MAX_MESSAGE_BYTES = 1024
MAX_STACK_TRACE_BYTES = 1024


def clip(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, marking a cut with ``...``."""
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return text
    return data[: limit - 3].decode("utf-8", "ignore") + "..."


@dataclass
class ServiceError(Exception):
    """An RPC failure mapped to a gRPC code plus a ``ServiceErrorResponse`` detail.

    The gRPC status message equals ``message`` (the worker detail for worker failures), and
    the trailer repeats the same code and message, as the SDK's ``rpc_status.from_call``
    requires (spec section 9.1 #11).
    """

    code: grpc.StatusCode
    sub_status: int
    message: str
    worker_detail: str = ""
    worker_type: str = ""
    worker_status: int = 0
    worker_stack_trace: str = ""
    dispatch_reason: int = 0

    def __post_init__(self) -> None:
        self.message = clip(self.message, MAX_MESSAGE_BYTES)
        self.worker_detail = clip(self.worker_detail, MAX_MESSAGE_BYTES)
        self.worker_type = clip(self.worker_type, 256)
        self.worker_stack_trace = clip(self.worker_stack_trace, MAX_STACK_TRACE_BYTES)

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"

    def details(self) -> pb.ServiceErrorResponse:
        """Return the ``ServiceErrorResponse`` packed into the status trailer."""
        return pb.ServiceErrorResponse(
            detail="" if self.worker_detail else self.message,
            sub_status=self.sub_status,  # type: ignore[arg-type]
            original_worker_error_detail=self.worker_detail,
            original_worker_error_type=self.worker_type,
            original_worker_error_status=self.worker_status,
            original_worker_error_stack_trace=self.worker_stack_trace,
            dispatch_task_error_reason=self.dispatch_reason,  # type: ignore[arg-type]
        )

    def trailing_metadata(self) -> tuple[tuple[str, bytes], ...]:
        """Return the ``grpc-status-details-bin`` trailer for this error."""
        packed = any_pb2.Any()
        packed.Pack(self.details())
        status = status_pb2.Status(
            code=self.code.value[0], message=self.message, details=[packed]
        )
        return ((_DETAILS_KEY, status.SerializeToString()),)


def invalid(message: str) -> ServiceError:
    """``INVALID_ARGUMENT`` + ``UNCATEGORIZED``: a malformed request."""
    return ServiceError(
        grpc.StatusCode.INVALID_ARGUMENT, pb.ERROR_SUB_STATUS_UNCATEGORIZED, message
    )


def not_found(flow_id: str, message: str = "") -> ServiceError:
    """``NOT_FOUND`` + ``FLOW_NOT_EXISTS``: flow missing, or closed for an active-only call."""
    return ServiceError(
        grpc.StatusCode.NOT_FOUND,
        pb.ERROR_SUB_STATUS_FLOW_NOT_EXISTS,
        message or f"flow {flow_id!r} does not exist or is not running",
    )


def long_poll_timeout(message: str = "long poll timed out") -> ServiceError:
    """``DEADLINE_EXCEEDED`` + ``LONG_POLL_TIME_OUT``."""
    return ServiceError(
        grpc.StatusCode.DEADLINE_EXCEEDED, pb.ERROR_SUB_STATUS_LONG_POLL_TIME_OUT, message
    )


def channel_message_not_found(message: str) -> ServiceError:
    """``NOT_FOUND`` + ``CHANNEL_MESSAGE_NOT_FOUND``."""
    return ServiceError(
        grpc.StatusCode.NOT_FOUND, pb.ERROR_SUB_STATUS_CHANNEL_MESSAGE_NOT_FOUND, message
    )


def uncategorized(code: grpc.StatusCode, message: str) -> ServiceError:
    """Any code with ``UNCATEGORIZED`` sub-status."""
    return ServiceError(code, pb.ERROR_SUB_STATUS_UNCATEGORIZED, message)


class WorkerFailed(Exception):
    """The worker answered an RPC task with a ``WorkerErrorResponse``."""

    def __init__(self, error: pb.WorkerErrorResponse) -> None:
        super().__init__(error.detail)
        self.error = error


class WorkerLost(Exception):
    """No worker ran an RPC task to the end (``reason`` is a DispatchTaskErrorReason)."""

    def __init__(self, reason: int) -> None:
        super().__init__("worker unavailable")
        self.reason = reason
