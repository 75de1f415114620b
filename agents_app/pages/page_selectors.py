"""Reads for the browser pages (HackSoft "selectors"): everything a page template shows.

Templates get plain dataclasses from here and run no queries of their own. Conversation
details (messages, live events, approvals) are not read here: the pages' ES modules load them
from the REST API and the websockets, which read Dex.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.paginator import Page, Paginator

from agents_app.models import (
    AgentDefinition,
    AgentSession,
    ApprovalNotification,
    NotificationPreference,
)
from agents_app.selectors.agent_catalog import (
    agent_list_enabled,
    agent_not_configured_reason,
    agent_tools_describe,
)
from agents_app.selectors.session_reads import (
    STATUS_AWAITING_APPROVAL,
    session_detail_extras,
    session_get_for_owner_or_staff,
    session_list_visible,
)
from agents_app.sessions.session_search import MessageMatch, message_matches_get, search_words
from agents_app.usage.usage_records import (
    session_row_usage,
    session_usage_totals,
    usage_by_owner,
    usage_summary,
    usd_display,
)

# Session index statuses (ARCHITECTURE.md "The Django index") with words for people.
SESSION_STATUS_LABELS: dict[str, str] = {
    "starting": "Starting",
    "waiting_for_user_message": "Waiting for a message",
    "running_model": "Model running",
    "running_tools": "Running tools",
    "waiting_for_user_input": "Waiting for an answer",
    "stopped": "Stopped",
}

# Labels for the orderings ``session_reads.session_list_visible`` accepts that the page offers.
SESSION_ORDERING_LABELS: dict[str, str] = {
    "-updated_at": "Recently active",
    "-created_at": "Newest first",
    "created_at": "Oldest first",
    "title": "Title A to Z",
    "status": "Status",
}
SESSION_DEFAULT_ORDERING = "-updated_at"
AWAITING_APPROVAL_LABEL = "Waiting for approval"
SESSION_PAGE_SIZE = 20


def _is_staff(user: AbstractBaseUser | AnonymousUser) -> bool:
    return bool(getattr(user, "is_staff", False))


@dataclasses.dataclass(frozen=True)
class PortalTool:
    """One tool an agent may be offered, as the portal lists it.

    ``name`` is the exposed ``<server>__<tool>`` name that ``POST /api/v1/sessions/`` takes in
    ``tools``; ``effect`` is an ``mcp_registry.effects.ToolEffect`` value.
    """

    name: str
    tool: str
    title: str
    description: str
    effect: str
    requires_approval: bool


@dataclasses.dataclass(frozen=True)
class PortalServer:
    """An MCP server with the agent's tools on it."""

    name: str
    tools: list[PortalTool]


@dataclasses.dataclass(frozen=True)
class PortalAgent:
    """One enabled agent on the portal.

    ``not_configured_reason`` is ``None`` for a configured agent; for others it is the
    provider check's sentence for staff and a generic one for everyone else. No credential
    value is ever part of it (``agents_app.providers``).
    """

    slug: str
    name: str
    description: str
    model: str
    configured: bool
    not_configured_reason: str | None
    servers: list[PortalServer]

    @property
    def tool_count(self) -> int:
        return sum(len(server.tools) for server in self.servers)


def portal_agents_get(*, user: AbstractBaseUser | AnonymousUser) -> list[PortalAgent]:
    """The enabled agents with their MCP servers and tools, by slug.

    Tools are the agent's exposed ones (enabled, available, on enabled servers), grouped by
    server name in name order.
    """
    agents: list[PortalAgent] = []
    for agent in agent_list_enabled():
        reason = agent_not_configured_reason(agent=agent, user=user)
        servers: dict[str, list[PortalTool]] = {}
        for tool in agent_tools_describe(agent=agent):
            servers.setdefault(tool["server"], []).append(
                PortalTool(
                    name=tool["name"],
                    tool=tool["tool"],
                    title=tool["title"] or tool["tool"],
                    description=tool["description"],
                    effect=tool["effect"],
                    requires_approval=tool["requires_approval"],
                )
            )
        agents.append(
            PortalAgent(
                slug=agent.slug,
                name=agent.name,
                description=agent.description,
                model=agent.model,
                configured=reason is None,
                not_configured_reason=reason,
                servers=[PortalServer(name=name, tools=tools) for name, tools in servers.items()],
            )
        )
    return agents


@dataclasses.dataclass(frozen=True)
class SessionRow:
    """One line of the sessions page; ``awaiting_approval`` when a tool call waits."""

    id: str
    title: str
    agent_slug: str
    agent_name: str
    owner: str
    status: str
    status_label: str
    awaiting_approval: bool
    created_at: Any
    updated_at: Any
    cost: str = "$0"
    usage_title: str = ""
    #: The caller owns it, so may rename it here.
    can_rename: bool = False
    archived: bool = False
    #: With a search: the message that matched (``session_search.MessageMatch``), or None.
    match: MessageMatch | None = None


@dataclasses.dataclass(frozen=True)
class SessionListPage:
    """One page of the sessions list with the filters that produced it.

    ``query`` holds the normalized filters (``search``, ``status``, ``agent``, ``ordering``,
    ``archived``: ``"1"`` to list archived sessions instead of the others);
    ``previous_query`` / ``next_query`` are ready-made query strings (``None`` at the ends).
    """

    rows: list[SessionRow]
    page: Page[AgentSession]
    total: int
    query: dict[str, str]
    show_owner: bool
    statuses: list[tuple[str, str]]
    agents: list[tuple[str, str]]
    orderings: list[tuple[str, str]]
    previous_query: str | None
    next_query: str | None


#: The ``archived`` values the sessions page reads as true: those DRF's ``BooleanField`` (the
#: API's ``GET /api/v1/sessions/?archived=``) reads as true, lower-cased.
ARCHIVED_TRUE = frozenset({"1", "true", "yes", "on"})


def session_list_page_get(
    *,
    user: AbstractBaseUser | AnonymousUser,
    search: str = "",
    status: str = "",
    agent: str = "",
    ordering: str = "",
    page: str | int = 1,
    page_size: int = SESSION_PAGE_SIZE,
    archived: str = "",
) -> SessionListPage:
    """Filter, sort and page the sessions ``user`` may read (``session_reads.session_list_visible``,
    from the Django index).

    Args:
        search: Case-insensitive substring of the title, the agent's slug or name.
        status: An index status of ``SESSION_STATUS_LABELS`` or ``awaiting_approval``;
            anything else means every status.
        agent: An agent slug; blank for every agent.
        ordering: A key of ``SESSION_ORDERING_LABELS``; anything else means the default
            (recently active first).
        page: 1-based; out-of-range or malformed values give the nearest valid page.
        archived: ``"1"`` or ``"true"`` (also ``"yes"``, ``"on"``, any case: what the API's
            ``archived`` takes as true): only archived sessions; anything else: only the
            others. The page's own links and form say ``"1"``.

    With a search, each row has the message that matched (``session_search``) as ``match``.
    """
    search = search.strip()[:200]
    archived = "1" if archived.strip().lower() in ARCHIVED_TRUE else ""
    statuses = [*SESSION_STATUS_LABELS.items(), (STATUS_AWAITING_APPROVAL, AWAITING_APPROVAL_LABEL)]
    status = status if status in dict(statuses) else ""
    ordering = ordering if ordering in SESSION_ORDERING_LABELS else SESSION_DEFAULT_ORDERING
    agent = agent.strip()[:64]
    sessions = session_list_visible(
        user=user, status=status, agent_slug=agent, search=search, ordering=ordering,
        archived=bool(archived),
    )
    paginator = Paginator(sessions, page_size)
    current = paginator.get_page(page)
    query = {
        "search": search, "status": status, "agent": agent, "ordering": ordering,
        "archived": archived,
    }
    words = search_words(search)
    matches = (
        message_matches_get(words=words, session_ids=[row.pk for row in current.object_list])
        if words
        else {}
    )

    def page_query(number: int) -> str:
        kept = {key: value for key, value in query.items() if value}
        if kept.get("ordering") == SESSION_DEFAULT_ORDERING:
            del kept["ordering"]
        return urlencode({**kept, "page": number})

    agent_choices = AgentDefinition.objects.order_by("slug").values_list("slug", "name")
    return SessionListPage(
        rows=[
            SessionRow(
                id=session.id,
                title=session.title or session.agent.name,
                agent_slug=session.agent.slug,
                agent_name=session.agent.name,
                owner=session.owner.get_username(),
                status=session.status,
                status_label=SESSION_STATUS_LABELS.get(session.status, session.status),
                awaiting_approval=bool(getattr(session, "pending_approval_count", 0)),
                created_at=session.created_at,
                updated_at=session.updated_at,
                cost=usd_display(session_row_usage(session)["cost_usd"]),
                usage_title=usage_title(session_row_usage(session)),
                can_rename=session.owner_id == user.pk,
                archived=session.archived_at is not None,
                match=matches.get(session.pk),
            )
            for session in current.object_list
        ],
        page=current,
        total=paginator.count,
        query=query,
        show_owner=_is_staff(user),
        statuses=statuses,
        agents=[(slug, name) for slug, name in agent_choices],
        orderings=list(SESSION_ORDERING_LABELS.items()),
        previous_query=page_query(current.previous_page_number())
        if current.has_previous()
        else None,
        next_query=page_query(current.next_page_number()) if current.has_next() else None,
    )


@dataclasses.dataclass(frozen=True)
class ChatPage:
    """What the chat page's template and module need before the snapshot arrives.

    ``status`` is the index status (the module replaces it with the snapshot's); ``model``
    is the agent definition's current model (the snapshot has the session's own).
    ``can_send``: the caller owns the session and it is not stopped; ``can_approve``: staff.
    """

    id: str
    title: str
    agent_slug: str
    agent_name: str
    model: str
    owner: str
    is_owner: bool
    status: str
    status_label: str
    can_send: bool
    can_approve: bool
    usage: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: Archived by its owner (still usable; hidden from the sessions list by default).
    archived: bool = False
    #: Subagents (issue 29): the session whose ``agent__<slug>`` call started this one, as
    #: ``(id, title)``, when the caller may read it; and that call's ID.
    parent: tuple[str, str] | None = None
    parent_tool_call_id: str = ""

    @property
    def can_delete(self) -> bool:
        """Its owner and staff may delete it."""
        return self.is_owner or self.can_approve

    @property
    def cost(self) -> str:
        """The session's recorded cost for display (``usd_display``)."""
        return usd_display(self.usage.get("cost_usd", "0"))

    @property
    def usage_title(self) -> str:
        """The session's tokens and calls in words (``usage_title``)."""
        return usage_title(self.usage)

    def client_config(self) -> dict[str, Any]:
        """The JSON the page module reads (through ``json_script``); no secrets."""
        return {
            "session": self.id,
            "status": self.status,
            "isOwner": self.is_owner,
            "owner": self.owner,
            "canSend": self.can_send,
            "canApprove": self.can_approve,
            "archived": self.archived,
            "statusLabels": SESSION_STATUS_LABELS,
        }


def chat_page_get(*, user: AbstractBaseUser | AnonymousUser, session_id: str) -> ChatPage:
    """The chat page of ``session_id`` for its owner or staff.

    Raises:
        AgentSession.DoesNotExist: No such session, or ``user`` neither owns it nor is staff
            (the page answers 404 either way).
    """
    session = session_get_for_owner_or_staff(user=user, session_id=session_id)
    is_owner = session.owner_id == user.pk
    rights = session_detail_extras(session=session, user=user)
    return ChatPage(
        id=session.id,
        title=session.title or session.agent.name,
        agent_slug=session.agent.slug,
        agent_name=session.agent.name,
        model=session.agent.model,
        owner=session.owner.get_username(),
        is_owner=is_owner,
        status=session.status,
        status_label=SESSION_STATUS_LABELS.get(session.status, session.status),
        can_send=rights["can_send"],
        can_approve=rights["can_approve"],
        usage=session_usage_totals(session_ids=[session.id]).get(session.id, {}),
        archived=session.archived_at is not None,
        parent=_parent_of(session=session, user=user),
        parent_tool_call_id=session.parent_tool_call_id,
    )


def _parent_of(
    *, session: AgentSession, user: AbstractBaseUser | AnonymousUser
) -> tuple[str, str] | None:
    """``(id, title)`` of the session that started ``session`` as a subagent, if ``user``
    may read it (a child has its parent's owner; staff read every session)."""
    if not session.parent_id:
        return None
    parent = AgentSession.objects.filter(pk=session.parent_id).select_related("agent").first()
    if parent is None or not (parent.owner_id == user.pk or getattr(user, "is_staff", False)):
        return None
    return parent.id, parent.title or parent.agent.name


def usage_title(usage: dict[str, Any]) -> str:
    """``"1,200 input tokens, 300 output tokens, 2 model calls"`` for a usage dict (the
    keys of ``AgentUsage.as_dict()``; missing ones count as zero)."""
    calls = int(usage.get("requests") or 0)
    return (
        f"{int(usage.get('input_tokens') or 0):,} input tokens, "
        f"{int(usage.get('output_tokens') or 0):,} output tokens, "
        f"{calls:,} model call{'' if calls == 1 else 's'}"
    )


@dataclasses.dataclass(frozen=True)
class UsagePage:
    """What the usage page shows: ``summary`` is ``usage_records.usage_summary`` (everyone's
    for staff, else the viewer's own) with display strings added (``cost`` and ``title`` on
    the totals, each day, agent and user); ``users`` is the per-user breakdown (staff only,
    else empty); ``chart`` is the JSON the page module draws (days and agents, costs as
    numbers of US dollars)."""

    everyone: bool
    date_from: str
    date_to: str
    summary: dict[str, Any]
    users: list[dict[str, Any]]
    chart: dict[str, Any]


def _displayed(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "cost": usd_display(row["cost_usd"]), "title": usage_title(row)}


def usage_page_get(
    *, user: AbstractBaseUser | AnonymousUser, date_from: datetime.date, date_to: datetime.date
) -> UsagePage:
    """The usage page between two UTC days (both included; the caller validated them)."""
    everyone = _is_staff(user)
    summary = usage_summary(
        owner_id=None if everyone else user.pk, date_from=date_from, date_to=date_to
    )
    shown = {
        **summary,
        "totals": _displayed(summary["totals"]),
        "days": [_displayed(day) for day in summary["days"]],
        "agents": [_displayed(agent) for agent in summary["agents"]],
    }
    users = (
        [_displayed(row) for row in usage_by_owner(date_from=date_from, date_to=date_to)]
        if everyone
        else []
    )
    chart = {
        "days": [
            {"day": day["day"], "cost": float(day["cost_usd"]), "tokens": day["input_tokens"]
             + day["output_tokens"]}
            for day in summary["days"]
        ],
        "agents": [
            {"agent": agent["name"] or agent["agent"], "cost": float(agent["cost_usd"]),
             "tokens": agent["input_tokens"] + agent["output_tokens"]}
            for agent in summary["agents"]
        ],
    }
    return UsagePage(
        everyone=everyone,
        date_from=summary["from"],
        date_to=summary["to"],
        summary=shown,
        users=users,
        chart=chart,
    )


#: How many of a user's latest approval emails the notification settings page lists.
NOTIFICATION_HISTORY_SIZE = 20


@dataclasses.dataclass(frozen=True)
class SentEmail:
    """One approval email to the viewer (an ``ApprovalNotification``) as the notification
    settings page lists it. ``state`` is ``sent``, ``queued`` (the Celery worker has not sent
    it yet), ``failed`` (``detail``: the mail server's last error; retried) or ``skipped``
    (``detail``: the approval was decided before it went out); ``session_id`` and
    ``tool_call_id`` link to the call."""

    kind: str
    tool: str
    session_id: str
    session_title: str
    tool_call_id: str
    created_at: datetime.datetime
    sent_at: datetime.datetime | None
    state: str
    detail: str


@dataclasses.dataclass(frozen=True)
class NotificationSettingsPage:
    """What ``/settings/notifications/`` shows: the viewer's choice (``email_on_approval``),
    the address emails go to (``email``, blank: none is set, so none are sent) and their
    latest ``NOTIFICATION_HISTORY_SIZE`` approval emails, newest first."""

    email_on_approval: bool
    email: str
    emails: list[SentEmail]


def _sent_email(notification: ApprovalNotification) -> SentEmail:
    request = notification.request
    if notification.sent_at is not None:
        state, detail = "sent", ""
    elif notification.last_error:
        failed = not notification.last_error.startswith("Not sent:")
        state, detail = ("failed" if failed else "skipped"), notification.last_error
    else:
        state, detail = "queued", ""
    return SentEmail(
        kind=notification.kind,
        tool=request.tool_name,
        session_id=request.session_id,
        session_title=request.session.title,
        tool_call_id=request.tool_call_id,
        created_at=notification.created_at,
        sent_at=notification.sent_at,
        state=state,
        detail=detail,
    )


def notification_settings_page_get(*, user: AbstractBaseUser) -> NotificationSettingsPage:
    """The notification settings page of ``user`` (the view admits staff only)."""
    preference = NotificationPreference.objects.filter(user_id=user.pk).first()
    notifications = (
        ApprovalNotification.objects.filter(user_id=user.pk)
        .select_related("request__session")
        .order_by("-created_at", "-id")[:NOTIFICATION_HISTORY_SIZE]
    )
    return NotificationSettingsPage(
        email_on_approval=bool(preference and preference.email_on_approval),
        email=str(getattr(user, "email", "") or ""),
        emails=[_sent_email(notification) for notification in notifications],
    )
