"""What every Step of ``AgentSessionFlow`` shares (seed "Flow shape").

This module owns the plumbing the Step modules have in common: the ``SessionStep`` base that
hands a Step its Flow, SYNC ``StepOptions``, the heartbeat period and timeout, the background
heartbeat, the observer call (``observe``), the outcome a Step records in its history, reads
of the session's config and tool call records, usage accounting and the deadline rounding of
Timers. It names no Step, so every Step module (``_tool_steps``, ``_approval_steps``,
``_builtin_steps``, ``_steps``) and the Step-free helpers (``_turn_interruptions``,
``_tool_deferral``, ``_turn_start``, ``_turn_endings``, ``_model_context``) may import it; it
imports only the records, the persistence definitions, the runner contract, the events and the
observer, never a module that names a Step.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any

from dex import AsyncContext, StepDurability, StepOptions

from dex_agents._contract import AgentContractError
from dex_agents._events import AgentEventType, AgentEventWriter
from dex_agents._history import FAILURE_MAX_CHARS, OUTCOME_DETAIL_RECORD, OUTCOME_RECORD
from dex_agents._observer import (
    AgentSessionChange,
    ClosedInterrupt,
    ObservedMessage,
    TurnEnd,
    notify_observer,
)
from dex_agents._options import SessionFlow
from dex_agents._persistence import AGENT_CONFIG, AGENT_TOOL_CALLS, AGENT_USAGE
from dex_agents._records import (
    AgentInterrupt,
    AgentSessionConfig,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    usd_text,
)

#: The background heartbeat period of RunModel and the tool Steps (seed "run_model_step").
HEARTBEAT_INTERVAL = timedelta(seconds=20)
#: Heartbeat timeout of RunModel, CompactContext and the tool Steps (seed "Flow shape":
#: RunModel).
STEP_HEARTBEAT_TIMEOUT = timedelta(minutes=2)

SYNC = StepDurability.SYNC


def sync_options(**overrides: Any) -> StepOptions:
    """StepOptions with SYNC ``wait_for`` and ``execute`` durability plus ``overrides``."""
    return replace(StepOptions(wait_for_durability=SYNC, execute_durability=SYNC), **overrides)


def record_load(tool_call_id: str) -> dict[str, Any]:
    """``StepOptions`` fields that load only ``tool_call_id``'s ``AGENT_TOOL_CALLS`` instance,
    in ``wait_for`` and ``execute``."""
    load = (AGENT_TOOL_CALLS.load(tool_call_id),)
    return {
        "wait_for_load_attribute_map_instances": load,
        "execute_load_attribute_map_instances": load,
    }


class SessionStep:
    """Gives a Step its Flow (runner, options, AgentEvents Stream)."""

    def __init__(self, flow: SessionFlow) -> None:
        self._flow = flow


def interrupt_id_for(record: AgentToolCall) -> str:
    """The interrupt ID of a tool call: ``"<turn_id>.<tool_call_id>"``."""
    return f"{record.turn_id}.{record.tool_call_id}"


def utc_now() -> datetime:
    """The Worker clock's time now, in UTC."""
    return datetime.now(UTC)


def deadline_timer_seconds(deadline: datetime, now: datetime) -> int:
    """Whole seconds from ``now`` until ``deadline``, rounded up; ``0`` once it has passed.

    The deadline Timer of AwaitToolApproval waits this long (seed "Flow shape": "a Timer at the
    deadline, rounded up to whole seconds"), so it never fires before the deadline on the
    Worker clock; one that fires early anyway (``skip_timer``, clock skew) waits again.
    """
    return max(0, math.ceil((deadline - now).total_seconds()))


async def observe(
    flow: SessionFlow,
    context: AsyncContext,
    *,
    status: AgentStatus | None,
    turn_id: str | None,
    raised: Sequence[AgentInterrupt] = (),
    closed: Sequence[ClosedInterrupt] = (),
    usage: AgentUsage | None = None,
    turn_ended: TurnEnd | None = None,
    turn_error: str | None = None,
    messages: Sequence[ObservedMessage] = (),
) -> None:
    """Tell the Flow's observer (platform addition) what this Step is about to commit;
    ``usage`` is the model call this Step made, keyed by its Step execution ID;
    ``turn_ended`` says how the turn ended when this Step ends it; ``messages`` the user and
    assistant texts it stores."""
    await notify_observer(
        flow.options.observer,
        AgentSessionChange(
            flow_id=context.flow_id,
            observed_at=utc_now(),
            status=status,
            turn_id=turn_id,
            raised=tuple(raised),
            closed=tuple(closed),
            usage=usage,
            model_call_id=context.step_execution_id if usage is not None else None,
            turn_ended=turn_ended,
            turn_error=turn_error,
            messages=tuple(messages),
        ),
    )


def observed_messages(messages: Sequence[tuple[int, str, str]]) -> list[ObservedMessage]:
    """``ObservedMessage`` values of the ``(sequence, role, text)`` that have text."""
    return [
        ObservedMessage(sequence, role, text)
        for sequence, role, text in messages
        if text and text.strip() and role in ("user", "assistant")
    ]


@asynccontextmanager
async def background_heartbeat(context: AsyncContext) -> AsyncIterator[None]:
    """Heartbeat every ``HEARTBEAT_INTERVAL`` while the runner works."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_INTERVAL.total_seconds())
            await context.heartbeat()

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with suppress(asyncio.CancelledError, Exception):
            await task


def record_step_outcome(
    context: AsyncContext, outcome: str, *, detail: str | None = None
) -> None:
    """Record in the Step method's history event what its ending meant (platform addition,
    read back as ``StepHistoryEntry.outcome``; ``outcome`` is one of ``STEP_OUTCOMES``): the
    status of a Step that completed says only that it ran, not that the model call it made was
    refused or cancelled, or that the approval it waited for was withdrawn."""
    context.record_event(OUTCOME_RECORD, outcome)
    if detail:
        context.record_event(OUTCOME_DETAIL_RECORD, detail[:FAILURE_MAX_CHARS])


def recovery_detail(context: AsyncContext) -> str:
    """The error text a failure route records, which the model reads
    (``describe_tool_call_outcome``): the failure's own message only. The Worker's error
    type is a Python class path (``mcp_registry.client.McpTransportError``), which tells a
    model nothing, so it is left out."""
    error = context.recovery_error
    if error is None:
        return "the Step failed"
    return error.detail or "the Step failed without a message"


def load_tool_calls(context: AsyncContext) -> dict[str, AgentToolCall]:
    """The turn's tool call records by ID; the Step must have loaded ``AGENT_TOOL_CALLS``."""
    return {
        key: AGENT_TOOL_CALLS.get(context, key)
        for key in AGENT_TOOL_CALLS.get_all_instance_keys(context)
    }


def session_config(context: AsyncContext) -> AgentSessionConfig:
    """``AGENT_CONFIG``, or the empty config before ``StartAgentSession`` wrote it."""
    return AGENT_CONFIG.get(context) or AgentSessionConfig()


def add_usage(context: AsyncContext, events: AgentEventWriter, usage: object) -> None:
    """Add one model call's usage to the session total and write ``usage_recorded``.

    Raises:
        AgentContractError: ``usage`` is not an ``AgentUsage`` with a plain non-negative
            decimal ``cost_usd``.
    """
    if not isinstance(usage, AgentUsage):
        raise AgentContractError("outcome usage must be an AgentUsage")
    try:
        valid_cost = (
            usd_text(Decimal(usage.cost_usd)) == usage.cost_usd and usage.cost_usd[0] != "-"
        )
    except (InvalidOperation, TypeError, ValueError):
        valid_cost = False
    if not valid_cost:
        raise AgentContractError(
            f"usage cost_usd must be a plain non-negative decimal string, got {usage.cost_usd!r}"
        )
    session = (AGENT_USAGE.get(context) or AgentUsage()) + usage
    AGENT_USAGE.set(context, session)
    events.write_event(
        AgentEventType.USAGE_RECORDED,
        {"recorded": usage.as_dict(), "session": session.as_dict()},
    )
