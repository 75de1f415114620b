"""Reads of agents and sessions (HackSoft "selectors").

Functions that ask Dex raise ``dex_gateway.EngineUnavailableError`` when the engine does
not answer and ``dex_gateway.SessionNotFoundError`` when it has no such session.
"""

import collections
import dataclasses
import datetime
import logging
import threading
from collections.abc import Collection
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import Count, F, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STOPPED,
    AgentDefinition,
    AgentSession,
    ApiToken,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
    OutboxMessage,
)
from agents_app.rest_errors import UnavailablePart
from agents_app.sessions.session_search import matching_session_ids, search_words
from agents_app.usage.usage_records import session_usage_annotations
from dex_agents import AgentStatus

logger = logging.getLogger(__name__)


def agent_list_enabled() -> QuerySet[AgentDefinition]:
    """Enabled agent definitions, by slug."""
    return AgentDefinition.objects.filter(enabled=True).order_by("slug")


def agent_get_enabled(*, slug: str) -> AgentDefinition:
    """Return the enabled agent ``slug``.

    Raises:
        AgentDefinition.DoesNotExist: No agent has that slug, or it is disabled.
    """
    return AgentDefinition.objects.get(slug=slug, enabled=True)


#: What the agents list and the portal tell non-staff about an unconfigured provider: the
#: provider check's own reason names environment variables, which only operators need.
NOT_CONFIGURED_FOR_USERS = "An administrator must configure its API key."


def agent_not_configured_reason(
    *, agent: AgentDefinition, user: AbstractBaseUser | AnonymousUser | None
) -> str | None:
    """Why ``agent`` cannot start, as ``user`` may read it: ``None`` when its provider is
    configured, the provider check's reason for staff, ``NOT_CONFIGURED_FOR_USERS`` otherwise."""
    status = agent.provider_status()
    if status.configured:
        return None
    return status.reason if getattr(user, "is_staff", False) else NOT_CONFIGURED_FOR_USERS


def api_token_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ApiToken]:
    """``user``'s own API tokens, newest first (expired ones included, until revoked)."""
    return ApiToken.objects.filter(user_id=user.pk).order_by("-created", "-id")


def message_queue_get(*, session: AgentSession) -> dict[str, Any]:
    """The session's queued and steered messages, oldest first: one Dex RPC, then the
    messages the outbox still keeps (accepted while the engine or every worker did not
    answer), which join the queue's tail once delivered.

    Returns:
        ``{"queued": [...], "steered": [...], "partial": bool}``, entries ``{"id", "text",
        "plan_mode", "created_at", "delivery"}`` (``dex_gateway.queued_message_to_data``;
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


def agent_tools_describe(*, agent: AgentDefinition) -> list[dict[str, Any]]:
    """The tools a session of ``agent`` may use, for the portal.

    Returns:
        ``[{"name" (exposed), "server", "tool", "title", "description", "effect",
        "requires_approval"}]`` by server, then tool name.
    """
    return [
        {
            "name": tool.exposed_name,
            "server": tool.server.name,
            "tool": tool.name,
            "title": tool.title,
            "description": tool.description,
            "effect": tool.effective_effect,
            "requires_approval": tool.effective_requires_approval,
        }
        for tool in agent.exposed_tools()
    ]


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
        ``{"messages": [message data, see dex_gateway.message_to_data], "next_before": the
        smallest sequence of the page when older retained messages exist, else None}``.

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    return dex_gateway.run(
        dex_gateway.session_messages_before(session_id=session.id, before=before, limit=limit)
    )


@dataclasses.dataclass(frozen=True)
class ApprovalFilters:
    """What the approvals lists are narrowed to; an empty string does not narrow.

    ``agent`` is an agent slug, ``tool`` a tool call's (model-facing) tool name and ``owner``
    the session owner's username, each matched whole but ignoring case (``iexact``: ``DEMO``
    finds ``demo``, as Django admin's filters and searches ignore case); ``session`` is a
    session ID, matched exactly.
    """

    agent: str = ""
    tool: str = ""
    owner: str = ""
    session: str = ""

    def lookups(self) -> dict[str, str]:
        """Django lookups on ``ApprovalRequest`` or ``ApprovalDecision`` rows."""
        fields = {
            "session__agent__slug__iexact": self.agent,
            "tool_name__iexact": self.tool,
            "session__owner__username__iexact": self.owner,
            "session_id": self.session,
        }
        return {lookup: value for lookup, value in fields.items() if value}


def approval_count_pending() -> int:
    """How many indexed tool calls wait for a decision (one query), for the navigation's count.

    Counts ``ApprovalRequest`` rows in state ``pending``, so it includes calls decided while
    the engine did not answer and calls past a deadline the worker has not recorded yet, as
    ``approval_list_pending`` lists them.
    """
    return ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING).count()


def approval_list_pending(
    *, now: datetime.datetime | None = None, filters: ApprovalFilters | None = None
) -> list[dict[str, Any]]:
    """Every indexed tool call waiting for approval, oldest first (two queries), narrowed to
    ``filters``.

    Returns:
        ``[{"session", "session_title", "agent" (slug), "owner" (username), "interrupt_id",
        "tool_call_id", "tool_name", "arguments" (JSON text), "requested_at", "deadline" (or
        None), "state", "decision"}]``; ``state`` is ``decided`` when staff decided and the
        decision waits for delivery to Dex (``decision`` is then ``{"approved",
        "decided_by", "decided_at", "rejection_message", "delivery": "pending"}``, else
        None), ``expired`` once the deadline passed (the worker has not recorded it yet, and
        Dex refuses a decision), else ``pending``.
    """
    moment = now or timezone.now()
    requests = list(
        ApprovalRequest.objects.filter(
            state=ApprovalRequest.State.PENDING, **(filters or ApprovalFilters()).lookups()
        )
        .select_related("session__agent", "session__owner")
        .order_by("requested_at", "id")
    )
    undelivered = {
        (decision.session_id, decision.interrupt_id): decision
        for decision in ApprovalDecision.objects.filter(
            delivery="pending", session_id__in={request.session_id for request in requests}
        ).select_related("decided_by")
    }
    items = []
    for request in requests:
        decision = undelivered.get((request.session_id, request.interrupt_id))
        if decision is not None:
            state = "decided"
        elif request.deadline is not None and request.deadline <= moment:
            state = "expired"
        else:
            state = "pending"
        items.append(
            {
                "session": request.session_id,
                "session_title": request.session.title,
                "agent": request.session.agent.slug,
                "owner": request.session.owner.get_username(),
                "interrupt_id": request.interrupt_id,
                "tool_call_id": request.tool_call_id,
                "tool_name": request.tool_name,
                "arguments": request.arguments,
                "requested_at": request.requested_at,
                "deadline": request.deadline,
                "state": state,
                "decision": None
                if decision is None
                else {
                    "approved": decision.approved,
                    "decided_by": decision.decided_by.get_username(),
                    "decided_at": decision.decided_at,
                    "rejection_message": decision.rejection_message,
                    "edited_arguments": decision.edited_arguments or None,
                    "delivery": decision.delivery,
                },
            }
        )
    return items


def approval_list_decided(
    *, filters: ApprovalFilters | None = None, decision: str = ""
) -> QuerySet[ApprovalRequest]:
    """Approvals that stopped waiting, newest first, narrowed to ``filters`` and, when
    ``decision`` is not empty, to that state (approved, rejected, expired, withdrawn).

    Annotated from the ``ApprovalDecision`` audit rows: ``decided_by`` (username, or None when
    no person decided), ``decision_at`` (when the person decided, else when it closed) and
    ``edited_arguments`` (the JSON text an approval ran with instead of ``arguments``; None or
    blank when not edited)."""
    decisions = ApprovalDecision.objects.filter(
        session_id=OuterRef("session_id"), interrupt_id=OuterRef("interrupt_id")
    )
    rows = ApprovalRequest.objects.exclude(state=ApprovalRequest.State.PENDING).filter(
        **(filters or ApprovalFilters()).lookups()
    )
    if decision:
        rows = rows.filter(state=decision)
    return (
        rows.select_related("session__agent", "session__owner")
        .annotate(
            edited_arguments=Subquery(decisions.values("edited_arguments")[:1]),
            decided_by=Subquery(decisions.values("decided_by__username")[:1]),
            # When the person decided (the audit row), not when Dex took the decision: with
            # the outbox these differ by the delivery's delay. Expired or withdrawn: closed_at.
            decision_at=Coalesce(Subquery(decisions.values("decided_at")[:1]), F("closed_at")),
        )
        .order_by("-closed_at", "-id")
    )


def worker_heartbeat_fresh() -> bool:
    """Whether at least one ``dexworker`` beat recently (``agents_app.worker.heartbeat``).

    Each worker beats every second under its own ID (Redis with ``REDIS_URL``, else a file
    per worker in ``DEXAGENTS["WORKER_HEARTBEAT_DIR"]``); a beat counts as fresh when younger
    than ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]`` seconds (4), so a killed or hung worker
    reads as down within that time, one that stops cleanly at once. Redis not answering
    reads as no fresh worker.
    """
    from agents_app.worker.heartbeat import fresh_workers

    try:
        return bool(fresh_workers())
    except Exception:  # redis.RedisError and socket errors: liveness cannot be shown
        return False


#: Parts of the platform ``/healthz`` reports, in the order a request needs them.
HEALTH_PARTS = ("web", "engine", "worker")


def health_get() -> dict[str, str]:
    """Report the liveness of each part: ``{"web", "engine", "worker"}``, each "up"/"down".

    When a part is down, ``detail`` (a sentence) and ``unavailable`` (the first part down, in
    the order a request needs them: ``"engine"`` before ``"worker"``) are added: the shape of
    every 503 (``agents_app.rest_errors.ServiceUnavailable``).

    The engine is up when it answers FlowService.HealthCheck within
    ``DEXAGENTS["ENGINE_TIMEOUT"]`` seconds; the worker when its heartbeat is fresh
    (``worker_heartbeat_fresh``).
    """
    try:
        engine_up = dex_gateway.run(dex_gateway.engine_health_check())
    except dex_gateway.EngineUnavailableError:
        engine_up = False
    parts: dict[str, str] = {
        "web": "up",
        "engine": "up" if engine_up else "down",
        "worker": "up" if worker_heartbeat_fresh() else "down",
    }
    down = [part for part in HEALTH_PARTS if parts[part] == "down"]
    if down:
        names = {"engine": "the Dex engine", "worker": "the Dex worker"}
        subject = " and ".join(names[part] for part in down)
        verb = "is" if len(down) == 1 else "are"
        parts["detail"] = f"{subject[0].upper()}{subject[1:]} {verb} down."
        parts["unavailable"] = down[0]
    return parts


#: Parts ``/readyz`` checks, in the order a request needs them.
READINESS_PARTS = ("database", "redis", "engine", "worker")


def _database_check() -> str:
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
    except Exception:  # any driver error: the database is not usable
        return "down"
    return "up"


def _redis_check() -> str:
    url = dexagents_setting("REDIS_URL")
    if not url:
        return "not_configured"
    import redis

    try:
        with redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2) as client:
            client.ping()
    except (redis.RedisError, OSError):
        return "down"
    return "up"


def readiness_get() -> dict[str, Any]:
    """Whether this web process can serve: ``/readyz`` (unauthenticated).

    Returns ``{"ready": bool, "checks": {"database", "redis", "engine", "worker"}, "workers"}``.
    Each check is ``"up"`` or ``"down"``; ``redis`` is ``"not_configured"`` without
    ``REDIS_URL`` (not a failure). ``database``: ``SELECT 1`` on the default connection;
    ``redis``: ``PING`` (2 s timeouts); ``engine``: FlowService.HealthCheck within
    ``DEXAGENTS["ENGINE_TIMEOUT"]``; ``worker``: at least one fresh beat
    (``agents_app.worker.heartbeat``). ``workers`` is the number of fresh workers. When not
    ready, ``detail`` (a sentence) and ``unavailable`` (the first part down) are added.
    """
    from agents_app.worker.heartbeat import fresh_workers

    try:
        engine_up = dex_gateway.run(dex_gateway.engine_health_check())
    except dex_gateway.EngineUnavailableError:
        engine_up = False
    try:
        workers = len(fresh_workers())
    except Exception:  # Redis down: no worker can be shown alive
        workers = 0
    checks = {
        "database": _database_check(),
        "redis": _redis_check(),
        "engine": "up" if engine_up else "down",
        "worker": "up" if workers else "down",
    }
    down = [part for part in READINESS_PARTS if checks[part] == "down"]
    body: dict[str, Any] = {"ready": not down, "checks": checks, "workers": workers}
    if down:
        body["detail"] = "Not ready: " + ", ".join(down) + " down."
        body["unavailable"] = down[0]
    return body


def unavailable_part(*, error: dex_gateway.EngineUnavailableError) -> UnavailablePart:
    """Name the part of the platform that ``error`` means is down, for a 503's ``unavailable``.

    ``"engine"`` when the engine refused the connection, or timed out while a worker beats
    (the engine itself is slow); ``"worker"`` when the engine said no worker took the RPC
    (``WorkerUnavailableError``, cause ``"worker"``), when the call timed out and no worker
    heartbeat is fresh (Dex RPCs run on a worker, so the engine waits for one), or when a Step
    kept the session's state locked (its worker is busy with it).
    """
    if error.cause in ("busy", "worker"):
        return "worker"
    if error.cause == "timeout" and not worker_heartbeat_fresh():
        return "worker"
    return "engine"


def session_readable_by(*, session: AgentSession, user: AbstractBaseUser | AnonymousUser) -> bool:
    """Whether ``user`` may read ``session``: its owner, or any staff member."""
    return session_readable(
        owner_id=session.owner_id, user_id=user.pk, user_is_staff=getattr(user, "is_staff", False)
    )


def session_readable(*, owner_id: Any, user_id: Any, user_is_staff: bool) -> bool:
    """``session_readable_by`` from the values it reads: the owner, or any staff member."""
    return owner_id == user_id or bool(user_is_staff)


def session_events_after_get(*, session: AgentSession) -> str:
    """The snapshot's ``events_after``: the newest retained AgentEvents token, ``""`` if none.

    Read it before the snapshot, so relaying from it misses nothing the snapshot lacks.
    """
    return dex_gateway.run(dex_gateway.session_events_tail_token(session_id=session.id))


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
            dex_gateway.session_events_turn_start_token(session_id=session.id, turn_id=turn_id)
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
