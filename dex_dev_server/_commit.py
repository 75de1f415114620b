"""Applying committed wait_for and execute results (spec sections 2.4 and 2.5)."""

from __future__ import annotations

from dex.dexpb import dex_pb2 as pb

from ._model import Run, StepExec, history_writes
from ._requests import method_context
from ._steps import StepMachine


def commit_wait_for(
    engine: StepMachine, run: Run, st: StepExec, resp: pb.InvokeWaitForMethodResponse
) -> None:
    """Apply a wait_for result: effects, locals, history, then wait or go to execute."""
    published = engine.apply_effects(
        run, resp.upsert_attributes, resp.publish_to_channel, resp.delete_from_channel
    )
    for kv in resp.upsert_step_exe_locals:
        st.locals[kv.key] = engine.offload(run, kv.value)
    output = pb.StepWaitForCompletedOutput(
        upsert_attributes=history_writes(resp.upsert_attributes),
        publish_to_channel=published,
        record_events=resp.record_events,
        upsert_step_execution_locals=resp.upsert_step_exe_locals,
        delete_from_channel=resp.delete_from_channel,
    )
    if resp.HasField("waiting_condition"):
        output.wait_for_condition.CopyFrom(resp.waiting_condition)
    engine.add_history(
        run,
        step_wait_for_completed=pb.StepWaitForCompletedEvent(
            input=pb.StepMethodEventInput(step_input=st.movement.step_input),
            output=output,
            context=method_context(run, st),
        ),
    )
    if st.wait_for_served_by:
        run.sticky = st.wait_for_served_by
    engine.release_locks(run, st)
    if resp.HasField("waiting_condition"):
        engine.enter_waiting(run, st, resp.waiting_condition)
    else:
        st.cond_results = pb.ConditionResults()
        engine.start_method(run, st, "execute")


def commit_execute(
    engine: StepMachine, run: Run, st: StepExec, resp: pb.InvokeExecuteMethodResponse
) -> None:
    """Apply an execute result: effects, history, then the StepDecision."""
    published = engine.apply_effects(
        run, resp.upsert_attributes, resp.publish_to_channel, resp.delete_from_channel
    )
    engine.add_history(
        run,
        step_execute_completed=pb.StepExecuteCompletedEvent(
            input=pb.StepMethodEventInput(
                step_input=st.movement.step_input,
                condition_results=st.cond_results,
                step_execution_locals=[pb.KV(key=k, value=v) for k, v in st.locals.items()],
            ),
            output=pb.StepExecuteCompletedOutput(
                step_decision=resp.step_decision,
                upsert_attributes=history_writes(resp.upsert_attributes),
                publish_to_channel=published,
                record_events=resp.record_events,
                upsert_step_execution_locals=resp.upsert_step_exe_locals,
                delete_from_channel=resp.delete_from_channel,
            ),
            context=method_context(run, st),
        ),
    )
    if st.served_by:
        run.sticky = st.served_by
    engine.finish_step(run, st)
    apply_decision(engine, run, resp.step_decision, st.exe_id, st.from_id, st)


def apply_decision(
    engine: StepMachine,
    run: Run,
    decision: pb.StepDecision,
    from_id: str,
    parent_from: str | None,
    st: StepExec | None,
) -> None:
    """Apply cancellations, then the close decision or the next movements."""
    existing = list(run.steps.values())
    cancel_types = set(decision.cancel_step_types)
    sibling_types = set(decision.cancel_sibling_step_types)
    for other in existing:
        if other.system or other.exe_id not in run.steps:
            continue
        if other.step_type in cancel_types or (
            parent_from is not None
            and other.step_type in sibling_types
            and other.from_id == parent_from
        ):
            engine.cancel_step(run, other)
    if cancel_types or sibling_types:
        run.queue = [
            (mv, at)
            for mv, at in run.queue
            if mv.step_type not in cancel_types
            and not (
                parent_from is not None
                and mv.step_type in sibling_types
                and mv.from_step_execution_id_internal_only == parent_from
            )
        ]
    close = decision.close_decision if decision.HasField("close_decision") else None
    kind = close.close_decision_type if close is not None else 0
    if close is not None and kind != pb.CLOSE_DECISION_TYPE_UNSPECIFIED:
        output = close.close_input
        if kind == pb.CLOSE_DECISION_TYPE_GRACEFUL_COMPLETE:
            run.graceful = True
            if st is not None:
                engine.add_output(run, st, output)
        elif kind == pb.CLOSE_DECISION_TYPE_FORCE_COMPLETE:
            if st is not None:
                engine.add_output(run, st, output)
            engine.close_run(run, pb.FLOW_STATUS_COMPLETED)
            return
        elif kind == pb.CLOSE_DECISION_TYPE_FORCE_FAIL:
            engine.close_run(
                run,
                pb.FLOW_STATUS_FAILED,
                pb.FLOW_ERROR_TYPE_STEP_DECISION_FAILING_FLOW,
                output.string_value,
            )
            return
        elif kind == pb.CLOSE_DECISION_TYPE_FORCE_COMPLETE_ON_CHANNELS_EMPTY:
            if all(not run.channels.get(n) for n in close.conditional_channel_names):
                if st is not None:
                    engine.add_output(run, st, output)
                engine.close_run(run, pb.FLOW_STATUS_COMPLETED)
                return
        elif kind == pb.CLOSE_DECISION_TYPE_DEAD_END:
            pass
        else:
            engine.close_run(
                run, pb.FLOW_STATUS_FAILED, pb.FLOW_ERROR_TYPE_INTERNAL, "unknown close decision"
            )
            return
    elif st is not None and not decision.next_steps:
        engine.close_run(
            run,
            pb.FLOW_STATUS_FAILED,
            pb.FLOW_ERROR_TYPE_WORKER_API_FAIL,
            "invalid step decision: no next step and no close decision",
        )
        return
    for mv in decision.next_steps:
        engine.enqueue(run, mv, from_id)
