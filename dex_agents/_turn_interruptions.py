"""Steer and ``cancel_turn`` as the Steps see them (platform additions).

This module owns what a steered user message or an accepted cancel does to a running turn:
the questions a Step asks at a safe boundary (``steer_pending``, ``cancel_pending``,
``stop_pending``) and the result a call that never ran gets (``cancelled_output``); taking
steered messages into the turn and withdrawing the turn's waits (approvals, MCP questions,
durable waits, open questions) from ResumeTurn; and, for a turn that ended early, steering
back the messages no model call saw and forgetting its interrupts and a stale cancel. It names
no Step: it imports ``_step_base``, the records, persistence, events, the observer and
``_elicitation``, and the Step modules import it.
"""

from __future__ import annotations

from typing import Any

from dex import AsyncContext, Context

from dex_agents._builtin_tools import DURABLE_WAIT_TOOL, REQUEST_USER_INPUT_TOOL
from dex_agents._contract import CANCELLED_BY_STEER_OUTPUT, CANCELLED_BY_USER_OUTPUT
from dex_agents._elicitation import WITHDRAWN_STEERED, withdraw_questions
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._observer import ClosedInterrupt, InterruptOutcome
from dex_agents._options import SessionFlow
from dex_agents._persistence import (
    BUILTIN_WAKEUPS,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    STEERED_FOR_TURN,
    STEERED_USER_MESSAGES,
    TURN_CANCEL,
    USER_INPUT_ANSWER,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentInterruptResolution,
    AgentState,
    AgentUserMessage,
)
from dex_agents._step_base import interrupt_id_for, load_tool_calls, observe

#: How many steered messages one Step takes at most (all of them, in practice).
STEER_DRAIN_LIMIT = 1000
#: The rejection message of an approval a steered user message withdrew.
SUPERSEDED_BY_STEER_MESSAGE = "Withdrawn: a steered user message superseded this tool call."
#: The rejection message of an approval withdrawn because the user cancelled the turn.
CANCELLED_TURN_MESSAGE = "Withdrawn: the user cancelled the turn."
#: The built-in tools whose Steps wait, and wake when the turn is steered or cancelled.
_WAITING_BUILTINS = frozenset({DURABLE_WAIT_TOOL, REQUEST_USER_INPUT_TOOL})


def steer_pending(flow: SessionFlow, context: Context) -> bool:
    """True when the session steers and a steered message waits to reach the model (platform
    addition): one still in ``STEERED_USER_MESSAGES``, or one a Step already took."""
    if not flow.options.steering:
        return False
    return STEERED_USER_MESSAGES.size(context) > 0 or bool(STEERED_FOR_TURN.get(context))


def cancel_pending(context: Context, turn_id: str | None) -> bool:
    """True when ``cancel_turn`` accepted a cancel of ``turn_id`` (platform addition) that the
    Step ending the turn has not applied yet."""
    return turn_id is not None and TURN_CANCEL.get(context) == turn_id


def stop_pending(flow: SessionFlow, context: Context, turn_id: str | None) -> bool:
    """A safe boundary must stop: a steered message waits, or the turn is being cancelled."""
    return steer_pending(flow, context) or cancel_pending(context, turn_id)


def cancelled_output(context: Context, turn_id: str | None) -> str:
    """The model-visible result of a call that ends ``cancelled`` without running."""
    if cancel_pending(context, turn_id):
        return CANCELLED_BY_USER_OUTPUT
    return CANCELLED_BY_STEER_OUTPUT


def steered_condition() -> Any:
    """The wait condition of a steered message: every one in ``STEERED_USER_MESSAGES``."""
    return STEERED_USER_MESSAGES.for_range(at_least=1, at_most=STEER_DRAIN_LIMIT)


async def take_steered(
    flow: SessionFlow,
    context: AsyncContext,
    state: AgentState | None,
    steered: list[AgentUserMessage],
) -> None:
    """Keep ``steered`` for the next model call and withdraw the turn's pending approvals
    (``withdraw_turn_waits``); writes ``steer_applied``."""
    STEERED_FOR_TURN.set(context, list(STEERED_FOR_TURN.get(context) or []) + steered)
    turn_id = state.turn_id if state is not None else None
    withdrawn = await withdraw_turn_waits(
        flow, context, turn_id, WITHDRAWN_STEERED, SUPERSEDED_BY_STEER_MESSAGE
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    applied: dict[str, Any] = {
        "message_count": len(steered),
        "withdrawn_interrupt_ids": [item.interrupt_id for item in withdrawn],
    }
    if any(message.client_id for message in steered):
        applied["client_ids"] = [message.client_id for message in steered if message.client_id]
    events.write_event(AgentEventType.STEER_APPLIED, applied)
    events.close()


async def withdraw_turn_waits(
    flow: SessionFlow,
    context: AsyncContext,
    turn_id: str | None,
    question_reason: str,
    rejection_message: str,
) -> list[AgentInterrupt]:
    """Withdraw the turn's pending approvals (their AwaitToolApproval Steps end the calls
    ``cancelled``), end its MCP questions and wake its durable waits and open questions;
    tells the observer and returns the withdrawn approvals. The Step must have loaded
    ``AGENT_TOOL_CALLS`` and locked PendingInterrupts and Elicitations."""
    # Questions of MCP servers the turn's running calls wait on end cancelled; their
    # Steps wake on the version change and answer the servers.
    withdraw_questions(context, lambda item: item.turn_id == turn_id, question_reason)
    for record in load_tool_calls(context).values():
        if not record.status.is_final and (
            record.tool_name in _WAITING_BUILTINS or record.subagent
        ):
            # Ends a durable wait, an open question or a running subagent early (its Step
            # records the outcome; a subagent's stops its child).
            BUILTIN_WAKEUPS.publish(context, interrupt_id_for(record), "steer")
    interrupts = PENDING_INTERRUPTS.get(context) or []
    withdrawn = [item for item in interrupts if item.turn_id == turn_id]
    if withdrawn:
        PENDING_INTERRUPTS.set(
            context, [item for item in interrupts if item.turn_id != turn_id]
        )
        for item in withdrawn:
            INTERRUPT_RESOLUTIONS.publish(
                context,
                item.interrupt_id,
                AgentInterruptResolution(
                    interrupt_id=item.interrupt_id,
                    approved=False,
                    rejection_message=rejection_message,
                    superseded=True,
                ),
            )
    if withdrawn:
        await observe(
            flow,
            context,
            status=None,
            turn_id=turn_id,
            closed=[
                ClosedInterrupt(
                    item.interrupt_id, InterruptOutcome.WITHDRAWN, rejection_message
                )
                for item in withdrawn
            ],
        )
    return withdrawn


def steer_back_taken(context: AsyncContext, *, answer_too: bool) -> None:
    """For a turn that ended early: the steered messages it took but no model call saw are
    steered again, so they start the next turn (``STEERED_FOR_TURN`` is cleared); the
    question's answer it held (``USER_INPUT_ANSWER``) is deleted, and steered again first
    when ``answer_too``."""
    taken = list(STEERED_FOR_TURN.get(context) or [])
    answer = USER_INPUT_ANSWER.get(context)
    if answer is not None:
        if answer_too:
            taken.insert(0, answer)
        USER_INPUT_ANSWER.delete(context)
    for item in taken:
        STEERED_USER_MESSAGES.publish(context, item)
    if STEERED_FOR_TURN.get(context):
        STEERED_FOR_TURN.delete(context)


def withdraw_turn_interrupts(context: AsyncContext, turn_id: str) -> list[AgentInterrupt]:
    """Remove ``turn_id``'s pending interrupts from ``PENDING_INTERRUPTS``; returns them."""
    interrupts = PENDING_INTERRUPTS.get(context) or []
    withdrawn = [item for item in interrupts if item.turn_id == turn_id]
    if withdrawn:
        PENDING_INTERRUPTS.set(context, [item for item in interrupts if item.turn_id != turn_id])
    return withdrawn


def forget_stale_cancel(context: AsyncContext) -> None:
    """Delete a ``TURN_CANCEL`` left by a cancel that arrived as its turn ended anyway."""
    if TURN_CANCEL.get(context) is not None:
        TURN_CANCEL.delete(context)
