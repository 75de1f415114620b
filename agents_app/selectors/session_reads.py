"""Reads of sessions: who may read one, the lists, the detail beside the Dex snapshot, the
queue.

Owns the lookups that check access (``session_get_for_owner_or_staff``,
``session_readable_by``), the sessions list with its filters and orderings
(``session_list_visible``), what the detail adds to the snapshot and how a stopped session's
snapshot reads (``session_detail_extras``, ``snapshot_as_stopped``), where a live view starts
relaying (``session_events_after_get``, ``session_live_events_after``), message pages, and the
queue with the messages the outbox still keeps (``message_queue_get``,
``snapshot_with_outbox``).

Functions that ask Dex raise ``dex_gateway.EngineUnavailableError`` when the engine does not
answer and ``dex_gateway.SessionNotFoundError`` when it has no such session.

May import: the sessions index, search and outbox, the Dex gateway, usage and the foundation
(tests/test_layering.py).
"""


import collections
import dataclasses
import threading
from collections.abc import Collection
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, Q, QuerySet

from agents_app.gateway import dex_gateway, event_stream
from agents_app.models import (
    SESSION_STATUS_STOPPED,
    AgentSession,
    ApprovalRequest,
    Delivery,
    OutboxMessage,
)
from agents_app.sessions.session_search import matching_session_ids, search_words
from agents_app.usage.usage_records import session_usage_annotations
from dex_agents import AgentStatus


def session_get_for_staff(*, session_id: str) -> AgentSession:
    """Return any user's session ``session_id`` (callers have checked the caller is staff).

    Raises:
        AgentSession.DoesNotExist: No such session.
    """
    return AgentSession.objects.select_related("agent", "owner").get(pk=session_id)


def session_get_for_owner_or_staff(
    *, user: AbstractBaseUser | AnonymousUser, session_id: str
) -> AgentSession:
    """Return ``session_id`` when ``user`` owns it or is staff (``session_readable_by``).

    Raises:
        AgentSession.DoesNotExist: No such session, or a non-staff caller does not own it
            (REST answers 404 and the websocket relay closes with 4404 either way, so
            foreign IDs are not revealed).
    """
    session = session_get_for_staff(session_id=session_id)
    if not session_readable_by(session=session, user=user):
        raise AgentSession.DoesNotExist(session_id)
    return session


def session_readable_by(*, session: AgentSession, user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether ``user`` may read ``session``: its owner, or any staff member."""
    return session_readable(
        owner_id=session.owner_id, user_id=user.pk, user_is_staff=getattr(user, "is_staff", False)
    )


def session_readable(*, owner_id: Any, user_id: Any, user_is_staff: bool) -> bool:
    """``session_readable_by`` from the values it reads: the owner, or any staff member."""
    return owner_id == user_id or bool(user_is_staff)


SESSION_ORDERINGS = (
    "created_at",
    "-created_at",
    "updated_at",
    "-updated_at",
    "title",
    "-title",
    "status",
    "-status",
)
#: The status filter value that selects sessions with a pending approval.
STATUS_AWAITING_APPROVAL = "awaiting_approval"
#: What ``session_list_visible`` filters by: the index statuses (``starting``, the AgentState
#: statuses, ``stopped``) and ``awaiting_approval``.
SESSION_LIST_STATUSES = (
    "starting",
    *(status.value for status in AgentStatus),
    "stopped",
    STATUS_AWAITING_APPROVAL,
)


def _pending_approvals() -> Count:
    """An AgentSession annotation: its pending approval requests (``pending_approval_count``,
    which ``SessionOutputSerializer.get_awaiting_approval`` reads)."""
    return Count(
        "approval_requests", filter=Q(approval_requests__state=ApprovalRequest.State.PENDING)
    )


def session_list_visible(
    *,
    user: AbstractBaseUser | AnonymousUser,
    status: str = "",
    agent_slug: str = "",
    search: str = "",
    ordering: str = "",
    archived: bool = False,
    parent: str = "",
) -> QuerySet[AgentSession]:
    """Sessions ``user`` may read (their own; staff: everyone's), filtered and sorted.

    Args:
        status: An index status (``waiting_for_user_message``, ``running_model``,
            ``running_tools``, ``waiting_for_user_input``, ``starting``, ``stopped``) or
            ``awaiting_approval``; blank: any.
        agent_slug: Only this agent's sessions; blank: any.
        search: Case-insensitive match on the title, the agent's slug or name, or every word
            of it (as word prefixes) in one user or assistant message (the full-text index of
            ``session_search``).
        ordering: One of ``SESSION_ORDERINGS``; anything else sorts newest first.
        archived: True: only archived sessions; False: only those not archived.
        parent: Only the child sessions this session's subagent calls started (issue 29);
            blank: any.

    Returns:
        AgentSession rows with ``agent`` and ``owner`` loaded and ``pending_approval_count``
        and the usage sums of ``usage_records.session_usage_annotations`` annotated.
    """
    sessions = AgentSession.objects.select_related("agent", "owner").annotate(
        pending_approval_count=_pending_approvals()
    )
    if not getattr(user, "is_staff", False):
        sessions = sessions.filter(owner_id=user.pk)
    if status == STATUS_AWAITING_APPROVAL:
        sessions = sessions.filter(pending_approval_count__gt=0)
    elif status:
        sessions = sessions.filter(status=status)
    if agent_slug:
        sessions = sessions.filter(agent__slug=agent_slug)
    if parent:
        sessions = sessions.filter(parent_id=parent)
    sessions = sessions.filter(archived_at__isnull=not archived)
    if search.strip():
        term = search.strip()
        matches = (
            Q(title__icontains=term)
            | Q(agent__slug__icontains=term)
            | Q(agent__name__icontains=term)
        )
        words = search_words(term)
        if words:
            matches |= Q(pk__in=matching_session_ids(words=words))
        sessions = sessions.filter(matches)
    order = ordering if ordering in SESSION_ORDERINGS else "-created_at"
    # After the filters: django-stubs cannot follow annotations given as ``**kwargs``.
    return sessions.order_by(order, "-pk").annotate(**session_usage_annotations())


def sessions_stopped(*, session_ids: Collection[str]) -> set[str]:
    """Which of ``session_ids`` the index shows as stopped, or no longer has (deleted)."""
    wanted = set(session_ids)
    present = dict(
        AgentSession.objects.filter(pk__in=wanted).values_list("pk", "status")
    )
    return {
        session_id
        for session_id in wanted
        if session_id not in present or present[session_id] == SESSION_STATUS_STOPPED
    }


def session_detail_extras(
    *, session: AgentSession, user: AbstractBaseUser | AnonymousUser
) -> dict[str, Any]:
    """What the session detail adds to the Dex snapshot from Django.

    Returns:
        ``{"model", "title", "owner" (username), "can_send" (``user`` owns it and it is not
        stopped), "can_approve" (``user`` is staff)}``.
    """
    return session_detail_extras_of(
        model=session.agent.model,
        title=session.title,
        owner_username=session.owner.get_username(),
        owner_id=session.owner_id,
        status=session.status,
        user_id=user.pk,
        user_is_staff=bool(getattr(user, "is_staff", False)),
    )


def session_detail_extras_of(
    *,
    model: str,
    title: str,
    owner_username: str,
    owner_id: Any,
    status: str,
    user_id: Any,
    user_is_staff: bool,
) -> dict[str, Any]:
    """``session_detail_extras`` from the values it reads (no model instances, no database)."""
    return {
        "model": model,
        "title": title,
        "owner": owner_username,
        "can_send": owner_id == user_id and status != "stopped",
        "can_approve": user_is_staff,
    }


def session_messages_page(
    *, session: AgentSession, before: int | None, limit: int
) -> dict[str, Any]:
    """One page of retained messages, oldest first, ending just before ``before`` (the newest
    page when ``before`` is None).

    Reads ``AgentSessionClient.list_agent_messages_before``, which loads only the page's
    message instances; with context compaction the oldest messages may have been deleted after
    they were summarized, so paging stops at the oldest retained one.

    Returns:
        ``{"messages": [message data, see session_data.message_to_data], "next_before": the
        smallest sequence of the page when older retained messages exist, else None}``.

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    return dex_gateway.run(
        dex_gateway.session_messages_before(session_id=session.id, before=before, limit=limit)
    )


def session_events_after_get(*, session: AgentSession) -> str:
    """The snapshot's ``events_after``: the newest retained AgentEvents token, ``""`` if none.

    Read it before the snapshot, so relaying from it misses nothing the snapshot lacks.
    """
    return dex_gateway.run(event_stream.session_events_tail_token(session_id=session.id))


def session_index_values_reload(*, session: AgentSession) -> AgentSession:
    """Read ``session``'s index values again (``status``, ``title``, ``updated_at``) and its
    pending approvals (``pending_approval_count``, as ``session_list_visible`` annotates it)
    into the instance, in one query, and where a held ``first_message`` stands now (a second
    query, only for one); the loaded ``agent`` and ``owner`` stay. Returns ``session``.

    Raises:
        AgentSession.DoesNotExist: The row is gone.
    """
    status, title, updated_at, pending = (
        AgentSession.objects.filter(pk=session.pk)
        .annotate(pending_approvals=_pending_approvals())
        .values_list("status", "title", "updated_at", "pending_approvals")
        .get()
    )
    session.status, session.title, session.updated_at = status, title, updated_at
    session.pending_approval_count = pending  # type: ignore[attr-defined]
    held = getattr(session, "first_message", None)
    if held is not None and held.delivery == Delivery.PENDING:
        # A first message the running-turn cap held: where it stands now (gone from the
        # outbox once delivered).
        delivery = (
            OutboxMessage.objects.filter(pk=held.id).values_list("delivery", flat=True).first()
        )
        if delivery != Delivery.PENDING:
            session.first_message = dataclasses.replace(  # type: ignore[attr-defined]
                held, delivery=delivery or Delivery.DELIVERED, pending_reason=""
            )
    return session


def snapshot_as_stopped(*, snapshot: dict[str, Any]) -> dict[str, Any]:
    """A stopped session's snapshot as readers should see it: ``status`` ``stopped``, no running
    turn, no pending approval, question, wait or plan execution, no queued message. Dex keeps
    the last AgentState of a stopped Flow, which would otherwise still say ``running_tools``
    with an approval nobody can decide any more.

    Tool calls still open end as readers should see them: one awaiting approval never runs
    (``cancelled``); one pending or approved may or may not have run (``outcome_unknown``).
    """
    final_status = {"awaiting_approval": "cancelled", "pending": "outcome_unknown",
                    "approved": "outcome_unknown"}
    tool_calls = [
        {**call, "status": final_status.get(str(call.get("status")), call.get("status"))}
        if isinstance(call, dict) else call
        for call in snapshot.get("tool_calls", [])
    ]
    return {
        **snapshot,
        "tool_calls": tool_calls,
        "status": "stopped",
        "turn_id": None,
        "pending_interrupts": [],
        "awaiting_approval": False,
        # Queued and steered messages of a stopped session will never run.
        "queued_messages": [],
        "queued_message_count": 0,
        "steered_messages": [],
        # Its turn will never go on: no question to answer, no wait, no plan execution.
        "pending_input": None,
        "pending_timer": None,
        "pending_elicitations": [],
        "plan_execution_requested": False,
    }


def session_live_events_after(
    *, session: AgentSession, snapshot: dict[str, Any], events_after: str
) -> str:
    """Where a live view of ``session`` should start relaying: before the running turn's
    ``turn_started`` when a turn runs (its streamed text is in no stored message yet), else
    ``events_after``. Falls back to ``events_after`` when that event is no longer retained.
    """
    turn_id = snapshot.get("turn_id")
    if not turn_id:
        return events_after
    key = (session.id, turn_id)
    token = _turn_start_tokens.get(key)
    if token is None:
        # A backward scan of the turn's events: done once per turn and process, not on every
        # snapshot read while the turn runs (tokens never change once written).
        token = dex_gateway.run(
            event_stream.session_events_turn_start_token(session_id=session.id, turn_id=turn_id)
        )
        if token is None:
            return events_after
        with _turn_start_tokens_lock:
            _turn_start_tokens[key] = token
            while len(_turn_start_tokens) > _TURN_START_TOKENS_KEPT:
                _turn_start_tokens.popitem(last=False)
    return token


def session_live_events_after_known(
    *, session_id: str, snapshot: dict[str, Any], events_after: str
) -> str | None:
    """``session_live_events_after`` when it needs no Dex read (no running turn, or the turn's
    start token already found in this process); None when it would need one."""
    turn_id = snapshot.get("turn_id")
    if not turn_id:
        return events_after
    return _turn_start_tokens.get((session_id, turn_id))


# ``session_live_events_after``'s answers, by (session ID, turn ID), oldest first.
_turn_start_tokens: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()
_TURN_START_TOKENS_KEPT = 1024
_turn_start_tokens_lock = threading.Lock()


def message_queue_get(*, session: AgentSession) -> dict[str, Any]:
    """The session's queued and steered messages, oldest first: one Dex RPC, then the
    messages the outbox still keeps (accepted while the engine or every worker did not
    answer), which join the queue's tail once delivered.

    Returns:
        ``{"queued": [...], "steered": [...], "partial": bool}``, entries ``{"id", "text",
        "plan_mode", "created_at", "delivery"}`` (``session_data.queued_message_to_data``;
        ``delivery`` is ``delivered`` for what Dex lists and ``pending`` for the outbox's).
        ``partial`` is True when Dex did not answer: then only the outbox's messages are
        listed. A stopped session's queue is empty without asking Dex, as its snapshot is
        (``snapshot_as_stopped``): those messages will never run.
    """
    if session.status == "stopped":
        return {"queued": [], "steered": [], "partial": False}
    kept = message_queue_kept(session=session)
    try:
        queue = dex_gateway.run(dex_gateway.session_message_queue(session_id=session.id))
    except dex_gateway.EngineUnavailableError:
        queue = None
    return message_queue_merge(queue=queue, kept=kept)


def message_queue_kept(*, session: AgentSession) -> list[dict[str, Any]]:
    """The queue entries the outbox still keeps for ``session`` (``delivery`` ``pending``),
    oldest first; read them before Dex's queue (``message_queue_get``)."""
    from agents_app.sessions import outbox

    return [
        outbox.outbox_message_to_queue_entry(item)
        for item in outbox.outbox_message_pending(session=session)
    ]


def message_queue_merge(
    *, queue: dict[str, list[dict[str, Any]]] | None, kept: list[dict[str, Any]]
) -> dict[str, Any]:
    """``message_queue_get``'s answer from Dex's queue (``dex_gateway.session_message_queue``,
    or None when the engine did not answer) and the outbox's entries (``message_queue_kept``).
    No I/O."""
    if queue is None:
        return {"queued": kept, "steered": [], "partial": True}
    listed = {
        name: [
            {
                **{key: value for key, value in entry.items() if key != "client_id"},
                "delivery": "delivered",
            }
            for entry in entries
        ]
        for name, entries in queue.items()
    }
    # A message delivered between the two reads shows once, as Dex lists it.
    seen = {entry["client_id"] for entries in queue.values() for entry in entries}
    listed["queued"] += [entry for entry in kept if entry["id"] not in seen]
    return {**listed, "partial": False}


def snapshot_with_outbox(*, session: AgentSession, snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot with each queued and steered entry's ``delivery`` (``delivered``), and the
    messages the outbox still keeps added at the queue's tail (``delivery`` ``pending``), as
    ``message_queue_get`` lists them; ``queued_message_count`` counts them too."""
    from agents_app.sessions import outbox

    kept = [] if session.status == "stopped" else outbox.outbox_message_pending(session=session)
    return snapshot_with_kept_messages(snapshot=snapshot, kept=kept)


def snapshot_with_kept_messages(*, snapshot: dict[str, Any], kept: list[Any]) -> dict[str, Any]:
    """``snapshot_with_outbox`` given the outbox's pending messages ``kept``
    (``outbox.outbox_message_pending``, ``[]`` for a stopped session): no database access."""
    from agents_app.sessions import outbox

    queued = [{**entry, "delivery": "delivered"} for entry in snapshot.get("queued_messages", [])]
    steered = [{**entry, "delivery": "delivered"} for entry in snapshot.get("steered_messages", [])]
    # A message delivered while the snapshot was read (Dex has it, the outbox row is not
    # marked delivered yet) shows once, as Dex lists it: listed twice under one ID, the page's
    # rows would jump (a click could land on the next row's button).
    seen = {entry.get("id") for entry in queued + steered}
    kept = [item for item in kept if str(item.pk) not in seen]
    queued += [outbox.outbox_message_to_queue_entry(item) for item in kept]
    return {
        **snapshot,
        "queued_messages": queued,
        "steered_messages": steered,
        "queued_message_count": int(snapshot.get("queued_message_count", 0)) + len(kept),
    }
