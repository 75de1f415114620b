"""Persistence definitions shared by every agent Flow type (seed "Persistence").

The names are the wire names of the seed's table. The AgentEvents Stream is not here: a Stream
belongs to exactly one Flow type, so each ``AgentSessionFlow`` owns its ``agent_events``.
"""

from __future__ import annotations

from typing import cast

from dex import Attribute, AttributeMap, Channel, ChannelMap

from dex_agents._builtin_records import (
    AgentPlan,
    PendingTimer,
    PendingUserInput,
    PlanExecutionRequest,
    UserInputAnswer,
)
from dex_agents._elicitation_records import AgentElicitation
from dex_agents._records import (
    AgentInterrupt,
    AgentInterruptResolution,
    AgentMessage,
    AgentSessionConfig,
    AgentState,
    AgentToolCall,
    AgentUsage,
    AgentUserMessage,
    ContextSummary,
    TextParts,
    ToolCallCompleted,
)

#: ``AgentState`` Attribute.
AGENT_STATE: Attribute[AgentState] = Attribute("AGENT_STATE", AgentState)
#: ``AgentMessages`` AttributeMap keyed ``message_sequence_key(n)``.
AGENT_MESSAGES: AttributeMap[AgentMessage] = AttributeMap("AGENT_MESSAGES", AgentMessage)
#: ``FrameworkRunState`` Attribute, set only while a turn waits for tool calls.
FRAMEWORK_RUN_STATE: Attribute[str] = Attribute("FRAMEWORK_RUN_STATE", str)
#: ``AgentToolCalls`` AttributeMap keyed by tool call ID, cleared when the turn ends.
AGENT_TOOL_CALLS: AttributeMap[AgentToolCall] = AttributeMap("AGENT_TOOL_CALLS", AgentToolCall)
#: ``PendingInterrupts`` Attribute.
PENDING_INTERRUPTS: Attribute[list[AgentInterrupt]] = Attribute(
    "PENDING_INTERRUPTS", cast(type[list[AgentInterrupt]], list[AgentInterrupt])
)
#: ``AgentUsage`` Attribute: the session total.
AGENT_USAGE: Attribute[AgentUsage] = Attribute("AGENT_USAGE", AgentUsage)
#: ``AgentConfig`` Attribute (platform addition): agent definition snapshot and policies.
AGENT_CONFIG: Attribute[AgentSessionConfig] = Attribute("AGENT_CONFIG", AgentSessionConfig)
#: ``QueuedUserMessages`` Channel.
QUEUED_USER_MESSAGES: Channel[AgentUserMessage] = Channel("QUEUED_USER_MESSAGES", AgentUserMessage)
#: ``SteeredUserMessages`` Channel (platform addition, Steer): messages the running turn applies
#: at its next safe boundary.
STEERED_USER_MESSAGES: Channel[AgentUserMessage] = Channel(
    "STEERED_USER_MESSAGES", AgentUserMessage
)
#: Steered messages a Step took from ``STEERED_USER_MESSAGES`` that the next model call of the
#: turn has not been given yet (platform addition, Steer).
STEERED_FOR_TURN: Attribute[list[AgentUserMessage]] = Attribute(
    "STEERED_FOR_TURN", cast(type[list[AgentUserMessage]], list[AgentUserMessage])
)
#: The turn's running ``durable_wait`` (platform addition).
PENDING_TIMER: Attribute[PendingTimer] = Attribute("PENDING_TIMER", PendingTimer)
#: The turn's open ``request_user_input`` question (platform addition).
PENDING_USER_INPUT: Attribute[PendingUserInput] = Attribute("PENDING_USER_INPUT", PendingUserInput)
#: The answer to the turn's question, kept until the next model call sees it (platform addition).
USER_INPUT_ANSWER: Attribute[AgentUserMessage] = Attribute("USER_INPUT_ANSWER", AgentUserMessage)
#: Answers of ``answer_user_input``, keyed by tool call ID (platform addition).
USER_INPUT_ANSWERS: ChannelMap[UserInputAnswer] = ChannelMap("USER_INPUT_ANSWERS", UserInputAnswer)
#: Wake-ups ResumeTurn sends a ``durable_wait`` or ``request_user_input`` Step when a steered
#: message supersedes it, keyed by tool call ID (platform addition, internal).
BUILTIN_WAKEUPS: ChannelMap[str] = ChannelMap("BUILTIN_WAKEUPS", str)
#: The session's plan (platform addition, ``AgentPlan``).
AGENT_PLAN: Attribute[AgentPlan] = Attribute("AGENT_PLAN", AgentPlan)
#: Accepted ``execute_plan`` requests the session has not started yet (platform addition).
PLAN_EXECUTIONS: Channel[PlanExecutionRequest] = Channel("PLAN_EXECUTIONS", PlanExecutionRequest)
#: ``InterruptResolutions`` ChannelMap keyed by interrupt ID.
INTERRUPT_RESOLUTIONS: ChannelMap[AgentInterruptResolution] = ChannelMap(
    "INTERRUPT_RESOLUTIONS", AgentInterruptResolution
)
#: ``ToolCallResults`` Channel (internal).
TOOL_CALL_RESULTS: Channel[ToolCallCompleted] = Channel("TOOL_CALL_RESULTS", ToolCallCompleted)

#: The turn ``cancel_turn`` accepted a cancel for, by turn ID (platform addition): every Step
#: of that turn reads it at its start (a tool call not started ends ``cancelled``, a model call
#: not started is not made) until the Step that ends the turn deletes it; a value naming an
#: older turn is stale and ignored. Kept by the engine, so a cancel survives Worker restarts.
TURN_CANCEL: Attribute[str] = Attribute("TURN_CANCEL", str)
#: Wake-ups ``cancel_turn`` sends the turn's waiting ResumeTurn, keyed by turn ID (platform
#: addition, internal): it withdraws the turn's approvals and questions and ends the turn once
#: the running calls have finished.
TURN_CANCELS: ChannelMap[str] = ChannelMap("TURN_CANCELS", str)

#: The questions MCP servers asked during the running turn's tool calls, open and answered
#: (platform addition, MCP elicitation): an answered one is kept until the turn ends, so a
#: retried attempt of the call that asks the same question gets the same answer. Every writer
#: holds its lock: the elicitation RPCs, ResumeTurn of a steering session and the tool failure
#: routes; the Steps that end a turn delete it.
ELICITATIONS: Attribute[list[AgentElicitation]] = Attribute(
    "ELICITATIONS", cast(type[list[AgentElicitation]], list[AgentElicitation])
)
#: Grows by one with every change to ``ELICITATIONS`` (platform addition): a tool Step waiting
#: for an answer waits for it to pass the value it saw (``wait_for_attribute_match``) instead of
#: polling.
ELICITATION_VERSION: Attribute[int] = Attribute("ELICITATION_VERSION", int)

#: Sender IDs (``AgentUserMessage.client_id``) of the user messages ``send_user_message``
#: accepted, each with its acceptance time as ISO 8601 UTC (platform addition): a message sent
#: again under the same ID is not queued twice, so a sender may retry a send whose answer it
#: never got. The RPC locks and loads only the one instance it checks.
ACCEPTED_CLIENT_IDS: AttributeMap[str] = AttributeMap("ACCEPTED_CLIENT_IDS", str)

#: Parts of texts too large for one Dex value (platform addition, ``dex_agents._text_parts``):
#: a tool result's whole text, keyed ``<turn_id>:<tool_call_id>:<nnnnn>``. Loaded one instance
#: per call, never whole.
TEXT_PARTS: AttributeMap[str] = AttributeMap("TEXT_PARTS", str)
#: Which stored messages own parts in ``TEXT_PARTS``, by message key (platform addition), so
#: that deleting messages deletes their parts without loading the messages.
TEXT_PARTS_INDEX: Attribute[dict[str, TextParts]] = Attribute(
    "TEXT_PARTS_INDEX", cast(type[dict[str, TextParts]], dict[str, TextParts])
)

#: The Attribute, AttributeMap, Channel and ChannelMap definitions of every agent Flow.
SHARED_DEFINITIONS = (
    AGENT_STATE,
    AGENT_MESSAGES,
    FRAMEWORK_RUN_STATE,
    AGENT_TOOL_CALLS,
    PENDING_INTERRUPTS,
    AGENT_USAGE,
    AGENT_CONFIG,
    QUEUED_USER_MESSAGES,
    INTERRUPT_RESOLUTIONS,
    TOOL_CALL_RESULTS,
    STEERED_USER_MESSAGES,
    STEERED_FOR_TURN,
    PENDING_TIMER,
    PENDING_USER_INPUT,
    USER_INPUT_ANSWER,
    USER_INPUT_ANSWERS,
    BUILTIN_WAKEUPS,
    AGENT_PLAN,
    PLAN_EXECUTIONS,
    ACCEPTED_CLIENT_IDS,
    ELICITATIONS,
    ELICITATION_VERSION,
    TEXT_PARTS,
    TEXT_PARTS_INDEX,
    TURN_CANCEL,
    TURN_CANCELS,
)

#: ``ContextSummary`` Attribute (platform addition, ``AgentSessionOptions.compaction``): the
#: cumulative summary of the older messages and the retained message range.
CONTEXT_SUMMARY: Attribute[ContextSummary] = Attribute("CONTEXT_SUMMARY", ContextSummary)

#: The definitions of context compaction; part of every agent Flow's schema.
COMPACTION_DEFINITIONS = (CONTEXT_SUMMARY,)
