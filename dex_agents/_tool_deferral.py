"""Deferring a model response's tool calls: RunModel's ``ToolCallsRequested`` branch.

This module owns what happens between a model response that requested tool calls and the Steps
that run them (seed "Flow shape": RunModel): the runner contract's checks of the response
(``validate_tool_calls``), a record per call with its effect and policy limits, the interrupt
of each call that needs an approval, the built-in calls applied at once or given their own
Steps (plans, durable waits, questions), and the movements to the approval, tool and built-in
Steps. It names no turn-loop Step (RunModel adds ResumeTurn's movement itself): it imports
``_step_base``, ``_tool_steps``, ``_approval_steps`` and ``_builtin_steps`` below it, and
``_turn_endings`` and ``_steps`` import it.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from dex import AsyncContext, StepMovement

from dex_agents._approval_steps import approval_deadline, approval_movement
from dex_agents._builtin_records import PendingTimer, PendingUserInput
from dex_agents._builtin_steps import (
    AwaitUserInput,
    DurableWait,
    builtin_error,
    builtin_movement,
    first_question,
    write_plan,
)
from dex_agents._builtin_tools import (
    CANCELLED_BY_USER_INPUT_OUTPUT,
    DURABLE_WAIT_TOOL,
    REQUEST_USER_INPUT_TOOL,
    WRITE_TODOS_TOOL,
    BuiltinToolArgumentError,
    parse_durable_wait,
    parse_user_input,
)
from dex_agents._contract import AgentContractError, ToolCallsRequested, ToolPolicy
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    FRAMEWORK_RUN_STATE,
    PENDING_INTERRUPTS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentState,
    AgentStatus,
    AgentToolCall,
    ToolCallStatus,
    ToolEffect,
    TurnMode,
)
from dex_agents._step_base import add_usage, interrupt_id_for, utc_now
from dex_agents._subagent_steps import (
    is_subagent_call,
    subagent_calls_in,
    subagent_movement,
    subagent_refusal,
)
from dex_agents._tool_steps import publish_final, tool_movement


def validate_tool_calls(outcome: ToolCallsRequested, recorded: dict[str, AgentToolCall]) -> None:
    """Check a ``ToolCallsRequested`` against the runner contract and the turn's ``recorded``
    calls.

    Raises:
        AgentContractError: An empty ``framework_run_state`` or ``tool_calls``, a tool call ID
            that is empty, holds ``/`` or repeats within the turn, or a call without a
            ``ToolPolicy``.
    """
    if not isinstance(outcome.framework_run_state, str) or not outcome.framework_run_state:
        raise AgentContractError("ToolCallsRequested.framework_run_state must be non-empty text")
    if not outcome.tool_calls:
        raise AgentContractError("ToolCallsRequested.tool_calls must not be empty")
    seen = set(recorded)
    for call in outcome.tool_calls:
        tool_call_id = call.tool_call_id
        if not isinstance(tool_call_id, str) or not tool_call_id:
            raise AgentContractError("tool call IDs must be non-empty")
        if "/" in tool_call_id:
            raise AgentContractError(f"tool call ID {tool_call_id!r} must not contain '/'")
        if tool_call_id in seen:
            raise AgentContractError(f"tool call ID {tool_call_id!r} repeats within the turn")
        if not isinstance(call.policy, ToolPolicy):
            raise AgentContractError(f"tool call {tool_call_id!r} needs a ToolPolicy")
        seen.add(tool_call_id)


def defer_tool_calls(
    flow: SessionFlow,
    context: AsyncContext,
    events: AgentEventWriter,
    state: AgentState,
    recorded: dict[str, AgentToolCall],
    outcome: ToolCallsRequested,
) -> tuple[list[StepMovement[Any]], list[AgentInterrupt], AgentStatus]:
    """Store the calls of ``outcome`` and their interrupts, apply what runs at once
    (``write_todos``, refusals, a question's cancelled siblings), and return the movements of
    the Steps that run the rest, the raised interrupts and the new status (seed "Flow shape":
    RunModel). The caller adds ResumeTurn's movement after these.

    Raises:
        AgentContractError: ``outcome`` breaks the runner contract (``validate_tool_calls``).
    """
    assert state.turn_id is not None
    validate_tool_calls(outcome, recorded)
    now = utc_now()
    interrupts = list(PENDING_INTERRUPTS.get(context) or [])
    raised: list[AgentInterrupt] = []
    movements: list[StepMovement[Any]] = []
    options = flow.options
    mode = state.turn_mode if options.plans else TurnMode.CHAT
    planning = mode is TurnMode.PLANNING
    question = first_question(outcome) if options.user_input and not planning else None
    timer_taken = False
    plan_writes = sum(1 for call in outcome.tool_calls if call.tool_name == WRITE_TODOS_TOOL)
    # Subagent calls (platform addition, issue 29): the turn's earlier ones count against the
    # per-turn limit.
    children = subagent_calls_in(recorded.values())
    for order, call in enumerate(outcome.tool_calls, start=len(recorded)):
        builtin = AgentToolCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments=call.arguments,
            effect=ToolEffect.READ,
            requires_approval=False,
            status=ToolCallStatus.PENDING,
            deferral_order=order,
            turn_id=state.turn_id,
        )
        # write_todos applies at once, so a question in the same response does not cancel it
        # (a task that asks and is marked done in one response is not asked again).
        if options.plans and call.tool_name == WRITE_TODOS_TOOL:
            try:
                if plan_writes > 1:
                    raise BuiltinToolArgumentError(
                        "multiple_write_todos_calls: call write_todos once per response"
                    )
                plan, output = write_plan(context, mode, call.arguments)
            except BuiltinToolArgumentError as error:
                final = replace(builtin, status=ToolCallStatus.FAILED, error=str(error))
            else:
                final = replace(builtin, status=ToolCallStatus.SUCCEEDED, output=output)
                events.write_event(
                    AgentEventType.PLAN_UPDATED,
                    {
                        "revision": plan.revision if plan else None,
                        "status": str(plan.status) if plan else None,
                        "task_count": len(plan.tasks) if plan else 0,
                    },
                )
            publish_final(context, events, final)
            continue
        if planning:
            refusal = "only write_todos can run in plan mode; the plan executes after review"
            publish_final(
                context, events, replace(builtin, status=ToolCallStatus.FAILED, error=refusal)
            )
            continue
        if question is not None and call.tool_call_id != question[0]:
            # The response asked the user something: none of its other calls run
            # (write_todos, applied above, excepted).
            publish_final(
                context,
                events,
                replace(
                    builtin,
                    status=ToolCallStatus.CANCELLED,
                    output=CANCELLED_BY_USER_INPUT_OUTPUT,
                ),
            )
            continue
        if question is not None:
            _, prompt, choices = question
            AGENT_TOOL_CALLS.set(context, call.tool_call_id, builtin)
            PENDING_USER_INPUT.set(
                context, PendingUserInput(call.tool_call_id, prompt, choices, state.turn_id)
            )
            events.write_event(
                AgentEventType.USER_INPUT_REQUESTED,
                {"tool_call_id": call.tool_call_id, "prompt": prompt, "choices": choices},
            )
            movements.append(builtin_movement(AwaitUserInput, call.tool_call_id))
            continue
        if options.user_input and call.tool_name == REQUEST_USER_INPUT_TOOL:
            refusal = builtin_error(parse_user_input, call.arguments)
            publish_final(
                context, events, replace(builtin, status=ToolCallStatus.FAILED, error=refusal)
            )
            continue
        if options.durable_waits and call.tool_name == DURABLE_WAIT_TOOL:
            try:
                seconds, reason = parse_durable_wait(call.arguments)
                if timer_taken:
                    raise BuiltinToolArgumentError("only one durable_wait per model response")
            except BuiltinToolArgumentError as error:
                publish_final(
                    context,
                    events,
                    replace(builtin, status=ToolCallStatus.FAILED, error=str(error)),
                )
                continue
            timer_taken = True
            fires_at = now + timedelta(seconds=seconds)
            AGENT_TOOL_CALLS.set(context, call.tool_call_id, builtin)
            PENDING_TIMER.set(
                context,
                PendingTimer(call.tool_call_id, fires_at, seconds, reason, state.turn_id),
            )
            events.write_event(
                AgentEventType.DURABLE_WAIT_STARTED,
                {
                    "tool_call_id": call.tool_call_id,
                    "fires_at": fires_at.isoformat(),
                    "duration_seconds": seconds,
                    "reason": reason,
                },
            )
            movements.append(builtin_movement(DurableWait, call.tool_call_id))
            continue
        if is_subagent_call(flow, context, call.tool_name):
            subagent = replace(builtin, effect=ToolEffect.IDEMPOTENT_WRITE, subagent=True)
            refused = subagent_refusal(flow, context, call.arguments, children)
            if refused is not None:
                publish_final(
                    context,
                    events,
                    replace(subagent, status=ToolCallStatus.FAILED, error=refused),
                )
                continue
            children += 1
            AGENT_TOOL_CALLS.set(context, call.tool_call_id, subagent)
            events.write_event(
                AgentEventType.TOOL_CALL_DEFERRED,
                {
                    "tool_call_id": call.tool_call_id,
                    "tool_name": call.tool_name,
                    "effect": str(subagent.effect),
                    "requires_approval": False,
                },
            )
            movements.append(subagent_movement(call.tool_call_id))
            continue
        effect = ToolEffect(call.policy.effect)
        requires_approval = call.policy.is_approval_required
        record = AgentToolCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments=call.arguments,
            effect=effect,
            requires_approval=requires_approval,
            status=(
                ToolCallStatus.AWAITING_APPROVAL
                if requires_approval
                else ToolCallStatus.PENDING
            ),
            deferral_order=order,
            turn_id=state.turn_id,
            timeout_seconds=call.policy.timeout_seconds,
            retries=call.policy.retries,
        )
        AGENT_TOOL_CALLS.set(context, record.tool_call_id, record)
        events.write_event(
            AgentEventType.TOOL_CALL_DEFERRED,
            {
                "tool_call_id": record.tool_call_id,
                "tool_name": record.tool_name,
                "effect": str(effect),
                "requires_approval": requires_approval,
            },
        )
        if requires_approval:
            deadline = approval_deadline(flow, call.policy, now)
            interrupt = AgentInterrupt(
                interrupt_id=interrupt_id_for(record),
                tool_call_id=record.tool_call_id,
                tool_name=record.tool_name,
                arguments=record.arguments,
                deadline=deadline,
                turn_id=state.turn_id,
            )
            interrupts.append(interrupt)
            raised.append(interrupt)
            events.write_event(
                AgentEventType.INTERRUPT_RAISED,
                {
                    "interrupt_id": interrupt.interrupt_id,
                    "tool_call_id": record.tool_call_id,
                    "tool_name": record.tool_name,
                    "deadline": deadline.isoformat() if deadline is not None else None,
                },
            )
            movements.append(approval_movement(record.tool_call_id))
        else:
            movements.append(tool_movement(record))
    PENDING_INTERRUPTS.set(context, interrupts)
    FRAMEWORK_RUN_STATE.set(context, outcome.framework_run_state)
    add_usage(context, events, outcome.usage)
    # A question cancels every other call of the response: the turn waits for the user.
    status = (
        AgentStatus.WAITING_FOR_USER_INPUT
        if question is not None
        else AgentStatus.RUNNING_TOOLS
    )
    AGENT_STATE.set(context, replace(state, status=status))
    return movements, raised, status
