"""AgentEvents: typed, best-effort live events on the session's Dex Stream (seed "Events").

A writer is bound to one Step invocation. Its methods may be called from any thread: calls off
the event loop are handed to the loop with ``call_soon_threadsafe``. Once the Step call returns
the writer is closed and later writes are dropped silently.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dex import AsyncContext, Stream

from dex_agents._wire_types import resolve_annotations


class AgentEventType(StrEnum):
    """Every event type (seed "Events"). Payload keys:

    - ``turn_started``: ``sequence`` (int, the turn's user message); platform addition:
      ``client_ids`` (list of str), the ``AgentUserMessage.client_id`` of each message the turn
      took as it started, present only when a sender gave one;
    - ``turn_completed``: ``message_count`` (int, stored messages after the turn's commit);
    - ``turn_failed``: ``error`` (str, as stored in ``last_turn_error``);
    - ``text_delta``, ``reasoning_delta``: ``text`` (str);
    - ``tool_call_started``: ``tool_call_id``, ``tool_name``;
    - ``tool_call_finished``: ``tool_call_id``, ``tool_name``, ``status`` (final
      ``ToolCallStatus`` value), once per tool call, including rejections; platform addition:
      ``outcome`` (str), present only when the status alone misleads a reader: ``interrupted``
      or ``completed`` for a ``durable_wait`` that succeeded, ``answered`` for a
      ``request_user_input`` that succeeded, and the failure text (at most
      ``FINISHED_OUTCOME_MAX_CHARS`` characters) for ``failed`` and ``outcome_unknown``;
    - ``tool_call_deferred``: ``tool_call_id``, ``tool_name``, ``effect``, ``requires_approval``;
    - ``interrupt_raised``: ``interrupt_id``, ``tool_call_id``, ``tool_name``, ``deadline``
      (ISO-8601 UTC or ``None``);
    - ``interrupt_resolved``: ``interrupt_id``, ``approved``, ``rejection_message``; platform
      addition: ``superseded: true``, present only when a steered message withdrew it;
    - ``usage_recorded``: ``recorded`` (this model call) and ``session`` (running total), each a
      dict of the five ``AgentUsage`` counters.

    Platform addition written by the Step that ends a turn the user cancelled
    (``cancel_turn``):

    - ``turn_cancelled``: ``message_count`` (int, stored messages after the turn's commit),
      ``interrupted_sequence`` (int or ``None``: the stored message holding the text the
      abandoned model call had streamed, marked ``interrupted``) and
      ``cancelled_tool_call_ids`` (list of str, calls that ended ``cancelled`` without
      running, approvals the cancel withdrew among them).

    Platform additions (not in the seed), written by a runner while a tool runs:

    - ``tool_progress``: ``tool_call_id``, ``tool_name``, ``progress`` (float), ``total``
      (float or ``None``), ``message`` (str or ``None``), from MCP ``notifications/progress``;
    - ``tool_log``: ``tool_call_id``, ``tool_name``, ``level`` (MCP logging level), ``data``
      (any JSON), from MCP ``notifications/message``; such a message names no request, so the
      platform writes it only while the call is the one request in flight on its server's
      connection (``mcp_registry.client``), never into another session.

    Platform addition written by a Step when a session has ``AgentSessionOptions.steering``:

    - ``steer_applied``: ``message_count`` (int, steered messages the turn took),
      ``withdrawn_interrupt_ids`` (list of str, approvals the steer withdrew), ``client_ids``
      (list of str, the steered messages' ``client_id``; present only when a sender gave one).

    Platform additions written by Steps of a session with built-in tools
    (``AgentSessionOptions.durable_waits`` / ``user_input``):

    - ``durable_wait_started``: ``tool_call_id``, ``fires_at`` (ISO-8601 UTC),
      ``duration_seconds`` (int), ``reason`` (str);
    - ``user_input_requested``: ``tool_call_id``, ``prompt`` (str), ``choices`` (list of str);
    - ``user_input_answered``: ``tool_call_id``.

    Platform additions written by a tool Step while an MCP server's question waits for the
    user (``dex_agents._tool_call_elicitations.ToolCallElicitations``):

    - ``elicitation_requested``: ``tool_call_id``, ``tool_name``, ``elicitation_id``,
      ``server``, ``mode`` (``form`` or ``url``), ``message``, ``deadline`` (ISO-8601 UTC);
    - ``elicitation_closed``: ``tool_call_id``, ``tool_name``, ``elicitation_id``, ``server``,
      ``status`` (``ElicitationStatus``: ``accepted``, ``declined``, ``cancelled``,
      ``expired`` or ``withdrawn``), ``reason`` (why it was withdrawn, else empty),
      ``reused`` (bool: an earlier attempt of the call got this answer).

    Platform additions written by Steps of a session with ``AgentSessionOptions.plans``:

    - ``plan_updated``: ``revision`` (int), ``status`` (``PlanStatus``), ``task_count`` (int);
    - ``plan_started``: ``revision`` (int); an ``execute_plan`` turn began (its
      ``turn_started`` carries ``sequence: None`` and ``plan_revision``).
    Platform additions written by the CompactContext Step of a session with
    ``AgentSessionOptions.compaction``:

    - ``context_compaction_started``: ``through_sequence`` (int, the chunk's last message),
      ``reason``; before the summarizer runs (each attempt);
    - ``context_compacted``: ``through_sequence`` (int, messages up to here are summarized),
      ``generation`` (int), ``first_retained_sequence`` (int, the oldest stored message),
      ``deleted_count`` (int, messages retention deleted in this commit), ``reason``
      (``context``, ``retention`` or ``overflow``); once per committed chunk.

    Platform additions written by the ``CallSubagent`` Step of a session with
    ``AgentSessionOptions.subagents`` (issue 29):

    - ``subagent_started``: ``tool_call_id``, ``tool_name`` (``agent__<slug>``),
      ``child_session_id`` (the child session's ID), ``depth`` (int, the child's);
    - ``subagent_finished``: ``tool_call_id``, ``tool_name``, ``child_session_id``,
      ``outcome`` (``completed``, ``failed`` or ``cancelled``); before the call's
      ``tool_call_finished``.

    Platform additions written by an application through its Dex client, not by a Step (their
    ``turn_id`` is ``None``, ``step_execution_id`` is ``""`` and ``attempt`` is 0), so every
    viewer hears of changes no Step reports:

    - ``message_queued``: a user message joined ``QUEUED_USER_MESSAGES``; ``message_id``
      (its ``client_id``), present only when the sender gave one;
    - ``queue_changed``: ``change`` (``deleted``, ``edited`` or ``steered``) and
      ``message_id`` (the message's ID as the queue lists it); a queued message was deleted,
      replaced or steered;
    - ``session_stopped``: ``reason`` (str); the session's Flow was stopped.
    """

    TURN_STARTED = "turn_started"
    TURN_COMPLETED = "turn_completed"
    TURN_FAILED = "turn_failed"
    TURN_CANCELLED = "turn_cancelled"
    TEXT_DELTA = "text_delta"
    REASONING_DELTA = "reasoning_delta"
    TOOL_CALL_STARTED = "tool_call_started"
    TOOL_CALL_FINISHED = "tool_call_finished"
    TOOL_CALL_DEFERRED = "tool_call_deferred"
    INTERRUPT_RAISED = "interrupt_raised"
    INTERRUPT_RESOLVED = "interrupt_resolved"
    STEER_APPLIED = "steer_applied"
    DURABLE_WAIT_STARTED = "durable_wait_started"
    USER_INPUT_REQUESTED = "user_input_requested"
    USER_INPUT_ANSWERED = "user_input_answered"
    ELICITATION_REQUESTED = "elicitation_requested"
    ELICITATION_CLOSED = "elicitation_closed"
    PLAN_UPDATED = "plan_updated"
    PLAN_STARTED = "plan_started"
    USAGE_RECORDED = "usage_recorded"
    TOOL_PROGRESS = "tool_progress"
    TOOL_LOG = "tool_log"
    CONTEXT_COMPACTION_STARTED = "context_compaction_started"
    CONTEXT_COMPACTED = "context_compacted"
    SUBAGENT_STARTED = "subagent_started"
    SUBAGENT_FINISHED = "subagent_finished"
    MESSAGE_QUEUED = "message_queued"
    QUEUE_CHANGED = "queue_changed"
    SESSION_STOPPED = "session_stopped"


#: The longest ``tool_call_finished`` ``outcome`` (a failure text is cut to it).
FINISHED_OUTCOME_MAX_CHARS = 300


@dataclass(frozen=True)
class AgentEvent:
    """One AgentEvents Stream message.

    Attributes:
        type: The event type.
        turn_id: The turn it belongs to (``None`` only outside a turn).
        step_execution_id: Shared by all attempts of one Step execution.
        attempt: The one-based Step attempt that wrote it.
        payload: The type's payload, plain JSON.
    """

    type: AgentEventType
    turn_id: str | None
    step_execution_id: str
    attempt: int
    payload: dict[str, Any]


class AgentEventWriter:
    """Writes AgentEvents for one turn, Step execution and attempt.

    Created by the session for each Step call; runners receive it as ``AgentTurnContext.events``
    and ``DeferredToolExecution.events``. Thread-safe; writes after ``close()`` are dropped.
    """

    def __init__(
        self, stream: Stream[AgentEvent], context: AsyncContext, turn_id: str | None
    ) -> None:
        self._stream = stream
        self._context = context
        self._turn_id = turn_id
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._closed = False
        self._streamed: list[str] = []

    @property
    def streamed_text(self) -> str:
        """The text of every ``text_delta`` written so far (platform addition): what a model
        call the user cancelled had shown, which the session keeps as its partial answer."""
        return "".join(self._streamed)

    @property
    def turn_id(self) -> str | None:
        """The turn every event of this writer carries."""
        return self._turn_id

    def write_text_delta(self, text: str) -> None:
        """Write ``text_delta {"text"}``; one call is one Stream message, so batch tiny chunks."""
        if text and not self._closed:
            self._streamed.append(text)
        if text:
            self.write_event(AgentEventType.TEXT_DELTA, {"text": text})

    def write_reasoning_delta(self, text: str) -> None:
        """Write ``reasoning_delta {"text"}``."""
        if text:
            self.write_event(AgentEventType.REASONING_DELTA, {"text": text})

    def write_tool_call_started(self, tool_call_id: str, tool_name: str) -> None:
        """Write ``tool_call_started {"tool_call_id", "tool_name"}``."""
        self.write_event(
            AgentEventType.TOOL_CALL_STARTED,
            {"tool_call_id": tool_call_id, "tool_name": tool_name},
        )

    def write_tool_call_finished(
        self, tool_call_id: str, tool_name: str, status: str, outcome: str | None = None
    ) -> None:
        """Write ``tool_call_finished {"tool_call_id", "tool_name", "status"}``, plus
        ``outcome`` when given (cut to ``FINISHED_OUTCOME_MAX_CHARS`` characters)."""
        payload = {"tool_call_id": tool_call_id, "tool_name": tool_name, "status": str(status)}
        if outcome:
            payload["outcome"] = outcome[:FINISHED_OUTCOME_MAX_CHARS]
        self.write_event(AgentEventType.TOOL_CALL_FINISHED, payload)

    def write_event(self, event_type: AgentEventType | str, payload: dict[str, Any]) -> None:
        """Write one event of any type with a plain-JSON payload.

        Raises:
            ValueError: If ``event_type`` is not an ``AgentEventType`` value.
        """
        event = AgentEvent(
            type=AgentEventType(event_type),
            turn_id=self._turn_id,
            step_execution_id=self._context.step_execution_id,
            attempt=self._context.attempt,
            payload=dict(payload),
        )
        if threading.get_ident() == self._loop_thread:
            self._write_now(event)
        elif not self._closed:
            try:
                self._loop.call_soon_threadsafe(self._write_now, event)
            except RuntimeError:
                # The Worker loop is already closed: the call has long returned.
                return

    def close(self) -> None:
        """Drop every later write; called by the session when its Step call returns."""
        self._closed = True

    def _write_now(self, event: AgentEvent) -> None:
        if self._closed:
            return
        self._stream.write(self._context, event)


resolve_annotations(globals())
