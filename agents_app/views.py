"""The browser pages: portal, sessions, chat and the approvals dashboard.

Views check who may see the page, read what it shows from ``page_selectors`` and render a
template; the pages' ES modules (``static/agents_app/``) do the rest through the REST API and
the websockets. Anonymous visitors are sent to the login page; a session the user may not read
answers 404 like an unknown one; the approvals dashboard answers 403 to non-staff.
"""

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents_app import page_selectors
from agents_app.models import AgentSession


@require_GET
@login_required
def portal_view(request: HttpRequest) -> HttpResponse:
    """``/``: choose an agent, narrow its tools, write the first message, start."""
    agents = page_selectors.portal_agents_get(user=request.user)
    selectable = [agent for agent in agents if agent.configured]
    return render(
        request,
        "agents_app/portal.html",
        {
            "agents": agents,
            "selected": selectable[0] if selectable else None,
            "page_module": "agents_app/portal.mjs",
        },
    )


@require_GET
@login_required
def session_list_view(request: HttpRequest) -> HttpResponse:
    """``/sessions/``: the user's sessions (staff: everyone's), filtered, sorted and paged."""
    listing = page_selectors.session_list_page_get(
        user=request.user,
        search=request.GET.get("search", ""),
        status=request.GET.get("status", ""),
        agent=request.GET.get("agent", ""),
        ordering=request.GET.get("ordering", ""),
        page=request.GET.get("page", "1"),
    )
    return render(
        request,
        "agents_app/session_list.html",
        {"listing": listing, "page_module": "agents_app/session_list.mjs"},
    )


@require_GET
@login_required
def session_detail_view(request: HttpRequest, session_id: str) -> HttpResponse:
    """``/sessions/<id>/``: the chat page, for the session's owner or staff (others: 404)."""
    try:
        chat = page_selectors.chat_page_get(user=request.user, session_id=session_id)
    except AgentSession.DoesNotExist:
        raise Http404("No such session.") from None
    return render(
        request,
        "agents_app/chat.html",
        {"chat": chat, "client_config": chat.client_config(), "page_module": "agents_app/chat.mjs"},
    )


@require_GET
@login_required
def approvals_view(request: HttpRequest) -> HttpResponse:
    """``/approvals/`` (staff only): pending approvals of every session and the decisions."""
    if not request.user.is_staff:
        # Rendered here rather than raised: Django logs a raised PermissionDenied with its
        # whole traceback, and a user following a link is no server problem.
        return render(
            request,
            "agents_app/403.html",
            {"exception": "Only staff decide approvals."},
            status=403,
        )
    return render(
        request,
        "agents_app/approvals.html",
        {"page_module": "agents_app/approvals.mjs"},
    )
