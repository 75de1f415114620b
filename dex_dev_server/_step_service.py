"""FlowService Steps and timers: wait for a Step execution, skip a timer (spec section 4)."""

from __future__ import annotations

from typing import Any

from dex.dexpb import dex_pb2 as pb
from google.protobuf import empty_pb2

from ._clock import now
from ._errors import invalid, long_poll_timeout, not_found
from ._model import TIMER_PENDING, Run
from ._runs import MAX_LONG_POLL, RunEngine, long_poll_budget

SKIP_TIMER_WAIT = 5.0
#: Phases of a Step execution whose method a worker may be running; its result may schedule
#: further Step executions.
_IN_FLIGHT = ("wait_for", "execute")


def _may_still_appear(run: Run, exe_id: str) -> bool:
    """Whether Step execution ``exe_id`` (``<type>-<n>``), absent from ``run``, may still be
    created soon: a movement to its type is queued, or it is the next execution of its type
    and the run has a movement queued or a Step method in flight (either may schedule it)."""
    step_type, _, number = exe_id.rpartition("-")
    if any(mv.step_type == step_type for mv, _ in run.queue):
        return True
    if not number.isdecimal() or int(number) != run.counters.get(step_type, 0) + 1:
        return False
    return bool(run.queue) or any(st.phase in _IN_FLIGHT for st in run.steps.values())


class StepService(RunEngine):
    """FlowService handlers for Step executions and their timers."""

    # Steps and timers ---------------------------------------------------------------------------

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
        deadline = now() + long_poll_budget(context, cap)
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
        # yet, nor has one that a running Step method has still to schedule; the skip waits
        # (bounded) for them instead of failing, as the Dex server keeps an early skip until
        # the timer exists. It is committed before the reply.
        deadline = now() + long_poll_budget(context, SKIP_TIMER_WAIT)
        while True:
            run = self._open_run(request.flow_id, request.run_id)
            st = run.steps.get(request.step_execution_id)
            early = (st is not None and st.phase == "wait_for") or (
                st is None and _may_still_appear(run, request.step_execution_id)
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
