"""FlowService and WorkerTaskService handlers on top of :class:`EngineState` (spec section 4)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import socket
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2

from . import _streams
from ._commit import apply_decision
from ._engine import (
    DEFAULT_METHOD_TIMEOUT,
    EngineState,
    RpcCall,
    WorkerFailed,
    WorkerLost,
    duration,
    now,
    rpc_too_large,
    timestamp,
)
from ._errors import (
    ServiceError,
    channel_message_not_found,
    invalid,
    long_poll_timeout,
    not_found,
    uncategorized,
)
from ._model import (
    START_FROM,
    TIMER_PENDING,
    ChannelEntry,
    Run,
    StepExec,
    has_kind,
    history_writes,
    null_value,
    replayable_writes,
)
from ._push import is_push
from ._store import RunWrite, Store

_LOG = logging.getLogger("dex_dev_server")

SERVER_VERSION = "dex_dev_server-0.1.0"
MAX_LONG_POLL = 60.0
RPC_NO_WORKER_WAIT = 10.0
_RESERVED = ("/", "$", ":")
_BLOB_KINDS = ("internal_blob_id_for_string_value", "internal_blob_id_for_obj_value")


def _check_name(value: str, what: str) -> None:
    if not value:
        raise invalid(f"{what} is required")
    if any(c in value for c in _RESERVED):
        raise invalid(f"{what} must not contain '/', '$' or ':'")


def _check_value(value: pb.Value, what: str) -> None:
    kind = value.WhichOneof("kind")
    if kind in _BLOB_KINDS:
        raise invalid(f"{what} must not reference a blob")
    if kind == "double_value" and not math.isfinite(value.double_value):
        raise invalid(f"{what} must be finite")


SKIP_TIMER_WAIT = 5.0


def _remaining(context: grpc.aio.ServicerContext, cap: float) -> float:
    remaining = context.time_remaining()
    if remaining is None:
        return cap
    return max(0.0, min(cap, remaining - 0.2))


def flow_result(run: Run) -> pb.FlowResult:
    """The ``FlowResult`` of a closed run."""
    return pb.FlowResult(
        flow_status=run.status,  # type: ignore[arg-type]
        results=run.results if run.status == pb.FLOW_STATUS_COMPLETED else [],
        error_type=run.error_type,  # type: ignore[arg-type]
        error_message=run.error_message,
    )


class Engine(EngineState):
    """The embedded Dex engine: state, reducer, dispatcher and all service handlers."""

    def __init__(self, store: Store) -> None:
        super().__init__(store)

    # Boot ---------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild all runs from SQLite and resume every open run (spec section 7 #2).

        Dispatched-but-uncommitted attempts are retried at once, overdue timers fire,
        waiting conditions are re-evaluated and locks are re-acquired.
        """
        for row in self.store.load_runs():
            run = Run.from_row(row)
            self.runs[run.run_id] = run
            self.flows.setdefault(run.flow_id, []).append(run.run_id)
            self.run_seq = max(self.run_seq, run.seq)
        for run_id, key, value in self.store.load_attributes():
            v = pb.Value()
            v.ParseFromString(value)
            if run_id in self.runs:
                self.runs[run_id].attributes[key] = v
        for run_id, seq, channel, message_id, value in self.store.load_channel_messages():
            owner = self.runs.get(run_id)
            if owner is None:
                continue
            run = owner
            v = pb.Value()
            v.ParseFromString(value)
            run.channels.setdefault(channel, []).append(
                ChannelEntry(seq, pb.ChannelMessage(channel_name=channel, value=v,
                                                    message_id=message_id))
            )
            run.chan_seq = max(run.chan_seq, seq)
        for run in list(self.runs.values()):
            if run.is_open:
                self._resume(run)
            elif run.retry_at:
                self.schedule(("flow-retry", run.run_id), run.retry_at,
                              functools.partial(self._retry_run, run))

    def _resume(self, run: Run) -> None:
        for st in sorted(run.steps.values(), key=lambda s: s.created_order):
            if st.phase != "waiting" and st.mstate in ("ready", "backoff", "dispatched"):
                keys = self.lock_keys(st)
                if keys and self.try_lock(run, keys, st.exe_id):
                    st.locks_held = True
                elif keys:
                    st.mstate = "locking"
                    continue
            if st.mstate == "dispatched":
                message = "engine restarted while the task was running"
                self.fail_attempt(
                    run, st, self.failure(st, backend_error=message), message, count=False
                )
            elif st.mstate == "ready":
                self.ready[(run.run_id, st.exe_id)] = None
            elif st.mstate == "backoff":
                self._arm_retry(run, st)
            elif st.phase == "waiting":
                self.schedule_timers(run, st)
        self.advance(run)
        self.flush(run)

    # Sub-flows and flow retries ------------------------------------------------------------

    def start_sub_flow(
        self, run: Run, st: StepExec, position: int, condition: pb.SubFlowCondition
    ) -> None:
        """Start or attach ``SubFlow:<parent>-<exe>-<index>`` (spec section 2.11).

        The request ID derives from the parent run ID, so a parent re-run in a new run
        restarts children that the old run attached.
        """
        child_id = f"SubFlow:{run.flow_id}-{st.exe_id}-{condition.sub_flow_index}"
        request_id = f"{run.run_id}/{child_id}"
        opts = condition.options
        link = [run.run_id, st.exe_id, position]
        latest = self.latest_run(child_id)
        if latest is not None:
            policy = opts.reuse_policy
            finished = not latest.is_open and not latest.retry_at
            attach = (
                latest.request_id == request_id
                or policy == pb.SUB_FLOW_REUSE_POLICY_ATTACH
                or (
                    policy != pb.SUB_FLOW_REUSE_POLICY_ALWAYS_RESTART
                    and (not finished or latest.status == pb.FLOW_STATUS_COMPLETED)
                )
            )
            if attach:
                if finished:
                    st.subs[position] = flow_result(latest)
                elif link not in latest.parents:
                    latest.parents.append(link)
                    self.flush(latest)
                return
            if latest.is_open:
                self.close_run(latest, pb.FLOW_STATUS_TERMINATED)
                self.flush(latest)
        config = pb.FlowConfig()
        config.CopyFrom(run.config)
        config.MergeFrom(opts.flow_config_override)
        start_options = pb.FlowStartOptions(
            id_reuse_policy=pb.ID_REUSE_POLICY_ALLOW_TERMINATE_IF_RUNNING,
            flow_start_delay_seconds=opts.flow_start_delay_seconds,
            attributes=opts.attributes,
            flow_config_override=config,
            timeout_handler_options=opts.timeout_handler_options,
        )
        if opts.HasField("retry_policy"):
            start_options.retry_policy.CopyFrom(opts.retry_policy)
        request = pb.StartFlowRequest(
            flow_id=child_id,
            flow_type=condition.sub_flow_type,
            flow_timeout_seconds=opts.flow_timeout_seconds,
            flow_timeout_policy=opts.flow_timeout_policy,
            start_step_type=condition.start_step_type,
            step_input=condition.step_input,
            step_options=condition.step_options,
            flow_start_options=start_options,
            request_id=request_id,
        )
        child = self._new_run(request, first_run_id="", run_attempt=1, parents=[link])
        self.loop.call_soon(self.pump)
        _LOG.info("sub-flow %s started for %s", child.flow_id, st.exe_id)

    def after_close(self, run: Run) -> None:
        """Schedule a flow retry for a failed run, else report it to parent Steps."""
        req = run.start_request
        policy = req.flow_start_options.retry_policy
        if (
            run.status == pb.FLOW_STATUS_FAILED
            and run.error_type != pb.FLOW_ERROR_TYPE_CLIENT_API_FAILING_FLOW
            and req.flow_start_options.HasField("retry_policy")
            and (policy.maximum_attempts == 0 or run.run_attempt < policy.maximum_attempts)
        ):
            initial = policy.initial_interval_seconds or 1
            coefficient = policy.backoff_coefficient or 2.0
            maximum = policy.maximum_interval_seconds or 100
            delay = min(initial * coefficient ** (run.run_attempt - 1), maximum)
            run.retry_at = now() + delay
            self.schedule(("flow-retry", run.run_id), run.retry_at,
                          functools.partial(self._retry_run, run))
            return
        self._report_to_parents(run)

    def _retry_run(self, run: Run) -> None:
        if not run.retry_at or self.latest_run(run.flow_id) is not run:
            return
        run.retry_at = 0.0
        self.flush(run)
        self._new_run(
            run.start_request,
            first_run_id=run.first_run_id,
            run_attempt=run.run_attempt + 1,
            parents=run.parents,
        )
        self.pump()

    def _report_to_parents(self, run: Run) -> None:
        result = flow_result(run)
        for parent_run_id, exe_id, position in run.parents:
            parent = self.runs.get(parent_run_id)
            while parent is not None and parent.continued_to:
                parent = self.runs.get(parent.continued_to)
            if parent is None or not parent.is_open:
                continue
            st = parent.steps.get(exe_id)
            if st is None or st.phase != "waiting" or position in st.subs:
                continue
            st.subs[position] = result
            self.advance(parent)
            self.flush(parent)
        self.loop.call_soon(self.pump)

    # Server info --------------------------------------------------------------------------

    async def GetServerInfo(self, request: empty_pb2.Empty, context: Any) -> pb.ServerInfo:
        return pb.ServerInfo(
            server_version=SERVER_VERSION,
            minimum_supported_protocol_version=1,
            current_protocol_version=3,
            server_engine=pb.SERVER_ENGINE_UNSPECIFIED,
        )

    async def HealthCheck(self, request: empty_pb2.Empty, context: Any) -> pb.HealthInfo:
        return pb.HealthInfo(condition="OK", hostname=socket.gethostname(), duration=0)

    async def SyncAttributeIndexes(
        self, request: pb.SyncAttributeIndexRequest, context: Any
    ) -> pb.SyncAttributeIndexResponse:
        self.index_types.update(dict(request.attribute_indexes))
        return pb.SyncAttributeIndexResponse()

    async def LoadBlobs(self, request: pb.LoadBlobsRequest, context: Any) -> pb.LoadBlobsResponse:
        for entry in request.entries:
            if entry.blob_value.WhichOneof("kind") not in _BLOB_KINDS:
                raise invalid("LoadBlobs entries must carry a blob id")
        # This engine never hands out blob ids, so none is known.
        return pb.LoadBlobsResponse()

    # Start / stop ---------------------------------------------------------------------------

    async def StartFlow(
        self, request: pb.StartFlowRequest, context: Any
    ) -> pb.StartFlowResponse:
        return pb.StartFlowResponse(run_id=self.start_flow(request))

    def start_flow(self, req: pb.StartFlowRequest) -> str:
        """Validate and start a run (spec section 2.2); returns its run ID."""
        _check_name(req.flow_id, "flow_id")
        _check_name(req.flow_type, "flow_type")
        if req.start_step_type:
            _check_name(req.start_step_type, "start_step_type")
        if not req.request_id:
            raise invalid("request_id is required")
        opts = req.flow_start_options
        if opts.flow_start_delay_seconds < 0:
            raise invalid("flow_start_delay_seconds must not be negative")
        if req.flow_timeout_seconds < 0:
            raise invalid("flow_timeout_seconds must not be negative")
        if req.flow_timeout_policy not in pb.FlowTimeoutPolicy.values():
            raise invalid("unknown flow_timeout_policy")
        if opts.id_reuse_policy not in pb.IdReusePolicy.values():
            raise invalid("unknown id_reuse_policy")
        if req.flow_timeout_policy != pb.FLOW_TIMEOUT_POLICY_UNSPECIFIED and (
            req.flow_timeout_seconds <= 0
        ):
            raise invalid("a flow timeout policy needs a positive flow timeout")
        _check_value(req.step_input, "step_input")
        for write in opts.attributes:
            if not write.key:
                raise invalid("attribute key is required")
            _check_value(write.value, "attribute value")
        target = opts.flow_config_override.worker_target
        if target.address.startswith(("http://", "https://")):
            raise invalid("worker_target.address must be a gRPC target, not a URL")

        latest = self.latest_run(req.flow_id)
        if latest is not None:
            policy = opts.id_reuse_policy
            reject = False
            if latest.is_open:
                if policy == pb.ID_REUSE_POLICY_ALLOW_TERMINATE_IF_RUNNING:
                    self.close_run(latest, pb.FLOW_STATUS_TERMINATED)
                    self.flush(latest)
                else:
                    reject = True
            elif policy in (pb.ID_REUSE_POLICY_UNSPECIFIED, pb.ID_REUSE_POLICY_DISALLOW_REUSE):
                reject = True
            elif policy == pb.ID_REUSE_POLICY_ALLOW_IF_PREVIOUS_EXISTS_ABNORMALLY:
                reject = latest.status == pb.FLOW_STATUS_COMPLETED
            if reject:
                if (
                    opts.flow_already_started_options.ignore_already_started_error
                    and latest.request_id == req.request_id
                ):
                    return latest.run_id
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    pb.ERROR_SUB_STATUS_FLOW_ALREADY_STARTED,
                    f"flow {req.flow_id!r} was already started",
                )
        run = self._new_run(req, first_run_id="", run_attempt=1)
        self.pump()
        return run.run_id

    def _new_run(
        self,
        req: pb.StartFlowRequest,
        first_run_id: str,
        run_attempt: int,
        parents: list[list[Any]] | None = None,
    ) -> Run:
        config = pb.FlowConfig(continue_as_new_threshold=100,
                               step_durability=pb.STEP_DURABILITY_ASYNC)
        override = req.flow_start_options.flow_config_override
        for name in (
            "active_step_search_mode",
            "continue_as_new_threshold",
            "continue_as_new_page_size_in_bytes",
            "step_durability",
            "worker_target",
            "attribute_store_names",
        ):
            if override.HasField(name):
                if name in ("worker_target", "attribute_store_names"):
                    getattr(config, name).CopyFrom(getattr(override, name))
                else:
                    setattr(config, name, getattr(override, name))
        self.run_seq += 1
        run_id = str(uuid.uuid4())
        run = Run(
            flow_id=req.flow_id,
            run_id=run_id,
            seq=self.run_seq,
            flow_type=req.flow_type,
            status=pb.FLOW_STATUS_RUNNING,
            request_id=req.request_id,
            start_ts=now(),
            first_run_id=first_run_id or run_id,
            config=config,
            start_request=req,
            run_attempt=run_attempt,
            parents=list(parents or []),
        )
        if override.HasField("continue_as_new_threshold"):
            # Only an explicitly configured threshold continues runs as new automatically.
            run.can_threshold = override.continue_as_new_threshold
        self.runs[run_id] = run
        self.flows.setdefault(req.flow_id, []).append(run_id)
        initial = []
        for write in req.flow_start_options.attributes:
            self.set_attribute(run, write.key, write.value)
            self.index_attribute(run, write, by_key=True)
            recorded = not write.is_hard_delete_on_null
            if recorded and write.value.WhichOneof("kind") not in (None, "null_value"):
                initial.append(pb.KV(key=write.key, value=write.value))
        self.add_history(
            run,
            flow_started_or_continued=pb.FlowStartedOrContinuedHistoryEvent(
                flow_execution_id=pb.FlowExecutionID(flow_id=run.flow_id, run_id=run_id),
                flow_type=run.flow_type,
                flow_config=config,
                flow_timeout=duration(req.flow_timeout_seconds),
                flow_timeout_policy=req.flow_timeout_policy,
                timeout_handler_options=req.flow_start_options.timeout_handler_options,
                initial_start=pb.FlowInitialStart(
                    start_step_type=req.start_step_type,
                    step_input=req.step_input,
                    step_options=req.step_options,
                    initial_attributes=initial,
                ),
            ),
        )
        if req.flow_timeout_seconds > 0:
            self.create_timeout_step(run, req.flow_timeout_seconds)
        if req.start_step_type:
            delay = req.flow_start_options.flow_start_delay_seconds
            self.enqueue(
                run,
                pb.StepMovement(
                    step_type=req.start_step_type,
                    step_input=req.step_input,
                    step_options=req.step_options,
                ),
                START_FROM,
                not_before=run.start_ts + delay if delay > 0 else 0.0,
            )
        self.advance(run)
        self.flush(run)
        _LOG.info("flow %s (%s) started run %s", run.flow_id, run.flow_type, run_id)
        return run

    def _open_run(self, flow_id: str, run_id: str = "") -> Run:
        if not flow_id:
            raise invalid("flow_id is required")
        run = self.find_run(flow_id, run_id)
        if run is None or not run.is_open:
            raise not_found(flow_id)
        return run

    def _existing_run(self, flow_id: str, run_id: str = "") -> Run:
        if not flow_id:
            raise invalid("flow_id is required")
        run = self.find_run(flow_id, run_id)
        if run is None:
            raise not_found(flow_id, f"flow {flow_id!r} does not exist")
        return run

    async def StopFlow(self, request: pb.StopFlowRequest, context: Any) -> empty_pb2.Empty:
        run = self._open_run(request.flow_id, request.run_id)
        if request.stop_type == pb.STOP_TYPE_TERMINATE:
            self.close_run(run, pb.FLOW_STATUS_TERMINATED)
        elif request.stop_type == pb.STOP_TYPE_FAIL:
            self.close_run(
                run,
                pb.FLOW_STATUS_FAILED,
                pb.FLOW_ERROR_TYPE_CLIENT_API_FAILING_FLOW,
                request.reason or "fail by client",
            )
        elif request.stop_type in (pb.STOP_TYPE_CANCEL, pb.STOP_TYPE_UNSPECIFIED):
            self.close_run(run, pb.FLOW_STATUS_CANCELED)
        else:
            raise invalid("unknown stop_type")
        self.flush(run)
        self.pump()
        return empty_pb2.Empty()

    async def WaitForFlow(self, request: pb.WaitForFlowRequest, context: Any) -> pb.FlowResult:
        self._existing_run(request.flow_id, request.run_id)
        cap = min(float(request.wait_time_seconds or MAX_LONG_POLL), MAX_LONG_POLL)
        deadline = now() + _remaining(context, cap)
        while True:
            run = self.latest_run(request.flow_id)
            if request.run_id:
                run = self.find_run(request.flow_id, request.run_id)
                while run is not None and run.continued_to:
                    run = self.runs.get(run.continued_to)
            assert run is not None
            if not run.is_open and not run.retry_at:
                return flow_result(run)
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("flow is still running")
            await self.notifier.wait(("flow", request.flow_id), left)

    async def GetFlowSummary(
        self, request: pb.GetFlowSummaryRequest, context: Any
    ) -> pb.GetFlowSummaryResponse:
        run = self._existing_run(request.flow_id, request.run_id)
        resp = pb.GetFlowSummaryResponse(
            flow_execution_id=pb.FlowExecutionID(flow_id=run.flow_id, run_id=run.run_id),
            first_run_id=run.first_run_id,
            request_id=run.request_id,
            flow_type=run.flow_type,
            flow_status=run.status,  # type: ignore[arg-type]
            start_time=timestamp(run.start_ts),
            run_attempt=run.run_attempt,
        )
        if run.close_ts is not None:
            resp.close_time.CopyFrom(timestamp(run.close_ts))
        return resp

    async def GetFlowState(
        self, request: pb.GetFlowStateRequest, context: Any
    ) -> pb.GetFlowStateResponse:
        run = self._existing_run(request.flow_id, request.run_id)
        return self.flow_state(run)

    def flow_state(self, run: Run) -> pb.GetFlowStateResponse:
        """The ``GetFlowStateResponse`` of a run (spec section 4.5)."""
        resp = pb.GetFlowStateResponse(
            flow_config=run.config,
            attributes=[pb.KV(key=k, value=v) for k, v in run.attributes.items()],
            queued_steps=[mv for mv, _ in run.queue],
            completed_steps=run.results,
            sticky_app_worker_id=run.sticky,
        )
        for name, entries in run.channels.items():
            resp.pending_channel_messages[name].messages.extend(e.message for e in entries)
        for st in sorted(run.steps.values(), key=lambda s: s.created_order):
            state = pb.ActiveStepExecutionState(
                step_execution_id=st.exe_id,
                from_step_execution_id=st.from_id,
                step_type=st.step_type,
                phase=(
                    pb.ACTIVE_STEP_PHASE_WAITING
                    if st.phase == "waiting"
                    else pb.ACTIVE_STEP_PHASE_ACTIVE
                ),
                movement=st.movement,
                step_execution_locals=[pb.KV(key=k, value=v) for k, v in st.locals.items()],
                wait_for_pull_routing=pb.PullRouting(served_by_app_worker_id=st.wait_for_served_by),
                execute_pull_routing=pb.PullRouting(served_by_app_worker_id=st.served_by),
            )
            if st.waiting is not None:
                w = st.waiting
                state.waiting_condition.CopyFrom(
                    pb.WaitingConditionState(
                        waiting_condition_type=w.waiting_condition_type,
                        timer_conditions=w.timer_conditions,
                        channel_conditions=w.channel_conditions,
                        condition_combinations=w.condition_combinations,
                        sub_flow_conditions=[
                            pb.SubFlowConditionState(condition_id=s.condition_id)
                            for s in w.sub_flow_conditions
                        ],
                    )
                )
                for i, (fire_at, status) in enumerate(st.timers):
                    state.timers.add(
                        condition_id=w.timer_conditions[i].condition_id,
                        firing_unix_timestamp_seconds=int(fire_at),
                        status=int(status),
                    )
                    if status != TIMER_PENDING:
                        done = state.completed_conditions.completed_timer_conditions
                        done[i] = int(status)  # type: ignore[assignment]
            if st.last_failure is not None:
                state.last_failure_info.CopyFrom(st.last_failure)
            elif st.mstate == "ready" and not self.serves_flow_type(run.flow_type):
                state.last_failure_info.CopyFrom(
                    pb.StepMethodFailure(
                        backend_error=f"no worker serves flow type {run.flow_type!r} yet",
                        attempt=st.attempt,
                        details=pb.ServiceErrorResponse(
                            dispatch_task_error_reason=(
                                pb.DISPATCH_TASK_ERROR_REASON_NO_WORKER_AVAILABLE
                            )
                        ),
                    )
                )
            resp.active_step_executions.append(state)
        return resp

    # History --------------------------------------------------------------------------------

    async def GetHistoryEvents(
        self, request: pb.GetHistoryEventsRequest, context: Any
    ) -> pb.GetHistoryEventsResponse:
        run = self._existing_run(request.flow_id, request.run_id)
        start = max(1, request.start_internal_event_id)
        if request.next_page_token:
            try:
                start = int(request.next_page_token.decode())
            except ValueError as exc:
                raise invalid("malformed next_page_token") from exc
        size = request.estimate_page_size if request.estimate_page_size > 0 else 100
        size = min(size, 1000)
        rows = self.store.history_page(run.run_id, start, size + 1)
        resp = pb.GetHistoryEventsResponse()
        for _, data in rows[:size]:
            event = pb.FlowHistoryEvent()
            event.ParseFromString(data)
            resp.events.append(event)
        last = rows[size - 1][0] if len(rows) > size else (rows[-1][0] if rows else start - 1)
        resp.next_internal_event_id = last + 1
        if len(rows) > size:
            resp.next_page_token = str(rows[size][0]).encode()
        return resp

    async def WaitForHistoryEvent(
        self, request: pb.WaitForHistoryEventRequest, context: Any
    ) -> pb.WaitForHistoryEventResponse:
        if request.next_internal_event_id <= 0:
            raise invalid("next_internal_event_id must be positive")
        deadline = now() + _remaining(context, MAX_LONG_POLL)
        while True:
            run = self._existing_run(request.flow_id, request.run_id)
            last = run.next_event_id - 1
            if last >= request.next_internal_event_id or not run.is_open:
                available = last >= request.next_internal_event_id
                return pb.WaitForHistoryEventResponse(
                    event_available=available,
                    available_internal_event_id=request.next_internal_event_id if available else 0,
                    flow_status=run.status,  # type: ignore[arg-type]
                )
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("no new history event")
            await self.notifier.wait(("flow", run.flow_id), left)

    # Channels --------------------------------------------------------------------------------

    async def PublishToChannel(
        self, request: pb.PublishToChannelRequest, context: Any
    ) -> empty_pb2.Empty:
        for message in request.messages:
            if not message.channel_name:
                raise invalid("channel_name is required")
            _check_value(message.value, "message value")
        run = self._open_run(request.flow_id, request.run_id)
        if not request.messages:
            return empty_pb2.Empty()
        published = [self.publish(run, m.channel_name, m.value) for m in request.messages]
        self.add_history(
            run, channel_external_publish=pb.ChannelExternalPublishEvent(messages=published)
        )
        self.settle(run)
        return empty_pb2.Empty()

    async def GetChannelMessages(
        self, request: pb.GetChannelMessagesRequest, context: Any
    ) -> pb.GetChannelMessagesResponse:
        if not request.channel_name:
            raise invalid("channel_name is required")
        run = self._existing_run(request.flow_id, request.run_id)
        entries = run.channels.get(request.channel_name, [])
        return pb.GetChannelMessagesResponse(messages=[e.message for e in entries])

    async def DeleteChannelMessage(
        self, request: pb.DeleteChannelMessageRequest, context: Any
    ) -> empty_pb2.Empty:
        if not request.channel_name or not request.message_id:
            raise invalid("channel_name and message_id are required")
        run = self._open_run(request.flow_id, request.run_id)
        if not self.delete_message(run, request.channel_name, request.message_id):
            raise channel_message_not_found(
                f"message {request.message_id!r} is not pending on {request.channel_name!r}"
            )
        self.add_history(
            run,
            channel_external_delete=pb.ChannelExternalDeleteEvent(
                messages=[
                    pb.ChannelMessageDeletion(
                        channel_name=request.channel_name, message_id=request.message_id
                    )
                ]
            ),
        )
        self.settle(run)
        return empty_pb2.Empty()

    # Attributes ------------------------------------------------------------------------------

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
            _check_value(write.value, "attribute value")
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
        _check_value(operand, "operand")
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
        deadline = now() + _remaining(context, cap)
        while True:
            run = self._existing_run(request.flow_id)
            stored = run.attributes.get(match.key)
            if stored is not None and _matches(stored, op, operand):
                return pb.WaitForAttributeResponse(matched_value=stored)
            if not run.is_open:
                raise not_found(request.flow_id)
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("attribute did not match in time")
            await self.notifier.wait(("flow", run.flow_id), left)

    # Steps and timers --------------------------------------------------------------------------

    async def WaitForStepCompletion(
        self, request: pb.WaitForStepCompletionRequest, context: Any
    ) -> pb.WaitForStepCompletionResponse:
        if not request.step_type:
            raise invalid("step_type is required")
        try:
            number = int(request.step_execution_number)
        except ValueError as exc:
            raise invalid("step_execution_number must be a positive decimal") from exc
        if number <= 0:
            raise invalid("step_execution_number must be a positive decimal")
        exe_id = f"{request.step_type}-{number}"
        cap = MAX_LONG_POLL
        if request.request_timeout_seconds > 0:
            cap = min(cap, float(request.request_timeout_seconds))
        deadline = now() + _remaining(context, cap)
        while True:
            run = self._existing_run(request.flow_id)
            allocated = run.counters.get(request.step_type, 0) >= number
            done = allocated and exe_id not in run.steps
            if not run.is_open:
                if done and exe_id not in run.unfinished_at_close:
                    return pb.WaitForStepCompletionResponse()
                raise not_found(request.flow_id)
            if done:
                return pb.WaitForStepCompletionResponse()
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("step execution is not completed yet")
            await self.notifier.wait(("flow", run.flow_id), left)

    async def SkipTimer(self, request: pb.SkipTimerRequest, context: Any) -> empty_pb2.Empty:
        if not request.step_execution_id:
            raise invalid("step_execution_id is required")
        # A Step execution that is queued or still in wait_for has not created its timers
        # yet; the skip waits (bounded) for them instead of failing, as the Dex server
        # keeps an early skip until the timer exists. It is committed before the reply.
        deadline = now() + _remaining(context, SKIP_TIMER_WAIT)
        while True:
            run = self._open_run(request.flow_id, request.run_id)
            st = run.steps.get(request.step_execution_id)
            step_type = request.step_execution_id.rpartition("-")[0]
            early = (st is not None and st.phase == "wait_for") or (
                st is None and any(mv.step_type == step_type for mv, _ in run.queue)
            )
            left = deadline - now()
            if not early or left <= 0:
                break
            await self.notifier.wait(("flow", run.flow_id), left)
        index = -1
        if st is not None and st.phase == "waiting" and st.waiting is not None:
            if request.timer_condition_id:
                for i, t in enumerate(st.waiting.timer_conditions):
                    if t.condition_id == request.timer_condition_id:
                        index = i
                        break
            elif request.HasField("timer_condition_index"):
                index = request.timer_condition_index
        if (
            st is None
            or not 0 <= index < len(st.timers)
            or st.timers[index][1] != TIMER_PENDING
        ):
            raise invalid("requested timer condition does not exist or is not pending")
        self.skip_timer(run, st, index)
        self.settle(run)
        return empty_pb2.Empty()

    async def UpdateFlowConfig(
        self, request: pb.UpdateFlowConfigRequest, context: Any
    ) -> empty_pb2.Empty:
        run = self._open_run(request.flow_id, request.run_id)
        cfg = request.flow_config
        for name in ("active_step_search_mode", "continue_as_new_threshold",
                     "continue_as_new_page_size_in_bytes", "step_durability"):
            if cfg.HasField(name):
                setattr(run.config, name, getattr(cfg, name))
        for name in ("worker_target", "attribute_store_names"):
            if cfg.HasField(name):
                getattr(run.config, name).CopyFrom(getattr(cfg, name))
        if cfg.HasField("continue_as_new_threshold"):
            run.can_threshold = cfg.continue_as_new_threshold
        self.flush(run)
        return empty_pb2.Empty()

    async def TriggerContinueAsNew(
        self, request: pb.TriggerContinueAsNewRequest, context: Any
    ) -> empty_pb2.Empty:
        run = self._open_run(request.flow_id, request.run_id)
        self.continue_as_new(run)
        return empty_pb2.Empty()

    def continue_as_new(self, live: Run) -> None:
        """Close the current run as CONTINUED_AS_NEW and carry all its state into a new run.

        Waiting and queued Steps, attributes, pending channel messages (same IDs), counters
        and outputs move over; in-flight attempts keep running and commit into the new run
        (spec section 2.12).
        """
        old_id = live.run_id
        new_id = str(uuid.uuid4())
        closed = Run(
            flow_id=live.flow_id,
            run_id=old_id,
            seq=live.seq,
            flow_type=live.flow_type,
            status=pb.FLOW_STATUS_CONTINUED_AS_NEW,
            request_id=live.request_id,
            start_ts=live.start_ts,
            first_run_id=live.first_run_id,
            config=live.config,
            start_request=live.start_request,
            close_ts=now(),
            run_attempt=live.run_attempt,
            attributes=dict(live.attributes),
            next_event_id=live.next_event_id,
            continued_to=new_id,
            parents=live.parents,
            search=dict(live.search),
            counters=dict(live.counters),
            can_threshold=live.can_threshold,
        )
        closed.write = live.write
        self.add_history(
            closed,
            flow_closed=pb.FlowClosedHistoryEvent(
                flow_status=pb.FLOW_STATUS_CONTINUED_AS_NEW,
                continued_to_run_id=new_id,
                sticky_app_worker_id=live.sticky,
            ),
        )
        self.run_seq += 1
        live.run_id = new_id
        live.seq = self.run_seq
        live.start_ts = now()
        live.next_event_id = 1
        live.write = RunWrite(channels_moved_from=old_id)
        for key, value in live.attributes.items():
            live.write.set_attribute(key, value.SerializeToString())
        self.runs[old_id] = closed
        self.runs[new_id] = live
        self.flows[live.flow_id].append(new_id)
        for ready_key in [k for k in self.ready if k[0] == old_id]:
            del self.ready[ready_key]
            self.ready[(new_id, ready_key[1])] = None
        for inflight in self.inflight.values():
            if inflight.run_id == old_id:
                inflight.run_id = new_id
        self.rekey_schedules(old_id, new_id)
        self.add_history(
            live,
            flow_started_or_continued=pb.FlowStartedOrContinuedHistoryEvent(
                flow_execution_id=pb.FlowExecutionID(flow_id=live.flow_id, run_id=new_id),
                flow_type=live.flow_type,
                flow_config=live.config,
                continued_start=pb.FlowContinuedStart(
                    previous_run_id=old_id,
                    steps_to_start=[mv for mv, _ in live.queue],
                    attributes=[pb.KV(key=k, value=v) for k, v in live.attributes.items()],
                    completed_steps=live.results,
                    sticky_app_worker_id=live.sticky,
                ),
            ),
        )
        closed_write = closed.write
        closed_write.run_row = closed.row()
        live_write = live.write
        live.write = RunWrite()
        live_write.run_row = live.row()
        self.store.commit_many([(old_id, closed_write), (new_id, live_write)])
        closed.write = RunWrite()
        self.notifier.notify(("flow", live.flow_id))
        self.loop.call_soon(self.pump)
        _LOG.info("flow %s continued as new: %s -> %s", live.flow_id, old_id, new_id)

    async def ResetFlow(self, request: pb.ResetFlowRequest, context: Any) -> pb.ResetFlowResponse:
        kind = request.reset_type
        if kind not in pb.FlowResetType.values() or kind == pb.FLOW_RESET_TYPE_UNSPECIFIED:
            raise invalid("reset_type is required")
        if kind == pb.FLOW_RESET_TYPE_HISTORY_EVENT_TIME and not request.history_event_time:
            raise invalid("history_event_time is required")
        if kind == pb.FLOW_RESET_TYPE_STEP_TYPE and not request.step_type:
            raise invalid("step_type is required")
        if kind == pb.FLOW_RESET_TYPE_STEP_EXECUTION_ID and (
            not request.step_execution_id
            or request.step_method == pb.FLOW_RESET_STEP_METHOD_UNSPECIFIED
        ):
            raise invalid("step_execution_id and step_method are required")
        if kind != pb.FLOW_RESET_TYPE_STEP_EXECUTION_ID and request.step_method:
            raise invalid("step_method is only valid with STEP_EXECUTION_ID")
        source = self._existing_run(request.flow_id, request.run_id)
        events = []
        for _, data in self.store.history_page(source.run_id, 1, 10_000_000):
            event = pb.FlowHistoryEvent()
            event.ParseFromString(data)
            events.append(event)
        cut = _reset_point(events, request)
        run = self.time_travel(source, events, cut, request.skip_writes_reapply)
        return pb.ResetFlowResponse(run_id=run.run_id, run_attempt=run.run_attempt)

    def time_travel(
        self, source: Run, events: list[pb.FlowHistoryEvent], cut: int, skip_writes: bool
    ) -> Run:
        """Fork a new run whose state is the source run's state just before ``events[cut]``.

        The new run starts from the original request, then the recorded Step results,
        RPC commits and external writes before the cut are replayed into it without
        calling workers (same execution IDs and message IDs). Unless ``skip_writes``,
        external writes after the cut (RPC commits with their next Steps, SetAttributes,
        external publishes and deletes) are re-applied too; everything else re-executes
        (spec section 4.8). Timers restart from the new run's clock.
        """
        latest = self.latest_run(source.flow_id)
        if latest is not None and latest.is_open:
            self.close_run(latest, pb.FLOW_STATUS_TERMINATED)
            self.flush(latest)
        run = self._new_run(
            source.start_request,
            first_run_id=source.first_run_id,
            run_attempt=source.run_attempt,
            parents=source.parents,
        )
        self.add_history(
            run,
            time_travel_fork=pb.TimeTravelForkHistoryEvent(
                previous_run_id=source.run_id,
                previous_run_attempt=source.run_attempt,
                target_run_attempt=run.run_attempt,
                target_event_id=events[cut].event_id if cut < len(events) else 0,
            ),
        )
        self.replaying = True
        try:
            for event in events[:cut]:
                if not run.is_open:
                    break
                self._replay(run, event)
                self.advance(run)
            if not skip_writes:
                for event in events[cut:]:
                    if run.is_open:
                        self._reapply(run, event)
        finally:
            self.replaying = False
        self.settle(run)
        return run

    def _replay(self, run: Run, event: pb.FlowHistoryEvent) -> None:
        """Apply one recorded event of the source run to the forked run."""
        from ._commit import commit_execute, commit_wait_for

        kind = event.WhichOneof("payload")
        if kind == "step_wait_for_completed":
            ev = event.step_wait_for_completed
            st = run.steps.get(ev.context.step_execution_id)
            if st is None or st.phase != "wait_for":
                return
            out = ev.output
            resp = pb.InvokeWaitForMethodResponse(
                upsert_attributes=replayable_writes(out.upsert_attributes),
                upsert_step_exe_locals=out.upsert_step_execution_locals,
                record_events=out.record_events,
                publish_to_channel=out.publish_to_channel,
                delete_from_channel=out.delete_from_channel,
            )
            if out.HasField("wait_for_condition"):
                resp.waiting_condition.CopyFrom(out.wait_for_condition)
            self._quiet(run, st)
            commit_wait_for(self, run, st, resp)
        elif kind == "step_execute_completed":
            ev2 = event.step_execute_completed
            st = run.steps.get(ev2.context.step_execution_id)
            if st is None:
                return
            if st.phase == "waiting":
                for result in ev2.input.condition_results.channel_results:
                    if result.condition_status == pb.CONDITION_STATUS_COMPLETED:
                        self.consume(run, result.channel_name, len(result.values))
                for i in range(len(st.timers)):
                    self.unschedule(("timer", run.run_id, st.exe_id, i))
                st.cond_results = ev2.input.condition_results
                st.phase = "execute"
            if st.phase != "execute":
                return
            out2 = ev2.output
            self._quiet(run, st)
            commit_execute(
                self,
                run,
                st,
                pb.InvokeExecuteMethodResponse(
                    step_decision=out2.step_decision,
                    upsert_attributes=replayable_writes(out2.upsert_attributes),
                    record_events=out2.record_events,
                    upsert_step_exe_locals=out2.upsert_step_execution_locals,
                    publish_to_channel=out2.publish_to_channel,
                    delete_from_channel=out2.delete_from_channel,
                ),
            )
        elif kind in ("step_wait_for_failed", "step_execute_failed"):
            failed = getattr(event, kind)
            st = run.steps.get(failed.context.step_execution_id)
            method = "wait_for" if kind == "step_wait_for_failed" else "execute"
            if st is None or st.phase != method:
                return
            failure = failed.output.failure
            self._quiet(run, st)
            detail = failure.details.original_worker_error_detail or failure.backend_error
            self._method_exhausted(run, st, failure, detail)
        else:
            self._reapply(run, event)

    def _quiet(self, run: Run, st: StepExec) -> None:
        """Take a replayed execution out of dispatch before committing its recorded result."""
        self.ready.pop((run.run_id, st.exe_id), None)
        self.unschedule(("retry", run.run_id, st.exe_id))
        if not st.locks_held and self.lock_keys(st):
            st.locks_held = self.try_lock(run, self.lock_keys(st), st.exe_id)
        st.mstate = "dispatched"

    def _reapply(self, run: Run, event: pb.FlowHistoryEvent) -> None:
        kind = event.WhichOneof("payload")
        if kind == "rpc_execution_completed":
            rpc = event.rpc_execution_completed
            for deletion in rpc.delete_from_channel:
                self.delete_message(run, deletion.channel_name, deletion.message_id)
            for write in replayable_writes(rpc.upsert_attributes):
                self.set_attribute(run, write.key, write.value)
                self.index_attribute(run, write)
            for m in rpc.publish_to_channel:
                self.publish(run, m.channel_name, m.value, m.message_id)
            decision = pb.StepDecision()
            decision.CopyFrom(rpc.step_decision)
            decision.ClearField("close_decision")
            if decision.next_steps or decision.cancel_step_types:
                apply_decision(self, run, decision, f"__rpc/{rpc.rpc_name}", None, None)
            self.add_history(run, rpc_execution_completed=rpc)
        elif kind == "channel_external_publish":
            for m in event.channel_external_publish.messages:
                self.publish(run, m.channel_name, m.value, m.message_id)
            self.add_history(run, channel_external_publish=event.channel_external_publish)
        elif kind == "channel_external_delete":
            for d in event.channel_external_delete.messages:
                self.delete_message(run, d.channel_name, d.message_id)
            self.add_history(run, channel_external_delete=event.channel_external_delete)

    async def SearchFlows(
        self, request: pb.SearchFlowsRequest, context: Any
    ) -> pb.SearchFlowsResponse:
        from ._search import search_flows

        return search_flows(self, request)

    # RPCs -----------------------------------------------------------------------------------

    async def InvokeRPC(self, request: pb.InvokeRPCRequest, context: Any) -> pb.InvokeRPCResponse:
        if not request.flow_id or not request.rpc_name or not request.request_id:
            raise invalid("flow_id, rpc_name and request_id are required")
        if request.timeout_seconds < 0:
            raise invalid("timeout_seconds must not be negative")
        if any(not k for k in request.lock_attribute_keys):
            raise invalid("lock attribute keys must not be empty")
        _check_value(request.input, "input")
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
        budget = _remaining(context, budget) or budget
        if is_push(run):
            return await self._run_push_rpc(run, request, budget, transactional)
        started = now()
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
        except WorkerFailed as failed:
            raise _rpc_worker_error(failed) from None
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
        from ._push import run_rpc
        from ._requests import build_rpc_request

        rpc_request = build_rpc_request(self, run, request)
        refused = rpc_too_large(run, request.rpc_name, rpc_request)
        if refused is not None:
            raise refused
        try:
            response = await run_rpc(self, run, rpc_request, budget)
        except WorkerFailed as failed:
            raise _rpc_worker_error(failed) from None
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
        output = resp.output if has_kind(resp.output) else null_value()
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

    # Streams ----------------------------------------------------------------------------------

    async def WriteStream(self, request: pb.WriteStreamRequest, context: Any) -> empty_pb2.Empty:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if not request.source:
            raise invalid("source is required")
        if request.stream_capacity_bytes < 0:
            raise invalid("stream_capacity_bytes must not be negative")
        _check_value(request.value, "value")
        value = request.value if has_kind(request.value) else null_value()
        _streams.append(
            self,
            request.flow_type,
            request.stream_name,
            request.flow_id,
            value,
            request.source,
            request.stream_capacity_bytes,
        )
        return empty_pb2.Empty()

    async def ReadStream(
        self, request: pb.ReadStreamRequest, context: Any
    ) -> pb.ReadStreamResponse:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if request.wait_time_seconds < 0:
            raise invalid("wait_time_seconds must not be negative")
        after = 0
        if request.resume_token:
            after = _streams.parse_token(
                request.resume_token, request.flow_type, request.stream_name, request.flow_id
            )
        cap = min(float(request.wait_time_seconds or MAX_LONG_POLL), MAX_LONG_POLL)
        deadline = now() + _remaining(context, cap)
        key = ("stream", request.flow_type, request.stream_name, request.flow_id)
        while True:
            message = _streams.read_after(
                self, request.flow_type, request.stream_name, request.flow_id, after
            )
            if message is not None:
                return pb.ReadStreamResponse(message=message)
            left = deadline - now()
            if left <= 0:
                raise long_poll_timeout("no stream message arrived in time")
            await self.notifier.wait(key, left)

    async def ListStreamMessages(
        self, request: pb.ListStreamMessagesRequest, context: Any
    ) -> pb.ListStreamMessagesResponse:
        if not request.flow_id or not request.flow_type or not request.stream_name:
            raise invalid("flow_id, flow_type and stream_name are required")
        if request.page_size <= 0:
            raise invalid("page_size must be positive")
        size = min(request.page_size, 1000)
        before = 0
        if request.before_page_token:
            before = _streams.parse_token(
                request.before_page_token, request.flow_type, request.stream_name, request.flow_id
            )
        messages = _streams.list_before(
            self, request.flow_type, request.stream_name, request.flow_id, before, size + 1
        )
        resp = pb.ListStreamMessagesResponse(messages=messages[:size])
        if len(messages) > size:
            resp.next_page_token = messages[size - 1].resume_token
        return resp

    # Pull workers ------------------------------------------------------------------------------

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
    """Register FlowService and WorkerTaskService backed by ``engine``."""
    flow = dex_pb2_grpc.FlowServiceServicer()
    for method in pb.DESCRIPTOR.services_by_name["FlowService"].methods:
        setattr(flow, method.name, _wrap_unary(getattr(engine, method.name)))
    dex_pb2_grpc.add_FlowServiceServicer_to_server(flow, server)

    class _Tasks(dex_pb2_grpc.WorkerTaskServiceServicer):
        async def PollWorkerTask(self, request_iterator: Any, context: Any) -> None:
            try:
                await engine.PollWorkerTask(request_iterator, context)
            except ServiceError as err:
                await context.abort(
                    err.code, err.message, trailing_metadata=err.trailing_metadata()
                )

    dex_pb2_grpc.add_WorkerTaskServiceServicer_to_server(_Tasks(), server)


__all__ = ["DEFAULT_METHOD_TIMEOUT", "Engine", "add_services", "flow_result"]


_STEP_EVENTS = (
    "step_wait_for_completed",
    "step_wait_for_failed",
    "step_execute_completed",
    "step_execute_failed",
)


def _step_context(event: pb.FlowHistoryEvent) -> pb.StepMethodEventContext | None:
    kind = event.WhichOneof("payload")
    if kind in _STEP_EVENTS:
        context: pb.StepMethodEventContext = getattr(event, kind).context
        return context
    return None


def _reset_point(events: list[pb.FlowHistoryEvent], request: pb.ResetFlowRequest) -> int:
    """Index of the first event that the forked run must not inherit (spec section 4.8)."""
    kind = request.reset_type
    if kind == pb.FLOW_RESET_TYPE_BEGINNING:
        return 0
    if kind == pb.FLOW_RESET_TYPE_HISTORY_EVENT_TIME:
        try:
            target = datetime.fromisoformat(request.history_event_time.replace("Z", "+00:00"))
        except ValueError as exc:
            raise invalid("history_event_time is not an ISO-8601 time") from exc
        if target.tzinfo is None:
            target = target.replace(tzinfo=UTC)
        for i, event in enumerate(events):
            if event.event_time.ToDatetime(tzinfo=UTC) >= target:
                return max(i, 1)
        return len(events)
    if kind == pb.FLOW_RESET_TYPE_STEP_TYPE:
        best: tuple[int, str] | None = None
        for event in events:
            ctx = _step_context(event)
            if ctx is None or ctx.step_type != request.step_type:
                continue
            number = int(ctx.step_execution_id.rsplit("-", 1)[1])
            if best is None or number > best[0]:
                best = (number, ctx.step_execution_id)
        if best is None:
            raise invalid(f"step type {request.step_type!r} never ran in this run")
        exe_id = best[1]
        kinds: tuple[str, ...] = _STEP_EVENTS
    else:
        exe_id = request.step_execution_id
        kinds = (
            _STEP_EVENTS[:2]
            if request.step_method == pb.FLOW_RESET_STEP_METHOD_WAIT_FOR
            else _STEP_EVENTS[2:]
        )
    for i, event in enumerate(events):
        ctx = _step_context(event)
        if (
            ctx is not None
            and event.WhichOneof("payload") in kinds
            and ctx.step_execution_id == exe_id
        ):
            return i
    raise invalid(f"no recorded {exe_id!r} method to travel to")


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
