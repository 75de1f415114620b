"""``AwaitToolApproval``: a tool call waiting for its approval (seed "Flow shape").

This module owns the approval side of a tool call: the Step that waits for the interrupt's
answer or its deadline Timer, its options and movement, and the deadline a policy gives an
approval. An approved call moves on to its tool Step (``_tool_steps.tool_movement``); a
rejected, expired or withdrawn one is made final here. It imports ``_step_base``,
``_turn_interruptions`` and ``_tool_steps`` below it; the deferral of tool calls and the
turn-loop Steps import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime, timedelta
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
    go_to_many,
)

from dex_agents._contract import ToolPolicy
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._history import TOOL_NAME_RECORD
from dex_agents._observer import ClosedInterrupt, InterruptOutcome
from dex_agents._options import SessionFlow
from dex_agents._persistence import AGENT_TOOL_CALLS, INTERRUPT_RESOLUTIONS, PENDING_INTERRUPTS
from dex_agents._records import AgentInterrupt, ToolCallStatus
from dex_agents._step_base import (
    SessionStep,
    deadline_timer_seconds,
    interrupt_id_for,
    observe,
    record_load,
    record_step_outcome,
    sync_options,
    utc_now,
)
from dex_agents._tool_steps import finish_tool_call, open_record, tool_movement
from dex_agents._turn_interruptions import cancelled_output

#: The ``condition_id`` of AwaitToolApproval's deadline Timer (stable, so ``skip_timer`` can
#: name it).
DEADLINE_TIMER_ID = "interrupt-deadline"


def _approval_step_options(**loads: Any) -> StepOptions:
    return sync_options(execute_lock_attributes=(PENDING_INTERRUPTS.lock(),), **loads)


def approval_options(tool_call_id: str) -> StepOptions:
    """``AwaitToolApproval``: its own record, and PendingInterrupts locked while it decides."""
    return _approval_step_options(**record_load(tool_call_id))


def approval_movement(tool_call_id: str) -> StepMovement[str]:
    """The movement to ``AwaitToolApproval`` for ``tool_call_id``."""
    return StepMovement.of(AwaitToolApproval, tool_call_id, options=approval_options(tool_call_id))


def approval_deadline(
    flow: SessionFlow, policy: ToolPolicy, now: datetime
) -> datetime | None:
    """The deadline of an approval: the policy's own (platform addition), else the Flow's."""
    if policy.approval_deadline_seconds is not None:
        return now + timedelta(seconds=policy.approval_deadline_seconds)
    after = flow.options.interrupt_deadline
    return now + after if after is not None else None


def _find_interrupt(
    interrupts: Sequence[AgentInterrupt], interrupt_id: str
) -> AgentInterrupt | None:
    return next((item for item in interrupts if item.interrupt_id == interrupt_id), None)


class AwaitToolApproval(SessionStep, Step[str]):
    """Waits for the interrupt's answer, plus a Timer at its deadline while it is pending.

    Approved: marks the record approved and moves to its tool Step. Rejected or expired: records
    ``rejected`` and publishes ToolCallResults. A Timer that fires early, or races an answer that
    already left PendingInterrupts, waits again.
    """

    def get_step_options(self) -> StepOptions:
        """SYNC, PendingInterrupts locked in ``execute``; movements add the record load."""
        return _approval_step_options()

    async def wait_for(self, context: AsyncContext, input: str) -> Wait:  # type: ignore[override]
        record = open_record(context, input)
        if record is None or record.status is ToolCallStatus.APPROVED:
            return Wait.skip_immediately()
        # The history names the call's tool even after the turn ended and took the record.
        context.record_event(TOOL_NAME_RECORD, record.tool_name)
        interrupt_id = interrupt_id_for(record)
        answer = INTERRUPT_RESOLUTIONS.for_one(interrupt_id)
        pending = _find_interrupt(PENDING_INTERRUPTS.get(context) or [], interrupt_id)
        if pending is None or pending.deadline is None:
            return Wait.until(answer)
        seconds = deadline_timer_seconds(pending.deadline, utc_now())
        timer = Timer.by_duration(timedelta(seconds=seconds), condition_id=DEADLINE_TIMER_ID)
        return Wait.any_of(answer, timer)

    async def execute(self, context: AsyncContext, input: str) -> StepDecision:  # type: ignore[override]
        record = open_record(context, input)
        if record is None:
            # Its turn ended (failed, cancelled, stopped) and withdrew the approval.
            record_step_outcome(context, "withdrawn")
            return dead_end()
        if record.status is ToolCallStatus.APPROVED:
            return go_to_many(tool_movement(record))
        interrupt_id = interrupt_id_for(record)
        events = AgentEventWriter(self._flow.agent_events, context, record.turn_id)
        try:
            answers = INTERRUPT_RESOLUTIONS.results(context, interrupt_id)
            if answers and answers[0].superseded:
                record_step_outcome(context, "withdrawn", detail=answers[0].rejection_message)
                # ResumeTurn withdrew the interrupt for a steered message (and told the
                # observer); the call never runs.
                events.write_event(
                    AgentEventType.INTERRUPT_RESOLVED,
                    {
                        "interrupt_id": interrupt_id,
                        "approved": False,
                        "rejection_message": answers[0].rejection_message,
                        "superseded": True,
                    },
                )
                cancelled = replace(
                    record,
                    status=ToolCallStatus.CANCELLED,
                    output=cancelled_output(context, record.turn_id),
                )
                return finish_tool_call(context, events, cancelled)
            if answers:
                answer = answers[0]
                resolved: dict[str, Any] = {
                    "interrupt_id": interrupt_id,
                    "approved": answer.approved,
                    "rejection_message": answer.rejection_message,
                }
                if answer.approved and answer.edited_arguments is not None:
                    # Platform addition (approve with edits); absent otherwise, so the seed's
                    # payload is unchanged for every other answer.
                    resolved["edited"] = True
                record_step_outcome(
                    context,
                    "approved" if answer.approved else "rejected",
                    detail=None if answer.approved else answer.rejection_message,
                )
                events.write_event(AgentEventType.INTERRUPT_RESOLVED, resolved)
                await observe(
                    self._flow,
                    context,
                    status=None,
                    turn_id=record.turn_id,
                    closed=[
                        ClosedInterrupt(
                            interrupt_id,
                            InterruptOutcome.APPROVED
                            if answer.approved
                            else InterruptOutcome.REJECTED,
                            None if answer.approved else answer.rejection_message,
                        )
                    ],
                )
                if answer.approved:
                    approved = replace(record, status=ToolCallStatus.APPROVED)
                    if answer.edited_arguments is not None:
                        # The tool Step runs whatever the record holds; the model's own
                        # arguments stay for the audit and the model's note.
                        approved = replace(
                            approved,
                            arguments=answer.edited_arguments,
                            original_arguments=record.arguments,
                        )
                    AGENT_TOOL_CALLS.set(context, record.tool_call_id, approved)
                    return go_to_many(tool_movement(approved))
                rejected = replace(
                    record,
                    status=ToolCallStatus.REJECTED,
                    rejection_message=answer.rejection_message,
                )
                return finish_tool_call(context, events, rejected)
            interrupts = PENDING_INTERRUPTS.get(context) or []
            pending = _find_interrupt(interrupts, interrupt_id)
            if pending is None or pending.deadline is None or utc_now() < pending.deadline:
                return go_to_many(approval_movement(record.tool_call_id))
            PENDING_INTERRUPTS.set(
                context, [item for item in interrupts if item.interrupt_id != interrupt_id]
            )
            message = f"No approval before the deadline {pending.deadline.isoformat()}."
            record_step_outcome(context, "expired", detail=message)
            events.write_event(
                AgentEventType.INTERRUPT_RESOLVED,
                {"interrupt_id": interrupt_id, "approved": False, "rejection_message": message},
            )
            expired = replace(record, status=ToolCallStatus.REJECTED, rejection_message=message)
            await observe(
                self._flow,
                context,
                status=None,
                turn_id=record.turn_id,
                closed=[ClosedInterrupt(interrupt_id, InterruptOutcome.EXPIRED, message)],
            )
            return finish_tool_call(context, events, expired)
        finally:
            events.close()
