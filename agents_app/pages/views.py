"""The browser pages: portal, sessions, chat, the approvals dashboard, usage and the staff
notification settings.

Views check who may see the page, read what it shows from ``page_selectors`` and render a
template; the pages' ES modules (``static/agents_app/``) do the rest through the REST API and
the websockets. Anonymous visitors are sent to the login page; a session the user may not read
answers 404 like an unknown one; the approvals dashboard and the notification settings answer
403 to non-staff.
"""

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents_app.api.usage import UsageRangeSerializer
from agents_app.models import AgentSession
from agents_app.pages import page_selectors


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
        archived=request.GET.get("archived", ""),
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


def _staff_only(request: HttpRequest, reason: str) -> HttpResponse:
    # Rendered here rather than raised: Django logs a raised PermissionDenied with its
    # whole traceback, and a user following a link is no server problem.
    return render(request, "agents_app/403.html", {"exception": reason}, status=403)


@require_GET
@login_required
def approvals_view(request: HttpRequest) -> HttpResponse:
    """``/approvals/`` (staff only): pending approvals of every session and the decisions."""
    if not request.user.is_staff:
        return _staff_only(request, "Only staff decide approvals.")
    return render(
        request,
        "agents_app/approvals.html",
        {"page_module": "agents_app/approvals.mjs"},
    )


@require_GET
@login_required
def usage_view(request: HttpRequest) -> HttpResponse:
    """``/usage/``: model usage and cost per day and per agent (and per user for staff, who
    see everyone's; others see their own), over ``?from=&to=`` UTC days (default: the last
    30). Bad dates show their messages and the default range."""
    query = UsageRangeSerializer(data=request.GET)
    errors: dict[str, Any] = {}
    if query.is_valid():
        first, last = query.validated_data["from"], query.validated_data["to"]
    else:
        errors = {key: " ".join(str(m) for m in messages) for key, messages in query.errors.items()}
        fallback = UsageRangeSerializer(data={})
        fallback.is_valid(raise_exception=True)
        first, last = fallback.validated_data["from"], fallback.validated_data["to"]
    usage = page_selectors.usage_page_get(user=request.user, date_from=first, date_to=last)
    return render(
        request,
        "agents_app/usage.html",
        {
            "usage": usage,
            "errors": errors,
            "chart_data": usage.chart,
            "page_module": "agents_app/usage.mjs",
        },
        status=400 if errors else 200,
    )


@require_GET
@login_required
def notification_settings_view(request: HttpRequest) -> HttpResponse:
    """``/settings/notifications/`` (staff only): turn approval emails on or off (the page
    module saves with ``PUT /api/v1/me/notifications/``), the address they go to, and the
    approval emails sent lately."""
    if not request.user.is_staff:
        return _staff_only(request, "Only staff are told about approvals.")
    settings_page = page_selectors.notification_settings_page_get(user=request.user)
    return render(
        request,
        "agents_app/notification_settings.html",
        {"settings": settings_page, "page_module": "agents_app/notification_settings.mjs"},
    )
