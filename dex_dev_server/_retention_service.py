"""``dexdev.FlowRetention``: deleting a closed Flow's stored data, an extension of this engine.

The Dex protocol has no call that deletes a Flow (spec section 1.1: FlowService has none, and
``dex-python-sdk`` 1.23.0 none either); a real Dex server deletes a closed Flow's history once
its namespace's retention period has passed. Applications that must forget a Flow at once (a
user deleting a conversation) call this service, which lives beside FlowService on the same
port so the unchanged SDK keeps working:

- ``/dexdev.FlowRetention/DeleteFlow``: request ``google.protobuf.StringValue`` (the Flow ID),
  answer ``google.protobuf.Empty``. Deletes every run of the Flow, with its Attributes, channel
  messages, history events, Stream messages and the blobs nothing else references; afterwards
  the Flow is unknown (``NOT_FOUND`` everywhere) and its ID may be started again.
  ``INVALID_ARGUMENT`` without an ID, ``NOT_FOUND`` (``FLOW_NOT_EXISTS``) for an unknown Flow,
  ``FAILED_PRECONDITION`` while a run of it is still RUNNING (stop it first).

A real Dex server answers ``UNIMPLEMENTED``: callers then leave the history to its retention.
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2, wrappers_pb2

from ._errors import ServiceError, invalid, not_found
from ._runs import RunEngine

_LOG = logging.getLogger("dex_dev_server")

#: The gRPC service name (``/<SERVICE>/DeleteFlow``).
SERVICE = "dexdev.FlowRetention"


class FlowRetentionService(RunEngine):
    """The ``DeleteFlow`` handler (module docstring)."""

    async def DeleteFlow(
        self, request: wrappers_pb2.StringValue, context: Any
    ) -> empty_pb2.Empty:
        flow_id = request.value
        if not flow_id:
            raise invalid("a flow ID is required")
        run_ids = list(self.flows.get(flow_id, ()))
        if not run_ids:
            raise not_found(flow_id, f"flow {flow_id!r} does not exist")
        runs = [self.runs[run_id] for run_id in run_ids if run_id in self.runs]
        if any(run.is_open for run in runs):
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                pb.ERROR_SUB_STATUS_UNCATEGORIZED,
                f"flow {flow_id!r} is still running; stop it before deleting it",
            )
        # Writes still queued for these runs or their Streams land before the delete.
        for run in runs:
            if self.unflushed.pop(run.run_id, None) is not None:
                self.flush(run)
        self.flush_streams()
        events = self.store.delete_flow(flow_id, run_ids)
        for run in runs:
            self.unschedule(("flow-retry", run.run_id))
            self.runs.pop(run.run_id, None)
        self.flows.pop(flow_id, None)
        _LOG.info("deleted flow %s: %d runs, %d history events", flow_id, len(run_ids), events)
        return empty_pb2.Empty()


def add_retention_service(
    handler: Any, server: grpc.aio.Server, wrap: Any
) -> None:
    """Serve ``handler.DeleteFlow`` (wrapped by ``wrap``, the engine's error mapping) as
    ``/dexdev.FlowRetention/DeleteFlow`` on ``server``."""
    method = grpc.unary_unary_rpc_method_handler(
        wrap(handler.DeleteFlow),
        request_deserializer=wrappers_pb2.StringValue.FromString,
        response_serializer=empty_pb2.Empty.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(SERVICE, {"DeleteFlow": method}),)
    )
