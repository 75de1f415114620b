"""How a turn starts: with a user message, or with a plan to execute (``execute_plan``).

This module owns the bookkeeping of a turn's start, without the move to RunModel that follows
(the Step that calls it, StartAgentSession or AwaitUserMessage, makes it): the turn's ID and
mode, the user message stored as its first message, ``turn_started`` (and ``plan_started``)
written, a draft plan made active, and the observer told. It names no Step: it imports
``_step_base`` and ``_turn_interruptions`` below it, and the turn-loop Steps (``_steps``)
import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from dex import AsyncContext

from dex_agents._builtin_records import AgentPlan, PlanStatus
from dex_agents._contract import require_user_message
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._options import SessionFlow
from dex_agents._persistence import AGENT_MESSAGES, AGENT_PLAN, AGENT_STATE
from dex_agents._records import (
    AgentMessage,
    AgentState,
    AgentStatus,
    MessageRole,
    TurnMode,
    message_sequence_key,
)
from dex_agents._step_base import observe, observed_messages, utc_now
from dex_agents._turn_interruptions import forget_stale_cancel


async def start_turn(
    flow: SessionFlow,
    context: AsyncContext,
    state: AgentState,
    text: str,
    *,
    plan_mode: bool = False,
    client_ids: Sequence[str] = (),
    created_at: datetime | None = None,
) -> None:
    """Store the user message as the turn's first message; the caller moves to RunModel.

    With ``AgentSessionOptions.plans``, a ``plan_mode`` message starts a ``planning`` turn and
    any other a ``chat`` turn. ``client_ids`` (platform addition): the non-empty
    ``AgentUserMessage.client_id`` of every message the turn takes as it starts; written into
    ``turn_started`` as ``client_ids`` when there is one, so a sender can tell which turn
    answers its message. ``created_at``: when the message was accepted (stored as the
    message's ``created_at``); ``None`` means now.
    """
    message = require_user_message(flow.runner.build_user_message(text))
    forget_stale_cancel(context)
    number = state.turn_number + 1
    turn_id = f"turn-{number}"
    sequence = state.message_count + 1
    AGENT_MESSAGES.set(
        context,
        message_sequence_key(sequence),
        AgentMessage(
            sequence,
            MessageRole.USER,
            message.text,
            message.framework_item,
            turn_id,
            created_at=created_at or utc_now(),
        ),
    )
    mode = TurnMode.PLANNING if plan_mode and flow.options.plans else TurnMode.CHAT
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.RUNNING_MODEL,
            turn_number=number,
            turn_id=turn_id,
            message_count=sequence,
            turn_mode=mode,
        ),
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    started: dict[str, Any] = {"sequence": sequence}
    if any(client_ids):
        started["client_ids"] = [client_id for client_id in client_ids if client_id]
    events.write_event(AgentEventType.TURN_STARTED, started)
    events.close()
    await observe(
        flow,
        context,
        status=AgentStatus.RUNNING_MODEL,
        turn_id=turn_id,
        messages=observed_messages([(sequence, MessageRole.USER.value, message.text)]),
    )


async def start_plan_turn(
    flow: SessionFlow, context: AsyncContext, state: AgentState, plan: AgentPlan
) -> None:
    """Start an ``executing`` turn for ``plan`` without a user message (``execute_plan``); a
    draft becomes active. The caller moves to RunModel."""
    forget_stale_cancel(context)
    number = state.turn_number + 1
    turn_id = f"turn-{number}"
    if plan.status is PlanStatus.DRAFT:
        AGENT_PLAN.set(context, replace(plan, status=PlanStatus.ACTIVE))
    AGENT_STATE.set(
        context,
        replace(
            state,
            status=AgentStatus.RUNNING_MODEL,
            turn_number=number,
            turn_id=turn_id,
            turn_mode=TurnMode.EXECUTING,
        ),
    )
    events = AgentEventWriter(flow.agent_events, context, turn_id)
    events.write_event(
        AgentEventType.TURN_STARTED, {"sequence": None, "plan_revision": plan.revision}
    )
    events.write_event(AgentEventType.PLAN_STARTED, {"revision": plan.revision})
    events.close()
    await observe(flow, context, status=AgentStatus.RUNNING_MODEL, turn_id=turn_id)
