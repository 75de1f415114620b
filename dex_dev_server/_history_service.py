"""FlowService history: reading the history, and time travel with ResetFlow.

Spec sections 4.6 and 4.8.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from dex.dexpb import dex_pb2 as pb

from ._clock import now
from ._commit import apply_decision, commit_execute, commit_wait_for
from ._errors import invalid, long_poll_timeout
from ._model import Run, StepExec, replayable_writes
from ._runs import MAX_LONG_POLL, RunEngine, long_poll_budget


class HistoryService(RunEngine):
    """FlowService handlers for history events and resets."""

    # History ------------------------------------------------------------------------------------

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
        deadline = now() + long_poll_budget(context, MAX_LONG_POLL)
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


    # Time travel --------------------------------------------------------------------------------

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
