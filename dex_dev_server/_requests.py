"""Construction of worker requests (spec section 2.13) and history contexts (section 4.6)."""

from __future__ import annotations

from dex.dexpb import dex_pb2 as pb

from ._clock import duration, now, timestamp
from ._model import Run, StepExec, has_kind, null_value
from ._state import DEFAULT_METHOD_TIMEOUT, EngineState


def _selectors(st: StepExec) -> tuple[list[str], list[str], list[str]]:
    o = st.options
    if st.phase == "wait_for":
        maps = o.wait_for_load_attribute_map_instances
        names = o.wait_for_load_channel_names
        cmaps = o.wait_for_load_channel_map_instances
    else:
        maps = o.execute_load_attribute_map_instances
        names = o.execute_load_channel_names
        cmaps = o.execute_load_channel_map_instances
    return sorted(set(maps)), sorted(set(names)), sorted(set(cmaps))


def _context(run: Run, st: StepExec) -> pb.Context:
    ctx = pb.Context(
        flow_id=run.flow_id,
        run_id=run.run_id,
        flow_started_timestamp=int(run.start_ts),
        step_execution_id=st.exe_id,
        first_attempt_timestamp=int(st.first_attempt_ts),
        attempt=st.attempt,
        from_step_execution_id=st.from_id,
        run_attempt=run.run_attempt,
    )
    if st.movement.HasField("recovery_error_internal_only"):
        ctx.recovery_error.CopyFrom(st.movement.recovery_error_internal_only)
    elif st.phase == "execute" and st.recovery is not None:
        ctx.recovery_error.CopyFrom(st.recovery)
    if st.heartbeat is not None:
        ctx.last_heartbeat_value.CopyFrom(st.heartbeat)
    return ctx


def build_step_task(
    engine: EngineState, run: Run, st: StepExec, task_id: str, deadline: float
) -> pb.PollWorkerTask:
    """The ``PollWorkerTask`` for the current attempt of a Step method."""
    maps, names, cmaps = _selectors(st)
    infos, loaded = engine.channel_view(run, names, cmaps)
    attributes = engine.attributes_for(run, maps)
    ctx = _context(run, st)
    step_input = st.movement.step_input if has_kind(st.movement.step_input) else null_value()
    task = pb.PollWorkerTask(task_id=task_id, deadline=timestamp(deadline))
    if st.phase == "wait_for":
        task.wait_for.CopyFrom(
            pb.InvokeWaitForMethodRequest(
                context=ctx,
                flow_type=run.flow_type,
                step_type=st.step_type,
                step_input=step_input,
                attributes=attributes,
                channel_infos=infos,
                loaded_channel_messages=loaded,
                loaded_attribute_map_instances=maps,
                loaded_channel_names=names,
                loaded_channel_map_instances=cmaps,
            )
        )
    else:
        req = pb.InvokeExecuteMethodRequest(
            context=ctx,
            flow_type=run.flow_type,
            step_type=st.step_type,
            attributes=attributes,
            step_exe_locals=[pb.KV(key=k, value=v) for k, v in st.locals.items()],
            channel_infos=infos,
            loaded_channel_messages=loaded,
            loaded_attribute_map_instances=maps,
            loaded_channel_names=names,
            loaded_channel_map_instances=cmaps,
        )
        if not st.system:
            req.step_input.CopyFrom(step_input)
        if st.cond_results is not None:
            req.condition_results.CopyFrom(st.cond_results)
        task.execute.CopyFrom(req)
    return task


def build_rpc_request(
    engine: EngineState, run: Run, request: pb.InvokeRPCRequest
) -> pb.InvokeWorkerRPCRequest:
    """The worker-side request of an InvokeRPC (spec section 4.1 step 5)."""
    maps = sorted(set(request.load_attribute_map_instances))
    names = sorted(set(request.load_channel_names))
    cmaps = sorted(set(request.load_channel_map_instances))
    infos, loaded = engine.channel_view(run, names, cmaps)
    return pb.InvokeWorkerRPCRequest(
        context=pb.Context(
            flow_id=run.flow_id,
            run_id=run.run_id,
            flow_started_timestamp=int(run.start_ts),
            run_attempt=run.run_attempt,
        ),
        flow_type=run.flow_type,
        rpc_name=request.rpc_name,
        input=request.input if has_kind(request.input) else null_value(),
        attributes=engine.attributes_for(run, maps),
        channel_infos=infos,
        loaded_channel_messages=loaded,
        loaded_attribute_map_instances=maps,
        loaded_channel_names=names,
        loaded_channel_map_instances=cmaps,
    )


def method_context(run: Run, st: StepExec) -> pb.StepMethodEventContext:
    """``StepMethodEventContext`` of the current method, for history events."""
    o = st.options
    if st.phase == "wait_for":
        timeout = o.wait_for_timeout_seconds
        policy = o.wait_for_retry_policy
        durability = o.wait_for_durability_override
        served = st.wait_for_served_by
    else:
        timeout = o.execute_timeout_seconds
        policy = o.execute_retry_policy
        durability = o.execute_durability_override
        served = st.served_by
    started = st.first_attempt_ts or st.method_started or now()
    ctx = pb.StepMethodEventContext(
        step_execution_id=st.exe_id,
        from_step_execution_id=st.from_id,
        step_type=st.step_type,
        durability=durability or run.config.step_durability or pb.STEP_DURABILITY_ASYNC,
        final_attempt=st.attempt,
        started_time=timestamp(started),
        duration=duration(max(0.0, now() - started)),
        method_options=pb.StepMethodOptions(
            timeout_seconds=timeout or DEFAULT_METHOD_TIMEOUT,
            retry_policy=policy,
            heartbeat_timeout_seconds=o.heartbeat_timeout_seconds or 60,
        ),
        pull_routing=pb.PullRouting(
            served_by_app_worker_id=served, sticky_app_worker_id=run.sticky
        ),
    )
    if st.last_failure is not None:
        ctx.last_failure_info.CopyFrom(st.last_failure)
    return ctx
