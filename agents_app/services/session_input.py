"""Writes of what a session's owner sends into it while it lives.

Owns user messages (``session_message_send``: kept in the outbox, then delivered, answered as
``MessageAccepted``), the queue's edits (delete, replace, steer), the answers to the model's
and MCP servers' questions (``user_input_answer``, ``elicitation_answer``), plan execution
(``plan_execute``) and turn cancels (``session_turn_cancel``, kept when no worker answers).

May import: the sessions index and outbox, the Dex gateway, worker titles, usage budgets and
the foundation (tests/test_layering.py).
"""


import dataclasses
import logging
import uuid
from typing import Any

from django.db import transaction

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway, event_stream, input_rpcs
from agents_app.models import (
    AgentSession,
    Delivery,
    OutboxMessage,
    OutboxTurnCancel,
    TitleSource,
)
from agents_app.usage.budgets import budget_refusal
from agents_app.worker.titles import title_from_message
from dex_agents import (
    ElicitationAnswerResult,
    PlanExecutionResult,
    TurnCancelResult,
)

logger = logging.getLogger(__name__)


# How long AgentSessionClient.resolve_interrupt retries a held PendingInterrupts lock
# (seed "RPCs": 5 seconds); the answer RPCs retry their locks alike, so their deadlines add it.
RESOLVE_LOCK_RETRY_SECONDS = 5.0


def _title_from_first_message(*, session: AgentSession, text: str) -> None:
    """A session named after its agent (started without a message) takes the title of its
    first message that has one (``titles.title_from_message``)."""
    if session.title_source != TitleSource.AGENT:
        return
    title = title_from_message(text)
    if title and AgentSession.objects.filter(
        pk=session.pk, title_source=TitleSource.AGENT
    ).update(title=title, title_source=TitleSource.MESSAGE):
        session.title, session.title_source = title, TitleSource.MESSAGE


@dataclasses.dataclass(frozen=True)
class MessageAccepted:
    """A user message the API accepted (``session_message_send``, ``queued_message_replace``).

    Attributes:
        id: The ID the queue endpoints take: the Dex Channel message ID while it waits in
            the session's queue, else its outbox ID (which is also its ``client_id``).
        delivery: ``delivered`` (the session has it) or ``pending`` (kept in the outbox until
            the engine and a worker answer).
        pending_reason: Why it is pending: ``unavailable`` (the engine or every worker did
            not answer) or ``active_session_limit`` (its owner already runs
            ``DEXAGENTS["MAX_ACTIVE_SESSIONS_PER_USER"]`` turns; it goes when one ends) or
            ``budget`` (a budget of its owner or agent is spent); ``""`` when delivered.
        pending_detail: The reason in words for people (a budget's refusal names the budget
            and when it resets); ``""`` when delivered.
    """

    id: str
    delivery: str
    pending_reason: str = ""
    pending_detail: str = ""


#: ``MessageAccepted.pending_reason`` values.
PENDING_UNAVAILABLE = "unavailable"
PENDING_ACTIVE_LIMIT = "active_session_limit"
PENDING_BUDGET = "budget"


class QueueFullError(Exception):
    """The session's queue holds ``DEXAGENTS["MAX_QUEUED_MESSAGES"]`` messages (those
    waiting in the outbox included); nothing was kept."""


def session_message_send(
    *, session: AgentSession, text: str, plan_mode: bool = False, message_id: str | None = None
) -> MessageAccepted:
    """Accept a user message for ``session``: keep it in the outbox, then deliver it.

    The message is written as an ``OutboxMessage`` (its ID, a uuid4 hex, is also its Dex
    ``client_id``), then the session's pending messages are delivered oldest first, so it
    never overtakes one sent earlier. When the engine or every worker does not answer, it
    stays pending and a Celery task delivers it (ARCHITECTURE.md "Accepted means kept").

    ``message_id`` (32 hex) makes a send that may be repeated idempotent (a schedule's run):
    a repeat finds the outbox row of that ID and delivers it if it is still pending, never a
    second message; Dex takes a ``client_id`` once.

    Returns:
        ``MessageAccepted``; its id is the outbox row's ID, which is also the message's Dex
        ``client_id`` and the ``id`` the queue lists it under, before and after delivery.

    Raises:
        QueueFullError: The session's queue is full; nothing was kept.
        dex_gateway.SessionNotFoundError: Dex no longer has the session; nothing was kept.
    """
    from agents_app import task_queue
    from agents_app.sessions import outbox

    limit = int(dexagents_setting("MAX_QUEUED_MESSAGES"))
    repeated = (
        OutboxMessage.objects.filter(pk=message_id, session=session).first()
        if message_id is not None else None
    )
    if repeated is not None:
        message = repeated
    else:
        pending = OutboxMessage.objects.filter(session=session, delivery=Delivery.PENDING)
        if pending.count() >= limit:
            raise QueueFullError()
        message = OutboxMessage.objects.create(
            id=message_id or uuid.uuid4().hex, session=session, text=text, plan_mode=plan_mode
        )
        _title_from_first_message(session=session, text=text)
    reason = detail = ""
    try:
        outbox.outbox_session_deliver(session_id=session.id)
    except outbox.QueueFullDeferred:
        # As before the outbox: one more than a full queue is refused and nothing is kept.
        if outbox.outbox_message_withdraw(session=session, message_id=message.id) is not None:
            OutboxMessage.objects.filter(pk=message.pk).delete()
            raise QueueFullError() from None
    except outbox.DeliveryDeferred as error:
        logger.info("Message %s for %s kept in the outbox: %s", message.id, session.id, error)
        if isinstance(error, outbox.BudgetDeferred):
            reason, detail = PENDING_BUDGET, str(error)
        elif isinstance(error, outbox.ActiveLimitDeferred):
            reason = PENDING_ACTIVE_LIMIT
        else:
            reason = PENDING_UNAVAILABLE
    message.refresh_from_db()
    if message.delivery == Delivery.PENDING:
        task_queue.outbox_delivery_schedule(session_id=session.id)
        return MessageAccepted(
            id=message.id,
            delivery=Delivery.PENDING,
            pending_reason=reason or PENDING_UNAVAILABLE,
            pending_detail=detail,
        )
    if message.delivery == Delivery.REFUSED:
        OutboxMessage.objects.filter(pk=message.pk).delete()
        raise dex_gateway.SessionNotFoundError(session.id)
    return MessageAccepted(id=message.id, delivery=Delivery.DELIVERED)


def _outbox_change_announce(*, session: AgentSession, change: str, message_id: str) -> None:
    """Announce ``queue_changed`` for a message withdrawn from the outbox, as the Dex queue
    RPCs do (``input_rpcs.QUEUE_CHANGED``), so pages re-read the queue and a send-and-wait
    for it ends. Best effort: the engine may be the reason the message was still kept."""
    try:
        dex_gateway.run(
            event_stream.session_event_announce(
                session_id=session.id,
                event_type=input_rpcs.QUEUE_CHANGED,
                payload={"change": change, "message_id": message_id},
            )
        )
    except Exception:  # the withdrawal already happened; pages also refresh on their own
        logger.warning("Could not announce the withdrawal of %s from %s's outbox.",
                       message_id, session.id, exc_info=True)


def queued_message_delete(*, session: AgentSession, message_id: str) -> bool:
    """Delete the queued message ``message_id`` (Channel message ID or ``client_id``); a
    message still in the outbox is withdrawn there without asking Dex.

    Returns:
        False when it is no longer pending (a turn took it, it was deleted, or never queued).

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    from agents_app.sessions import outbox

    if outbox.outbox_message_withdraw(session=session, message_id=message_id) is not None:
        _outbox_change_announce(session=session, change="deleted", message_id=message_id)
        return True
    return dex_gateway.run(
        input_rpcs.session_delete_queued_message(session_id=session.id, message_id=message_id)
    )


def queued_message_replace(
    *, session: AgentSession, message_id: str, text: str, plan_mode: bool = False
) -> MessageAccepted | None:
    """Edit a queued message: remove ``message_id`` and queue ``text`` at the tail.

    A message still in the outbox is withdrawn there and the new text is accepted like a new
    message (``session_message_send``); otherwise one transactional Dex RPC replaces it and
    the new message gets a fresh ``client_id``.

    Returns:
        The new message (as ``session_message_send`` returns it); None when ``message_id``
        is no longer pending (nothing changed) or ``text`` is blank.

    Raises:
        QueueFullError: The message is still queued, but the new text would bring the
            queue's texts past their bytes (``dex_agents.QUEUED_MESSAGES_BYTES``).
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    from agents_app.sessions import outbox

    if outbox.outbox_message_withdraw(session=session, message_id=message_id) is not None:
        _outbox_change_announce(session=session, change="edited", message_id=message_id)
        return session_message_send(session=session, text=text, plan_mode=plan_mode)
    client_id = uuid.uuid4().hex
    replaced = dex_gateway.run(
        input_rpcs.session_replace_queued_message(
            session_id=session.id,
            message_id=message_id,
            text=text,
            plan_mode=plan_mode,
            client_id=client_id,
        )
    )
    if not replaced:
        # Refused: gone, or still queued but the new text does not fit the queue's bytes.
        if queued_message_plan_mode(session=session, message_id=message_id) is not None:
            raise QueueFullError()
        return None
    return MessageAccepted(
        id=client_id, delivery=Delivery.DELIVERED
    )


def queued_message_plan_mode(*, session: AgentSession, message_id: str) -> bool | None:
    """The ``plan_mode`` of the queued message ``message_id`` (Channel message ID or
    ``client_id``, or a message still in the outbox), or None when it is not queued.

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    kept = OutboxMessage.objects.filter(
        pk=message_id, session=session, delivery=Delivery.PENDING
    ).first()
    if kept is not None:
        return kept.plan_mode
    queue = dex_gateway.run(dex_gateway.session_message_queue(session_id=session.id))
    for entry in queue["queued"]:
        if message_id in (entry["id"], entry["client_id"]):
            return bool(entry["plan_mode"])
    return None


class MessageHeldError(Exception):
    """A message a spent budget holds cannot be steered: no turn may take it before the budget
    allows it. The text is the budget's refusal (``budgets.budget_refusal``)."""


def queued_message_steer(*, session: AgentSession, message_id: str) -> bool:
    """Steer the queued message ``message_id`` into the running turn, which applies it at its
    next safe boundary (``dex_agents`` Steer); a message still in the outbox is steered right
    after its delivery.

    Returns:
        False when it is no longer pending.

    Raises:
        MessageHeldError: It waits in the outbox and a budget of the owner or the agent is
            spent; nothing changed.
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    from agents_app.sessions import outbox

    if OutboxMessage.objects.filter(
        pk=message_id, session=session, delivery=Delivery.PENDING
    ).exists():
        refusal = budget_refusal(owner_id=session.owner_id, agent_id=session.agent_id)
        if refusal is not None:
            raise MessageHeldError(refusal)
    if outbox.outbox_message_mark_steer(session=session, message_id=message_id):
        return True
    return dex_gateway.run(
        input_rpcs.session_steer_queued_message(session_id=session.id, message_id=message_id)
    )


def user_input_answer(*, session: AgentSession, call_id: str, answer: str) -> bool:
    """Answer the question the session's model asked with ``request_user_input``.

    ``call_id`` is the question's tool call ID (the snapshot's ``pending_input.call_id``);
    the turn goes on with ``answer`` as a user message after the tool result.

    Returns:
        False when no question with ``call_id`` is open (answered already, withdrawn by a
        steered message, or never asked) or ``answer`` is blank.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer, or stayed busy deciding.
        dex_gateway.SessionNotFoundError: Dex has no such session.
    """
    # answer_user_input retries a held PendingUserInput lock for a while; leave room for it.
    return dex_gateway.run(
        input_rpcs.session_answer_user_input(
            session_id=session.id, call_id=call_id, answer=answer
        ),
        timeout=float(dexagents_setting("ENGINE_TIMEOUT")) + RESOLVE_LOCK_RETRY_SECONDS,
    )


def elicitation_answer(
    *,
    session: AgentSession,
    elicitation_id: str,
    action: str,
    content: dict[str, Any] | None,
) -> ElicitationAnswerResult:
    """Answer a question an MCP server asks during one of the session's tool calls (the
    snapshot's ``pending_elicitations``): ``accept`` (with the form's ``content``),
    ``decline`` or ``cancel``; the waiting call goes on with it.

    The session's Flow checks the content against the server's schema, so a refusal and its
    messages come from the same commit that would have stored the answer.

    Returns:
        ``accepted``, or ``reason``: ``not_pending`` (answered, expired or withdrawn
        already, or never asked), ``expired`` (its deadline passed just now), ``invalid``
        (``errors`` per field name, ``""`` for the content as a whole), ``bad_action``.

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    # answer_elicitation retries a held ELICITATIONS lock for a while; leave room for it.
    result: ElicitationAnswerResult = dex_gateway.run(
        input_rpcs.session_answer_elicitation(
            session_id=session.id, elicitation_id=elicitation_id, action=action, content=content
        ),
        timeout=float(dexagents_setting("ENGINE_TIMEOUT")) + RESOLVE_LOCK_RETRY_SECONDS,
    )
    return result


def plan_execute(*, session: AgentSession, revision: int) -> PlanExecutionResult:
    """Start executing (or continue) the session's plan at ``revision`` (the one the user
    reviewed).

    Returns:
        ``accepted``, or ``reason``: ``stale_revision`` (not the current plan),
        ``not_executable`` (completed, or no tasks), ``busy`` (a turn runs or waits for an
        answer), ``queued`` (messages wait in the queue), ``already_requested``,
        ``no_session``, ``no_plans`` (see ``dex_agents.AgentSessionFlow.execute_plan``).

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    return dex_gateway.run(
        input_rpcs.session_execute_plan(session_id=session.id, revision=revision)
    )


#: Index statuses of a session with a turn a cancel can end.
TURN_STATUSES = frozenset({"running_model", "running_tools", "waiting_for_user_input"})


@dataclasses.dataclass(frozen=True)
class TurnCancelAnswer:
    """What ``session_turn_cancel`` did.

    Attributes:
        accepted: Dex took the cancel, or it is kept to be delivered.
        turn_id: The turn Dex cancels; when kept, the one asked for (``None``: whichever runs);
            refused with ``turn_ended``: the turn that runs instead.
        reason: Why it was refused: ``no_turn`` or ``turn_ended``.
        delivery: ``delivered``, ``pending`` (kept: no worker answered) or ``""`` (refused).
    """

    accepted: bool
    turn_id: str | None = None
    reason: str = ""
    delivery: str = ""


def session_turn_cancel(*, session: AgentSession, turn_id: str = "") -> TurnCancelAnswer:
    """Cancel the session's running turn (``dex_agents`` ``cancel_turn``), only if it is
    ``turn_id`` when one is given; the session goes on and the queue is not touched. The
    worker reports the turn's end (``turn_cancelled``, the index status back to
    ``waiting_for_user_message``) moments later.

    When the engine or every worker does not answer while the index shows a turn running,
    the cancel is kept (``OutboxTurnCancel``) and a Celery task delivers it once one does
    (ARCHITECTURE.md "Accepted means kept"); the Flow then applies it as it would have.

    Returns:
        The answer; refused with ``no_turn`` (no turn runs) or ``turn_ended`` (another turn
        than ``turn_id`` runs).

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer and the index shows no turn
            running (nothing to keep a cancel for, but Dex could not say so).
        dex_gateway.SessionNotFoundError: Dex has no such session.
    """
    from agents_app import task_queue

    try:
        result: TurnCancelResult = dex_gateway.run(
            input_rpcs.session_cancel_turn(session_id=session.id, turn_id=turn_id)
        )
    except dex_gateway.EngineUnavailableError as error:
        session.refresh_from_db(fields=["status"])
        if session.status not in TURN_STATUSES:
            raise
        with transaction.atomic():
            kept = OutboxTurnCancel.objects.create(
                session=session, turn_id=turn_id, last_error=str(error)[:500]
            )
            task_queue.outbox_delivery_schedule(cancel_id=kept.pk)
        return TurnCancelAnswer(True, turn_id=turn_id or None, delivery=Delivery.PENDING)
    if not result.accepted:
        return TurnCancelAnswer(False, turn_id=result.turn_id, reason=result.reason)
    return TurnCancelAnswer(True, turn_id=result.turn_id, delivery=Delivery.DELIVERED)
