"""FlowService InvokeRPC: RPCs run on a worker and their committed effects (spec section 4.1)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb

from ._blobs import (
    MAX_HYDRATION_REDELIVERIES,
    is_hydration_shortfall,
    oversized_detail,
    oversized_value,
)
from ._clock import now
from ._commit import apply_decision
from ._dispatch import MAX_TASK_FRAME_BYTES, rpc_too_large
from ._errors import (
    ServiceError,
    WorkerFailed,
    WorkerLost,
    channel_message_not_found,
    invalid,
    not_found,
    uncategorized,
)
from ._model import Run, has_kind, history_writes, null_value
from ._push import is_push, run_rpc
from ._requests import build_rpc_request
from ._runs import MAX_LONG_POLL, RunEngine, check_value, long_poll_budget
from ._state import RpcCall

RPC_NO_WORKER_WAIT = 10.0


class RpcService(RunEngine):
    """The InvokeRPC handler, on pull streams or a listening worker."""

    # RPCs ---------------------------------------------------------------------------------------

    async def InvokeRPC(self, request: pb.InvokeRPCRequest, context: Any) -> pb.InvokeRPCResponse:
        if not request.flow_id or not request.rpc_name or not request.request_id:
            raise invalid("flow_id, rpc_name and request_id are required")
        if request.timeout_seconds < 0:
            raise invalid("timeout_seconds must not be negative")
        if any(not k for k in request.lock_attribute_keys):
            raise invalid("lock attribute keys must not be empty")
        check_value(request.input, "input")
        run = self.find_run(request.flow_id, request.run_id)
        if run is None:
            raise not_found(request.flow_id)
        locking = bool(request.lock_attribute_keys)
        transactional = request.is_transactional or locking
        if not run.is_open and transactional:
            raise not_found(request.flow_id)
        owner = f"rpc:{uuid.uuid4().hex}"
        if run.is_open and locking and not self.try_lock(
            run, request.lock_attribute_keys, owner
        ):
            raise ServiceError(
                grpc.StatusCode.ABORTED,
                pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
                "one or more attribute keys are locked",
            )
        try:
            return await self._run_rpc(run, request, context, transactional)
        finally:
            if locking:
                self.unlock(run, owner)
                if run.is_open:
                    self.settle(run)

    async def _run_rpc(
        self, run: Run, request: pb.InvokeRPCRequest, context: Any, transactional: bool
    ) -> pb.InvokeRPCResponse:
        budget = min(float(request.timeout_seconds or MAX_LONG_POLL), MAX_LONG_POLL)
        budget = long_poll_budget(context, budget) or budget
        started = now()
        deliveries = 0
        while True:
            try:
                if is_push(run):
                    left = max(0.0, budget - (now() - started))
                    return await self._run_push_rpc(run, request, left, transactional)
                return await self._run_pull_rpc(run, request, budget, started, transactional)
            except WorkerFailed as failed:
                # The worker could not load all the RPC's blobs in one answer; it cached
                # what it got, so the next delivery loads the rest.
                deliveries += 1
                if (
                    not is_hydration_shortfall(failed.error.detail)
                    or deliveries > MAX_HYDRATION_REDELIVERIES
                    or now() - started >= budget
                ):
                    raise _rpc_worker_error(failed) from None

    async def _run_pull_rpc(
        self, run: Run, request: pb.InvokeRPCRequest, budget: float, started: float,
        transactional: bool,
    ) -> pb.InvokeRPCResponse:
        """One delivery of an RPC to a pull worker; ``WorkerFailed`` when its worker failed."""
        call = RpcCall(run=run, request=request, future=self.loop.create_future(), budget=budget)
        self.rpc_queue.append(call)
        self.pump()
        try:
            wait = min(budget, RPC_NO_WORKER_WAIT)
            try:
                await asyncio.wait_for(call.dispatched.wait(), wait)
            except TimeoutError:
                if not call.dispatched.is_set():
                    raise ServiceError(
                        grpc.StatusCode.FAILED_PRECONDITION,
                        pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
                        f"no worker available for flow type {run.flow_type!r}",
                        dispatch_reason=pb.DISPATCH_TASK_ERROR_REASON_NO_WORKER_AVAILABLE,
                    ) from None
            left = budget - (now() - started)
            try:
                response, served_by = await asyncio.wait_for(
                    asyncio.shield(call.future), max(0.0, left)
                )
            except TimeoutError:
                raise _rpc_timeout_error(request, budget) from None
        except WorkerLost as lost:
            unknown = lost.reason == pb.DISPATCH_TASK_ERROR_REASON_UNKNOWN_NAME
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
                f"no worker knows rpc {request.rpc_name!r}"
                if unknown
                else "worker disconnected while running the rpc",
                dispatch_reason=lost.reason,
            ) from None
        finally:
            self._drop_rpc(call)
        return self._commit_rpc(run, request, response, served_by, transactional)

    async def _run_push_rpc(
        self, run: Run, request: pb.InvokeRPCRequest, budget: float, transactional: bool
    ) -> pb.InvokeRPCResponse:
        rpc_request = build_rpc_request(self, run, request)
        refused = rpc_too_large(run, request.rpc_name, rpc_request)
        if refused is not None:
            raise refused
        try:
            stub = self.push.stub(run.config.worker_target.address)
            response = await run_rpc(stub, rpc_request, budget)
        except TimeoutError:
            raise _rpc_timeout_error(request, budget) from None
        except WorkerLost as lost:
            raise ServiceError(
                grpc.StatusCode.FAILED_PRECONDITION,
                pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
                f"worker at {run.config.worker_target.address!r} is unreachable",
                dispatch_reason=lost.reason,
            ) from None
        return self._commit_rpc(run, request, response, "", transactional)

    def _drop_rpc(self, call: RpcCall) -> None:
        if call in self.rpc_queue:
            self.rpc_queue.remove(call)
        for task_id, inflight in list(self.inflight.items()):
            if inflight.rpc is call and inflight.valid and inflight.stream is not None:
                inflight.valid = False
                inflight.stream.out.put_nowait(
                    pb.PollWorkerTaskResponse(
                        cancel_task=pb.PollWorkerTaskCancelTask(task_id=task_id)
                    )
                )

    def _commit_rpc(
        self,
        run: Run,
        request: pb.InvokeRPCRequest,
        resp: pb.InvokeWorkerRPCResponse,
        served_by: str,
        transactional: bool,
    ) -> pb.InvokeRPCResponse:
        oversized = oversized_value(resp)
        if oversized:
            raise uncategorized(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rpc {request.rpc_name!r} of flow {run.flow_id!r}: "
                f"{oversized_detail(oversized)}; nothing of the rpc was applied",
            )
        output = resp.output if has_kind(resp.output) else null_value()
        size = output.ByteSize()
        if size > MAX_TASK_FRAME_BYTES:
            # Refused before anything of it is applied: a client could not receive it.
            raise uncategorized(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"rpc {request.rpc_name!r} of flow {run.flow_id!r}: its output is {size} bytes, "
                f"more than a client accepts in one message ({MAX_TASK_FRAME_BYTES}; gRPC's "
                "4 MiB limit); nothing of the rpc was applied",
            )
        decision = resp.step_decision
        has_effects = bool(
            resp.upsert_attributes
            or resp.publish_to_channel
            or resp.delete_from_channel
            or resp.record_events
            or decision.next_steps
            or decision.cancel_step_types
            or decision.cancel_sibling_step_types
            or decision.HasField("close_decision")
        )
        if not has_effects:
            return pb.InvokeRPCResponse(output=output)
        if not run.is_open:
            raise not_found(request.flow_id)
        if decision.HasField("close_decision") and decision.close_decision.close_decision_type:
            raise invalid("an RPC decision must not close the flow")
        for m in resp.publish_to_channel:
            if not m.channel_name:
                raise invalid("published message needs a channel name")
        for d in resp.delete_from_channel:
            if not d.channel_name or not d.message_id:
                raise invalid("deletion needs a channel name and message id")
            if transactional and not any(
                e.message.message_id == d.message_id for e in run.channels.get(d.channel_name, [])
            ):
                raise channel_message_not_found(
                    f"message {d.message_id!r} is not pending on {d.channel_name!r}"
                )
        published = self.apply_effects(
            run, resp.upsert_attributes, resp.publish_to_channel, resp.delete_from_channel
        )
        self.add_history(
            run,
            rpc_execution_completed=pb.RpcExecutionCompletedEvent(
                rpc_name=request.rpc_name,
                input=request.input,
                output=output,
                step_decision=decision,
                upsert_attributes=history_writes(resp.upsert_attributes),
                record_events=resp.record_events,
                publish_to_channel=published,
                delete_from_channel=resp.delete_from_channel,
                served_by_app_worker_id=served_by,
            ),
        )
        stripped = pb.StepDecision()
        stripped.CopyFrom(decision)
        stripped.ClearField("close_decision")
        if stripped.next_steps or stripped.cancel_step_types:
            apply_decision(self, run, stripped, f"__rpc/{request.rpc_name}", None, None)
        self.settle(run)
        return pb.InvokeRPCResponse(output=output)


def _rpc_worker_error(failed: WorkerFailed) -> ServiceError:
    """The InvokeRPC error for a worker that answered with an error (spec section 5)."""
    we = failed.error
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
        we.detail or "worker error",
        worker_detail=we.detail,
        worker_type=we.error_type,
        worker_status=we.grpc_status or 2,
        worker_stack_trace=we.stack_trace,
    )


def _rpc_timeout_error(request: pb.InvokeRPCRequest, budget: float) -> ServiceError:
    """The InvokeRPC error for an RPC that did not finish within ``budget`` seconds."""
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION,
        pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
        f"rpc {request.rpc_name!r} timeout after {int(budget)}s",
    )
