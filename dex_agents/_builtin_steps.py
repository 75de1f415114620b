"""The built-in tools as the Steps run them (platform additions).

This module owns what the session does with its own tools (``dex_agents._builtin_tools``
defines their schemas, arguments and outputs): the ``DurableWait`` and ``AwaitUserInput``
Steps with their movements and Timer ID, and the parts of a model response RunModel applies
at once (``write_plan`` for ``write_todos``, ``first_question`` and ``builtin_error`` for
``request_user_input``). Its Steps end by making their call final through ``_tool_steps``; it
imports ``_step_base``, ``_turn_interruptions`` and ``_tool_steps`` below it, and the deferral
of tool calls imports it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any

from dex import (
    AsyncContext,
    Step,
    StepDecision,
    StepMovement,
    StepOptions,
    Timer,
    Wait,
    dead_end,
)

from dex_agents._builtin_records import AgentPlan, PlanStatus, PlanTaskStatus
from dex_agents._builtin_tools import (
    REQUEST_USER_INPUT_TOOL,
    WAIT_CANCELLED_OUTPUT,
    WAIT_INTERRUPTED_OUTPUT,
    BuiltinToolArgumentError,
    parse_todos,
    parse_user_input,
    plan_updated_output,
    wait_completed_output,
    waiting_for_user_output,
)
from dex_agents._contract import ToolCallsRequested
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._persistence import (
    AGENT_PLAN,
    BUILTIN_WAKEUPS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
    USER_INPUT_ANSWER,
    USER_INPUT_ANSWERS,
)
from dex_agents._records import AgentUserMessage, ToolCallStatus, TurnMode
from dex_agents._step_base import (
    SessionStep,
    deadline_timer_seconds,
    interrupt_id_for,
    record_load,
    sync_options,
    utc_now,
)
from dex_agents._tool_steps import finish_tool_call, open_record
from dex_agents._turn_interruptions import cancel_pending, cancelled_output, stop_pending

#: ``condition_id`` of DurableWait's Timer.
DURABLE_WAIT_TIMER_ID = "durable-wait"


def first_question(outcome: ToolCallsRequested) -> tuple[str, str, list[str]] | None:
    """``(tool_call_id, prompt, choices)`` of the response's first valid ``request_user_input``
    call, or ``None``."""
    for call in outcome.tool_calls:
        if call.tool_name != REQUEST_USER_INPUT_TOOL:
            continue
        try:
            prompt, choices = parse_user_input(call.arguments)
        except BuiltinToolArgumentError:
            continue
        return call.tool_call_id, prompt, choices
    return None


def builtin_error(parse: Callable[[str], object], arguments: str) -> str:
    """Why ``parse`` refuses ``arguments``: the model-visible error of a built-in call."""
    try:
        parse(arguments)
    except BuiltinToolArgumentError as error:
        return str(error)
    return "invalid arguments"


def _builtin_options(tool_call_id: str, *locked: Any) -> StepOptions:
    return sync_options(execute_lock_attributes=locked, **record_load(tool_call_id))


def builtin_movement(step: type[Step[str]], tool_call_id: str) -> StepMovement[str]:
    """The movement to ``step`` (``DurableWait`` or ``AwaitUserInput``) for the call: its own
    record loaded, PendingUserInput locked for ``AwaitUserInput``."""
    locked = (PENDING_USER_INPUT.lock(),) if step is AwaitUserInput else ()
    return StepMovement.of(step, tool_call_id, options=_builtin_options(tool_call_id, *locked))


def write_plan(
    context: AsyncContext, mode: TurnMode, arguments: str
) -> tuple[AgentPlan | None, str]:
    """Apply one ``write_todos`` call: ``(new plan, model-visible output)``.

    Raises:
        BuiltinToolArgumentError: Unusable tasks, or a chat turn (no plan mode, no execution).
    """
    if mode is TurnMode.CHAT:
        raise BuiltinToolArgumentError(
            "write_todos is available only in plan mode or while a plan executes"
        )
    tasks = parse_todos(arguments)
    current = AGENT_PLAN.get(context)
    revision = (current.revision if current is not None else 0) + 1
    if mode is TurnMode.PLANNING:
        status = PlanStatus.DRAFT
    elif all(task.status is PlanTaskStatus.COMPLETED for task in tasks):
        status = PlanStatus.COMPLETED
    else:
        status = PlanStatus.ACTIVE
    plan = AgentPlan(revision, status, tasks)
    AGENT_PLAN.set(context, plan)
    output = plan_updated_output(cleared=not tasks, revision=revision, task_count=len(tasks))
    return plan, output


class DurableWait(SessionStep, Step[str]):
    """Runs a ``durable_wait`` call (platform addition): waits on a Dex Timer until
    ``PENDING_TIMER.fires_at``, or until ResumeTurn wakes it for a steered message.

    The Timer is the engine's, so it survives Worker and engine restarts; an operator can end
    the wait at once with ``skip_timer`` (condition ``DURABLE_WAIT_TIMER_ID``). Fired:
    ``succeeded`` with
    ``{"status": "completed", ...}``; steered: ``succeeded`` with ``{"status": "interrupted",
    "reason": "superseded_by_steered_user_message"}``; its turn cancelled (``cancel_turn``):
    the same with ``"reason": "turn_cancelled_by_user"``. Either way it clears
    ``PENDING_TIMER`` and publishes the call's result.
    """

    def get_step_options(self) -> StepOptions:
        return sync_options()

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = open_record(context, input)
        timer = PENDING_TIMER.get(context)
        if (
            record is None
            or timer is None
            or timer.tool_call_id != input
            or stop_pending(self._flow, context, record.turn_id)
        ):
            return Wait.skip_immediately()
        seconds = deadline_timer_seconds(timer.fires_at, utc_now())
        return Wait.any_of(
            BUILTIN_WAKEUPS.for_one(interrupt_id_for(record)),
            Timer.by_duration(timedelta(seconds=seconds), condition_id=DURABLE_WAIT_TIMER_ID),
        )

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = open_record(context, input)
        if record is None:
            return dead_end()
        timer = PENDING_TIMER.get(context)
        ours = timer is not None and timer.tool_call_id == input
        woken = bool(BUILTIN_WAKEUPS.results(context, interrupt_id_for(record)))
        if cancel_pending(context, record.turn_id):
            output = WAIT_CANCELLED_OUTPUT
        elif woken or stop_pending(self._flow, context, record.turn_id):
            output = WAIT_INTERRUPTED_OUTPUT
        else:
            seconds, reason = (
                (timer.duration_seconds, timer.reason) if timer is not None and ours else (0, "")
            )
            output = wait_completed_output(seconds, reason)
        if ours:
            PENDING_TIMER.delete(context)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            final = replace(record, status=ToolCallStatus.SUCCEEDED, output=output)
            return finish_tool_call(context, events, final)
        finally:
            events.close()


class AwaitUserInput(SessionStep, Step[str]):
    """Runs a ``request_user_input`` call (platform addition): waits for ``answer_user_input``
    (``USER_INPUT_ANSWERS``), or for ResumeTurn's wake-up when a steered message supersedes the
    question.

    Answered: ``succeeded`` with ``{"status": "waiting_for_user", "prompt", "choices"}`` and the
    answer kept in ``USER_INPUT_ANSWER``, which the next model call sees as a user message right
    after the tool results. Superseded: ``cancelled``. PendingUserInput is locked while it
    decides, as ``answer_user_input`` locks it.
    """

    def get_step_options(self) -> StepOptions:
        return sync_options(execute_lock_attributes=(PENDING_USER_INPUT.lock(),))

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = open_record(context, input)
        if record is None or stop_pending(self._flow, context, record.turn_id):
            return Wait.skip_immediately()
        key = interrupt_id_for(record)
        return Wait.any_of(USER_INPUT_ANSWERS.for_one(key), BUILTIN_WAKEUPS.for_one(key))

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = open_record(context, input)
        if record is None:
            return dead_end()
        key = interrupt_id_for(record)
        answers = USER_INPUT_ANSWERS.results(context, key)
        pending = PENDING_USER_INPUT.get(context)
        if pending is not None and pending.tool_call_id == input:
            PENDING_USER_INPUT.delete(context)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            if answers:
                prompt, choices = parse_user_input(record.arguments)
                USER_INPUT_ANSWER.set(context, AgentUserMessage(text=answers[0].answer))
                events.write_event(
                    AgentEventType.USER_INPUT_ANSWERED, {"tool_call_id": record.tool_call_id}
                )
                final = replace(
                    record,
                    status=ToolCallStatus.SUCCEEDED,
                    output=waiting_for_user_output(prompt, choices),
                )
            else:
                final = replace(
                    record,
                    status=ToolCallStatus.CANCELLED,
                    output=cancelled_output(context, record.turn_id),
                )
            return finish_tool_call(context, events, final)
        finally:
            events.close()
