"""Django admin for MCP servers and tools.

Only superusers may add, change or delete servers and tools: a server's command runs on
the worker machine, and a tool's overrides decide whether a write waits for approval.
Staff with the view permission may look.

A server's page shows its processes as the Dex workers last reported them (state, PIDs,
scope, restarts, how a crashed one ended and the last lines of its stderr;
``McpServerProcess``), the HTTP sessions workers hold open, what its isolation level lets
cross between sessions, and the time and outcome of its last discovery. Saving an enabled
server queues its tool discovery (``services.server_save``) and says so; saving a stdio
server whose command is not found on this machine warns.

Every tool shows its effective effect, approval, timeout and attempts with the rule or
setting that decided each (``mcp_registry.effects``); a tool's page adds the limit of each
attempt's Dex Step. The help texts of the limits say what they mean here, so no migration
is needed to reword them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.options import IS_POPUP_VAR
from django.db import models
from django.db.models import QuerySet
from django.forms import ModelForm
from django.http import HttpRequest, HttpResponse
from django.utils import formats, timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from mcp_registry.client import exit_status_text
from mcp_registry.effects import STEP_TIMEOUT_MARGIN_SECONDS
from mcp_registry.models import ISOLATION_CROSSES, McpServer, McpServerProcess, McpTool
from mcp_registry.services import server_discovery_enqueue, server_save

#: Processes a server's page lists (running first, then the newest ended).
PROCESSES_SHOWN = 10


def _when(moment: datetime) -> str:
    return formats.date_format(timezone.localtime(moment), "DATETIME_FORMAT")


def process_describe(process: McpServerProcess, *, short: bool = False) -> str:
    """One line for a process: ``exited with code 3, PID 41 (guard 40), 1 restart, for
    session ses_1, on worker host:12``; ``short`` leaves out the guard, the scope and the
    worker (the server list)."""
    if process.state == McpServerProcess.State.EXITED:
        parts = [exit_status_text(process.exit_code)]
    else:
        parts = [process.get_state_display()]
    if process.server_pid is not None:
        guard = f" (guard {process.guard_pid})" if process.guard_pid and not short else ""
        parts.append(f"PID {process.server_pid}{guard}")
    parts.append(f"{process.restarts} restart{'' if process.restarts == 1 else 's'}")
    if not short:
        parts.append(f"for {process.scope}" if process.scope != "shared" else "shared")
        parts.append(f"on worker {process.worker}")
    return ", ".join(parts)


def processes_summarize(processes: list[McpServerProcess]) -> str:
    """The server list's short form: how many run, and the newest crash or failed start
    (``2 running; last crash: exited with code 3 at <time>``)."""
    live = [p for p in processes if p.state in (p.State.STARTING, p.State.RUNNING)]
    parts = [f"{len(live)} running"]
    ended = [
        p for p in processes if p.state in (p.State.EXITED, p.State.FAILED) and p.ended_at
    ]
    if ended:
        last = max(ended, key=lambda process: process.ended_at or process.updated_at)
        what = (
            exit_status_text(last.exit_code)
            if last.state == McpServerProcess.State.EXITED
            else "failed to start"
        )
        parts.append(f"last crash: {what} at {_when(last.ended_at or last.updated_at)}")
    return "; ".join(parts)


def discovery_describe(server: McpServer) -> str:
    """``"never"``, ``"ok at <time>, N tools"`` or ``"failed at <time>: <first line>"``."""
    when, succeeded = server.last_discovery
    if when is None:
        return "never"
    stamp = _when(when)
    if succeeded:
        count = sum(1 for tool in server.tools.all() if tool.available)
        return f"ok at {stamp}, {count} tool{'' if count == 1 else 's'} available"
    return f"failed at {stamp}: {server.last_error.splitlines()[0] if server.last_error else ''}"


def timeout_describe(tool: McpTool) -> str:
    """``"5 s (tool override)"`` or ``"60 s (server call timeout)"``."""
    decision = tool.timeout_decision
    return f"{decision.value} s ({decision.reason})"


def attempts_describe(tool: McpTool) -> str:
    """``"3 attempts (server retries 2)"``, ``"1 attempt (retries override 0)"`` or ``"1 attempt
    (non_idempotent_write calls are never retried)"``."""
    decision = tool.attempts_decision
    return f"{decision.value} attempt{'' if decision.value == 1 else 's'} ({decision.reason})"


def step_limit_describe(tool: McpTool) -> str:
    """``"45 s per attempt: 5 s call + 30 s server startup + 10 s margin"``."""
    return (
        f"{tool.step_timeout} s per attempt: {tool.effective_timeout} s call + "
        f"{tool.server.startup_timeout} s server startup + {STEP_TIMEOUT_MARGIN_SECONDS} s margin"
    )


class McpServerForm(ModelForm):
    """The server form, with help texts that say what the limits do (the admin adds the
    other fields of its fieldsets)."""

    class Meta:
        model = McpServer
        fields = ("startup_timeout", "call_timeout", "retries")
        help_texts = {
            "startup_timeout": (
                "Seconds allowed to start the server (or reach it) and finish the MCP "
                "handshake."
            ),
            "call_timeout": (
                "Seconds one tool call may take, for tools without their own timeout. A call "
                "that takes longer gets no answer, like a dropped connection."
            ),
            "retries": (
                "Extra attempts after the first for read and idempotent_write calls that get "
                "no answer (the server cannot be started or reached, drops the connection, or "
                "times out): 2 means up to 3 attempts. A tool may set its own. "
                "non_idempotent_write and unclassified calls are never retried, and an error "
                "the tool itself returns goes to the model without a retry."
            ),
        }


class McpToolForm(ModelForm):
    """The tool form, with help texts that say what the overrides do (the admin adds the
    other fields it shows)."""

    class Meta:
        model = McpTool
        fields = ("timeout_override", "retries_override")
        help_texts = {
            "timeout_override": (
                "Seconds one call of this tool may take. Empty: the server's call timeout."
            ),
            "retries_override": (
                "Extra attempts after the first when a call gets no answer; read and "
                "idempotent_write tools only. Empty: the server's retries."
            ),
        }


class SuperuserWriteMixin:
    """Allow add, change and delete to superusers only."""

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_superuser

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return request.user.is_active and request.user.is_superuser


class ToolDecisionsMixin:
    """Read-only columns that show what a tool does, whether it waits, and why."""

    @admin.display(description="effective effect")
    def effective_effect(self, obj: McpTool) -> str:
        return obj.effective_effect

    @admin.display(description="effect decided by")
    def effect_reason(self, obj: McpTool) -> str:
        return obj.effect_decision.reason

    @admin.display(description="requires approval", boolean=True)
    def effective_requires_approval(self, obj: McpTool) -> bool:
        return obj.effective_requires_approval

    @admin.display(description="approval decided by")
    def approval_reason(self, obj: McpTool) -> str:
        return obj.approval_decision.reason

    @admin.display(description="timeout per call")
    def effective_timeout(self, obj: McpTool) -> str:
        return timeout_describe(obj)

    @admin.display(description="attempts")
    def effective_attempts(self, obj: McpTool) -> str:
        return attempts_describe(obj)

    @admin.display(description="quarantined because")
    def quarantine(self, obj: McpTool) -> str:
        return obj.quarantine_reason or "-"


class McpToolInline(SuperuserWriteMixin, ToolDecisionsMixin, admin.TabularInline):
    model = McpTool
    form = McpToolForm
    extra = 0
    can_delete = False
    fields = (
        "exposed_name",
        "available",
        "quarantine",
        "enabled",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
        "effect_override",
        "requires_approval_override",
        "effective_timeout",
        "timeout_override",
        "effective_attempts",
        "retries_override",
    )
    readonly_fields = (
        "exposed_name",
        "available",
        "quarantine",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
        "effective_timeout",
        "effective_attempts",
    )
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        # Tools come from discovery, not from the form.
        return False


@admin.register(McpServer)
class McpServerAdmin(SuperuserWriteMixin, admin.ModelAdmin):
    form = McpServerForm
    list_display = (
        "name",
        "enabled",
        "isolation_level",
        "process_summary",
        "last_discovery",
        "short_error",
        "transport",
        "trust_annotations",
    )
    list_filter = ("transport", "enabled", "trust_annotations")
    search_fields = ("name",)
    readonly_fields = (
        "last_discovery",
        "last_discovered_at",
        "last_error",
        "last_error_at",
        "process_table",
        "isolation_effect",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("name", "transport", "enabled", "trust_annotations")}),
        ("stdio", {"fields": ("command", "args", "cwd", "env_names", "env_values")}),
        ("Streamable HTTP", {"fields": ("url", "header_env")}),
        ("Limits", {"fields": ("startup_timeout", "call_timeout", "retries")}),
        ("Isolation", {"fields": ("isolation", "isolation_effect", "idle_timeout")}),
        ("Processes", {"fields": ("process_table",)}),
        (
            "Discovery",
            {
                "fields": (
                    "last_discovery",
                    "last_discovered_at",
                    "last_error",
                    "last_error_at",
                    "created_at",
                    "updated_at",
                )
            },
        ),
    )
    inlines = (McpToolInline,)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    actions = ("discover_tools",)

    def get_queryset(self, request: HttpRequest) -> QuerySet[McpServer]:
        return (
            super().get_queryset(request).prefetch_related("processes", "tools", "http_sessions")
        )

    def save_model(
        self, request: HttpRequest, obj: McpServer, form: ModelForm[McpServer], change: bool
    ) -> None:
        for problem in server_save(server=obj).command_problems:
            self.message_user(
                request,
                f"Saved, but {problem} on this machine: the worker will not be able to start "
                "it unless its machine has it.",
                messages.WARNING,
            )

    def response_add(
        self, request: HttpRequest, obj: McpServer, post_url_continue: str | None = None
    ) -> HttpResponse:
        response = super().response_add(request, obj, post_url_continue)
        self._discovery_message(request, obj)
        return response

    def response_change(self, request: HttpRequest, obj: McpServer) -> HttpResponse:
        response = super().response_change(request, obj)
        self._discovery_message(request, obj)
        return response

    def _discovery_message(self, request: HttpRequest, obj: McpServer) -> None:
        """Follow Django's "saved successfully" with what ``server_save`` did about discovery."""
        if IS_POPUP_VAR in request.POST:
            return
        if obj.enabled:
            self.message_user(
                request,
                f"Discovery of the tools of “{obj.name}” is queued: it runs in the background, "
                "and the server's last discovery shows the outcome once it ends.",
                messages.SUCCESS,
            )
        else:
            self.message_user(
                request,
                f"“{obj.name}” is disabled, so its tools are not discovered.",
                messages.INFO,
            )

    @admin.display(description="last error")
    def short_error(self, obj: McpServer) -> str:
        return obj.last_error[:80]

    @admin.display(description="last discovery")
    def last_discovery(self, obj: McpServer) -> str:
        return discovery_describe(obj)

    @admin.display(description="isolation", ordering="isolation")
    def isolation_level(self, obj: McpServer) -> str:
        return obj.isolation

    @admin.display(description="what crosses between agent sessions")
    def isolation_effect(self, obj: McpServer) -> SafeString:
        current = obj.isolation or McpServer.Isolation.SESSION
        return format_html_join(
            "",
            "<p>{}<strong>{}</strong>: {}</p>",
            (
                ("\u2192 " if level == current else "", level, text)
                for level, text in ISOLATION_CROSSES.items()
            ),
        )

    @admin.display(description="processes")
    def process_summary(self, obj: McpServer) -> str:
        if obj.transport != McpServer.Transport.STDIO:
            count = len(obj.http_sessions.all())
            return f"{count} HTTP session{'' if count == 1 else 's'} open"
        processes = list(obj.processes.all())
        if not processes:
            return "not started by a worker"
        return processes_summarize(processes)

    @admin.display(description="processes (as the Dex workers last reported them)")
    def process_table(self, obj: McpServer) -> SafeString | str:
        if obj.pk is None:
            return "-"
        if obj.transport != McpServer.Transport.STDIO:
            sessions = list(obj.http_sessions.all())
            if not sessions:
                return "No worker holds an HTTP session with this server."
            return format_html_join(
                "",
                "<p>Mcp-Session-Id {} for {}, opened {} by worker {}</p>",
                (
                    (row.session_id, row.scope, _when(row.opened_at), row.worker)
                    for row in sessions
                ),
            )
        processes = list(obj.processes.all())
        if not processes:
            return "No worker has started this server yet."
        # Running ones first, then the newest ended ones: one process per session adds up.
        processes.sort(
            key=lambda process: (process.ended_at is not None, -process.updated_at.timestamp())
        )
        shown, hidden = processes[:PROCESSES_SHOWN], len(processes) - PROCESSES_SHOWN
        more = (
            format_html("<p>and {} older ended processes.</p>", hidden) if hidden > 0 else ""
        )
        return format_html_join(
            "",
            '<section class="mcp-process"><p><strong>{}</strong></p>'
            "<p>started {}, {}; reported {}</p>{}{}</section>",
            (
                (
                    process_describe(process),
                    _when(process.started_at),
                    f"ended {_when(process.ended_at)}" if process.ended_at else "still alive",
                    _when(process.updated_at),
                    format_html("<p>{}</p>", process.error) if process.error else "",
                    format_html(
                        "<p>Last lines of its stderr:</p><pre>{}</pre>", process.stderr_tail
                    )
                    if process.stderr_tail
                    else format_html("<p>{}</p>", "Nothing on stderr."),
                )
                for process in shown
            ),
        ) + more

    @admin.action(description="Discover tools (in the background)", permissions=["change"])
    def discover_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            server_discovery_enqueue(server=server)
        self.message_user(
            request, f"Discovery queued for {queryset.count()} server(s).", messages.SUCCESS
        )


@admin.register(McpTool)
class McpToolAdmin(SuperuserWriteMixin, ToolDecisionsMixin, admin.ModelAdmin):
    form = McpToolForm
    list_display = (
        "exposed_name",
        "available",
        "enabled",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
        "effective_timeout",
        "effective_attempts",
        "quarantine",
    )
    list_filter = ("server", "enabled", "available", "effect_override")
    list_select_related = ("server",)
    search_fields = ("name", "exposed_name", "server__name", "description")
    readonly_fields = (
        "server",
        "name",
        "exposed_name",
        "title",
        "description",
        "input_schema",
        "output_schema",
        "parameters",
        "quarantine",
        "annotations",
        "available",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
        "effective_timeout",
        "effective_attempts",
        "step_limit",
        "created_at",
        "updated_at",
    )
    fields = (
        "server",
        "name",
        "exposed_name",
        "title",
        "description",
        "input_schema",
        "output_schema",
        "parameters",
        "quarantine",
        "annotations",
        "available",
        "enabled",
        "effective_effect",
        "effect_reason",
        "effect_override",
        "effective_requires_approval",
        "approval_reason",
        "requires_approval_override",
        "effective_timeout",
        "timeout_override",
        "effective_attempts",
        "retries_override",
        "step_limit",
        "approval_deadline_override",
        "created_at",
        "updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.display(description="Dex Step limit")
    def step_limit(self, obj: McpTool) -> str:
        return step_limit_describe(obj)
