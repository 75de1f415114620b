"""The embedded engine assembled from its gRPC services, and their registration (spec section 4).

Each FlowService area lives in its own module (``_flow_service``, ``_history_service``,
``_channel_service``, ``_attribute_service``, ``_step_service``, ``_rpc_service``,
``_stream_service``) and the pull workers' WorkerTaskService in ``_worker_service``; all of
them build on :class:`~dex_dev_server._runs.RunEngine`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from ._attribute_service import AttributeService
from ._channel_service import ChannelService
from ._errors import ServiceError, uncategorized
from ._flow_service import SERVER_VERSION, FlowLifecycleService
from ._history_service import HistoryService
from ._retention_service import FlowRetentionService, add_retention_service
from ._rpc_service import RpcService
from ._runs import flow_result
from ._state import DEFAULT_METHOD_TIMEOUT
from ._step_service import StepService
from ._stream_service import StreamService
from ._worker_service import WorkerTaskService, WorkerTaskServicer

_LOG = logging.getLogger("dex_dev_server")


class Engine(
    FlowLifecycleService,
    HistoryService,
    ChannelService,
    AttributeService,
    StepService,
    RpcService,
    StreamService,
    WorkerTaskService,
    FlowRetentionService,
):
    """The embedded Dex engine: state, reducer, dispatcher and all service handlers."""


def _wrap_unary(
    fn: Callable[[Any, Any], Awaitable[Any]],
) -> Callable[[Any, Any], Awaitable[Any]]:
    async def handler(request: Any, context: grpc.aio.ServicerContext) -> Any:
        try:
            return await fn(request, context)
        except ServiceError as err:
            await context.abort(err.code, err.message, trailing_metadata=err.trailing_metadata())
        except (asyncio.CancelledError, grpc.aio.AbortError):
            raise
        except Exception as exc:
            _LOG.exception("internal error in %s", getattr(fn, "__name__", "handler"))
            internal = uncategorized(grpc.StatusCode.INTERNAL, f"internal engine error: {exc}")
            await context.abort(
                internal.code, internal.message, trailing_metadata=internal.trailing_metadata()
            )

    return handler


def add_services(engine: Engine, server: grpc.aio.Server) -> None:
    """Register FlowService, WorkerTaskService and this engine's ``dexdev.FlowRetention``
    (``_retention_service``) backed by ``engine``."""
    flow = dex_pb2_grpc.FlowServiceServicer()
    for method in pb.DESCRIPTOR.services_by_name["FlowService"].methods:
        setattr(flow, method.name, _wrap_unary(getattr(engine, method.name)))
    dex_pb2_grpc.add_FlowServiceServicer_to_server(flow, server)
    dex_pb2_grpc.add_WorkerTaskServiceServicer_to_server(WorkerTaskServicer(engine), server)
    add_retention_service(engine, server, _wrap_unary)


__all__ = ["DEFAULT_METHOD_TIMEOUT", "SERVER_VERSION", "Engine", "add_services", "flow_result"]
