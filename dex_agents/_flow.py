"""``AgentSessionFlow``: one Flow execution is one agent session (seed "Running an agent").

The Flow ID is the session ID. The session never completes by itself; stop it with
``AsyncClient.stop_flow`` (``AgentSessionClient.stop_session``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from dex import Context, Flow, PersistenceSchema, RPCResult, StepList, Stream, rpc

from dex_agents._contract import AgentFrameworkRunner
from dex_agents._events import AgentEvent
from dex_agents._observer import AgentSessionObserver
from dex_agents._persistence import (
    AGENT_MESSAGES,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    QUEUED_USER_MESSAGES,
    SHARED_DEFINITIONS,
)
from dex_agents._records import (
    AgentInterruptResolution,
    AgentMessage,
    AgentMessagesPage,
    AgentQueuedMessage,
    AgentSessionStartInput,
    AgentSnapshot,
    AgentUsage,
    AgentUserMessage,
    ListAgentMessagesRequest,
    ResolveInterruptRequest,
    ToolEffect,
    ToolPolicy,
)
from dex_agents._steps import (
    AwaitToolApproval,
    AwaitUserMessage,
    CallSingleAttemptTool,
    CallTool,
    RecordToolFailure,
    RecordToolOutcomeUnknown,
    RecordTurnFailure,
    ResumeTurn,
    RunModel,
    StartAgentSession,
    _now,
)

#: ``get_agent_snapshot`` returns at most this many of the newest messages.
SNAPSHOT_MESSAGE_LIMIT = 200
#: ``list_agent_messages`` clamps ``limit`` to ``1..MAX_PAGE_SIZE``.
MAX_PAGE_SIZE = 200
#: Wire name of each Flow type's AgentEvents Stream.
AGENT_EVENTS_STREAM_NAME = "AGENT_EVENTS"


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
    """

    tool_policies: Mapping[str, ToolPolicy] = field(default_factory=dict)
    default_tool_effect: ToolEffect = ToolEffect.UNCLASSIFIED
    agent_events_capacity_bytes: int = 10 * 1024 * 1024
    interrupt_deadline: timedelta | None = None
    observer: AgentSessionObserver | None = None


class AgentSessionFlow(Flow[AgentSessionStartInput]):
    """The durable agent session Flow (seed "Flow shape").

    Register one per agent, each with its own ``flow_type``; the platform registers one shared
    Flow of type ``AgentSession``. The Registry needs ``allow_async_handlers=True`` and an
    ``AsyncWorker`` serves it with enough task slots for the largest batch of tool calls.

    Attributes:
        runner: The framework adapter.
        options: Session options.
        agent_events: This Flow type's AgentEvents Stream (``AgentEvent`` values).
    """

    def __init__(
        self,
        runner: AgentFrameworkRunner,
        *,
        flow_type: str = "AgentSession",
        options: AgentSessionOptions | None = None,
    ) -> None:
        self.runner = runner
        self.options = options or AgentSessionOptions()
        self._flow_type = flow_type
        self.agent_events: Stream[AgentEvent] = Stream(
            AGENT_EVENTS_STREAM_NAME, AgentEvent, self.options.agent_events_capacity_bytes
        )

    def get_flow_type(self) -> str:
        return self._flow_type

    def get_steps(self) -> StepList[AgentSessionStartInput]:
        return StepList.start_step(StartAgentSession(self)).other_steps(
            AwaitUserMessage(self),
            RunModel(self),
            AwaitToolApproval(self),
            CallTool(self),
            CallSingleAttemptTool(self),
            RecordToolFailure(self),
            RecordToolOutcomeUnknown(self),
            ResumeTurn(self),
            RecordTurnFailure(self),
        )

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(*SHARED_DEFINITIONS, self.agent_events)

    @rpc(is_transactional=True)
    def send_user_message(self, context: Context, message: AgentUserMessage) -> RPCResult[bool]:
        """Queue a user message for the next turn; ``False`` for blank text."""
        if not message.text.strip():
            return RPCResult(False)
        QUEUED_USER_MESSAGES.publish(context, message)
        return RPCResult(True)

    @rpc(lock_attributes=(PENDING_INTERRUPTS.lock(),))
    def resolve_interrupt(
        self, context: Context, request: ResolveInterruptRequest
    ) -> RPCResult[bool]:
        """Answer a pending approval.

        Locks PendingInterrupts; ``False`` when the interrupt is not pending or past its
        deadline. Otherwise removes it and publishes the answer in one commit; an approval
        drops ``rejection_message``.
        """
        interrupts = PENDING_INTERRUPTS.get(context) or []
        pending = next(
            (item for item in interrupts if item.interrupt_id == request.interrupt_id), None
        )
        if pending is None or (pending.deadline is not None and _now() >= pending.deadline):
            return RPCResult(False)
        PENDING_INTERRUPTS.set(
            context, [item for item in interrupts if item.interrupt_id != request.interrupt_id]
        )
        INTERRUPT_RESOLUTIONS.publish(
            context,
            request.interrupt_id,
            AgentInterruptResolution(
                interrupt_id=request.interrupt_id,
                approved=request.approved,
                rejection_message=None if request.approved else request.rejection_message,
            ),
        )
        return RPCResult(True)

    @rpc(
        load_attribute_maps=(AGENT_MESSAGES, AGENT_TOOL_CALLS),
        load_channels=(QUEUED_USER_MESSAGES,),
    )
    def get_agent_snapshot(self, context: Context) -> RPCResult[AgentSnapshot]:
        """State, last 200 messages, pending interrupts, the active turn's tool calls, usage and
        queued message count, plus (platform addition) the queued messages themselves; also
        served for retained closed sessions."""
        state = AGENT_STATE.get(context)
        keys = AGENT_MESSAGES.get_all_instance_keys(context)[-SNAPSHOT_MESSAGE_LIMIT:]
        tool_calls = sorted(
            (
                AGENT_TOOL_CALLS.get(context, key)
                for key in AGENT_TOOL_CALLS.get_all_instance_keys(context)
            ),
            key=lambda record: record.deferral_order,
        )
        return RPCResult(
            AgentSnapshot(
                state=state,
                messages=[AGENT_MESSAGES.get(context, key) for key in keys],
                pending_interrupts=list(PENDING_INTERRUPTS.get(context) or []),
                tool_calls=tool_calls,
                usage=AGENT_USAGE.get(context) or AgentUsage(),
                queued_message_count=QUEUED_USER_MESSAGES.size(context),
                last_turn_error=state.last_turn_error if state is not None else None,
                queued_messages=[
                    AgentQueuedMessage(message_id=item.message_id, text=item.value.text)
                    for item in QUEUED_USER_MESSAGES.pending_messages(context)
                ],
            )
        )

    @rpc(load_attribute_maps=(AGENT_MESSAGES,))
    def list_agent_messages(
        self, context: Context, request: ListAgentMessagesRequest
    ) -> RPCResult[AgentMessagesPage]:
        """Messages after ``after_sequence``, oldest first; ``limit`` clamped to 1..200."""
        limit = min(max(request.limit, 1), MAX_PAGE_SIZE)
        keys = [
            key
            for key in AGENT_MESSAGES.get_all_instance_keys(context)
            if int(key) > request.after_sequence
        ]
        messages: list[AgentMessage] = [AGENT_MESSAGES.get(context, key) for key in keys[:limit]]
        return RPCResult(AgentMessagesPage(messages=messages, has_more=len(keys) > limit))
