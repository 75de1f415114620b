"""``AgentSessionOptions`` and ``SessionFlow``, what the session's Steps see of their Flow.

The Steps (``dex_agents._steps`` and the Step modules below it) are built by
``AgentSessionFlow`` and read its runner, its options, its AgentEvents Stream and the model
calls running in this Worker; they name the Flow through the ``SessionFlow`` protocol, so the
Flow module imports the Steps and never the other way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Protocol

from dex import Stream

from dex_agents._compaction import CompactionOptions
from dex_agents._contract import AgentFrameworkRunner
from dex_agents._events import AgentEvent
from dex_agents._observer import AgentSessionObserver, TurnGuard
from dex_agents._records import ToolEffect, ToolPolicy
from dex_agents._subagents import SubagentOptions
from dex_agents._turn_cancel import RunningModelCalls
from dex_agents._wire_types import resolve_annotations


@dataclass(frozen=True)
class AgentSessionOptions:
    """Session options (seed "Effects and policies").

    Attributes:
        tool_policies: Policy per tool name; override framework metadata and the default.
        default_tool_effect: Effect of a tool with neither policy nor metadata.
        agent_events_capacity_bytes: AgentEvents Stream budget in bytes (default 10 MiB).
        interrupt_deadline: How long an approval may wait before it counts as rejected; ``None``
            waits forever. Measured on the Worker clock. A policy's
            ``approval_deadline_seconds`` overrides it per tool (platform addition).
        observer: Platform addition: awaited with an ``AgentSessionChange`` by every Step that
            changes the status or the pending interrupts (``dex_agents._observer``).
        steering: Platform addition that lifts the seed's limit "a running turn cannot be
            steered": ``steer_queued_message`` moves a queued message to
            ``STEERED_USER_MESSAGES`` and the running turn applies it at its next safe boundary
            (before a model call, before a tool call starts, while tool results or an approval
            are awaited). Calls that have not started end ``cancelled``, pending approvals are
            withdrawn, running calls finish, and the next model call sees the steered message
            after every call's result (``AgentTurnContext.steered_messages``; the runner must
            support it). Without it ``steer_queued_message`` returns ``False``.
        durable_waits: Platform addition: the session runs ``durable_wait`` calls itself
            (``dex_agents.DURABLE_WAIT_TOOL``; a DurableWait Step on a Dex Timer) instead of
            handing them to the runner. The runner offers the tool to its model.
        user_input: Platform addition: the session runs ``request_user_input`` calls itself
            (an AwaitUserInput Step answered through ``answer_user_input``); the response's
            other calls are cancelled (but a write_todos call still applies).
        plans: Platform addition: a ``plan_mode`` message starts a ``planning`` turn (only the
            session's ``write_todos`` runs; it replaces ``AGENT_PLAN`` whole), and
            ``execute_plan`` starts an ``executing`` turn without a user message.
        compaction: Platform addition that lifts the seed's limit "RunModel and
            get_agent_snapshot load the whole AgentMessages map": RunModel loads only the
            summary and the unsummarized messages, compacts older messages into
            ``CONTEXT_SUMMARY`` (a CompactContext Step) before a call that would pass the
            trigger fraction of the context window, and the map keeps the newest
            ``retention_limit`` messages (``dex_agents._compaction``). The runner must be a
            ``CompactingRunner``. ``None`` keeps the seed's behaviour.
        max_queued_messages: Platform addition: ``send_user_message`` refuses a message while
            this many wait in the queued and steered queues together (``None``: no limit), so
            a queue can never grow past what one RPC can load.
        max_queued_bytes: Platform addition: ``send_user_message`` and
            ``replace_queued_message`` refuse a message that would bring the texts of the
            queued and steered messages together past this many bytes of JSON
            (``_views.queued_bytes``; ``None``: no limit), so that a snapshot, which lists
            them, stays under the 4 MiB one answer may carry whatever their characters.
        turn_guard: Platform addition: asked after each model call that requested tool calls,
            before any of them runs (``TurnGuardCheck``). A reason stops the turn there: the
            requested calls end ``cancelled`` without running, the turn fails with the reason
            as ``last_turn_error`` and a note (``MessageNotice.TURN_FAILED``) that starts with
            the reason and lists the turn's tool calls for the model, like a cancelled turn's.
            A guard that raises is logged and the turn goes on. The platform stops a turn
            that crossed a spending budget with it.
    """

    tool_policies: Mapping[str, ToolPolicy] = field(default_factory=dict)
    default_tool_effect: ToolEffect = ToolEffect.UNCLASSIFIED
    agent_events_capacity_bytes: int = 10 * 1024 * 1024
    interrupt_deadline: timedelta | None = None
    observer: AgentSessionObserver | None = None
    steering: bool = False
    durable_waits: bool = False
    user_input: bool = False
    plans: bool = False
    max_queued_messages: int | None = None
    max_queued_bytes: int | None = None
    compaction: CompactionOptions | None = None
    turn_guard: TurnGuard | None = None
    subagents: SubagentOptions | None = None


class SessionFlow(Protocol):
    """What a Step reads of the ``AgentSessionFlow`` that built it (its attributes of the
    same names)."""

    @property
    def runner(self) -> AgentFrameworkRunner:
        """The framework adapter."""

    @property
    def options(self) -> AgentSessionOptions:
        """Session options."""

    @property
    def agent_events(self) -> Stream[AgentEvent]:
        """This Flow type's AgentEvents Stream."""

    @property
    def model_calls(self) -> RunningModelCalls:
        """The model calls running in this Worker process (``cancel_turn`` abandons them)."""


resolve_annotations(globals())
