"""Writes of a session's own life: start, title, status, stop, rename, archive, delete.

Owns ``session_create`` (the index row, then the Dex Flow with the agent's snapshot; a first
message the running-turn cap or a budget holds waits in the outbox), the generated title
(``session_title_generate``), statuses read from Dex (``session_status_record``), stops (also
those that happened behind the index's back: ``session_stopped_detect``), and the owner's
rename, archive and delete (issue 27, "Sessions").

May import: ``session_input`` (what a held first message is accepted as), the sessions index
and outbox, the Dex gateway, worker titles, usage budgets and the foundation
(tests/test_layering.py).
"""


import contextlib
import dataclasses
import datetime
import logging
import uuid
from collections.abc import Collection

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STARTING,
    SESSION_STATUS_STOPPED,
    AgentDefinition,
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
    OutboxMessage,
    OutboxTurnCancel,
    TitleSource,
)
from agents_app.services.session_input import (
    PENDING_ACTIVE_LIMIT,
    PENDING_BUDGET,
    MessageAccepted,
)
from agents_app.sessions import approval_index, session_index
from agents_app.usage.budgets import budget_refusal
from agents_app.worker.titles import fallback_title, title_from_message, title_without_controls
from dex_agents import AgentStatus

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
    session_id: str | None = None,
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
        session_id: A deterministic ID (``ses_<32 hex>``) for a start that may be repeated
            (a schedule's run: ``services.schedule_runs``); ``None`` makes a fresh one. With
            it, a repeat is recognised: an index row of that ID (same owner and agent) is
            reused, Dex's ALREADY_EXISTS counts as started, a held first message keeps one
            outbox ID, and a start Dex did not confirm is left for the caller to repeat
            (neither the row nor the Flow is removed).

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
    from agents_app.sessions import outbox_holds

    owner_pk = owner.pk
    if owner_pk is None:
        raise ValueError("Sessions belong to a saved user.")
    repeatable = session_id is not None
    session_id = session_id or session_id_new()
    if repeatable:
        existing = AgentSession.objects.filter(
            pk=session_id, owner_id=owner_pk, agent=agent
        ).first()
        if existing is not None:
            return _session_start_repeat(
                session=existing, message=message, plan_mode=plan_mode, tool_names=tool_names
            )
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
            outbox_holds.owner_turn_lock(owner_id=owner_pk)
        held = refusal is not None or (
            capped and outbox_holds.active_sessions_count(owner_id=owner_pk) >= limit
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
    except dex_gateway.SessionAlreadyStartedError:
        if not repeatable:
            AgentSession.objects.filter(pk=session_id).delete()
            raise
    except BaseException as error:
        if repeatable:
            # The caller repeats the start with the same ID; a Flow Dex accepted just before
            # the deadline is then found (ALREADY_EXISTS) rather than stopped.
            raise
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

        first, _ = OutboxMessage.objects.get_or_create(
            id=first_message_id(session_id) if repeatable else uuid.uuid4().hex,
            defaults={
                "session": session, "text": message, "plan_mode": plan_mode,
                "last_error": refusal or outbox_holds.active_limit_reason(),
            },
        )
        task_queue.outbox_delivery_schedule(session_id=session.id)
        session.first_message = MessageAccepted(  # type: ignore[attr-defined]
            id=first.id,
            delivery=Delivery.PENDING,
            pending_reason=PENDING_BUDGET if refusal else PENDING_ACTIVE_LIMIT,
            pending_detail=refusal or "",
        )
    return session


def first_message_id(session_id: str) -> str:
    """The outbox ID (32 hex) of the held first message of a session started with a
    deterministic ID: the same for every repeat of that start."""
    return uuid.uuid5(uuid.NAMESPACE_URL, f"dexagents:first-message:{session_id}").hex


def _session_start_repeat(
    *, session: AgentSession, message: str, plan_mode: bool,
    tool_names: Collection[str] | None,
) -> AgentSession:
    """A repeated ``session_create(session_id=)`` that found its index row: start the Flow
    unless Dex has it already (ALREADY_EXISTS, or a held first message in the outbox shows
    the first start got through). A first message a hold kept in the outbox is not sent again.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer; the caller repeats.
    """
    if OutboxMessage.objects.filter(pk=first_message_id(session.id)).exists():
        return session
    config = session.agent.agent_config(tool_names=tool_names)
    config["owner_id"] = str(session.owner_id)
    with contextlib.suppress(dex_gateway.SessionAlreadyStartedError):
        dex_gateway.run(
            dex_gateway.session_start(
                session_id=session.id, message=message, agent_config=config,
                plan_mode=plan_mode,
            )
        )
    return session


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
    """Stop the session's Dex Flow and mark its index row ``stopped``, and its running
    subagents' child sessions with it.

    Dex keeps serving the snapshot of the stopped session (seed "RPCs": retained closed
    sessions). A Flow Dex no longer has counts as stopped.

    Raises:
        dex_gateway.EngineUnavailableError: Dex did not answer; the row is left as it was.
    """
    dex_gateway.run(dex_gateway.session_stop(session_id=session.id, reason="stopped by user"))
    if session_index.session_stopped_index(session=session):
        approval_index.approvals_changed_notify()
    # Subagents (issue 29): a stopped parent's Step no longer waits for its children, and
    # Dex does not stop a sub-flow with its parent; the running ones are stopped too.
    for child in AgentSession.objects.filter(parent=session).exclude(
        status=SESSION_STATUS_STOPPED
    ):
        session_stop(session=child)


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
