"""The RPCs that hand a running session what people send it.

Owns: user messages and edits of the queue (``session_send_message``,
``session_delete_queued_message``, ``session_replace_queued_message``,
``session_steer_queued_message``), approval decisions (``session_resolve_interrupt``), answers to
the agent's and MCP servers' questions (``session_answer_user_input``,
``session_answer_elicitation``), plan execution and turn cancels. The services and the outbox
call them through ``dex_gateway.run`` (sync) or ``dex_gateway.call`` (async views). Each
forgets the session's cached snapshot before and after it (``snapshot_cache.writes_session``),
and the queue's changes are announced on the session's AgentEvents Stream.

May import: ``engine_connection``, ``engine_errors``, ``event_stream`` and ``snapshot_cache``
of the gateway (never ``dex_gateway``), ``dex_agents`` and the Dex SDK.

Errors raised by every function here, besides those each names:
    EngineUnavailableError: The engine did not answer (``WorkerUnavailableError``: no worker
        took the RPC; cause ``busy``: a Step held the session's state locked for the client's
        retry window).
    SessionNotFoundError: Dex has no such session (Flow).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Coroutine
from typing import Any

from agents_app.gateway import snapshot_cache
from agents_app.gateway.engine_connection import connection
from agents_app.gateway.engine_errors import EngineUnavailableError, translate
from agents_app.gateway.event_stream import session_event_announce
from dex_agents import PlanExecutionResult, TurnCancelResult


@snapshot_cache.writes_session
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
            await connection().sessions.send_user_message(
                session_id, text, plan_mode=plan_mode, client_id=client_id,
                created_at=created_at,
            )
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "Another delivery of this message is under way; try again shortly."
        ) from error
    except Exception as error:
        raise translate(error, session_id) from error
    if accepted:
        # The message's ID lets a viewer place this event before the turn_started that took
        # it (whose client_ids name it), which the worker may have written first.
        await session_event_announce(
            session_id=session_id,
            event_type="message_queued",
            payload={"message_id": client_id} if client_id else None,
        )
    return accepted


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
        applied = bool(await call(connection().sessions))
    except ChannelMessageNotFoundError:
        return False
    except Exception as error:
        raise translate(error, session_id) from error
    if applied:
        await session_event_announce(
            session_id=session_id,
            event_type=QUEUE_CHANGED,
            payload={"change": change, "message_id": message_id},
        )
    return applied


@snapshot_cache.writes_session
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


@snapshot_cache.writes_session
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


@snapshot_cache.writes_session
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


@snapshot_cache.writes_session
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
        return await connection().sessions.cancel_turn(session_id, turn_id)
    except Exception as error:
        raise translate(error, session_id) from error


@snapshot_cache.writes_session
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
            await connection().sessions.resolve_interrupt(
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
        raise translate(error, session_id) from error


@snapshot_cache.writes_session
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
            await connection().sessions.answer_user_input(session_id, call_id, answer)
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "The session is busy with its question; try again shortly.", cause="busy"
        ) from error
    except Exception as error:
        raise translate(error, session_id) from error


@snapshot_cache.writes_session
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
        return await connection().sessions.answer_elicitation(
            session_id, elicitation_id, action, content
        )
    except RpcLockConflictError as error:
        raise EngineUnavailableError(
            "The session is busy with its questions; try again shortly.", cause="busy"
        ) from error
    except Exception as error:
        raise translate(error, session_id) from error


@snapshot_cache.writes_session
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
        return await connection().sessions.execute_plan(session_id, revision)
    except Exception as error:
        raise translate(error, session_id) from error

