"""Step lifecycles: executions, locks, waiting conditions, timers, attempts and closing.

Every mutation happens synchronously on the asyncio loop thread, so a run's reducer never
interleaves with another change; each externally triggered change ends with
:meth:`EngineState.flush`, which writes the run's changes to SQLite in one transaction before
anything is acknowledged (spec sections 2, 3 and 7).

One piece past 600 lines because ``StepMachine`` is one of the engine's mixins: the lifecycles
above change the same Step execution records in one reducer.
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any

from dex.dexpb import dex_pb2 as pb

from ._clock import now
from ._model import (
    START_FROM,
    TIMEOUT_HANDLER_ID,
    TIMEOUT_HANDLER_TYPE,
    TIMER_FIRED,
    TIMER_PENDING,
    TIMER_SKIPPED,
    Run,
    StepExec,
    has_kind,
    null_value,
)
from ._requests import method_context
from ._state import DEFAULT_TOTAL_RETRY, EngineState

_LOG = logging.getLogger("dex_dev_server")


class StepMachine(EngineState):
    """The Step execution reducer on top of :class:`EngineState` (spec section 2)."""

    # Step executions -------------------------------------------------------------------------

    def enqueue(
        self,
        run: Run,
        movement: pb.StepMovement,
        from_id: str,
        recovery: pb.RecoveryErrorInfo | None = None,
        not_before: float = 0.0,
    ) -> None:
        """Queue a movement (a Step execution is created when it is dequeued)."""
        mv = pb.StepMovement()
        mv.CopyFrom(movement)
        mv.from_step_execution_id_internal_only = from_id
        if recovery is not None:
            mv.recovery_error_internal_only.CopyFrom(recovery)
        if not has_kind(mv.step_input):
            mv.step_input.CopyFrom(null_value())
        else:
            reference = self.offload(run, mv.step_input)
            if reference is not mv.step_input:
                mv.step_input.CopyFrom(reference)
        run.queue.append((mv, not_before))

    def user_step_count(self, run: Run) -> int:
        """Queued plus executing user Steps (the timeout Step is excluded)."""
        return len(run.queue) + sum(1 for s in run.steps.values() if not s.system)

    def settle(self, run: Run) -> None:
        """After a change to ``run``: move it as far as it can go, commit, and dispatch."""
        self.advance(run)
        self.flush(run)
        self.pump()

    def advance(self, run: Run) -> None:
        """Dequeue movements, evaluate waits and check graceful completion.

        Locks are not taken here but when a method's task goes to a worker
        (:meth:`lock_for_dispatch`).
        """
        progressed = True
        while progressed and run.is_open:
            progressed = False
            t = now()
            remaining: list[tuple[pb.StepMovement, float]] = []
            for mv, at in run.queue:
                if at > t:
                    remaining.append((mv, at))
                    continue
                self._create_step(run, mv)
                progressed = True
            run.queue = remaining
            if remaining:
                self.schedule(
                    ("queue", run.run_id),
                    min(at for _, at in remaining),
                    functools.partial(self._tick, run),
                )
            waiting = sorted(
                (s for s in run.steps.values() if s.phase == "waiting"),
                key=lambda s: s.wait_order,
            )
            for st in waiting:
                if st.exe_id in run.steps and self._evaluate_wait(run, st):
                    progressed = True
        if run.is_open and run.graceful and self.user_step_count(run) == 0:
            self.close_run(run, pb.FLOW_STATUS_COMPLETED)

    def _tick(self, run: Run) -> None:
        if run.is_open:
            self.settle(run)

    def _create_step(self, run: Run, mv: pb.StepMovement) -> None:
        n = run.counters.get(mv.step_type, 0) + 1
        run.counters[mv.step_type] = n
        st = StepExec(
            exe_id=f"{mv.step_type}-{n}",
            step_type=mv.step_type,
            movement=mv,
            phase="execute" if mv.step_options.skip_wait_for else "wait_for",
            created_order=run.next_order(),
        )
        run.steps[st.exe_id] = st
        self.start_method(run, st, st.phase)

    def start_method(self, run: Run, st: StepExec, method: str) -> None:
        """Begin a fresh method (attempt 1) of a Step execution: it is ready for a worker."""
        st.phase = method
        st.mstate = "ready"
        st.attempt = 1
        st.first_attempt_ts = 0.0
        st.method_started = now()
        st.heartbeat = None
        st.last_failure = None
        self.ready[(run.run_id, st.exe_id)] = None

    def lock_keys(self, st: StepExec) -> list[str]:
        """Physical attribute keys the current method must hold."""
        opts = st.options
        keys = (
            opts.wait_for_lock_attribute_keys
            if st.phase == "wait_for"
            else opts.execute_lock_attribute_keys
        )
        return sorted(set(keys))

    def lock_for_dispatch(self, run: Run, st: StepExec) -> bool:
        """Take the current method's locks as its task goes to a worker (spec section 3.1).

        Taken at dispatch rather than when the method becomes ready, so a method that waits
        for a free worker slot holds nothing and a locking RPC is not refused meanwhile. The
        locks stay held across the method's retries and go with :meth:`release_locks`.
        Returns ``False``, taking nothing, while another Step or RPC holds one of the keys;
        the method stays ready and the dispatcher tries again after the holder releases.
        """
        if st.locks_held:
            return True
        keys = self.lock_keys(st)
        if not keys:
            return True
        if not self.try_lock(run, keys, st.exe_id):
            return False
        st.locks_held = True
        return True

    def requeue_undelivered(self, run: Run, st: StepExec) -> None:
        """Put a method whose task never ran (worker at capacity, stream closed before it
        started) back in line for a worker at the same attempt.

        Locks taken for a first attempt's dispatch are released, as nothing of the method ran
        under them; a later attempt keeps its locks, which span all retries (spec section 3.1).
        """
        st.mstate = "ready"
        st.task_id = ""
        if st.attempt <= 1:
            self.release_locks(run, st)
        self.ready[(run.run_id, st.exe_id)] = None

    def release_locks(self, run: Run, st: StepExec) -> None:
        """Release the current method's locks (and let blocked Steps retry)."""
        if st.locks_held:
            self.unlock(run, st.exe_id)
            st.locks_held = False

    def finish_step(self, run: Run, st: StepExec) -> None:
        """Remove a finished (or canceled) execution from the run."""
        self.release_locks(run, st)
        self.ready.pop((run.run_id, st.exe_id), None)
        self.unschedule(("retry", run.run_id, st.exe_id))
        for i in range(len(st.timers)):
            self.unschedule(("timer", run.run_id, st.exe_id, i))
        run.steps.pop(st.exe_id, None)

    def cancel_step(self, run: Run, st: StepExec) -> None:
        """Cancel an execution in any phase: cancel its task and discard its results."""
        self._cancel_inflight(st)
        self.finish_step(run, st)

    def _cancel_inflight(self, st: StepExec) -> None:
        if st.mstate == "dispatched" and st.task_id:
            inflight = self.inflight.get(st.task_id)
            if inflight is not None and inflight.valid:
                inflight.valid = False
                if inflight.deadline_handle is not None:
                    inflight.deadline_handle.cancel()
                if inflight.stream is not None:
                    inflight.stream.out.put_nowait(
                        pb.PollWorkerTaskResponse(
                            cancel_task=pb.PollWorkerTaskCancelTask(task_id=st.task_id)
                        )
                    )
                if inflight.push_task is not None:
                    inflight.push_task.cancel()
                    self.inflight.pop(st.task_id, None)
        st.task_id = ""

    # Waiting conditions -----------------------------------------------------------------------

    def enter_waiting(self, run: Run, st: StepExec, condition: pb.WaitingCondition) -> None:
        """Commit a wait_for's condition: set absolute timer due times and start waiting."""
        st.phase = "waiting"
        st.mstate = "waiting"
        st.waiting = condition
        st.wait_order = run.next_order()
        t = now()
        st.timers = []
        for timer in condition.timer_conditions:
            fire_at = float(
                timer.firing_unix_timestamp_seconds or math.ceil(t + timer.duration_seconds)
            )
            if timer.duration_seconds <= 0 and not timer.firing_unix_timestamp_seconds:
                fire_at = t
            st.timers.append([float(fire_at), float(TIMER_PENDING)])
        self.schedule_timers(run, st)
        for i, sub in enumerate(condition.sub_flow_conditions):
            self.start_sub_flow(run, st, i, sub)

    def start_sub_flow(
        self, run: Run, st: StepExec, position: int, condition: pb.SubFlowCondition
    ) -> None:
        """Start or attach the child Flow of a sub-flow condition (see ``RunEngine``)."""

    def after_close(self, run: Run) -> None:
        """Hook run after a run closed: flow retries and sub-flow result delivery."""

    def schedule_timers(self, run: Run, st: StepExec) -> None:
        """(Re)arm the pending timers of a waiting execution."""
        for i, (fire_at, status) in enumerate(st.timers):
            if status == TIMER_PENDING:
                self.schedule(
                    ("timer", run.run_id, st.exe_id, i),
                    fire_at,
                    functools.partial(self._fire_timer, run, st.exe_id, i),
                )

    def _fire_timer(self, run: Run, exe_id: str, index: int) -> None:
        st = run.steps.get(exe_id)
        if not run.is_open or st is None or st.phase != "waiting" or index >= len(st.timers):
            return
        if st.timers[index][1] == TIMER_PENDING:
            st.timers[index][1] = float(TIMER_FIRED)
        self.settle(run)

    def skip_timer(self, run: Run, st: StepExec, index: int) -> None:
        """Mark a pending timer SKIPPED (counts as fired)."""
        st.timers[index][1] = float(TIMER_SKIPPED)
        self.unschedule(("timer", run.run_id, st.exe_id, index))

    def _evaluate_wait(self, run: Run, st: StepExec) -> bool:
        cond = st.waiting
        assert cond is not None
        timers = list(cond.timer_conditions)
        chans = list(cond.channel_conditions)
        subs = list(cond.sub_flow_conditions)
        ids: dict[str, tuple[str, int]] = {}
        for i, c in enumerate(timers):
            ids.setdefault(c.condition_id, ("t", i))
        for i, cc in enumerate(chans):
            ids.setdefault(cc.condition_id, ("c", i))
        for i, sc in enumerate(subs):
            ids.setdefault(sc.condition_id, ("s", i))
        all_refs = (
            [("t", i) for i in range(len(timers))]
            + [("c", i) for i in range(len(chans))]
            + [("s", i) for i in range(len(subs))]
        )
        kind = cond.waiting_condition_type
        if kind == pb.WAITING_CONDITION_TYPE_ANY_COMPLETED:
            candidates = [[ref] for ref in all_refs]
        elif kind == pb.WAITING_CONDITION_TYPE_ANY_COMBINATION_COMPLETED:
            candidates = [
                [ids[i] for i in combo.condition_ids if i in ids]
                for combo in cond.condition_combinations
            ]
        else:
            candidates = [all_refs]
        if not all_refs:
            candidates = [[]]
        for candidate in candidates:
            take = self._match(run, st, candidate, chans)
            if take is not None:
                self._promote(run, st, take, chans)
                return True
        return False

    @staticmethod
    def _bounds(cc: pb.ChannelCondition) -> tuple[int, float]:
        has_min, has_max = cc.HasField("at_least"), cc.HasField("at_most")
        if not has_min and not has_max:
            return 1, 1
        if has_max and not has_min:
            return 0, cc.at_most
        if has_min and not has_max:
            return cc.at_least, math.inf
        return cc.at_least, cc.at_most

    def _match(
        self, run: Run, st: StepExec, candidate: list[tuple[str, int]], chans: list[Any]
    ) -> dict[int, int] | None:
        for ref_kind, i in candidate:
            if ref_kind == "t" and st.timers[i][1] == TIMER_PENDING:
                return None
            if ref_kind == "s" and i not in st.subs:
                return None
        chan_idx = sorted(i for k, i in candidate if k == "c")
        available = {name: len(entries) for name, entries in run.channels.items()}
        take: dict[int, int] = {}
        for i in chan_idx:
            lo, _ = self._bounds(chans[i])
            name = chans[i].channel_name
            if available.get(name, 0) < lo:
                return None
            available[name] = available.get(name, 0) - lo
            take[i] = lo
        for i in chan_idx:
            _, hi = self._bounds(chans[i])
            name = chans[i].channel_name
            extra = min(available.get(name, 0), hi - take[i])
            extra = int(extra) if extra != math.inf else available.get(name, 0)
            take[i] += extra
            available[name] = available.get(name, 0) - extra
        return take

    def _promote(self, run: Run, st: StepExec, take: dict[int, int], chans: list[Any]) -> None:
        results = pb.ConditionResults()
        cond = st.waiting
        assert cond is not None
        for i, timer in enumerate(cond.timer_conditions):
            done = st.timers[i][1] != TIMER_PENDING
            results.timer_results.add(
                condition_id=timer.condition_id,
                condition_status=(
                    pb.CONDITION_STATUS_COMPLETED if done else pb.CONDITION_STATUS_WAITING
                ),
            )
            self.unschedule(("timer", run.run_id, st.exe_id, i))
        for i, cc in enumerate(chans):
            if i in take:
                results.channel_results.add(
                    condition_id=cc.condition_id,
                    channel_name=cc.channel_name,
                    condition_status=pb.CONDITION_STATUS_COMPLETED,
                    values=self.consume(run, cc.channel_name, take[i]),
                )
            else:
                results.channel_results.add(
                    condition_id=cc.condition_id,
                    channel_name=cc.channel_name,
                    condition_status=pb.CONDITION_STATUS_WAITING,
                )
        for i, _ in enumerate(cond.sub_flow_conditions):
            if i in st.subs:
                results.sub_flow_results.append(st.subs[i])
            else:
                results.sub_flow_results.add(flow_status=pb.FLOW_STATUS_RUNNING)
        st.cond_results = results
        if st.system:
            self._fire_flow_timeout(run, st)
            return
        self.start_method(run, st, "execute")

    # Flow timeout ---------------------------------------------------------------------------

    def create_timeout_step(self, run: Run, timeout_seconds: int) -> None:
        """Create ``sys:timeout_handler-1`` waiting on one timer (spec section 2.9)."""
        req = run.start_request
        opts = pb.StepOptions()
        h = req.flow_start_options.timeout_handler_options
        opts.execute_timeout_seconds = h.method_timeout_seconds
        opts.heartbeat_timeout_seconds = h.heartbeat_timeout_seconds
        if h.HasField("retry_policy"):
            opts.execute_retry_policy.CopyFrom(h.retry_policy)
        opts.execute_failure_policy = h.failure_policy
        opts.execute_failure_proceed_step_type = h.failure_proceed_step_type
        if h.HasField("failure_proceed_step_options"):
            opts.execute_failure_proceed_step_options.CopyFrom(h.failure_proceed_step_options)
        opts.execute_durability_override = h.durability_override
        opts.execute_lock_attribute_keys.extend(h.lock_attribute_keys)
        opts.execute_load_attribute_map_instances.extend(h.load_attribute_map_instances)
        opts.execute_load_channel_names.extend(h.load_channel_names)
        opts.execute_load_channel_map_instances.extend(h.load_channel_map_instances)
        mv = pb.StepMovement(
            step_type=TIMEOUT_HANDLER_TYPE,
            step_options=opts,
            from_step_execution_id_internal_only=START_FROM,
        )
        st = StepExec(
            exe_id=TIMEOUT_HANDLER_ID,
            step_type=TIMEOUT_HANDLER_TYPE,
            movement=mv,
            phase="waiting",
            system=True,
            created_order=run.next_order(),
        )
        run.counters[TIMEOUT_HANDLER_TYPE] = 1
        run.steps[st.exe_id] = st
        cond = pb.WaitingCondition(
            waiting_condition_type=pb.WAITING_CONDITION_TYPE_ANY_COMPLETED,
            timer_conditions=[
                pb.TimerCondition(
                    condition_id="flow-timeout",
                    duration_seconds=timeout_seconds,
                    firing_unix_timestamp_seconds=math.ceil(run.start_ts + timeout_seconds),
                )
            ],
        )
        self.enter_waiting(run, st, cond)

    def _fire_flow_timeout(self, run: Run, st: StepExec) -> None:
        req = run.start_request
        policy = req.flow_timeout_policy
        if policy == pb.FLOW_TIMEOUT_POLICY_CANCEL:
            self.close_run(run, pb.FLOW_STATUS_CANCELED)
        elif policy == pb.FLOW_TIMEOUT_POLICY_HANDLER:
            st.cond_results = None
            self.start_method(run, st, "execute")
        else:
            self.close_run(
                run,
                pb.FLOW_STATUS_FAILED,
                pb.FLOW_ERROR_TYPE_FLOW_TIMEOUT,
                f"Flow timed out after {req.flow_timeout_seconds} seconds",
            )

    # Closing --------------------------------------------------------------------------------

    def close_run(
        self, run: Run, status: int, error_type: int = 0, message: str = "", continued_to: str = ""
    ) -> None:
        """Close a run: cancel in-flight methods, drop queued/waiting Steps, record history."""
        if not run.is_open:
            return
        for st in list(run.steps.values()):
            if not st.system:
                run.unfinished_at_close.append(st.exe_id)
            self.cancel_step(run, st)
        run.queue.clear()
        run.locks.clear()
        self.unschedule(("queue", run.run_id))
        run.status = status
        run.error_type = error_type
        run.error_message = message
        run.close_ts = now()
        run.continued_to = continued_to
        if status != pb.FLOW_STATUS_COMPLETED:
            results: list[pb.StepCompletionOutput] = []
        else:
            results = run.results
        self.add_history(
            run,
            flow_closed=pb.FlowClosedHistoryEvent(
                flow_status=status,  # type: ignore[arg-type]
                results=results,
                error_type=error_type,  # type: ignore[arg-type]
                error_message=message,
                continued_to_run_id=continued_to,
                sticky_app_worker_id=run.sticky,
            ),
        )
        _LOG.info("flow %s run %s closed with status %s", run.flow_id, run.run_id,
                  pb.FlowStatus.Name(status))
        self.after_close(run)

    def add_output(self, run: Run, st: StepExec, output: pb.Value) -> None:
        """Collect a completion output (absent or ``null_value`` outputs are not collected)."""
        if output.WhichOneof("kind") in (None, "null_value"):
            return
        run.results.append(
            pb.StepCompletionOutput(
                completed_step_type=st.step_type,
                completed_step_execution_id=st.exe_id,
                completed_step_output=self.offload(run, output),
            )
        )

    # Attempts and retries ---------------------------------------------------------------------

    def failure(
        self,
        st: StepExec,
        backend_error: str = "",
        worker: pb.WorkerErrorResponse | None = None,
        reason: int = 0,
    ) -> pb.StepMethodFailure:
        """Build the StepMethodFailure of the current attempt."""
        details = pb.ServiceErrorResponse(
            detail=backend_error,
            sub_status=pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
            dispatch_task_error_reason=reason,  # type: ignore[arg-type]
        )
        if worker is not None:
            details.original_worker_error_detail = worker.detail
            details.original_worker_error_type = worker.error_type
            details.original_worker_error_status = worker.grpc_status or 2
            details.original_worker_error_stack_trace = worker.stack_trace
        served = st.wait_for_served_by if st.phase == "wait_for" else st.served_by
        return pb.StepMethodFailure(
            backend_error=backend_error,
            details=details,
            attempt=st.attempt,
            pull_routing=pb.PullRouting(served_by_app_worker_id=served),
        )

    def fail_attempt(
        self,
        run: Run,
        st: StepExec,
        failure: pb.StepMethodFailure,
        message: str,
        retry_after: int = 0,
        count: bool = True,
    ) -> None:
        """Record a failed attempt and schedule a retry, or apply the failure route."""
        st.last_failure = failure
        st.task_id = ""
        opts = st.options
        policy = opts.wait_for_retry_policy if st.phase == "wait_for" else opts.execute_retry_policy
        initial = policy.initial_interval_seconds or 1
        coefficient = policy.backoff_coefficient or 2.0
        maximum = policy.maximum_interval_seconds or 100
        total = policy.total_duration_seconds or DEFAULT_TOTAL_RETRY
        delay = float(min(initial * coefficient ** (st.attempt - 1), maximum))
        if retry_after > 0:
            delay = float(retry_after)
        elapsed = now() - (st.first_attempt_ts or now())
        exhausted = count and (
            (policy.maximum_attempts > 0 and st.attempt >= policy.maximum_attempts)
            or elapsed + delay >= total
        )
        if exhausted:
            self._method_exhausted(run, st, failure, message)
            return
        st.attempt += 1
        if not count:
            delay = 0.0
        st.mstate = "backoff"
        st.retry_at = now() + delay
        self._arm_retry(run, st)

    def _arm_retry(self, run: Run, st: StepExec) -> None:
        def retry() -> None:
            current = run.steps.get(st.exe_id)
            if current is st and run.is_open and st.mstate == "backoff":
                st.mstate = "ready"
                self.ready[(run.run_id, st.exe_id)] = None
                self.pump()

        self.schedule(("retry", run.run_id, st.exe_id), st.retry_at, retry)

    def _method_exhausted(
        self, run: Run, st: StepExec, failure: pb.StepMethodFailure, message: str
    ) -> None:
        opts = st.options
        detail = failure.details.original_worker_error_detail or message
        recovery = pb.RecoveryErrorInfo(
            detail=detail, error_type=failure.details.original_worker_error_type
        )
        if st.phase == "wait_for":
            if opts.wait_for_failure_policy == pb.WAIT_FOR_METHOD_FAILURE_POLICY_PROCEED_ON_FAILURE:
                self.add_history(
                    run,
                    step_wait_for_failed=pb.StepWaitForFailedEvent(
                        input=pb.StepMethodEventInput(step_input=st.movement.step_input),
                        output=pb.StepMethodFailedOutput(failure=failure),
                        context=method_context(run, st),
                    ),
                )
                self.release_locks(run, st)
                st.cond_results = pb.ConditionResults(wait_for_failed=True)
                st.recovery = recovery
                self.start_method(run, st, "execute")
                return
        elif (
            opts.execute_failure_policy
            == pb.EXECUTE_METHOD_FAILURE_POLICY_PROCEED_TO_CONFIGURED_STEP
            and opts.execute_failure_proceed_step_type
        ):
            self.add_history(
                run,
                step_execute_failed=pb.StepExecuteFailedEvent(
                    input=pb.StepMethodEventInput(step_input=st.movement.step_input),
                    output=pb.StepMethodFailedOutput(failure=failure),
                    context=method_context(run, st),
                ),
            )
            self.finish_step(run, st)
            mv = pb.StepMovement(
                step_type=opts.execute_failure_proceed_step_type,
                step_input=st.movement.step_input if not st.system else null_value(),
                step_options=opts.execute_failure_proceed_step_options,
            )
            self.enqueue(run, mv, st.exe_id, recovery=recovery)
            return
        self.close_run(run, pb.FLOW_STATUS_FAILED, pb.FLOW_ERROR_TYPE_WORKER_API_FAIL, detail)

    # Dispatch hook ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Hand ready tasks to workers (see :class:`~dex_dev_server._dispatch.Dispatcher`).

        The Step machine calls it when work may have become ready; dispatch lives in the
        layer above so that this module does not import it.
        """
