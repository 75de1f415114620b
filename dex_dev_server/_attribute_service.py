"""FlowService attributes: read, write and wait for a match (spec section 3.1)."""

from __future__ import annotations

from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2

from ._blobs import BLOB_KINDS
from ._clock import now
from ._errors import invalid, long_poll_timeout, not_found, uncategorized
from ._model import history_writes
from ._runs import MAX_LONG_POLL, RunEngine, check_value, long_poll_budget


class AttributeService(RunEngine):
    """FlowService handlers for a run's attributes."""

    # Attributes ---------------------------------------------------------------------------------

    async def GetAttributes(
        self, request: pb.GetAttributesRequest, context: Any
    ) -> pb.GetAttributesResponse:
        run = self._existing_run(request.flow_id, request.run_id)
        if request.all_keys:
            kvs = [pb.KV(key=k, value=v) for k, v in run.attributes.items()]
        else:
            kvs = [
                pb.KV(key=k, value=run.attributes[k]) for k in request.keys if k in run.attributes
            ]
        return pb.GetAttributesResponse(attributes=kvs)

    async def SetAttributes(
        self, request: pb.SetAttributesRequest, context: Any
    ) -> empty_pb2.Empty:
        if not request.request_id:
            raise invalid("request_id is required")
        for write in request.attributes:
            if not write.key:
                raise invalid("attribute key is required")
            check_value(write.value, "attribute value")
        run = self._open_run(request.flow_id, request.run_id)
        self.apply_effects(run, request.attributes, [], [])
        self.add_history(
            run,
            rpc_execution_completed=pb.RpcExecutionCompletedEvent(
                upsert_attributes=history_writes(request.attributes),
                is_set_attribute_api=True,
            ),
        )
        self.settle(run)
        return empty_pb2.Empty()

    async def WaitForAttribute(
        self, request: pb.WaitForAttributeRequest, context: Any
    ) -> pb.WaitForAttributeResponse:
        match = request.match
        if not match.key:
            raise invalid("match.key is required")
        operand = match.operand
        kind = operand.WhichOneof("kind")
        if kind not in ("string_value", "bool_value", "int_value", "double_value"):
            raise invalid("operand must be a string, bool, int or double")
        check_value(operand, "operand")
        op = match.operator
        if op == pb.ATTRIBUTE_MATCH_OPERATOR_UNSPECIFIED or (
            op not in pb.AttributeMatchOperator.values()
        ):
            raise invalid("unknown match operator")
        if kind in ("string_value", "bool_value") and op not in (
            pb.ATTRIBUTE_MATCH_OPERATOR_EQUAL,
            pb.ATTRIBUTE_MATCH_OPERATOR_NOT_EQUAL,
        ):
            raise invalid("string and bool operands support only EQUAL and NOT_EQUAL")
        cap = MAX_LONG_POLL
        if request.request_timeout_seconds > 0:
            cap = min(cap, float(request.request_timeout_seconds))
        deadline = now() + long_poll_budget(context, cap)
        while True:
            run = self._existing_run(request.flow_id)
            stored = run.attributes.get(match.key)
            if stored is not None and stored.WhichOneof("kind") in BLOB_KINDS:
                # Spec section 4.10: a blob-backed value is never compared.
                raise uncategorized(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"attribute {match.key} is stored as a blob and cannot be matched",
                )
            if stored is not None and _matches(stored, op, operand):
                return pb.WaitForAttributeResponse(matched_value=stored)
            if not run.is_open:
                raise not_found(request.flow_id)
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("attribute did not match in time")
            await self.notifier.wait(("flow", run.flow_id), left)


def _matches(stored: pb.Value, op: int, operand: pb.Value) -> bool:
    kind = operand.WhichOneof("kind")
    if stored.WhichOneof("kind") != kind:
        return False
    a = getattr(stored, kind)
    b = getattr(operand, kind)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_EQUAL:
        return bool(a == b)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_NOT_EQUAL:
        return bool(a != b)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_GREATER_THAN:
        return bool(a > b)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_GREATER_THAN_OR_EQUAL:
        return bool(a >= b)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_LESS_THAN:
        return bool(a < b)
    if op == pb.ATTRIBUTE_MATCH_OPERATOR_LESS_THAN_OR_EQUAL:
        return bool(a <= b)
    return False
