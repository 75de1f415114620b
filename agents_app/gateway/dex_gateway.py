"""The web side's only door to the Dex engine.

Views and services call these functions instead of the Dex SDK, so the SDK's errors are
translated in one place and one ``AsyncClient`` serves the whole process:

- async callers (Channels consumers) ``await`` the ``session_*`` coroutines; they reuse one
  connection per running event loop, because gRPC aio objects are bound to their loop
  (reference/django-notes.md G1);
- sync callers (DRF views, services, commands) use ``run(...)``, which executes the
  coroutine on one private event loop thread per process, so every request shares one
  AsyncClient and one gRPC channel whatever server runs Django;
- async views ``await call(...)``, which runs the coroutine on that same private loop
  without holding a thread while Dex answers, so a web process serves many Dex-reading
  requests at once on one channel.

Nothing is created at import time; the first call builds the connection, which keeps this
module safe to import in forking processes (Celery prefork).

Errors raised by every function here:
    EngineUnavailableError: The engine did not answer (refused, unreachable, or slower
        than ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds); its subclass WorkerUnavailableError
        when the engine answered that no worker took an RPC.
    SessionNotFoundError: Dex has no such session (Flow).
    SessionTooLargeError: The session's state is too large to load in one worker message.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import datetime
import enum
import functools
import json
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping
from typing import Any, ParamSpec, TypeVar, cast

import grpc

from agents_app.conf import dexagents_setting
from dex_agents import (
    EXECUTE_COMPLETED_EVENT,
    EXECUTE_FAILED_EVENT,
    WAIT_FOR_COMPLETED_EVENT,
    WAIT_FOR_FAILED_EVENT,
    AgentUsage,
    PlanExecutionResult,
    StepHistoryEntry,
    TurnCancelResult,
    read_flow_step_history,
)
from mcp_registry.content import tool_result_text

logger = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

# gRPC codes that mean "the engine is not there", as opposed to "the request was wrong".
_UNAVAILABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})

# History events reported as ended Step methods (reference/dex-engine-spec.md 4.6).
HISTORY_EVENT_TYPES = _HISTORY_PAYLOADS = frozenset(
    {WAIT_FOR_COMPLETED_EVENT, EXECUTE_COMPLETED_EVENT, WAIT_FOR_FAILED_EVENT, EXECUTE_FAILED_EVENT}
)
_HISTORY_MAX_EVENTS = 10_000


class EngineUnavailableError(Exception):
    """The Dex engine could not be reached or did not answer in time.

    Attributes:
        cause: ``"unreachable"`` (the engine refused or dropped the connection: it is down),
            ``"timeout"`` (no answer in time: the engine is slow, or no Dex worker runs the
            RPC, since Dex RPCs execute on a worker), ``"worker"`` (``WorkerUnavailableError``:
            the engine said no worker took the RPC) or ``"busy"`` (a Step held the
            session's state locked for the client's whole retry window).
    """

    def __init__(self, message: str, *, cause: str = "unreachable") -> None:
        super().__init__(message)
        self.cause = cause


class WorkerUnavailableError(EngineUnavailableError):
    """The engine answered, but no Dex worker took the RPC (none connected, or it went away
    while running it): RPCs need a worker, unlike reads of Flow state."""


class SessionNotFoundError(Exception):
    """Dex has no Flow with the requested session ID."""


class SessionTooLargeError(Exception):
    """The engine cannot hand what a read needs to a worker, or its answer to the client, in
    one 4 MiB gRPC message.

    Values past the engine's blob threshold travel as blob references, the views
    (``dex_agents._views``) bound what a snapshot or a page carries, and one stored value is at
    most about 4 MiB, so a session within the documented limits (docs/limits.md) never gets
    here; a read that does answers 503 with this.
    """


class MessageNotFoundError(Exception):
    """The session stores no message with the requested sequence (any more)."""

    def __init__(self, sequence: int) -> None:
        super().__init__(f"The session has no message {sequence}.")
        self.sequence = sequence


class MessagePartOutOfRangeError(Exception):
    """The requested part of a message's text does not exist; ``parts`` says how many do."""

    def __init__(self, part: int, parts: int) -> None:
        super().__init__(f"The text has {parts} part(s), numbered from 0; there is no part {part}.")
        self.part = part
        self.parts = parts


class _Connection:
    """One AsyncClient, its AgentSessionClient and a raw FlowService stub, bound to a loop."""

    def __init__(self, address: str) -> None:
        from dex import AsyncClient, ClientOptions, Registry
        from dex.dexpb import dex_pb2_grpc

        from agents_app.worker.flow import build_flow
        from dex_agents import AgentCodecRegistry, AgentSessionClient

        self.flow = build_flow()
        registry = Registry([self.flow], AgentCodecRegistry(), allow_async_handlers=True)
        self.client = AsyncClient(registry, _blob_cache(), ClientOptions(server_address=address))
        self.sessions = AgentSessionClient(self.client, self.flow)
        # SDK 1.23.0's AsyncClient has no history call, so GetHistoryEvents goes through a
        # stub of our own on a separate channel.
        self.history_channel = grpc.aio.insecure_channel(address)
        self.flow_service = dex_pb2_grpc.FlowServiceStub(self.history_channel)

    async def close(self) -> None:
        await self.client.close()
        await self.history_channel.close(None)


_blob_cache_lock = threading.Lock()
_blob_cache_instance: Any = None
# Per loop, per engine address: a changed DEX_SERVER_ADDRESS (tests) gets its own client.
_connections: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _Connection]] = (
    weakref.WeakKeyDictionary()
)


def _blob_cache() -> Any:
    """Open the process's Dex blob cache once (``DEXAGENTS["BLOB_CACHE_DIR"]``)."""
    global _blob_cache_instance
    with _blob_cache_lock:
        if _blob_cache_instance is None:
            from dex import BlobCacheConfig, open_blob_cache

            directory = dexagents_setting("BLOB_CACHE_DIR")
            os.makedirs(directory, exist_ok=True)
            _blob_cache_instance = open_blob_cache(
                BlobCacheConfig(str(directory), dexagents_setting("BLOB_CACHE_BYTES"))
            )
        return _blob_cache_instance


def _connection() -> _Connection:
    """Return the running loop's connection, creating it on first use."""
    loop = asyncio.get_running_loop()
    address = dexagents_setting("DEX_SERVER_ADDRESS")
    by_address = _connections.setdefault(loop, {})
    connection = by_address.get(address)
    if connection is None:
        connection = by_address[address] = _Connection(address)
    return connection


def session_client() -> Any:
    """The running loop's ``dex_agents.AgentSessionClient`` of the shared Flow, created on
    first use from ``DEXAGENTS["DEX_SERVER_ADDRESS"]``.

    For code that runs on a loop of its own and speaks to the session Flow directly: a Dex
    worker's tool Steps put MCP servers' questions to the user through it
    (``agents_app.worker.runner.LiteLLMRunner``), on the worker's loop. SDK errors are not
    translated.

    Returns:
        An ``AgentSessionClient`` (typed ``Any``: the class is imported lazily).
    """
    return _connection().sessions


def _unavailable_cause(error: BaseException) -> str | None:
    """``"unreachable"`` or ``"timeout"`` when ``error`` (or one of its causes) says the engine
    did not answer, else None (the request itself failed)."""
    from dex import DexServiceError

    seen: BaseException | None = error
    while seen is not None:
        code = None
        if isinstance(seen, DexServiceError):
            code = seen.code
        elif isinstance(seen, grpc.RpcError):
            code = seen.code()
        if code == grpc.StatusCode.UNAVAILABLE:
            return "unreachable"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or isinstance(seen, TimeoutError):
            return "timeout"
        if isinstance(seen, ConnectionError):
            return "unreachable"
        seen = seen.__cause__ or seen.__context__
    return None


def _translate(error: Exception, session_id: str | None) -> Exception:
    """Map a Dex SDK error to this module's errors; other errors pass through."""
    from dex import DexServiceError, FlowNotActiveOrNotFoundError, FlowNotFoundError

    if isinstance(error, (FlowNotFoundError, FlowNotActiveOrNotFoundError)):
        return SessionNotFoundError(session_id or "")
    if isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.NOT_FOUND:
        return SessionNotFoundError(session_id or "")
    if isinstance(error, DexServiceError) and error.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return SessionTooLargeError(error.detail)
    if isinstance(error, grpc.RpcError) and error.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
        # A history page of large values passes the client's 4 MiB receive limit.
        return SessionTooLargeError(str(error.details()))
    cause = _unavailable_cause(error)
    if cause == "unreachable":
        address = dexagents_setting("DEX_SERVER_ADDRESS")
        return EngineUnavailableError(f"The Dex engine at {address} is not reachable.")
    if _no_worker_ran(error):
        return WorkerUnavailableError(
            f"No Dex worker took the request ({getattr(error, 'detail', error)}); try again "
            "shortly.",
            cause="worker",
        )
    if cause == "timeout":
        address = dexagents_setting("DEX_SERVER_ADDRESS")
        return EngineUnavailableError(
            f"The Dex engine at {address} or its workers did not answer in time.",
            cause="timeout",
        )
    return error


def _no_worker_ran(error: Exception) -> bool:
    """An RPC that no worker ran: FAILED_PRECONDITION without a worker's own status (the
    engine found no worker, or the worker went away before answering)."""
    from dex import WorkerInvocationError

    return (
        isinstance(error, WorkerInvocationError)
        and error.code == grpc.StatusCode.FAILED_PRECONDITION
        and error.worker_code is None
    )


def _writes_session(
    function: Callable[P, Coroutine[Any, Any, T]],
) -> Callable[P, Coroutine[Any, Any, T]]:
    """Mark an RPC that changes a session (keyword ``session_id``): its cached snapshot is
    forgotten before and after the call (``snapshot_cache``: read-your-writes)."""

    @functools.wraps(function)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        from agents_app.gateway import snapshot_cache

        session_id = str(kwargs["session_id"])
        await snapshot_cache.forget(session_id)
        try:
            return await function(*args, **kwargs)
        finally:
            await snapshot_cache.forget(session_id)

    return wrapper


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
        await _connection().sessions.start_session(
            session_id,
            message,
            agent_config=dict(agent_config),
            tool_policies=tool_policies_build(agent_config=agent_config),
            plan_mode=plan_mode,
        )
    except Exception as error:
        raise _translate(error, session_id) from error


@_writes_session
async def session_stop(*, session_id: str, reason: str) -> None:
    """Stop the session's Flow; a Flow that is already gone is not an error.

    Announces ``session_stopped {"reason"}`` on the session's AgentEvents Stream (best
    effort), so open pages show the stop at once.
    """
    from dex import StopFlowOptions

    try:
        await _connection().client.stop_flow(session_id, StopFlowOptions(reason=reason))
    except Exception as error:
        translated = _translate(error, session_id)
        if not isinstance(translated, SessionNotFoundError):
            raise translated from error
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

    call = _connection().history_channel.unary_unary(
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
        translated = _translate(error, session_id)
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
        info = await _connection().client.describe_flow(session_id)
    except Exception as error:
        raise _translate(error, session_id) from error
    return bool(info.status == FlowStatus.RUNNING)


@_writes_session
async def session_send_message(
    *,
    session_id: str,
    text: str,
    plan_mode: bool = False,
    client_id: str = "",
    created_at: datetime.datetime | None = None,
) -> bool:
    """Queue a user message; return False when the session refuses it (blank text).

    ``client_id`` is the sender's own ID for the message (``AgentUserMessage.client_id``): the
    queue RPCs find the message by it as well as by its Channel message ID, and a message the
    session already accepted under it is not queued again (True), so a send whose answer was
    lost may be repeated. ``created_at`` (timezone-aware): when the user sent it, kept as the
    message's time (the outbox gives it for a message it held); ``None``: when Dex accepts it.

    An accepted message is announced on the session's AgentEvents Stream as
    ``message_queued`` (best effort; ``{"message_id": client_id}`` when there is one), so
    every open page shows the queue at once.

    Raises:
        EngineUnavailableError: Dex did not answer, or another send of the same
            ``client_id`` kept it locked for about 5 seconds.
        SessionNotFoundError: Dex has no such session.
    """
    from dex import RpcLockConflictError

    try:
        accepted = bool(
            await _connection().sessions.send_user_message(
                session_id, text, plan_mode=plan_mode, client_id=client_id,
                created_at=created_at,
            )
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "Another delivery of this message is under way; try again shortly."
        ) from error
    except Exception as error:
        raise _translate(error, session_id) from error
    if accepted:
        # The message's ID lets a viewer place this event before the turn_started that took
        # it (whose client_ids name it), which the worker may have written first.
        await session_event_announce(
            session_id=session_id,
            event_type="message_queued",
            payload={"message_id": client_id} if client_id else None,
        )
    return accepted


async def session_message_queue(*, session_id: str) -> dict[str, list[dict[str, Any]]]:
    """Read the session's queued and steered messages in one ``get_message_queue`` RPC.

    Returns:
        ``{"queued": [entry], "steered": [entry]}``, each oldest first; an entry is
        ``queued_message_to_data`` plus ``"client_id"`` (the sender's own ID, for the web
        side's lookups; the API leaves it out).
    """
    try:
        queue = await _connection().sessions.get_message_queue(session_id)
    except Exception as error:
        raise _translate(error, session_id) from error
    return {
        "queued": [
            {**queued_message_to_data(item), "client_id": item.client_id} for item in queue.queued
        ],
        "steered": [
            {**queued_message_to_data(item), "client_id": item.client_id} for item in queue.steered
        ],
    }


def queued_message_to_data(message: Any) -> dict[str, Any]:
    """One ``AgentQueuedMessage`` as ``{"id", "text", "plan_mode", "created_at" (ISO 8601 or
    None)}``.

    ``id`` is the sender's ``client_id`` when it has one (every message the API accepted: its
    ``OutboxMessage`` ID), else the Channel message ID: so a message keeps the ID its POST
    answered from the outbox to the queue and the turn, and the queue RPCs take either.
    """
    return {
        "id": getattr(message, "client_id", "") or message.message_id,
        "text": message.text,
        "plan_mode": bool(getattr(message, "plan_mode", False)),
        "created_at": plain_data(getattr(message, "created_at", None)),
    }


#: Written to the AgentEvents Stream after a queued message was deleted, edited or steered,
#: with ``{"change": "deleted" | "edited" | "steered", "message_id"}`` (``message_id`` as the
#: caller named it: the ID the queue lists, its ``client_id`` when it has one); pages re-read
#: their queue on it, and a send-and-wait for a deleted or edited message ends on it.
QUEUE_CHANGED = "queue_changed"




async def _queue_rpc(
    session_id: str,
    change: str,
    message_id: str,
    call: Callable[[Any], Coroutine[Any, Any, bool]],
) -> bool:
    """Run one transactional queue RPC, ``call(AgentSessionClient)``, and announce
    ``QUEUE_CHANGED`` when it applied.

    A Step that consumes the message while the RPC runs makes Dex reject the commit
    (``ChannelMessageNotFoundError``); nothing changed then, so it counts as not pending.
    """
    from dex import ChannelMessageNotFoundError

    try:
        applied = bool(await call(_connection().sessions))
    except ChannelMessageNotFoundError:
        return False
    except Exception as error:
        raise _translate(error, session_id) from error
    if applied:
        await session_event_announce(
            session_id=session_id,
            event_type=QUEUE_CHANGED,
            payload={"change": change, "message_id": message_id},
        )
    return applied


@_writes_session
async def session_delete_queued_message(*, session_id: str, message_id: str) -> bool:
    """Delete a queued message (``delete_queued_message`` RPC) by its Channel message ID or
    ``client_id``.

    Returns:
        False when it is no longer pending (a turn took it, or it never was queued).
    """
    return await _queue_rpc(
        session_id,
        "deleted",
        message_id,
        lambda sessions: sessions.delete_queued_message(session_id, message_id),
    )


@_writes_session
async def session_replace_queued_message(
    *, session_id: str, message_id: str, text: str, plan_mode: bool, client_id: str
) -> bool:
    """Edit a queued message: remove it and queue ``text`` at the tail, in one transactional
    ``replace_queued_message`` RPC.

    Returns:
        False when the old message is no longer pending (then nothing changed) or ``text`` is
        blank.
    """
    return await _queue_rpc(
        session_id,
        "edited",
        message_id,
        lambda sessions: sessions.replace_queued_message(
            session_id, message_id, text, plan_mode=plan_mode, client_id=client_id
        ),
    )


@_writes_session
async def session_steer_queued_message(*, session_id: str, message_id: str) -> bool:
    """Steer a queued message into the running turn (``steer_queued_message`` RPC): it moves
    to the steered queue and the turn applies it at its next safe boundary.

    Returns:
        False when it is no longer pending.
    """
    return await _queue_rpc(
        session_id,
        "steered",
        message_id,
        lambda sessions: sessions.steer_queued_message(session_id, message_id),
    )


@_writes_session
async def session_cancel_turn(*, session_id: str, turn_id: str = "") -> TurnCancelResult:
    """Cancel the session's running turn through ``cancel_turn`` (``dex_agents``): its model
    call is abandoned (the streamed text kept, marked ``interrupted``), tool calls not started
    end ``cancelled``, pending approvals are withdrawn and the turn ends with
    ``turn_cancelled``; the queue is not touched. ``turn_id`` (``""``: whichever runs)
    names the turn meant.

    Returns:
        ``accepted`` with the ``turn_id``, or ``reason``: ``no_turn`` when none runs,
        ``turn_ended`` when another turn than ``turn_id`` runs.

    Raises:
        EngineUnavailableError, SessionNotFoundError.
    """
    try:
        return await _connection().sessions.cancel_turn(session_id, turn_id)
    except Exception as error:
        raise _translate(error, session_id) from error


#: The Stream ``source`` of events the web side writes (Steps write ``#<step execution>``).
WEB_EVENT_SOURCE = "dexagents-web"


async def session_event_announce(
    *, session_id: str, event_type: str, payload: Mapping[str, Any] | None = None
) -> None:
    """Write a platform event that no Step writes (``message_queued``, ``session_stopped``,
    ``queue_changed``; see ``dex_agents.AgentEventType``) to the session's AgentEvents Stream.

    Best effort, like every Stream write: a failure is logged and swallowed, because the
    change it announces already happened and pages also refresh on their own.
    """
    from dex_agents import AgentEvent, AgentEventType

    connection = _connection()
    event = AgentEvent(AgentEventType(event_type), None, "", 0, dict(payload or {}))
    try:
        await connection.client.write_stream(
            session_id, connection.flow.agent_events, WEB_EVENT_SOURCE, event
        )
    except Exception as error:
        logger.info("Could not announce %s for %s: %s", event_type, session_id, error)


@_writes_session
async def session_resolve_interrupt(
    *,
    session_id: str,
    interrupt_id: str,
    approved: bool,
    rejection_message: str | None,
    edited_arguments: str | None = None,
) -> bool:
    """Answer a pending approval through the seed's ``resolve_interrupt`` RPC.

    ``edited_arguments``: JSON text an approved call runs with instead of the model's
    (approve with edits; the caller validated it against the tool's input schema).

    Returns:
        True when Dex applied the answer; False when the interrupt is no longer pending or
        is past its deadline.

    Raises:
        EngineUnavailableError: Dex did not answer, or a Step kept the PendingInterrupts lock
            for the client's retry window (about 5 seconds).
        SessionNotFoundError: Dex has no such session.
    """
    from dex import RpcLockConflictError

    try:
        return bool(
            await _connection().sessions.resolve_interrupt(
                session_id,
                interrupt_id,
                approved=approved,
                rejection_message=rejection_message,
                edited_arguments=edited_arguments,
            )
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "The session is busy with its pending approvals; try again shortly.", cause="busy"
        ) from error
    except Exception as error:
        raise _translate(error, session_id) from error


@_writes_session
async def session_answer_user_input(*, session_id: str, call_id: str, answer: str) -> bool:
    """Answer the session's open ``request_user_input`` question through ``answer_user_input``.

    The AwaitUserInput Step then finishes the call and the next model call reads the answer
    as a user message; the Step announces ``user_input_answered``.

    Returns:
        True when Dex took the answer; False when no question with ``call_id`` is open (it
        was answered, a steered message withdrew it, or it never was) or ``answer`` is blank.

    Raises:
        EngineUnavailableError: Dex did not answer, or the Step kept PendingUserInput locked
            for the client's retry window (about 5 seconds).
        SessionNotFoundError: Dex has no such session.
    """
    from dex import RpcLockConflictError

    try:
        return bool(
            await _connection().sessions.answer_user_input(session_id, call_id, answer)
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "The session is busy with its question; try again shortly.", cause="busy"
        ) from error
    except Exception as error:
        raise _translate(error, session_id) from error


@_writes_session
async def session_answer_elicitation(
    *, session_id: str, elicitation_id: str, action: str, content: dict[str, Any] | None
) -> Any:
    """Answer a question an MCP server asks during a running tool call
    (``answer_elicitation``): ``action`` ``accept`` (with ``content`` for a form), ``decline``
    or ``cancel``. The waiting tool Step wakes, answers the server and announces
    ``elicitation_closed``.

    Returns:
        The ``dex_agents.ElicitationAnswerResult``: ``accepted``, or ``reason``
        (``not_pending``, ``expired``, ``invalid`` with ``errors`` per field, ``bad_action``).

    Raises:
        EngineUnavailableError: Dex did not answer, or the session's questions stayed locked
            for the client's retry window (about 5 seconds).
        SessionNotFoundError: Dex has no such session, or it is stopped.
    """
    from dex import RpcLockConflictError

    try:
        return await _connection().sessions.answer_elicitation(
            session_id, elicitation_id, action, content
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "The session is busy with its questions; try again shortly.", cause="busy"
        ) from error
    except Exception as error:
        raise _translate(error, session_id) from error


@_writes_session
async def session_execute_plan(*, session_id: str, revision: int) -> PlanExecutionResult:
    """Execute (or continue) the session's plan at ``revision`` through ``execute_plan``.

    Returns:
        ``accepted``, or the ``reason`` it was not (``stale_revision``,
        ``not_executable``, ``busy``, ``queued``, ``already_requested``, ``no_session``,
        ``no_plans``). An accepted request starts an ``executing`` turn without a user
        message, announced by ``plan_started``.

    Raises:
        EngineUnavailableError, SessionNotFoundError.
    """
    try:
        return await _connection().sessions.execute_plan(session_id, revision)
    except Exception as error:
        raise _translate(error, session_id) from error


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
        snapshot = await _connection().sessions.get_agent_snapshot(session_id)
    except Exception as error:
        raise _translate(error, session_id) from error
    return snapshot_to_data(snapshot)


def snapshot_to_data(snapshot: Any) -> dict[str, Any]:
    """Convert an ``AgentSnapshot`` to the API's JSON-ready shape (see ``session_snapshot``)."""
    state = getattr(snapshot, "state", None)
    status = plain_data(getattr(state, "status", None)) if state is not None else None
    last_turn_error = getattr(snapshot, "last_turn_error", None)
    if last_turn_error is None and state is not None:
        last_turn_error = getattr(state, "last_turn_error", None)
    tool_calls = getattr(snapshot, "tool_calls", None) or []
    if isinstance(tool_calls, Mapping):
        tool_calls = list(tool_calls.values())
    pending = plain_data(list(getattr(snapshot, "pending_interrupts", None) or []))
    messages = [message_to_data(message) for message in getattr(snapshot, "messages", None) or []]
    summary = getattr(snapshot, "summary", None)
    oldest = getattr(summary, "first_retained_sequence", 1) if summary is not None else 1
    return {
        "status": status or "starting",
        "turn_id": getattr(state, "turn_id", None) if state is not None else None,
        "messages": messages,
        "pending_interrupts": pending,
        "awaiting_approval": bool(pending),
        "tool_calls": [tool_call_to_data(call) for call in tool_calls],
        "usage": plain_data(getattr(snapshot, "usage", None) or AgentUsage()),
        "queued_message_count": int(getattr(snapshot, "queued_message_count", 0) or 0),
        "queued_messages": [
            queued_message_to_data(item)
            for item in getattr(snapshot, "queued_messages", None) or []
        ],
        "steered_messages": [
            queued_message_to_data(item)
            for item in getattr(snapshot, "steered_messages", None) or []
        ],
        "last_turn_error": plain_data(last_turn_error),
        "has_older_messages": bool(messages) and messages[0]["sequence"] > oldest,
        "pending_input": pending_input_to_data(getattr(snapshot, "pending_input", None)),
        "pending_timer": pending_timer_to_data(getattr(snapshot, "pending_timer", None)),
        "plan": plan_to_data(getattr(snapshot, "plan", None)),
        "plan_execution_requested": bool(getattr(snapshot, "plan_execution_requested", False)),
        "turn_mode": (plain_data(getattr(state, "turn_mode", None)) if state else None) or "chat",
        "summary": summary_to_data(summary),
        "pending_elicitations": [
            elicitation_to_data(item)
            for item in getattr(snapshot, "pending_elicitations", None) or []
        ],
    }


def elicitation_to_data(item: Any) -> dict[str, Any]:
    """A question an MCP server asks during a running tool call (``AgentElicitation``) as
    ``{"kind": "elicitation", "elicitation_id", "call_id" (the tool call), "tool_name",
    "server", "mode" ("form" | "url"), "message", "requested_schema" (the form's restricted JSON
    Schema, its properties in the server's order, or None in URL mode), "field_order" (the
    property names in that order: JSON readers may reorder keys), "url" (the page to open in
    URL mode, or None), "requested_at", "deadline" (ISO 8601 UTC)}``."""
    schema = plain_data(item.requested_schema) if item.mode == "form" else None
    order = [name for name in getattr(item, "field_order", None) or [] if name in
             ((schema or {}).get("properties") or {})]
    if schema is not None and isinstance(schema.get("properties"), dict):
        properties = schema["properties"]
        order += [name for name in properties if name not in order]
        schema = {**schema, "properties": {name: properties[name] for name in order}}
    return {
        "kind": "elicitation",
        "elicitation_id": item.elicitation_id,
        "call_id": item.tool_call_id,
        "tool_name": item.tool_name,
        "server": item.server_name,
        "mode": item.mode,
        "message": item.message,
        "requested_schema": schema,
        "field_order": order,
        "url": item.url if item.mode == "url" else None,
        "requested_at": plain_data(item.requested_at),
        "deadline": plain_data(item.deadline),
    }


def tool_call_to_data(record: Any) -> Any:
    """One tool call record as plain data, its ``output`` reduced to the text people read
    (``tool_result_text``: an attached image is its label, not its base64). Where the session
    stored a longer result whole (``output_parts``) is left out: the turn's tool message
    carries it (``text_length``) once the turn completes."""
    data = plain_data(record)
    if isinstance(data, dict):
        data.pop("output_parts", None)
        if isinstance(data.get("output"), str):
            data["output"] = tool_result_text(data["output"])
    return data


def pending_input_to_data(pending: Any) -> dict[str, Any] | None:
    """The open ``request_user_input`` question (``PendingUserInput``) as ``{"call_id",
    "prompt", "choices"}`` (``choices`` empty for a free-text answer), or None."""
    if pending is None:
        return None
    return {
        "call_id": pending.tool_call_id,
        "prompt": pending.prompt,
        "choices": list(pending.choices or []),
    }


def pending_timer_to_data(timer: Any) -> dict[str, Any] | None:
    """The running ``durable_wait`` (``PendingTimer``) as ``{"call_id", "fires_at" (ISO 8601
    UTC), "duration_seconds", "reason"}``, or None."""
    if timer is None:
        return None
    return {
        "call_id": timer.tool_call_id,
        "fires_at": plain_data(timer.fires_at),
        "duration_seconds": int(timer.duration_seconds),
        "reason": timer.reason,
    }


def plan_to_data(plan: Any) -> dict[str, Any] | None:
    """The session's plan (``AgentPlan``) as ``{"revision", "status" (draft | active |
    completed), "tasks": [{"content", "status" (pending | in_progress | completed)}]}``, or
    None before the first ``write_todos`` and once the plan was cleared."""
    if plan is None:
        return None
    return {
        "revision": int(plan.revision),
        "status": plain_data(plan.status),
        "tasks": [
            {"content": task.content, "status": plain_data(task.status)} for task in plan.tasks
        ],
    }


def summary_to_data(summary: Any) -> dict[str, Any] | None:
    """A ``ContextSummary`` as ``{"through_sequence", "text", "generation",
    "first_retained_sequence"}``, or None (no compaction ran yet)."""
    if summary is None:
        return None
    return {
        "through_sequence": summary.through_sequence,
        "text": summary.text,
        "generation": summary.generation,
        "first_retained_sequence": summary.first_retained_sequence,
    }


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
        page = await _connection().sessions.list_agent_messages_before(
            session_id, before=before, limit=limit
        )
    except Exception as error:
        raise _translate(error, session_id) from error
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
        answer = await _connection().sessions.read_message_text(session_id, sequence, part)
    except Exception as error:
        raise _translate(error, session_id) from error
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
        page = await _connection().sessions.list_agent_messages(
            session_id, after_sequence=after_sequence, limit=limit
        )
    except Exception as error:
        raise _translate(error, session_id) from error
    return [message_to_data(message) for message in page.messages]


#: The keys of ``AgentUsage.as_dict()``.
_USAGE_FIELDS = frozenset(AgentUsage().as_dict())


def message_to_data(message: Any) -> dict[str, Any]:
    """One stored message as ``{"sequence", "role", "text", "turn_id", "created_at"}``
    (``created_at`` ISO 8601 UTC, ``None`` for a message stored before it was kept), plus what
    links tool results to their calls: ``tool_calls`` (``[{"id", "name", "arguments"}]``) on an
    assistant message that asked for tools and ``tool_call_id`` on a tool result, read from its Chat
    Completions item. A message too large for one answer arrives cut (``dex_agents._views``):
    then ``text_length`` is the stored text's length in characters, and ``text`` its start
    with a last line saying how much was left out. ``interrupted`` (true, present only then):
    an answer the user cancelled while it streamed; ``text`` is what had arrived.
    ``notice`` (``turn_failed`` or ``turn_cancelled``, present only then): a note the session
    stored when a turn ended early; its ``role`` is ``system`` (the model reads it as a user
    item, but no user wrote it).
    ``reasoning`` (``{"text", "seconds", "cut"?}``) on an assistant message whose model call
    reasoned: its readable summary as the Thinking panel showed it and how long the call
    reasoned. ``usage`` (``AgentUsage.as_dict()``: tokens, requests and ``cost_usd``) on an
    assistant message: the model call that produced it (messages stored before it was kept
    have none). Provider-specific replay data (encrypted reasoning items, thinking blocks and
    their signatures) is left out.
    """
    data: dict[str, Any] = {
        "sequence": message.sequence,
        "role": plain_data(message.role),
        "text": message.text,
        "turn_id": message.turn_id,
        "created_at": plain_data(getattr(message, "created_at", None)),
    }
    if getattr(message, "interrupted", False):
        data["interrupted"] = True
    notice = getattr(message, "notice", None)
    if notice is not None:
        # The model reads the note as a user item, but nobody typed it.
        data["role"] = "system"
        data["notice"] = plain_data(notice)
    item = getattr(message, "framework_item", None)
    if not isinstance(item, Mapping):
        return data
    calls = item.get("tool_calls")
    if isinstance(calls, list) and calls:
        data["tool_calls"] = [
            {
                "id": call.get("id"),
                "name": (call.get("function") or {}).get("name"),
                "arguments": (call.get("function") or {}).get("arguments"),
            }
            for call in calls
            if isinstance(call, Mapping)
        ]
    if item.get("tool_call_id"):
        data["tool_call_id"] = item["tool_call_id"]
    reasoning = item.get("reasoning")
    if (
        isinstance(reasoning, Mapping)
        and isinstance(reasoning.get("text"), str)
        and isinstance(reasoning.get("seconds"), int | float)
    ):
        data["reasoning"] = {"text": reasoning["text"], "seconds": reasoning["seconds"]}
        if reasoning.get("cut") is True:
            data["reasoning"]["cut"] = True
    usage = item.get("usage")  # agents_app.worker.runner.USAGE_KEY: the call that produced it
    if isinstance(usage, Mapping) and data["role"] == "assistant":
        data["usage"] = {
            **AgentUsage().as_dict(),
            **{key: value for key, value in usage.items() if key in _USAGE_FIELDS},
        }
    cut = item.get("cut")
    if isinstance(cut, Mapping) and isinstance(cut.get("text_length"), int):
        data["text_length"] = cut["text_length"]
    parts = getattr(message, "text_parts", None)
    if parts is not None and isinstance(getattr(parts, "length", None), int):
        data["text_length"] = parts.length
    return data


def plain_data(value: Any) -> Any:
    """Turn dataclasses, enums, datetimes and containers into JSON-ready values."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: plain_data(getattr(value, field.name))
            for field in dataclasses.fields(value)
            if field.name != "framework_item"
        }
    if isinstance(value, Mapping):
        return {str(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain_data(item) for item in value]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


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
            _connection().flow_service,
            session_id,
            page_timeout=float(dexagents_setting("ENGINE_TIMEOUT")),
            event_types=_HISTORY_PAYLOADS,
            max_events=_HISTORY_MAX_EVENTS,
        )
    except Exception as error:
        raise _translate(error, session_id) from error


@dataclasses.dataclass(frozen=True)
class SessionEventMessage:
    """One message of a session's AgentEvents Stream, shaped for the websocket relay.

    Attributes:
        token: The message's opaque Dex resume token (``read_stream`` continues after it).
        event: ``{"type", "turn_id", "step_execution_id", "attempt", "data", "created_at"}``:
            the ``dex_agents.AgentEvent`` fields, its payload as ``data``, and the Stream
            message's creation time as ISO 8601 UTC (``...Z``).
    """

    token: str
    event: dict[str, Any]

    @functools.cached_property
    def frame(self) -> str:
        """The message's ``{"type": "event", "token", "event"}`` JSON text frame (compact,
        ASCII), built once: every reader of the session in the process shares the message."""
        return json.dumps(
            {"type": "event", "token": self.token, "event": self.event},
            separators=(",", ":"),
        )


class EventsTokenInvalidError(Exception):
    """Dex refused a resume token: malformed, or minted for another Stream or session."""


# Newest-first page sizes used to look for a token: the first page is small because a relay
# that keeps up finds its own position among the newest few messages; later pages are large
# to bound the number of calls (the embedded engine caps pages at 1000).
_EVENTS_FIRST_PAGE = 20
_EVENTS_PAGE = 1000


def _event_message(message: Any) -> SessionEventMessage:
    """Shape an SDK ``StreamMessage[AgentEvent]`` (see ``SessionEventMessage``)."""
    value = message.value
    created = message.created_time.astimezone(datetime.UTC)
    return SessionEventMessage(
        token=message.resume_token,
        event={
            "type": plain_data(value.type),
            "turn_id": value.turn_id,
            "step_execution_id": value.step_execution_id,
            "attempt": value.attempt,
            "data": plain_data(value.payload),
            "created_at": created.isoformat().replace("+00:00", "Z"),
        },
    )


def _is_invalid_argument(error: BaseException) -> bool:
    from dex import DexServiceError

    return isinstance(error, DexServiceError) and error.code == grpc.StatusCode.INVALID_ARGUMENT


async def session_events_read(
    *, session_id: str, after: str, wait_seconds: float
) -> SessionEventMessage | None:
    """Long-poll the next AgentEvents Stream message after ``after`` (Dex ``ReadStream``).

    Args:
        session_id: The session (Flow ID); Dex Streams need no running Flow.
        after: A resume token, or ``""`` for the oldest retained message. Dex resumes a
            token whose message was trimmed at the next newer message without saying so
            (reference/dex-engine-spec.md 3.3); ``session_events_after_retained`` detects it.
        wait_seconds: How long the engine may hold the call open waiting for a write.

    Returns:
        The message, or None when nothing was written within ``wait_seconds``.

    Raises:
        EventsTokenInvalidError: ``after`` is malformed or belongs to another Stream.
        EngineUnavailableError: Dex did not answer (also when it stays silent for
            ``wait_seconds`` plus ``DEXAGENTS["ENGINE_TIMEOUT"]``: a lost connection).
    """
    from dex import LongPollTimeoutError

    connection = _connection()
    limit = wait_seconds + float(dexagents_setting("ENGINE_TIMEOUT"))
    try:
        async with asyncio.timeout(limit):
            message = await connection.client.read_stream(
                session_id,
                connection.flow.agent_events,
                after,
                datetime.timedelta(seconds=wait_seconds),
            )
    except LongPollTimeoutError:
        return None
    except Exception as error:
        if _is_invalid_argument(error):
            raise EventsTokenInvalidError(str(error)) from error
        raise _translate(error, session_id) from error
    return _event_message(message)


async def session_events_tail_token(*, session_id: str) -> str:
    """Return the newest retained AgentEvents token of the session, ``""`` when none is.

    The session snapshot's ``events_after``: read before the snapshot, so a client that
    relays from it after loading the snapshot misses no event (it may see some twice).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    connection = _connection()
    try:
        page = await connection.client.list_stream_messages(
            session_id, connection.flow.agent_events, 1
        )
    except Exception as error:
        raise _translate(error, session_id) from error
    return page.messages[0].resume_token if page.messages else ""


async def _events_newest_first(session_id: str, first_page: int = _EVENTS_FIRST_PAGE
                               ) -> AsyncIterator[Any]:
    """Yield the session's retained AgentEvents Stream messages, newest first (SDK
    ``StreamMessage`` values), paging ``ListStreamMessages`` as the caller reads on:
    ``first_page`` messages first (at most ``_EVENTS_PAGE``), then ``_EVENTS_PAGE`` at a time.

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    from dex import DexServiceError

    connection = _connection()
    page_token = ""
    page_size = max(1, min(first_page, _EVENTS_PAGE))
    shrunk = False
    while True:
        try:
            page = await connection.client.list_stream_messages(
                session_id, connection.flow.agent_events, page_size, page_token
            )
        except DexServiceError as error:
            # A page of large messages (up to 1 MiB each) can pass gRPC's 4 MiB limit;
            # smaller pages of the same position always fit (one message does).
            if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and page_size > 1:
                page_size = max(1, page_size // 4)
                shrunk = True
                continue
            raise _translate(error, session_id) from error
        except Exception as error:
            raise _translate(error, session_id) from error
        for message in page.messages:
            yield message
        if not page.next_page_token:
            return
        page_token = page.next_page_token
        if not shrunk:
            page_size = _EVENTS_PAGE


async def session_events_after_retained(*, session_id: str, after: str, newer: int = 0) -> bool:
    """Whether the Stream still holds the message whose token is ``after``.

    Pages ``ListStreamMessages`` newest-first until the token appears, so the cost grows
    with the number of messages newer than ``after``; ``newer``, the caller's count of
    messages it knows are newer, sizes the first page to reach it in one call (each message
    listed is decoded, so a first page of the same 1,000 messages for every check cost a
    feed more than its reads did). Tokens are compared as opaque strings,
    never decoded (a real Dex server mints them). Since Dex trims oldest-first, a retained
    ``after`` means every newer message is retained too: reading on from it loses nothing.

    Returns:
        True when found; False when it was trimmed, or never was a token of this Stream
        (``after`` itself is not sent to Dex, so a malformed one is simply not found).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    async for message in _events_newest_first(session_id, newer + _EVENTS_FIRST_PAGE):
        if message.resume_token == after:
            return True
    return False


async def session_events_turn_start_token(*, session_id: str, turn_id: str) -> str | None:
    """Where a live view of the running turn ``turn_id`` starts: the token of the message just
    before the turn's ``turn_started`` event, or before the ``message_queued`` of a message the
    turn took (its ``client_ids``) when the web wrote that announcement first.

    A page that opens while a turn runs relays from here, so the text the turn already
    streamed (which no stored message holds yet) shows too, and the Activity row of the
    message that started the turn comes before the turn's start, as on a page open since.
    The web announces a message after the engine took it, so its ``message_queued`` lands on
    either side of the worker's ``turn_started``; only web announcements (no turn) between the
    two are passed over, at most ``_TURN_START_LOOKBACK`` of them, so an earlier turn's events
    are never replayed.

    Returns:
        The token; ``""`` when the relay starts at the oldest retained message; ``None`` when
        ``turn_started`` is not retained (trimmed, or not written yet).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    found = False
    wanted: set[str] = set()
    older: list[Any] = []  # web announcements older than turn_started, newest first
    exhausted = True
    async for message in _events_newest_first(session_id):
        value = message.value
        if not found:
            if value.turn_id == turn_id and plain_data(value.type) == "turn_started":
                found = True
                client_ids = (value.payload or {}).get("client_ids") or []
                wanted = {str(item) for item in client_ids if item}
            continue
        older.append(message)
        if value.turn_id or not wanted or len(older) > _TURN_START_LOOKBACK:
            exhausted = False
            break
    if not found:
        return None
    taken = [
        index
        for index, message in enumerate(older)
        if not message.value.turn_id
        and plain_data(message.value.type) == "message_queued"
        and (message.value.payload or {}).get("message_id") in wanted
    ]
    start = taken[-1] + 1 if taken else 0
    if start < len(older):
        return str(older[start].resume_token)
    return "" if exhausted else str(older[-1].resume_token)


#: How many web announcements (queue changes, other queued messages) before a turn's
#: ``turn_started`` ``session_events_turn_start_token`` passes over to find the turn's message.
_TURN_START_LOOKBACK = 20


async def engine_connection_open() -> None:
    """Create the running loop's engine connection now, without an RPC: the Dex client,
    its Flow registry and the gRPC channels (``agents_app.live.lifespan`` does it at start-up, so
    the first request does not)."""
    _connection()


async def engine_connections_close() -> None:
    """Close the running loop's engine connections (a Dex worker's, at its stop), so no gRPC
    channel outlives the loop it is bound to; the next call opens a new one."""
    for connection in list(_connections.pop(asyncio.get_running_loop(), {}).values()):
        with contextlib.suppress(Exception):
            await connection.close()


async def engine_health_check() -> bool:
    """Return True when the engine answers FlowService.HealthCheck; never raises."""
    try:
        return bool(await _connection().client.health_check())
    except Exception as error:
        logger.info("Dex engine health check failed: %s", error)
        return False


class _GatewayLoop:
    """A private event loop thread per process for sync callers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            # A forked child inherits the loop object but not its thread.
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                thread = threading.Thread(target=loop.run_forever, name="dex-gateway", daemon=True)
                thread.start()
                self._loop = loop
                self._pid = os.getpid()
                atexit.register(_close_gateway_loop, loop, thread, self._pid)
            return self._loop


def _close_gateway_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread,
                        pid: int) -> None:
    """At interpreter exit: close the gateway loop's engine connections, then stop the loop.

    gRPC channels left open on this loop, whose daemon thread is frozen at exit, made the
    process hang in its final garbage collection: ``manage.py dexworker`` printed "dexworker
    stopped" after SIGTERM and then never exited (the e2e tests SIGKILLed it after 15 s; a
    service manager would wait for its own stop timeout). Each wait is bounded (5 s).
    """
    if pid != os.getpid() or loop.is_closed() or not thread.is_alive():
        return

    async def close_connections() -> None:
        for connection in list(_connections.get(loop, {}).values()):
            with contextlib.suppress(Exception):
                await connection.close()

    with contextlib.suppress(Exception):
        asyncio.run_coroutine_threadsafe(close_connections(), loop).result(timeout=5)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=5)


_gateway_loop = _GatewayLoop()


def _timed_out(limit: float) -> EngineUnavailableError:
    address = dexagents_setting("DEX_SERVER_ADDRESS")
    return EngineUnavailableError(
        f"The Dex engine at {address} or its workers did not answer within {limit:g} seconds.",
        cause="timeout",
    )


async def call(coroutine: Coroutine[Any, Any, T]) -> T:
    """Await a coroutine of this module from async code (async views) without blocking a
    thread, on the process's gateway loop.

    The coroutine runs where ``run`` runs it, so async views and sync callers share the
    process's one AsyncClient and gRPC channel whatever loop the caller is on (the ASGI
    server's, or a short-lived one of ``async_to_sync`` under Django's test client, which
    would otherwise open a channel per request). Cancelling the caller (a client that went
    away) cancels the call on the gateway loop.

    Args:
        coroutine: e.g. ``session_snapshot(session_id=...)``.

    Raises:
        EngineUnavailableError: The engine did not answer within
            ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds (as ``run``).
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT"))
    # Loaded with the ASGI application in a web process; elsewhere (tests) once, here.
    import agents_app.worker.flow  # noqa: F401

    loop = _gateway_loop.get()
    awaitable: Any = coroutine
    if asyncio.get_running_loop() is not loop:
        awaitable = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coroutine, loop))
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return cast(T, await awaitable)
    except TimeoutError:
        # Only the deadline's own expiry means "no answer"; a TimeoutError the coroutine
        # raised passes through as it is.
        if deadline.expired():
            raise _timed_out(limit) from None
        raise


async def call_here(coroutine: Coroutine[Any, Any, T]) -> T:
    """``call``, but on the caller's own event loop and its own connection (``_connection``):
    no hop to the gateway loop's thread and back. Only for a long-lived loop, such as the
    ASGI server's (``agents_app.api.snapshot_asgi``); a short-lived loop would open a gRPC
    channel each time.

    Raises:
        EngineUnavailableError: The engine did not answer within
            ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds.
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT"))
    deadline = asyncio.timeout(limit)
    try:
        async with deadline:
            return await coroutine
    except TimeoutError:
        if deadline.expired():
            raise _timed_out(limit) from None
        raise


def run(coroutine: Coroutine[Any, Any, T], *, timeout: float | None = None) -> T:
    """Run a coroutine of this module from sync code and return its result.

    Args:
        coroutine: e.g. ``session_snapshot(session_id=...)``.
        timeout: Seconds; defaults to ``DEXAGENTS["ENGINE_TIMEOUT"]``.

    Raises:
        EngineUnavailableError: The engine did not answer within ``timeout``; the
            coroutine is cancelled.
        Whatever the coroutine raises.
    """
    limit = float(dexagents_setting("ENGINE_TIMEOUT")) if timeout is None else timeout
    # The first import of the Flow (LiteLLM, the MCP SDK) takes seconds; do it here, outside
    # the engine deadline and off the gateway loop.
    import agents_app.worker.flow  # noqa: F401

    future = asyncio.run_coroutine_threadsafe(coroutine, _gateway_loop.get())
    try:
        return future.result(timeout=limit)
    except TimeoutError:
        future.cancel()
        raise _timed_out(limit) from None
