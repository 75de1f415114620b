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
``agent_config`` and ``tool_policies`` start inputs, ``ModelCallError`` (a model call failure no
retry can fix: the turn fails at once) and ``ModelRateLimitError`` (the next attempt waits the
provider's ``Retry-After``), ``AgentTurnContext.agent_config``,
``DeferredToolExecution.agent_config``, ``AgentSnapshot.last_turn_error`` and
``AgentSnapshot.queued_messages``, ``ToolPolicy.approval_deadline_seconds``, the per-tool
limits ``ToolPolicy.timeout_seconds`` and ``ToolPolicy.retries`` (kept on ``AgentToolCall``; they
set the tool Step's ``execute_method_timeout`` and, for a retrying effect, its attempts), and the
session observer (``AgentSessionOptions.observer``, ``AgentSessionChange``).

Steer (platform addition, ``AgentSessionOptions.steering``; lifts the seed's limit "a running
turn cannot be steered"): the ``STEERED_USER_MESSAGES`` Channel and ``STEERED_FOR_TURN``
Attribute, the queue RPCs (``get_message_queue``, ``delete_queued_message``,
``replace_queued_message``, ``steer_queued_message``), ``AgentUserMessage.plan_mode`` /
``client_id`` / ``created_at``, ``AgentTurnContext.steered_messages``, the ``cancelled`` tool call
status and the ``steer_applied`` event.

Built-in tools (platform additions, ``AgentSessionOptions.durable_waits`` / ``user_input``):
``durable_wait`` runs as a DurableWait Step on a Dex Timer (``PENDING_TIMER``);
``request_user_input`` runs as an AwaitUserInput Step answered through ``answer_user_input``
(``PENDING_USER_INPUT``, ``USER_INPUT_ANSWERS``, ``USER_INPUT_ANSWER``); ResumeTurn ends either
early for a steered message (``BUILTIN_WAKEUPS``).

MCP elicitation (platform addition, ``dex_agents._elicitation``): a question an MCP server asks
during a running tool call is recorded by ``open_elicitation`` in ``ELICITATIONS``
(``AgentElicitation``, ``ELICITATION_VERSION``), listed in ``AgentSnapshot.pending_elicitations``,
answered through ``answer_elicitation`` (``ElicitationAnswer``, checked against the server's
restricted schema: ``elicitation_form``, ``elicitation_content_check``) and waited for by the
tool Step's runner with ``ToolCallElicitations``; events ``elicitation_requested`` and
``elicitation_closed``.

Plans (platform addition, ``AgentSessionOptions.plans``): ``AgentUserMessage.plan_mode`` starts a
``planning`` turn in which only the session's ``write_todos`` runs (``AGENT_PLAN``, replaced
whole, revision increasing); ``execute_plan`` (``PLAN_EXECUTIONS``) starts an ``executing`` turn
without a user message; ``AgentTurnContext.turn_mode`` / ``plan`` tell the runner which.
Context compaction and retention (platform addition, ``AgentSessionOptions.compaction``; lifts
the seed's limit "RunModel and get_agent_snapshot load the whole AgentMessages map"): the
``CONTEXT_SUMMARY`` Attribute (``ContextSummary``), the ``CompactContext`` Step
(``CompactionPlan``), the ``CompactingRunner`` protocol (``SummarizeRequest``,
``ContextWindowExceededError``), ``AgentTurnContext.summary``, ``AgentSnapshot.summary``, the
``context_compacted`` event, and the reads ``get_message_range``, ``read_agent_messages`` and
``get_agent_snapshot_page`` (``AgentMessageRange``, ``ReadAgentMessagesRequest``,
``AgentMessagesSlice``; ``AgentSessionClient.list_agent_messages_before`` returns
``AgentMessagesBeforePage``).

Large texts (platform addition): a tool result longer than what the model sees is stored whole
in parts (``ToolExecutionResult.full_text``, ``TEXT_PARTS``, ``TEXT_PARTS_INDEX``,
``TextParts`` on ``AgentToolCall.output_parts`` and ``AgentMessage.text_parts``,
``FrameworkMessage.tool_call_id``), and any stored message's whole text is read a part at a
time with ``read_message_text`` (``ReadMessageTextRequest``, ``MessageTextPart``;
``AgentSessionClient.read_message_text``); ``TEXT_PART_BYTES``, ``MAX_STORED_TEXT_BYTES``.

Speed (platform addition): ``AgentCodecRegistry`` is the SDK's automatic JSON codec compiled
once per type, with the same output; pass it to ``Registry`` in workers and clients. It also
reads records stored before a field with a default was added (the field takes its default).
"""

from dex_agents._approval_steps import AwaitToolApproval
from dex_agents._builtin_records import (
    AgentPlan,
    PendingTimer,
    PendingUserInput,
    PlanExecutionRequest,
    PlanExecutionResult,
    PlanStatus,
    PlanTask,
    PlanTaskStatus,
    UserInputAnswer,
)
from dex_agents._builtin_steps import AwaitUserInput, DurableWait
from dex_agents._builtin_tools import (
    DURABLE_WAIT_TOOL,
    REQUEST_USER_INPUT_TOOL,
    WRITE_TODOS_TOOL,
    BuiltinToolArgumentError,
    durable_wait_definition,
    request_user_input_definition,
    write_todos_definition,
)
from dex_agents._client import AgentSessionClient
from dex_agents._codecs import AgentCodecRegistry
from dex_agents._compaction import (
    CompactingRunner,
    CompactionOptions,
    ContextWindowExceededError,
    SummarizeRequest,
    SummaryResult,
    render_summary,
)
from dex_agents._contract import (
    CANCELLED_BY_STEER_OUTPUT,
    CANCELLED_BY_USER_OUTPUT,
    TURN_CANCELLED_EMPTY_NOTE,
    TURN_CANCELLED_NOTE_HEADER,
    TURN_STOPPED_NOTE_HEADER,
    TURN_STOPPED_OUTPUT_REASON,
    AgentContractError,
    AgentFrameworkRunner,
    AgentTurnContext,
    AgentTurnOutcome,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    ModelCallError,
    ModelRateLimitError,
    ToolCallsRequested,
    ToolExecutionError,
    ToolExecutionResult,
    ToolPolicyResolver,
    TurnCompleted,
    build_turn_failure_note,
    describe_tool_call_outcome,
    tool_call_edit_note,
)
from dex_agents._elicitation import elicitation_id_for
from dex_agents._elicitation_records import (
    ELICITATION_ACTIONS,
    AgentElicitation,
    ElicitationAnswer,
    ElicitationAnswerResult,
    ElicitationRef,
    ElicitationRequest,
    ElicitationState,
    ElicitationStatus,
)
from dex_agents._elicitation_schema import (
    ElicitationField,
    ElicitationForm,
    ElicitationSchemaError,
    elicitation_content_check,
    elicitation_form,
)
from dex_agents._events import AgentEvent, AgentEventType, AgentEventWriter
from dex_agents._flow import AgentSessionFlow
from dex_agents._history import (
    EXECUTE_COMPLETED_EVENT,
    EXECUTE_FAILED_EVENT,
    STEP_OUTCOMES,
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
    ObservedMessage,
    TurnEnd,
    TurnGuard,
    TurnGuardCheck,
)
from dex_agents._options import AgentSessionOptions
from dex_agents._persistence import (
    AGENT_CONFIG,
    AGENT_MESSAGES,
    AGENT_PLAN,
    AGENT_STATE,
    AGENT_TOOL_CALLS,
    AGENT_USAGE,
    CONTEXT_SUMMARY,
    ELICITATION_VERSION,
    ELICITATIONS,
    FRAMEWORK_RUN_STATE,
    INTERRUPT_RESOLUTIONS,
    PENDING_INTERRUPTS,
    PENDING_TIMER,
    PENDING_USER_INPUT,
    PLAN_EXECUTIONS,
    QUEUED_USER_MESSAGES,
    STEERED_FOR_TURN,
    STEERED_USER_MESSAGES,
    TEXT_PARTS,
    TEXT_PARTS_INDEX,
    TOOL_CALL_RESULTS,
    TURN_CANCEL,
    TURN_CANCELS,
    USER_INPUT_ANSWER,
    USER_INPUT_ANSWERS,
)
from dex_agents._records import (
    AgentInterrupt,
    AgentInterruptResolution,
    AgentMessage,
    AgentSessionConfig,
    AgentSessionStartInput,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    AgentUserMessage,
    CompactionPlan,
    ContextSummary,
    MessageNotice,
    MessageRole,
    SubagentLink,
    TextParts,
    ToolCallCompleted,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
    TurnMode,
    idempotency_key,
    is_approval_required,
    message_sequence_key,
    usd_text,
)
from dex_agents._rpc_records import (
    AgentMessageQueue,
    AgentMessageRange,
    AgentMessagesBeforePage,
    AgentMessagesPage,
    AgentMessagesSlice,
    AgentQueuedMessage,
    AgentSnapshot,
    CancelTurnRequest,
    ListAgentMessagesRequest,
    MessageTextPart,
    QueuedMessageRequest,
    ReadAgentMessagesRequest,
    ReadMessageTextRequest,
    ReplaceQueuedMessageRequest,
    ResolveInterruptRequest,
    TurnCancelResult,
)
from dex_agents._step_base import interrupt_id_for
from dex_agents._steps import (
    AwaitUserMessage,
    CompactContext,
    RecordTurnFailure,
    ResumeTurn,
    RunModel,
    StartAgentSession,
)
from dex_agents._subagent_steps import CallSubagent, FinishSubagentSession
from dex_agents._subagents import (
    SUBAGENT_TOOL_PREFIX,
    SubagentArgumentError,
    SubagentDirectory,
    SubagentOptions,
    SubagentOutcome,
    SubagentRefusedError,
    SubagentRequest,
    SubagentResult,
    SubagentTask,
    parse_subagent_arguments,
    subagent_tool_name,
    subagent_tool_parameters,
)
from dex_agents._text_parts import MAX_STORED_TEXT_BYTES, TEXT_PART_BYTES
from dex_agents._tool_call_elicitations import (
    DEFAULT_ELICITATION_TIMEOUT,
    ElicitationOutcome,
    ToolCallElicitations,
)
from dex_agents._tool_steps import (
    CallSingleAttemptTool,
    CallTool,
    RecordToolFailure,
    RecordToolOutcomeUnknown,
)
from dex_agents._views import QUEUED_MESSAGES_BYTES

__all__ = [
    "AGENT_CONFIG",
    "AGENT_MESSAGES",
    "AGENT_PLAN",
    "AGENT_STATE",
    "AGENT_TOOL_CALLS",
    "AGENT_USAGE",
    "CANCELLED_BY_STEER_OUTPUT",
    "CANCELLED_BY_USER_OUTPUT",
    "CONTEXT_SUMMARY",
    "DEFAULT_ELICITATION_TIMEOUT",
    "DURABLE_WAIT_TOOL",
    "ELICITATIONS",
    "ELICITATION_ACTIONS",
    "ELICITATION_VERSION",
    "EXECUTE_COMPLETED_EVENT",
    "EXECUTE_FAILED_EVENT",
    "FRAMEWORK_RUN_STATE",
    "INTERRUPT_RESOLUTIONS",
    "MAX_STORED_TEXT_BYTES",
    "PENDING_INTERRUPTS",
    "PENDING_TIMER",
    "PENDING_USER_INPUT",
    "PLAN_EXECUTIONS",
    "QUEUED_MESSAGES_BYTES",
    "QUEUED_USER_MESSAGES",
    "REQUEST_USER_INPUT_TOOL",
    "STEERED_FOR_TURN",
    "STEERED_USER_MESSAGES",
    "STEP_OUTCOMES",
    "SUBAGENT_TOOL_PREFIX",
    "TEXT_PARTS",
    "TEXT_PARTS_INDEX",
    "TEXT_PART_BYTES",
    "TOOL_CALL_RESULTS",
    "TURN_CANCEL",
    "TURN_CANCELLED_EMPTY_NOTE",
    "TURN_CANCELLED_NOTE_HEADER",
    "TURN_CANCELS",
    "TURN_STOPPED_NOTE_HEADER",
    "TURN_STOPPED_OUTPUT_REASON",
    "USER_INPUT_ANSWER",
    "USER_INPUT_ANSWERS",
    "WAIT_FOR_COMPLETED_EVENT",
    "WAIT_FOR_FAILED_EVENT",
    "WRITE_TODOS_TOOL",
    "AgentCodecRegistry",
    "AgentContractError",
    "AgentElicitation",
    "AgentEvent",
    "AgentEventType",
    "AgentEventWriter",
    "AgentFrameworkRunner",
    "AgentInterrupt",
    "AgentInterruptResolution",
    "AgentMessage",
    "AgentMessageQueue",
    "AgentMessageRange",
    "AgentMessagesBeforePage",
    "AgentMessagesPage",
    "AgentMessagesSlice",
    "AgentPlan",
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
    "AwaitUserInput",
    "AwaitUserMessage",
    "BuiltinToolArgumentError",
    "CallSingleAttemptTool",
    "CallSubagent",
    "CallTool",
    "CancelTurnRequest",
    "ClosedInterrupt",
    "CompactContext",
    "CompactingRunner",
    "CompactionOptions",
    "CompactionPlan",
    "ContextSummary",
    "ContextWindowExceededError",
    "DeferredToolCall",
    "DeferredToolExecution",
    "DurableWait",
    "ElicitationAnswer",
    "ElicitationAnswerResult",
    "ElicitationField",
    "ElicitationForm",
    "ElicitationOutcome",
    "ElicitationRef",
    "ElicitationRequest",
    "ElicitationSchemaError",
    "ElicitationState",
    "ElicitationStatus",
    "FinishSubagentSession",
    "FrameworkMessage",
    "InterruptOutcome",
    "ListAgentMessagesRequest",
    "MessageNotice",
    "MessageRole",
    "MessageTextPart",
    "ModelCallError",
    "ModelRateLimitError",
    "ObservedMessage",
    "PendingTimer",
    "PendingUserInput",
    "PlanExecutionRequest",
    "PlanExecutionResult",
    "PlanStatus",
    "PlanTask",
    "PlanTaskStatus",
    "QueuedMessageRequest",
    "ReadAgentMessagesRequest",
    "ReadMessageTextRequest",
    "RecordToolFailure",
    "RecordToolOutcomeUnknown",
    "RecordTurnFailure",
    "ReplaceQueuedMessageRequest",
    "ResolveInterruptRequest",
    "ResumeTurn",
    "RunModel",
    "StartAgentSession",
    "StepHistoryEntry",
    "SubagentArgumentError",
    "SubagentDirectory",
    "SubagentLink",
    "SubagentOptions",
    "SubagentOutcome",
    "SubagentRefusedError",
    "SubagentRequest",
    "SubagentResult",
    "SubagentTask",
    "SummarizeRequest",
    "SummaryResult",
    "TextParts",
    "ToolCallCompleted",
    "ToolCallElicitations",
    "ToolCallStatus",
    "ToolCallsRequested",
    "ToolEffect",
    "ToolExecutionError",
    "ToolExecutionResult",
    "ToolPolicy",
    "ToolPolicyResolver",
    "TurnCancelResult",
    "TurnCompleted",
    "TurnEnd",
    "TurnGuard",
    "TurnGuardCheck",
    "TurnMode",
    "UserInputAnswer",
    "build_turn_failure_note",
    "describe_tool_call_outcome",
    "durable_wait_definition",
    "elicitation_content_check",
    "elicitation_form",
    "elicitation_id_for",
    "idempotency_key",
    "interrupt_id_for",
    "is_approval_required",
    "message_sequence_key",
    "parse_subagent_arguments",
    "read_flow_step_history",
    "render_summary",
    "request_user_input_definition",
    "subagent_tool_name",
    "subagent_tool_parameters",
    "tool_call_edit_note",
    "usd_text",
    "write_todos_definition",
]
