"""The web side's door to the Dex engine: a session's lifecycle and reads.

Views, services and Celery tasks call these coroutines instead of the Dex SDK: starting a
session, stopping it and deleting its history, and reading its Flow's state (running or not,
the snapshot, pages of messages, a message's whole text, the queue, the Step history), plus the
engine's health check. The rest of the door is beside this module in ``agents_app.gateway``:
``input_rpcs`` (what people send a running session: messages and queue edits, decisions,
answers, plans, turn cancels) and ``event_stream`` (the session's AgentEvents Stream). Below
them: ``engine_loop`` (where calls run), ``engine_connection`` (one SDK client per event loop),
``engine_errors`` and ``session_data`` (the JSON-ready shapes).

Callers run a coroutine of the gateway with ``run(...)`` from sync code (the process's private
event loop thread), ``await call(...)`` from async views (the same loop, no thread held), or
``await call_here(...)`` on the ASGI server's own long-lived loop; async code with a loop of
its own awaits it directly. Those three and the errors below are re-exported here from
``engine_loop`` and ``engine_errors``, so callers write
``dex_gateway.run(dex_gateway.session_snapshot(session_id=...))`` and catch
``dex_gateway.EngineUnavailableError``.

Errors raised by every function here:
    EngineUnavailableError: The engine did not answer (refused, unreachable, or slower
        than ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds); its subclass WorkerUnavailableError
        when the engine answered that no worker took an RPC.
    SessionNotFoundError: Dex has no such session (Flow).
    SessionTooLargeError: The session's state is too large to load in one worker message.

May import: the rest of the gateway package, the settings, ``dex_agents`` and the Dex SDK.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import grpc

from agents_app.conf import dexagents_setting
from agents_app.gateway import snapshot_cache
from agents_app.gateway.engine_connection import connection, flow_stop
from agents_app.gateway.engine_errors import (
    EngineUnavailableError,
    MessageNotFoundError,
    MessagePartOutOfRangeError,
    SessionAlreadyStartedError,
    SessionNotFoundError,
    SessionTooLargeError,
    WorkerUnavailableError,
    translate,
)
from agents_app.gateway.engine_loop import call, call_here, run
from agents_app.gateway.event_stream import session_event_announce
from agents_app.gateway.session_data import (
    message_to_data,
    queued_message_to_data,
    snapshot_to_data,
)
from dex_agents import (
    EXECUTE_COMPLETED_EVENT,
    EXECUTE_FAILED_EVENT,
    WAIT_FOR_COMPLETED_EVENT,
    WAIT_FOR_FAILED_EVENT,
    StepHistoryEntry,
    read_flow_step_history,
)

# The module's interface: its own coroutines, and what it hands on from ``engine_loop`` and
# ``engine_errors`` (see the docstring).
__all__ = [
    "FLOW_DELETE_METHOD", "HISTORY_EVENT_TYPES", "EngineUnavailableError",
    "MessageNotFoundError", "MessagePartOutOfRangeError", "SessionAlreadyStartedError",
    "SessionNotFoundError",
    "SessionTooLargeError", "WorkerUnavailableError", "call", "call_here", "engine_health_check",
    "run", "session_flow_running", "session_history", "session_history_delete",
    "session_message_queue", "session_message_text", "session_messages",
    "session_messages_before", "session_snapshot", "session_start", "session_stop",
    "tool_policies_build",
]

logger = logging.getLogger(__name__)

# History events reported as ended Step methods (reference/dex-engine-spec.md 4.6).
HISTORY_EVENT_TYPES = frozenset(
    {WAIT_FOR_COMPLETED_EVENT, EXECUTE_COMPLETED_EVENT, WAIT_FOR_FAILED_EVENT, EXECUTE_FAILED_EVENT}
)
_HISTORY_MAX_EVENTS = 10_000


def tool_policies_build(*, agent_config: Mapping[str, Any]) -> dict[str, Any]:
    """Build per-session ``dex_agents.ToolPolicy`` values from an agent_config snapshot.

    Returns:
        ``{exposed tool name: ToolPolicy(ToolEffect(effect), requires_approval,
        approval_deadline_seconds, timeout_seconds=step_timeout_seconds, retries=retries)}``:
        each attempt of the call's Step is cut off at the tool's ``step_timeout_seconds``
        (longer than its MCP request timeout, which the runner enforces itself) plus the
        session's ``elicitation_timeout_seconds`` (the MCP request's clock stands still while
        the user answers a server's question; the Step's does not), and a read or
        idempotent_write call runs ``retries + 1`` attempts (``AgentDefinition.agent_config``).
        A snapshot taken before these limits existed gives ``None`` for both: the seed's
        defaults.

    Raises:
        ValueError: A limit in the snapshot that ``ToolPolicy`` refuses.
    """
    from dex_agents import ToolEffect, ToolPolicy

    # A server's question stops the MCP request's clock but not the Step's: the Step limit
    # makes room for the user's answer.
    answer_allowance = agent_config.get("elicitation_timeout_seconds") or 0

    def step_limit(tool: Mapping[str, Any]) -> Any:
        limit = tool.get("step_timeout_seconds")
        return None if limit is None else limit + answer_allowance

    return {
        tool["name"]: ToolPolicy(
            ToolEffect(tool["effect"]),
            tool["requires_approval"],
            tool.get("approval_deadline_seconds"),
            timeout_seconds=step_limit(tool),
            retries=tool.get("retries"),
        )
        for tool in agent_config.get("tools", [])
    }


async def session_start(
    *, session_id: str, message: str, agent_config: Mapping[str, Any], plan_mode: bool = False
) -> None:
    """Start the AgentSession Flow ``session_id`` with the agent_config snapshot.

    A non-blank ``message`` starts the first turn at once (seed "Flow shape"), a planning
    turn with ``plan_mode``.
    """
    try:
        await connection().sessions.start_session(
            session_id,
            message,
            agent_config=dict(agent_config),
            tool_policies=tool_policies_build(agent_config=agent_config),
            plan_mode=plan_mode,
        )
    except Exception as error:
        raise translate(error, session_id) from error


@snapshot_cache.writes_session
async def session_stop(*, session_id: str, reason: str) -> None:
    """Stop the session's Flow; a Flow that is already gone is not an error.

    Announces ``session_stopped {"reason"}`` on the session's AgentEvents Stream (best
    effort), so open pages show the stop at once.
    """
    await flow_stop(session_id, reason=reason)
    await session_event_announce(
        session_id=session_id, event_type="session_stopped", payload={"reason": reason}
    )


#: The embedded engine's Flow deletion (``dex_dev_server._retention_service``): not part of
#: the Dex protocol, so SDK 1.23.0 has no call for it and a real Dex server answers
#: UNIMPLEMENTED (it deletes closed Flows after its namespace's retention period).
FLOW_DELETE_METHOD = "/dexdev.FlowRetention/DeleteFlow"


async def session_history_delete(*, session_id: str) -> bool:
    """Delete the stopped session's stored history (runs, messages, events, blobs) from the
    engine, through the embedded engine's ``dexdev.FlowRetention/DeleteFlow``.

    Returns:
        True when the engine deleted it or does not know the Flow; False when the engine
        has no such call (a real Dex server: its retention deletes the closed Flow later).

    Raises:
        EngineUnavailableError: The engine did not answer.
        Exception: The engine refused (e.g. FAILED_PRECONDITION: the Flow still runs).
    """
    from google.protobuf import empty_pb2, wrappers_pb2

    call = connection().history_channel.unary_unary(
        FLOW_DELETE_METHOD,
        request_serializer=wrappers_pb2.StringValue.SerializeToString,
        response_deserializer=empty_pb2.Empty.FromString,
    )
    try:
        await call(
            wrappers_pb2.StringValue(value=session_id),
            timeout=float(dexagents_setting("ENGINE_TIMEOUT")),
        )
    except grpc.RpcError as error:
        if error.code() == grpc.StatusCode.UNIMPLEMENTED:
            return False
        translated = translate(error, session_id)
        if isinstance(translated, SessionNotFoundError):
            return True
        raise translated from error
    return True


async def session_flow_running(*, session_id: str) -> bool:
    """Whether the session's Flow still runs, from Dex's Flow summary (``describe_flow``, a
    FlowService call that needs no worker).

    Returns:
        False once the Flow was stopped (cancelled or terminated), failed or completed: Dex
        keeps serving its last snapshot, whose status no longer changes.

    Raises:
        EngineUnavailableError, SessionNotFoundError.
    """
    from dex import FlowStatus

    try:
        info = await connection().client.describe_flow(session_id)
    except Exception as error:
        raise translate(error, session_id) from error
    return bool(info.status == FlowStatus.RUNNING)


async def session_message_queue(*, session_id: str) -> dict[str, list[dict[str, Any]]]:
    """Read the session's queued and steered messages in one ``get_message_queue`` RPC.

    Returns:
        ``{"queued": [entry], "steered": [entry]}``, each oldest first; an entry is
        ``queued_message_to_data`` plus ``"client_id"`` (the sender's own ID, for the web
        side's lookups; the API leaves it out).
    """
    try:
        queue = await connection().sessions.get_message_queue(session_id)
    except Exception as error:
        raise translate(error, session_id) from error
    return {
        "queued": [
            {**queued_message_to_data(item), "client_id": item.client_id} for item in queue.queued
        ],
        "steered": [
            {**queued_message_to_data(item), "client_id": item.client_id} for item in queue.steered
        ],
    }


async def session_snapshot(*, session_id: str) -> dict[str, Any]:
    """Read the session's AgentSnapshot as plain JSON-ready data.

    Returns:
        ``{"status", "turn_id" (the running turn or None), "messages": [{"sequence", "role",
        "text", "turn_id", "tool_calls"?, "tool_call_id"?}], "pending_interrupts",
        "awaiting_approval", "tool_calls", "usage", "queued_message_count", "queued_messages",
        "steered_messages", "last_turn_error", "has_older_messages", "pending_input",
        "pending_timer", "plan", "plan_execution_requested", "turn_mode",
        "pending_elicitations"}``; queued and steered
        entries are ``queued_message_to_data``, oldest first; ``pending_input``,
        ``pending_timer`` and ``plan`` are shaped by ``pending_input_to_data``,
        ``pending_timer_to_data`` and ``plan_to_data``, each pending elicitation (an MCP
        server's question during a tool call) by ``elicitation_to_data``, oldest first;
        ``turn_mode`` is what the running or
        last turn does (``chat``, ``planning`` or ``executing``). ``status`` is the AgentState
        status, or ``"starting"`` while the state is None (seed "Design decisions"). Framework
        items are left out. ``summary`` (context compaction) is ``summary_to_data``, or None
        until a compaction ran; ``has_older_messages`` counts retained messages only. A tool
        call's ``output`` is its text (``mcp_registry.content.tool_result_text``): the images
        a result attached for the model appear as their labels, never as base64.
    """
    try:
        snapshot = await connection().sessions.get_agent_snapshot(session_id)
    except Exception as error:
        raise translate(error, session_id) from error
    return snapshot_to_data(snapshot)


async def session_messages_before(
    *, session_id: str, before: int | None, limit: int
) -> dict[str, Any]:
    """One page of retained messages: the newest ``limit`` (1..200) with ``sequence < before``
    (the newest when ``before`` is None), oldest first, loading only that page's instances.

    Returns:
        ``{"messages": [message_to_data], "next_before": the ``before`` of the next older page,
        or None when no older retained message exists}``.
    """
    try:
        page = await connection().sessions.list_agent_messages_before(
            session_id, before=before, limit=limit
        )
    except Exception as error:
        raise translate(error, session_id) from error
    return {
        "messages": [message_to_data(message) for message in page.messages],
        "next_before": page.next_before_sequence,
    }


async def session_message_text(*, session_id: str, sequence: int, part: int) -> dict[str, Any]:
    """Part ``part`` (zero-based) of stored message ``sequence``'s whole text, at most
    ``dex_agents.TEXT_PART_BYTES`` (512 KiB) of UTF-8, through ``read_message_text``.

    Returns:
        ``{"sequence", "part", "parts", "text_length" (characters of the whole text), "text"}``.

    Raises:
        MessageNotFoundError: The message is not stored (or compaction deleted it).
        MessagePartOutOfRangeError: ``part`` is not below ``parts`` (its ``parts`` says how
            many there are); the API answers 404.
        SessionNotFoundError, EngineUnavailableError, WorkerUnavailableError: As every read.
    """
    try:
        answer = await connection().sessions.read_message_text(session_id, sequence, part)
    except Exception as error:
        raise translate(error, session_id) from error
    if not answer.found:
        raise MessageNotFoundError(sequence)
    if answer.text is None:
        raise MessagePartOutOfRangeError(part, answer.parts)
    return {
        "sequence": answer.sequence,
        "part": answer.part,
        "parts": answer.parts,
        "text_length": answer.text_length,
        "text": answer.text,
    }


async def session_messages(
    *, session_id: str, after_sequence: int, limit: int
) -> list[dict[str, Any]]:
    """Stored messages with ``sequence > after_sequence``, oldest first, at most ``limit``
    (1..200), through the seed's ``list_agent_messages`` RPC; shapes as ``message_to_data``."""
    try:
        page = await connection().sessions.list_agent_messages(
            session_id, after_sequence=after_sequence, limit=limit
        )
    except Exception as error:
        raise translate(error, session_id) from error
    return [message_to_data(message) for message in page.messages]


async def session_history(*, session_id: str) -> list[StepHistoryEntry]:
    """List the session's ended Step methods, oldest first (current run).

    Keeps the ``step_wait_for_completed``, ``step_execute_completed``, ``step_wait_for_failed``
    and ``step_execute_failed`` events of FlowService.GetHistoryEvents
    (reference/dex-engine-spec.md 4.6).

    Raises:
        EngineUnavailableError: The engine could not be reached or did not answer in time.
        SessionNotFoundError: Dex has no Flow with this ID.
    """
    try:
        return await read_flow_step_history(
            connection().flow_service,
            session_id,
            page_timeout=float(dexagents_setting("ENGINE_TIMEOUT")),
            event_types=HISTORY_EVENT_TYPES,
            max_events=_HISTORY_MAX_EVENTS,
        )
    except Exception as error:
        raise translate(error, session_id) from error


async def engine_health_check() -> bool:
    """Return True when the engine answers FlowService.HealthCheck; never raises."""
    try:
        return bool(await connection().client.health_check())
    except Exception as error:
        logger.info("Dex engine health check failed: %s", error)
        return False

