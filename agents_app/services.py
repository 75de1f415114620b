"""Writes of agents and sessions (HackSoft "services")."""

import contextlib
import dataclasses
import datetime
import json
import logging
import uuid
from collections.abc import Collection
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, models, transaction
from django.utils import timezone
from knox.models import get_digest_token
from knox.settings import CONSTANTS as KNOX_CONSTANTS

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STARTING,
    SESSION_STATUS_STOPPED,
    AgentDefinition,
    AgentSession,
    ApiToken,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
    OutboxMessage,
    OutboxTurnCancel,
    TitleSource,
)
from agents_app.sessions import approval_index, session_index
from agents_app.usage.budgets import budget_refusal
from agents_app.worker.titles import fallback_title, title_from_message, title_without_controls
from dex_agents import (
    AgentStatus,
    ElicitationAnswerResult,
    PlanExecutionResult,
    TurnCancelResult,
)

_AGENT_STATUSES = frozenset(status.value for status in AgentStatus)

logger = logging.getLogger(__name__)

SESSION_ID_PREFIX = "ses_"
# Undoing a failed create must not keep the request waiting for long.
STOP_TIMEOUT_SECONDS = 2.0


def session_id_new() -> str:
    """A fresh session ID, which is also the Dex Flow ID: ``ses_<uuid4 hex>``."""
    return f"{SESSION_ID_PREFIX}{uuid.uuid4().hex}"


def session_create(
    *,
    owner: AbstractBaseUser | AnonymousUser,
    agent: AgentDefinition,
    message: str = "",
    plan_mode: bool = False,
    tool_names: Collection[str] | None = None,
) -> AgentSession:
    """Start a Dex AgentSession for ``owner`` with ``agent`` and index it.

    The index row is written first (status ``starting``), so the worker's index updates for
    the new session always find it; then the Flow starts with the agent's ``agent_config``
    snapshot. If Dex does not accept the start, the row is deleted again and a Flow that Dex
    may have accepted just before the deadline is stopped, so no half-created session
    remains on either side.

    Args:
        message: Optional first user message; non-blank starts the first turn at once.
        plan_mode: ``message`` asks for a plan before the agent acts (a ``planning`` turn).
        tool_names: Exposed tool names this session may use, a subset of the agent's (callers
            validate it); ``None`` means every tool of the agent.

    When ``message`` is given and the owner already runs
    ``DEXAGENTS["MAX_ACTIVE_SESSIONS_PER_USER"]`` turns, the session starts without it and the
    message waits in its outbox until one of those turns ends; the returned session then has
    ``first_message`` (a ``MessageAccepted`` with ``pending_reason`` ``active_session_limit``).
    Likewise when a budget of the owner or the agent is spent (``budgets.budget_refusal``):
    the message waits in the outbox, held like any message past a budget, and goes when the
    budget allows it (``pending_reason`` ``budget``, ``pending_detail`` the refusal). A first
    turn started past a budget would fail at its first model call and lose the message.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer; nothing was created.
    """
    from agents_app.sessions import outbox

    owner_pk = owner.pk
    if owner_pk is None:
        raise ValueError("Sessions belong to a saved user.")
    session_id = session_id_new()
    config = agent.agent_config(tool_names=tool_names)
    # Whom the session's MCP requests are made for (a server's "user" isolation).
    config["owner_id"] = str(owner_pk)
    title = title_from_message(message)
    fallback = agent.name
    if message.strip() and not title:
        # Every line a demo directive: "Demo agent" alone would name them all alike.
        fallback = fallback_title(agent_name=agent.name, started_at=timezone.now())
    limit = int(dexagents_setting("MAX_ACTIVE_SESSIONS_PER_USER"))
    capped = bool(message.strip()) and limit > 0
    refusal = (
        budget_refusal(owner_id=owner_pk, agent_id=agent.pk) if message.strip() else None
    )
    with transaction.atomic():
        # The count and the new "starting" row in one transaction under the owner's lock:
        # concurrent creates of one owner cannot both take the last free slot.
        if capped and refusal is None:
            outbox.owner_turn_lock(owner_id=owner_pk)
        held = refusal is not None or (
            capped and outbox.active_sessions_count(owner_id=owner_pk) >= limit
        )
        # "starting" while a first turn is coming; without one the session waits for a
        # message from the start (the cap on running turns counts "starting" as running).
        turn_coming = bool(message.strip()) and not held
        session = AgentSession.objects.create(
            id=session_id,
            owner_id=owner_pk,
            agent=agent,
            title=title or fallback,
            title_source=TitleSource.MESSAGE if title else TitleSource.AGENT,
            status=(
                SESSION_STATUS_STARTING
                if turn_coming
                else AgentStatus.WAITING_FOR_USER_MESSAGE.value
            ),
        )
    try:
        dex_gateway.run(
            dex_gateway.session_start(
                session_id=session_id,
                message="" if held else message,
                agent_config=config,
                plan_mode=plan_mode,
            )
        )
    except BaseException as error:
        if isinstance(error, dex_gateway.EngineUnavailableError):
            # The start may have reached Dex before the deadline; do not leave it orphaned.
            _session_stop_quietly(session_id=session_id, reason="start was not confirmed")
        AgentSession.objects.filter(pk=session_id).delete()
        raise
    if held:
        # Past a budget or over the owner's running-turn cap: the session starts idle and its
        # first message waits in the outbox like any held message (delivered when the budget
        # allows it, or when one of their turns ends).
        from agents_app import task_queue

        first = OutboxMessage.objects.create(
            id=uuid.uuid4().hex, session=session, text=message, plan_mode=plan_mode,
            last_error=refusal or outbox.active_limit_reason(),
        )
        task_queue.outbox_delivery_schedule(session_id=session.id)
        session.first_message = MessageAccepted(  # type: ignore[attr-defined]
            id=first.id,
            delivery=Delivery.PENDING,
            pending_reason=PENDING_BUDGET if refusal else PENDING_ACTIVE_LIMIT,
            pending_detail=refusal or "",
        )
    return session


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


def session_title_generate(*, session_id: str) -> str | None:
    """Write the generated title of a session whose first turn ended (``titles.title_write``,
    one call to its agent's model) and index it; the session must be ``title_source``
    ``pending`` (``session_index.titles_schedule`` marks it so).

    Returns:
        The new title, or ``None`` when nothing changed: the session is gone or not pending,
        titles are off, it has no answer yet, or the model wrote none (the first-message
        title stays; a failure is logged, never raised, and the next ended turn tries again).
    """
    from agents_app.worker.titles import title_write

    session = AgentSession.objects.select_related("agent").filter(pk=session_id).first()
    if session is None or session.title_source != TitleSource.PENDING:
        return None
    try:
        if not (dexagents_setting("GENERATE_TITLES") and session.agent.generate_titles):
            raise LookupError("titles are off")
        messages = dex_gateway.run(
            dex_gateway.session_messages(session_id=session_id, after_sequence=0, limit=20)
        )
        user_text = next((m["text"] for m in messages if m["role"] == "user"), "")
        answer = next((m["text"] for m in messages if m["role"] == "assistant" and m["text"]), "")
        if not answer:
            raise LookupError("no answer yet")
        title = dex_gateway.run(
            title_write(
                agent_config=session.agent.agent_config(),
                user_text=title_from_message(user_text) or user_text,
                answer_text=answer,
            ),
            timeout=60,
        )
    except LookupError:
        title = ""
    except Exception as error:
        logger.warning("No generated title for session %s: %s", session_id, error)
        title = ""
    if not title:
        AgentSession.objects.filter(pk=session_id, title_source=TitleSource.PENDING).update(
            title_source=TitleSource.MESSAGE
        )
        return None
    updated = AgentSession.objects.filter(
        pk=session_id, title_source=TitleSource.PENDING
    ).update(title=title, title_source=TitleSource.GENERATED)
    return title if updated else None


def _session_stop_quietly(*, session_id: str, reason: str) -> None:
    """Stop a Flow best-effort while undoing a failed create; log and swallow errors."""
    try:
        dex_gateway.run(
            dex_gateway.session_stop(session_id=session_id, reason=reason),
            timeout=STOP_TIMEOUT_SECONDS,
        )
    except Exception as error:
        logger.warning("Could not stop orphaned session %s: %s", session_id, error)


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
    *, session: AgentSession, text: str, plan_mode: bool = False
) -> MessageAccepted:
    """Accept a user message for ``session``: keep it in the outbox, then deliver it.

    The message is written as an ``OutboxMessage`` (its ID, a uuid4 hex, is also its Dex
    ``client_id``), then the session's pending messages are delivered oldest first, so it
    never overtakes one sent earlier. When the engine or every worker does not answer, it
    stays pending and a Celery task delivers it (ARCHITECTURE.md "Accepted means kept").

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
    if OutboxMessage.objects.filter(session=session, delivery=Delivery.PENDING).count() >= limit:
        raise QueueFullError()
    message = OutboxMessage.objects.create(
        id=uuid.uuid4().hex, session=session, text=text, plan_mode=plan_mode
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
    RPCs do (``dex_gateway.QUEUE_CHANGED``), so pages re-read the queue and a send-and-wait
    for it ends. Best effort: the engine may be the reason the message was still kept."""
    try:
        dex_gateway.run(
            dex_gateway.session_event_announce(
                session_id=session.id,
                event_type=dex_gateway.QUEUE_CHANGED,
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
        dex_gateway.session_delete_queued_message(session_id=session.id, message_id=message_id)
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
        dex_gateway.session_replace_queued_message(
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
        dex_gateway.session_steer_queued_message(session_id=session.id, message_id=message_id)
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
        dex_gateway.session_answer_user_input(
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
        dex_gateway.session_answer_elicitation(
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
        dex_gateway.session_execute_plan(session_id=session.id, revision=revision)
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
            dex_gateway.session_cancel_turn(session_id=session.id, turn_id=turn_id)
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


def session_status_record(
    *, session: AgentSession, status: str, observed_at: datetime.datetime
) -> None:
    """Store a status read from Dex at ``observed_at`` on the index row.

    ``stopped`` is final: a stopped session's retained snapshot still reports its last
    AgentState status, which must not reopen the row. A status observed before the stored
    one (the worker reported a newer one meanwhile) is ignored, and so is ``starting`` (the
    snapshot of a session whose first Step has not committed yet).
    """
    if not session_status_record_needed(indexed=session.status, status=status):
        return
    session_index.session_status_apply(
        session_id=session.pk, status=status, observed_at=observed_at
    )
    session.refresh_from_db(fields=["status", "status_observed_at"])


def session_status_record_needed(*, indexed: str, status: str) -> bool:
    """Whether ``session_status_record`` would write ``status`` (read from Dex) over the
    index row's status ``indexed``: not over a stopped row, not the status it already holds,
    not a status that is not an AgentState status (``starting``)."""
    return indexed not in (SESSION_STATUS_STOPPED, status) and status in _AGENT_STATUSES




def session_stop(*, session: AgentSession) -> None:
    """Stop the session's Dex Flow and mark its index row ``stopped``.

    Dex keeps serving the snapshot of the stopped session (seed "RPCs": retained closed
    sessions). A Flow Dex no longer has counts as stopped.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer; the row is left as it was.
    """
    dex_gateway.run(dex_gateway.session_stop(session_id=session.id, reason="stopped by user"))
    if session_index.session_stopped_index(session=session):
        approval_index.approvals_changed_notify()


def session_stopped_detect(*, session: AgentSession, flow_running: bool | None = None) -> bool:
    """Make stop final when it happened behind the index's back: mark ``session`` stopped
    (withdrawing its pending approvals) when its Dex Flow no longer runs.

    A Flow stopped from outside the platform, or by a stop whose index write was lost (the web
    process died in between), leaves the index saying ``running_tools`` with an approval
    nobody can decide any more; every read of the session's detail and every write Dex
    refused checks here.

    ``flow_running`` is ``dex_gateway.session_flow_running``'s answer when the caller (an
    async view) already read it; None asks Dex here.

    Returns:
        True when the session is stopped (already indexed so, or now).

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    if session.status == SESSION_STATUS_STOPPED:
        return True
    if flow_running is None:
        flow_running = dex_gateway.run(dex_gateway.session_flow_running(session_id=session.id))
    if flow_running:
        return False
    if session_index.session_stopped_index(session=session):
        approval_index.approvals_changed_notify()
    return True


# How long AgentSessionClient.resolve_interrupt retries a held PendingInterrupts lock
# (seed "RPCs": 5 seconds).
RESOLVE_LOCK_RETRY_SECONDS = 5.0


class InterruptNotFoundError(Exception):
    """The session never had an interrupt with this ID (as far as its snapshot shows)."""


class SessionIsStoppedError(Exception):
    """The session is stopped (possibly found out only now): nothing can be decided in it."""


class InterruptNotPendingError(Exception):
    """The interrupt was already decided, or its deadline passed, so Dex refused it."""


_NOT_PENDING_BECAUSE = {
    ApprovalRequest.State.APPROVED: "This tool call was already approved.",
    ApprovalRequest.State.REJECTED: "This tool call was already rejected.",
    ApprovalRequest.State.EXPIRED: "This tool call expired: its approval deadline passed.",
    ApprovalRequest.State.WITHDRAWN: (
        "This tool call no longer waits for a decision: its turn ended or the session stopped."
    ),
}


def _pending_from_snapshot(*, session: AgentSession, interrupt_id: str) -> dict[str, Any]:
    """The pending interrupt ``interrupt_id`` as the session's snapshot lists it (for an
    interrupt the index does not hold yet).

    Raises:
        InterruptNotFoundError, InterruptNotPendingError: See ``interrupt_resolve``.
    """
    snapshot = dex_gateway.run(dex_gateway.session_snapshot(session_id=session.id))
    pending = next(
        (
            item
            for item in snapshot["pending_interrupts"]
            if item.get("interrupt_id") == interrupt_id
        ),
        None,
    )
    if pending is not None:
        return dict(pending)
    # Interrupt IDs are "<turn_id>.<tool_call_id>" (seed "Persistence").
    past = any(
        f"{call.get('turn_id')}.{call.get('tool_call_id')}" == interrupt_id
        for call in snapshot["tool_calls"]
    )
    if past:
        raise InterruptNotPendingError("This tool call no longer waits for a decision.")
    raise InterruptNotFoundError(interrupt_id)


class InterruptAlreadyDecidedError(InterruptNotPendingError):
    """Someone already decided this tool call; ``decision`` is the recorded decision.

    The message names the verdict, the decider and the time (UTC), e.g. ``"Already approved
    by alice at 2026-12-05 08:40:12 UTC."``: the reviewer who lost the race reads it.
    """

    def __init__(self, decision: ApprovalDecision) -> None:
        verdict = "approved" if decision.approved else "rejected"
        when = decision.decided_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        super().__init__(
            f"Already {verdict} by {decision.decided_by.get_username()} at {when}."
        )
        self.decision = decision


class ApprovalArgumentsInvalidError(Exception):
    """Edited arguments that the tool's JSON input schema refuses.

    ``messages`` lists one sentence per problem, each prefixed with the JSON path of the
    offending value (``"count: 'x' is not of type 'integer'"``); an empty path names the
    arguments object itself.
    """

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


# At most this many schema problems are reported for one edit; the rest add nothing a
# reviewer can act on before fixing the first ones.
ARGUMENT_PROBLEMS_MAX = 20


#: Keywords by which an object schema says what it does with properties it does not name.
_OTHER_PROPERTIES_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def unnamed_properties(schema: Any, arguments: dict[str, Any]) -> list[str]:
    """The top-level keys of ``arguments`` that the object ``schema`` does not name in its
    ``properties``, sorted, when the schema says nothing about other properties (none of
    ``additionalProperties``, ``patternProperties``, ``unevaluatedProperties``).

    JSON Schema allows such keys, but a reviewer who adds one has most likely misspelt a
    property the tool would then never see; LangChain's Agent Inbox likewise edits only the
    fields the tool declares. A schema that names no ``properties`` at all is left alone, and
    so is one that says what other properties may be (``additionalProperties: true`` too)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    if any(keyword in schema for keyword in _OTHER_PROPERTIES_KEYWORDS):
        return []
    return sorted(name for name in arguments if name not in schema["properties"])


def approval_arguments_check(
    *, session: AgentSession, tool_name: str, arguments: Any
) -> str:
    """Check a reviewer's edited ``arguments`` (a decoded JSON value) for the tool call
    ``tool_name`` of ``session`` and return them as the JSON text the call will run with.

    The schema is the MCP tool's ``inputSchema`` as discovered (``McpTool.input_schema``),
    found among the tools the session's agent exposes by the model-facing name; validation
    follows the schema's own ``$schema`` draft (``jsonschema.validators.validator_for``, draft
    2020-12 when it names none), as MCP servers validate their input; a property the schema
    does not name is refused too unless the schema says what other properties may be
    (``unnamed_properties``).

    Raises:
        ApprovalArgumentsInvalidError: Not a JSON object, the tool is no longer exposed by the
            agent (its schema is unknown), or the schema refuses the value.
    """
    import jsonschema

    if not isinstance(arguments, dict):
        raise ApprovalArgumentsInvalidError(["The arguments must be a JSON object."])
    tool = next(
        (item for item in session.agent.exposed_tools() if item.exposed_name == tool_name), None
    )
    if tool is None:
        raise ApprovalArgumentsInvalidError(
            [f"The agent no longer offers {tool_name}, so its arguments cannot be checked."]
        )
    schema = tool.input_schema or {"type": "object"}
    try:
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ApprovalArgumentsInvalidError(
            [f"The tool's input schema is invalid, so no edit can be checked: {error.message}"]
        ) from None
    problems = sorted(
        validator_class(schema).iter_errors(arguments),
        key=lambda error: (list(map(str, error.absolute_path)), error.message),
    )
    messages = [
        (
            f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            if error.absolute_path
            else error.message
        )
        for error in problems
    ]
    messages.extend(
        f"{name}: the tool's input schema has no such property"
        for name in unnamed_properties(schema, arguments)
    )
    if messages:
        raise ApprovalArgumentsInvalidError(messages[:ARGUMENT_PROBLEMS_MAX])
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def interrupt_resolve(
    *,
    session: AgentSession,
    interrupt_id: str,
    approved: bool,
    rejection_message: str = "",
    decided_by: AbstractBaseUser | AnonymousUser,
    edited_arguments: Any = None,
) -> ApprovalDecision:
    """Approve or reject the pending tool call ``interrupt_id`` of ``session`` and audit it.

    ``edited_arguments`` (approve with edits): a decoded JSON object the approved call runs
    with instead of the model's arguments, checked by ``approval_arguments_check``; the audit
    row keeps both. ``None`` runs the call as the model asked; ignored on rejection.

    The tool call's details come from the approvals index (or, for an interrupt it does not
    hold yet, the session's snapshot). The ``ApprovalDecision`` row (who, when, the verdict)
    is written first, with ``delivery`` ``pending``; then Dex's ``resolve_interrupt`` RPC
    decides (seed "RPCs"). When the engine or every worker does not answer, the decision
    stays pending and a Celery task delivers it (ARCHITECTURE.md "Accepted means kept"). An
    approval drops ``rejection_message``, as Dex does. Permissions are the caller's business
    (only staff approve).

    When Dex does not hold an interrupt that the index lists as pending (its worker died
    between indexing it and committing its Step; another worker records it again), the
    decision is kept pending too and delivered once Dex holds the interrupt
    (``outbox.InterruptNotRecordedDeferred``).

    Returns:
        The decision; its ``delivery`` is ``delivered`` or ``pending``.

    Raises:
        InterruptAlreadyDecidedError: A decision was recorded already (``.decision``).
        ApprovalArgumentsInvalidError: ``edited_arguments`` do not fit the tool's schema.
        InterruptNotFoundError: Neither the index nor the snapshot knows the interrupt.
        InterruptNotPendingError: Past its deadline, withdrawn, or Dex answered that it no
            longer waits; no decision is kept.
        SessionIsStoppedError: Dex refused because the session's Flow was stopped (the
            index is marked stopped now); no decision is kept.
        dex_gateway.EngineUnavailableError: The index does not hold the interrupt and the
            snapshot that would describe it could not be read.
        dex_gateway.SessionNotFoundError: Dex has no such session.
    """
    from agents_app import task_queue
    from agents_app.sessions import outbox

    decider_pk = decided_by.pk
    if decider_pk is None:
        raise ValueError("Decisions are made by a saved user.")
    existing = _decision_get(session=session, interrupt_id=interrupt_id)
    if existing is not None:
        raise InterruptAlreadyDecidedError(existing)
    indexed = ApprovalRequest.objects.filter(session=session, interrupt_id=interrupt_id).first()
    if indexed is not None and indexed.state != ApprovalRequest.State.PENDING:
        raise InterruptNotPendingError(_NOT_PENDING_BECAUSE[ApprovalRequest.State(indexed.state)])
    if indexed is not None:
        # The index has the call's details: no snapshot read, which also keeps a session too
        # large for a snapshot decidable (resolve_interrupt loads only PendingInterrupts).
        pending: dict[str, Any] = {
            "tool_call_id": indexed.tool_call_id,
            "tool_name": indexed.tool_name,
            "arguments": indexed.arguments,
        }
    else:
        pending = _pending_from_snapshot(session=session, interrupt_id=interrupt_id)
    message = "" if approved else rejection_message
    edited = ""
    if approved and edited_arguments is not None:
        edited = approval_arguments_check(
            session=session, tool_name=str(pending.get("tool_name", "")), arguments=edited_arguments
        )
        with contextlib.suppress(ValueError):
            if json.loads(str(pending.get("arguments", ""))) == edited_arguments:
                # The same value (a form sends the arguments back untouched): not an edit, so
                # the model reads no note.
                edited = ""
    try:
        with transaction.atomic():
            decision = ApprovalDecision.objects.create(
                session=session,
                interrupt_id=interrupt_id,
                tool_call_id=str(pending.get("tool_call_id", "")),
                tool_name=str(pending.get("tool_name", "")),
                arguments=str(pending.get("arguments", "")),
                edited_arguments=edited,
                approved=approved,
                rejection_message=message,
                decided_by_id=decider_pk,
                delivery=Delivery.PENDING,
            )
    except IntegrityError:
        # A concurrent request recorded its decision first.
        existing = _decision_get(session=session, interrupt_id=interrupt_id)
        if existing is None:
            raise
        raise InterruptAlreadyDecidedError(existing) from None
    approval_index.approvals_changed_notify()
    try:
        state = outbox.approval_decision_deliver(decision=decision)
    except outbox.InterruptNotRecordedDeferred as error:
        # Either a Step is being run again (keep the decision) or the Flow was stopped
        # behind the index's back (say so now rather than after the window).
        stopped = False
        with contextlib.suppress(
            dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError
        ):
            stopped = session_stopped_detect(session=session)
        if stopped:
            decision.delete()
            raise SessionIsStoppedError() from None
        logger.info("Decision on %s kept in the outbox: %s", interrupt_id, error)
        task_queue.outbox_delivery_schedule(decision_id=decision.pk)
        return decision
    except outbox.DeliveryDeferred as error:
        logger.info("Decision on %s kept in the outbox: %s", interrupt_id, error)
        task_queue.outbox_delivery_schedule(decision_id=decision.pk)
        return decision
    if state == Delivery.REFUSED:
        decision.delete()
        # Refused because the Flow was stopped behind the index's back: say that, and make
        # the stop final in the index too.
        stopped = False
        with contextlib.suppress(
            dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError
        ):
            stopped = session_stopped_detect(session=session)
        if stopped:
            raise SessionIsStoppedError()
        raise InterruptNotPendingError(
            "This tool call no longer waits for a decision (decided, or past its deadline)."
        )
    return decision


def _decision_get(*, session: AgentSession, interrupt_id: str) -> ApprovalDecision | None:
    return (
        ApprovalDecision.objects.select_related("decided_by")
        .filter(session=session, interrupt_id=interrupt_id)
        .first()
    )


class ApiTokenLimitError(Exception):
    """The user already holds ``DEXAGENTS["MAX_API_TOKENS_PER_USER"]`` API tokens."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"You already have {limit} API tokens, the most one user may hold: revoke one "
            "you no longer use (DELETE /api/v1/tokens/<id>/), then create this one."
        )
        self.limit = limit


def api_token_create(
    *,
    user: AbstractBaseUser,
    name: str,
    expires_at: datetime.datetime | None = None,
    replace: bool = False,
) -> tuple[ApiToken, str]:
    """Create an API token for ``user`` and return ``(token, key)``.

    The key (``"dxa_"`` + 64 hex characters, django-rest-knox's generator) is returned here
    only: the database keeps its SHA-512 digest (``ApiToken``), so callers show it once.

    Args:
        name: What the token is for (1-100 characters; callers validate).
        expires_at: Aware datetime after which the token is refused; None: never.
        replace: Revoke ``user``'s other tokens named ``name`` first (``manage.py dev``
            prints a fresh demo token on every start without piling them up).

    Raises:
        ApiTokenLimitError: ``user`` holds ``DEXAGENTS["MAX_API_TOKENS_PER_USER"]`` tokens
            already (counted after ``replace``); nothing is created.
    """
    limit = int(dexagents_setting("MAX_API_TOKENS_PER_USER"))
    digest, key = get_digest_token()
    with transaction.atomic():
        if replace:
            ApiToken.objects.filter(user=user, name=name).delete()
        if ApiToken.objects.filter(user=user).count() >= limit:
            raise ApiTokenLimitError(limit)
        # Not knox's manager ``create``: it takes a time-to-live, not a moment.
        token = ApiToken(
            user=user,
            name=name,
            expiry=expires_at,
            digest=digest,
            token_key=key[: KNOX_CONSTANTS.TOKEN_KEY_LENGTH],
        )
        token.save(force_insert=True)
    return token, key


def api_token_revoke(*, user: AbstractBaseUser | AnonymousUser, token_id: int) -> bool:
    """Delete ``user``'s API token ``token_id``; False when ``user`` has no such token (another
    user's token counts as none). Clients using its key get 401 from the next request on."""
    deleted, _ = ApiToken.objects.filter(user_id=user.pk, pk=token_id).delete()
    return bool(deleted)


def user_token_create(
    *,
    username: str,
    staff: bool = False,
    name: str = "createtoken",
    expires_at: datetime.datetime | None = None,
    replace: bool = False,
) -> tuple[str, bool]:
    """Return ``(new API token key, user_created)`` for ``username``, creating the user when
    missing (``manage.py createtoken``).

    A new user gets no usable password; it authenticates with the token only. ``staff``
    creates the user as staff, or marks an existing one (it never takes staff away). Every
    call makes a new token (keys are stored hashed, so an old one cannot be shown again);
    ``name``, ``expires_at`` and ``replace`` are ``api_token_create``'s.

    Raises:
        django.core.exceptions.ValidationError: ``username`` fails the user model's
            username field (its validators and max length); nothing is created.
        ApiTokenLimitError: The user holds the most tokens one user may; nothing changes.
    """
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    username_field = user_model._meta.get_field(user_model.USERNAME_FIELD)
    if isinstance(username_field, models.Field):
        username_field.clean(username, None)
    lookup: dict[str, Any] = {user_model.USERNAME_FIELD: username}
    with transaction.atomic():
        user, created = user_model._default_manager.get_or_create(**lookup)
        if created:
            user.set_unusable_password()
        if staff:
            user.is_staff = True
        if created or staff:
            user.save()
        _, key = api_token_create(user=user, name=name, expires_at=expires_at, replace=replace)
    return key, created


# --- rename, archive, delete (issue 27, "Sessions") ------------------------------------------

#: Characters a title may have (``AgentSession.title``).
SESSION_TITLE_MAX_CHARS = 200


def session_rename(*, session: AgentSession, title: str) -> AgentSession:
    """Give ``session`` the title its owner chose, without control characters (bidi
    controls included, ``titles.title_without_controls``) and with its whitespace made single
    spaces; callers check it is 1 to ``SESSION_TITLE_MAX_CHARS`` characters after that. The
    title's source becomes ``user``, so no generated or first-message title replaces it later
    (``titles``)."""
    title = title_without_controls(title)
    if not title or len(title) > SESSION_TITLE_MAX_CHARS:
        raise ValueError("A title has 1 to 200 characters.")
    AgentSession.objects.filter(pk=session.pk).update(
        title=title, title_source=TitleSource.USER
    )
    session.title, session.title_source = title, TitleSource.USER
    return session


def session_archive_set(*, session: AgentSession, archived: bool) -> AgentSession:
    """Archive ``session`` (hidden from lists unless they ask for archived sessions; still
    readable and usable) or bring it back; archiving an archived session keeps its time."""
    if archived and session.archived_at is None:
        session.archived_at = datetime.datetime.now(tz=datetime.UTC)
    elif not archived:
        session.archived_at = None
    AgentSession.objects.filter(pk=session.pk).update(archived_at=session.archived_at)
    return session


@dataclasses.dataclass(frozen=True)
class SessionDeleted:
    """What ``session_delete`` did.

    Attributes:
        history_deleted: The engine deleted the session's stored history (False: the engine
            has no deletion call, a real Dex server, whose retention deletes the stopped Flow
            later; or it did not answer: a Celery task tries again).
    """

    history_deleted: bool


def session_delete(*, session: AgentSession) -> SessionDeleted:
    """Delete ``session``: stop its Flow (as ``session_stop``), remove it from the index, then
    delete its stored history in the engine.

    The index row becomes a tombstone (``deleted_at`` set, title blank) that
    ``AgentSession.objects`` leaves out, so the session answers 404 everywhere; its pending
    approval rows, outbox rows and search index rows are deleted; the approval audit
    (``ApprovalDecision``, for staff) and usage records (spent money still counts toward
    budgets and usage) stay, pointing at the tombstone. Open websockets of the session hear
    ``session.deleted`` on the channel layer and close.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer the stop; nothing changed.
    """
    from agents_app import task_queue
    from agents_app.gateway import snapshot_cache
    from agents_app.models import SessionMessageText

    dex_gateway.run(dex_gateway.session_stop(session_id=session.id, reason="deleted by user"))
    now = datetime.datetime.now(tz=datetime.UTC)
    with transaction.atomic():
        AgentSession.objects.filter(pk=session.pk).update(
            deleted_at=now, title="", status=SESSION_STATUS_STOPPED,
            status_observed_at=now, updated_at=now,
        )
        withdrawn = ApprovalRequest.objects.filter(session_id=session.pk).delete()[0]
        ApprovalDecision.objects.filter(session_id=session.pk, delivery=Delivery.PENDING).update(
            delivery=Delivery.REFUSED, last_error="The session was deleted."
        )
        OutboxMessage.objects.filter(session_id=session.pk).delete()
        OutboxTurnCancel.objects.filter(session_id=session.pk).delete()
        SessionMessageText.objects.filter(session_id=session.pk).delete()
    if withdrawn:
        approval_index.approvals_changed_notify()
    _session_deleted_announce(session_id=session.id)
    dex_gateway.run(snapshot_cache.forget(session.id))
    try:
        deleted = dex_gateway.run(dex_gateway.session_history_delete(session_id=session.id))
    except dex_gateway.EngineUnavailableError as error:
        logger.warning("History of deleted session %s not deleted yet: %s", session.id, error)
        task_queue.session_history_delete_schedule(session_id=session.id)
        deleted = False
    if not deleted:
        logger.info("The engine keeps the history of deleted session %s until its retention.",
                    session.id)
    return SessionDeleted(history_deleted=deleted)


def _session_deleted_announce(*, session_id: str) -> None:
    """Tell the session's websocket consumers it is gone (best effort; a socket that misses
    it reads nothing more: the session's Stream is deleted with its history)."""
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(
            session_index.session_group(session_id), {"type": session_index.SESSION_DELETED}
        )
    except Exception as error:
        logger.info("Deleted-session notice not sent for %s: %s", session_id, error)
