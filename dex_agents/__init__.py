"""dex_agents: durable agent sessions on Dex (seed ``dex-agents-0.1.0``).

One Flow execution of ``AgentSessionFlow`` is one agent session; every model call is a
``RunModel`` Step and every tool call its own Step. A framework adapter implements
``AgentFrameworkRunner``; applications drive sessions through ``AgentSessionClient``.
Integration tests use ``dex_agents.testing``. This package never imports Django.

The seed's persistence table maps to these definitions (wire name = Python name):
AgentState → ``AGENT_STATE``, AgentMessages → ``AGENT_MESSAGES``, FrameworkRunState →
``FRAMEWORK_RUN_STATE``, AgentToolCalls → ``AGENT_TOOL_CALLS``, PendingInterrupts →
``PENDING_INTERRUPTS``, AgentUsage → ``AGENT_USAGE``, QueuedUserMessages →
``QUEUED_USER_MESSAGES``, InterruptResolutions → ``INTERRUPT_RESOLUTIONS``, ToolCallResults →
``TOOL_CALL_RESULTS``, AgentEvents → ``flow.agent_events`` (Stream ``AGENT_EVENTS``, one per Flow
type). Platform additions to the seed: the ``AGENT_CONFIG`` Attribute (AgentConfig), the
``agent_config`` and ``tool_policies`` start inputs, ``AgentTurnContext.agent_config``,
``DeferredToolExecution.agent_config``, ``AgentSnapshot.last_turn_error`` and
``AgentSnapshot.queued_messages``, ``ToolPolicy.approval_deadline_seconds``, and the session
observer (``AgentSessionOptions.observer``, ``AgentSessionChange``).
"""

from dex_agents._client import AgentSessionClient
from dex_agents._contract import (
    AgentContractError,
    AgentFrameworkRunner,
    AgentTurnContext,
    AgentTurnOutcome,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    ToolCallsRequested,
    ToolExecutionError,
    ToolExecutionResult,
    ToolPolicyResolver,
    TurnCompleted,
    build_turn_failure_note,
    describe_tool_call_outcome,
)
from dex_agents._events import AgentEvent, AgentEventType, AgentEventWriter
from dex_agents._flow import AgentSessionFlow, AgentSessionOptions
from dex_agents._history import (
    EXECUTE_COMPLETED_EVENT,
    EXECUTE_FAILED_EVENT,
    WAIT_FOR_COMPLETED_EVENT,
    WAIT_FOR_FAILED_EVENT,
    StepHistoryEntry,
    read_flow_step_history,
)
from dex_agents._observer import (
    AgentSessionChange,
    AgentSessionObserver,
    ClosedInterrupt,
    InterruptOutcome,
)
from dex_agents._persistence import (
    AGENT_CONFIG,
    AGENT_MESSAGES,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    FRAMEWORK_RUN_STATE,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    QUEUED_USER_MESSAGES,
    TOOL_CALL_RESULTS,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentInterruptResolution,
    AgentMessage,
    AgentMessagesPage,
    AgentQueuedMessage,
    AgentSessionConfig,
    AgentSessionStartInput,
    AgentSnapshot,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    AgentUserMessage,
    ListAgentMessagesRequest,
    MessageRole,
    ResolveInterruptRequest,
    ToolCallCompleted,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
    idempotency_key,
    is_approval_required,
    message_sequence_key,
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
    interrupt_id_for,
)

__all__ = [
    "AGENT_CONFIG",
    "AGENT_MESSAGES",
    "AGENT_STATE",
    "AGENT_TOOL_CALLS",
    "AGENT_USAGE",
    "EXECUTE_COMPLETED_EVENT",
    "EXECUTE_FAILED_EVENT",
    "FRAMEWORK_RUN_STATE",
    "INTERRUPT_RESOLUTIONS",
    "PENDING_INTERRUPTS",
    "QUEUED_USER_MESSAGES",
    "TOOL_CALL_RESULTS",
    "WAIT_FOR_COMPLETED_EVENT",
    "WAIT_FOR_FAILED_EVENT",
    "AgentContractError",
    "AgentEvent",
    "AgentEventType",
    "AgentEventWriter",
    "AgentFrameworkRunner",
    "AgentInterrupt",
    "AgentInterruptResolution",
    "AgentMessage",
    "AgentMessagesPage",
    "AgentQueuedMessage",
    "AgentSessionChange",
    "AgentSessionClient",
    "AgentSessionConfig",
    "AgentSessionFlow",
    "AgentSessionObserver",
    "AgentSessionOptions",
    "AgentSessionStartInput",
    "AgentSnapshot",
    "AgentState",
    "AgentStatus",
    "AgentToolCall",
    "AgentTurnContext",
    "AgentTurnOutcome",
    "AgentUsage",
    "AgentUserMessage",
    "AwaitToolApproval",
    "AwaitUserMessage",
    "CallSingleAttemptTool",
    "CallTool",
    "ClosedInterrupt",
    "DeferredToolCall",
    "DeferredToolExecution",
    "FrameworkMessage",
    "InterruptOutcome",
    "ListAgentMessagesRequest",
    "MessageRole",
    "RecordToolFailure",
    "RecordToolOutcomeUnknown",
    "RecordTurnFailure",
    "ResolveInterruptRequest",
    "ResumeTurn",
    "RunModel",
    "StartAgentSession",
    "StepHistoryEntry",
    "ToolCallCompleted",
    "ToolCallStatus",
    "ToolCallsRequested",
    "ToolEffect",
    "ToolExecutionError",
    "ToolExecutionResult",
    "ToolPolicy",
    "ToolPolicyResolver",
    "TurnCompleted",
    "build_turn_failure_note",
    "describe_tool_call_outcome",
    "idempotency_key",
    "interrupt_id_for",
    "is_approval_required",
    "message_sequence_key",
    "read_flow_step_history",
]
