"""Reads for the browser pages (HackSoft "selectors"): everything a page template shows.

Templates get plain dataclasses from here and run no queries of their own. Conversation
details (messages, live events, approvals) are not read here: the pages' ES modules load them
from the REST API and the websockets, which read Dex.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlencode

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.core.paginator import Page, Paginator
from django.db.models import Q, QuerySet

from agents_app.models import AgentDefinition, AgentSession
from agents_app.selectors import agent_list_enabled, session_get_for_owner_or_staff

# Shown to non-staff instead of the provider check's reason, which names environment
# variables that only operators need (the same rule as GET /api/v1/agents/).
NOT_CONFIGURED_FOR_USERS = "An administrator must configure its API key."

# Session index statuses (ARCHITECTURE.md "The Django index") with words for people.
SESSION_STATUS_LABELS: dict[str, str] = {
    "starting": "Starting",
    "waiting_for_user_message": "Waiting for a message",
    "running_model": "Model running",
    "running_tools": "Running tools",
    "stopped": "Stopped",
}

SESSION_ORDERINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "-updated_at": ("Recently active", ("-updated_at", "-created_at")),
    "-created_at": ("Newest first", ("-created_at",)),
    "created_at": ("Oldest first", ("created_at",)),
    "title": ("Title A to Z", ("title", "-created_at")),
    "agent": ("Agent", ("agent__slug", "-created_at")),
}
SESSION_DEFAULT_ORDERING = "-updated_at"
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
        status = agent.provider_status()
        reason: str | None = None
        if not status.configured:
            reason = status.reason if _is_staff(user) else NOT_CONFIGURED_FOR_USERS
        servers: dict[str, list[PortalTool]] = {}
        for tool in agent.exposed_tools():
            servers.setdefault(tool.server.name, []).append(
                PortalTool(
                    name=tool.exposed_name,
                    tool=tool.name,
                    title=tool.title or tool.name,
                    description=tool.description,
                    effect=tool.effective_effect,
                    requires_approval=tool.effective_requires_approval,
                )
            )
        agents.append(
            PortalAgent(
                slug=agent.slug,
                name=agent.name,
                description=agent.description,
                model=agent.model,
                configured=status.configured,
                not_configured_reason=reason,
                servers=[PortalServer(name=name, tools=tools) for name, tools in servers.items()],
            )
        )
    return agents


@dataclasses.dataclass(frozen=True)
class SessionRow:
    """One line of the sessions page."""

    id: str
    title: str
    agent_slug: str
    agent_name: str
    owner: str
    status: str
    status_label: str
    created_at: Any
    updated_at: Any


@dataclasses.dataclass(frozen=True)
class SessionListPage:
    """One page of the sessions list with the filters that produced it.

    ``query`` holds the normalized filters (``search``, ``status``, ``agent``, ``ordering``);
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


def _sessions_visible(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[AgentSession]:
    """The sessions ``user`` may read: staff every session, everyone else their own."""
    sessions = AgentSession.objects.select_related("agent", "owner")
    if _is_staff(user):
        return sessions
    return sessions.filter(owner_id=user.pk)


def session_list_page_get(
    *,
    user: AbstractBaseUser | AnonymousUser,
    search: str = "",
    status: str = "",
    agent: str = "",
    ordering: str = "",
    page: str | int = 1,
    page_size: int = SESSION_PAGE_SIZE,
) -> SessionListPage:
    """Filter, sort and page the sessions ``user`` may read, from the Django index.

    Args:
        search: Case-insensitive substring of the title, the agent's slug or name (staff:
            also the owner's username).
        status: One of ``SESSION_STATUS_LABELS``; anything else means every status.
        agent: An agent slug; blank for every agent.
        ordering: A key of ``SESSION_ORDERINGS``; anything else means the default
            (recently active first).
        page: 1-based; out-of-range or malformed values give the nearest valid page.
    """
    search = search.strip()[:200]
    status = status if status in SESSION_STATUS_LABELS else ""
    ordering = ordering if ordering in SESSION_ORDERINGS else SESSION_DEFAULT_ORDERING
    agent = agent.strip()[:64]
    staff = _is_staff(user)
    sessions = _sessions_visible(user=user)
    if search:
        matches = (
            Q(title__icontains=search)
            | Q(agent__slug__icontains=search)
            | Q(agent__name__icontains=search)
        )
        if staff:
            matches |= Q(owner__username__icontains=search)
        sessions = sessions.filter(matches)
    if status:
        sessions = sessions.filter(status=status)
    if agent:
        sessions = sessions.filter(agent__slug=agent)
    sessions = sessions.order_by(*SESSION_ORDERINGS[ordering][1])
    paginator = Paginator(sessions, page_size)
    current = paginator.get_page(page)
    query = {"search": search, "status": status, "agent": agent, "ordering": ordering}

    def page_query(number: int) -> str:
        kept = {key: value for key, value in query.items() if value}
        if kept.get("ordering") == SESSION_DEFAULT_ORDERING:
            del kept["ordering"]
        return urlencode({**kept, "page": number})

    agent_choices = list(
        AgentDefinition.objects.order_by("slug").values_list("slug", "name")
    )
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
                created_at=session.created_at,
                updated_at=session.updated_at,
            )
            for session in current.object_list
        ],
        page=current,
        total=paginator.count,
        query=query,
        show_owner=staff,
        statuses=list(SESSION_STATUS_LABELS.items()),
        agents=[(slug, name) for slug, name in agent_choices],
        orderings=[(key, label) for key, (label, _) in SESSION_ORDERINGS.items()],
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

    def client_config(self) -> dict[str, Any]:
        """The JSON the page module reads (through ``json_script``); no secrets."""
        return {
            "session": self.id,
            "status": self.status,
            "isOwner": self.is_owner,
            "owner": self.owner,
            "canSend": self.can_send,
            "canApprove": self.can_approve,
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
        can_send=is_owner and session.status != "stopped",
        can_approve=_is_staff(user),
    )
