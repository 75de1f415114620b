"""FlowService for whole flows: server info, start / stop / wait, summaries, config, search.

Spec sections 4.2 to 4.7.
"""

from __future__ import annotations

import socket
from typing import Any

from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2

from ._blobs import BLOB_KINDS, LOAD_BLOBS_BUDGET, LOAD_BLOBS_ENTRY_OVERHEAD
from ._clock import now, timestamp
from ._crash import crash_point
from ._errors import invalid, long_poll_timeout
from ._model import TIMER_PENDING, Run
from ._runs import MAX_LONG_POLL, RunEngine, flow_result, long_poll_budget
from ._search import search_flows

SERVER_VERSION = "dex_dev_server-0.1.0"


class FlowLifecycleService(RunEngine):
    """FlowService handlers for whole flows."""

    # Server info --------------------------------------------------------------------------------

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
        """Answer blob references with their stored values (spec section 3.5): each known id
        maps to its concrete ``string_value`` or ``obj_value``; an unknown id, or one asked
        under the other kind, is left out. ``INVALID_ARGUMENT`` for an entry that is not a
        reference."""
        for entry in request.entries:
            if entry.blob_value.WhichOneof("kind") not in BLOB_KINDS:
                raise invalid("LoadBlobs entries must carry a blob id")
        response = pb.LoadBlobsResponse()
        left = LOAD_BLOBS_BUDGET
        for entry in request.entries:
            value = self.load_blob(entry.blob_value)
            if value is None:
                continue
            size = value.ByteSize() + LOAD_BLOBS_ENTRY_OVERHEAD
            if size > left:
                # The rest would pass the caller's 4 MiB receive limit: it asks again.
                break
            left -= size
            kind = entry.blob_value.WhichOneof("kind")
            response.values[getattr(entry.blob_value, kind)].CopyFrom(value)
        if response.values:
            crash_point("load-blobs")
        return response


    # Start / stop -------------------------------------------------------------------------------

    async def StartFlow(
        self, request: pb.StartFlowRequest, context: Any
    ) -> pb.StartFlowResponse:
        return pb.StartFlowResponse(run_id=self.start_flow(request))

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
        deadline = now() + long_poll_budget(context, cap)
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


    # Config, continue-as-new and search ---------------------------------------------------------

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

    async def SearchFlows(
        self, request: pb.SearchFlowsRequest, context: Any
    ) -> pb.SearchFlowsResponse:
        return search_flows(self, request)
