"""The browser pages: portal, sessions, chat, the approvals dashboard, usage, the staff
notification settings and schedules.

Views check who may see the page, read what it shows from ``page_selectors`` and render a
template; the pages' ES modules (``static/agents_app/``) do the rest through the REST API and
the websockets. Anonymous visitors are sent to the login page; a session the user may not read
answers 404 like an unknown one; the approvals dashboard and the notification settings answer
403 to non-staff.
"""

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents_app.api.usage import UsageRangeSerializer
from agents_app.models import AgentDefinition, AgentSession, Schedule, ScheduleTarget
from agents_app.pages import page_selectors
from agents_app.selectors import agent_catalog
from agents_app.selectors import schedules as schedule_reads
from agents_app.services import schedules as schedule_writes


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


# --- Schedules (issue 29) -------------------------------------------------------------------


@require_GET
@login_required
def schedule_list_view(request: HttpRequest) -> HttpResponse:
    """``/schedules/``: the user's schedules with their agent, times, target, status, next
    run and last run's outcome; pause and resume (``schedule_enabled_view``)."""
    rows = [
        {"schedule": schedule, "next_runs": schedule_reads.schedule_next_runs(
            schedule=schedule, count=1),
         "last_outcome": schedule_reads.schedule_outcome_text(
             getattr(schedule, "last_outcome", None))}
        for schedule in schedule_reads.schedule_list(owner=request.user)
    ]
    return render(request, "agents_app/schedule_list.html", {"rows": rows})


@require_POST
@login_required
def schedule_enabled_view(request: HttpRequest, schedule_id: int) -> HttpResponse:
    """``POST /schedules/<id>/enabled/`` ``enabled=true|false``: resume or pause one of the
    user's schedules, then back to the list; 404 for anyone else's."""
    schedule = _own_schedule(request, schedule_id)
    schedule_writes.schedule_enabled_set(
        schedule=schedule, enabled=request.POST.get("enabled") == "true"
    )
    return redirect("pages:schedule-list")


def _own_schedule(request: HttpRequest, schedule_id: int) -> Schedule:
    """The user's schedule ``schedule_id``; 404 for anyone else's."""
    try:
        return schedule_reads.schedule_get(owner=request.user, schedule_id=schedule_id)
    except Schedule.DoesNotExist:
        raise Http404("No such schedule") from None


@require_http_methods(["GET", "POST"])
@login_required
def schedule_form_view(request: HttpRequest, schedule_id: int | None = None) -> HttpResponse:
    """``/schedules/new/`` and ``/schedules/<id>/edit/``: create or edit a schedule. The
    form posts here and is validated by ``services.schedules`` (field messages shown beside
    their fields); the page module previews the next 5 run times as the user types
    (``POST /api/v1/schedules/preview/``), and the page shows them after a submit too. An
    existing schedule's page also lists its newest runs (``schedule_runs_recent``)."""
    schedule = _own_schedule(request, schedule_id) if schedule_id is not None else None
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        form = {name: request.POST.get(name, "").strip() for name in (
            "agent", "name", "message", "cron", "interval_seconds", "timezone", "target",
            "session", "missed_run_policy")}
        form["message"] = request.POST.get("message", "")
        form["enabled"] = "true" if request.POST.get("enabled") else ""
        values: dict[str, Any] = {
            "agent": AgentDefinition.objects.filter(slug=form["agent"]).first(),
            "name": form["name"], "message": form["message"], "cron": form["cron"],
            "timezone": form["timezone"] or "UTC", "target": form["target"],
            "missed_run_policy": form["missed_run_policy"], "enabled": bool(form["enabled"]),
            "session": None, "interval_seconds": None,
        }
        if form["interval_seconds"]:
            try:
                values["interval_seconds"] = int(form["interval_seconds"])
            except ValueError:
                errors["interval_seconds"] = ["Give a whole number of seconds."]
        if form["target"] == ScheduleTarget.SESSION and form["session"]:
            values["session"] = AgentSession.objects.filter(pk=form["session"]).first()
            if values["session"] is None:
                errors["session"] = ["Choose one of your own sessions of the schedule's agent."]
        if not errors:
            try:
                if schedule is None:
                    schedule_writes.schedule_create(owner=request.user, **values)
                else:
                    schedule_writes.schedule_update(schedule=schedule, **values)
            except schedule_writes.ScheduleValidationError as error:
                errors = error.errors
            else:
                return redirect("pages:schedule-list")
    elif schedule is not None:
        form = {
            "agent": schedule.agent.slug, "name": schedule.name, "message": schedule.message,
            "cron": schedule.cron, "interval_seconds": str(schedule.interval_seconds or ""),
            "timezone": schedule.timezone, "target": schedule.target,
            "session": schedule.session_id or "", "missed_run_policy": schedule.missed_run_policy,
            "enabled": "true" if schedule.enabled else "",
        }
    else:
        form = {"agent": "", "name": "", "message": "", "cron": "0 9 * * 1-5",
                "interval_seconds": "", "timezone": "UTC", "target": "new_session",
                "session": "", "missed_run_policy": "skip", "enabled": "true"}
    interval = form["interval_seconds"]
    preview = schedule_reads.schedule_preview(
        cron=form["cron"],
        interval_seconds=int(interval) if interval.isdigit() else None,
        timezone=form["timezone"] or "UTC",
    )
    return render(
        request,
        "agents_app/schedule_form.html",
        {
            "schedule": schedule,
            "form": form,
            "errors": errors,
            "preview": preview,
            "agents": agent_catalog.agent_list_enabled(),
            "sessions": schedule_reads.schedule_sessions_choosable(owner=request.user),
            "runs": (
                schedule_reads.schedule_runs_recent(schedule=schedule)
                if schedule is not None else []
            ),
            "runs_limit": schedule_reads.RECENT_RUNS,
            "page_module": "agents_app/schedule_form.mjs",
        },
        status=400 if errors else 200,
    )
