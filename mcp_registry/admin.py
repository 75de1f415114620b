"""Django admin for MCP servers and tools.

Only superusers may add, change or delete servers and tools: a server's command runs on
the worker machine, and a tool's overrides decide whether a write waits for approval.
Staff with the view permission may look.
"""

from typing import Any

from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest

from mcp_registry.models import McpServer, McpTool
from mcp_registry.services import server_discovery_enqueue


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

    @admin.display(description="quarantined because")
    def quarantine(self, obj: McpTool) -> str:
        return obj.quarantine_reason or "-"


class McpToolInline(SuperuserWriteMixin, ToolDecisionsMixin, admin.TabularInline):
    model = McpTool
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
        "timeout_override",
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
    )
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, *args: Any) -> bool:
        # Tools come from discovery, not from the form.
        return False


@admin.register(McpServer)
class McpServerAdmin(SuperuserWriteMixin, admin.ModelAdmin):
    list_display = (
        "name",
        "transport",
        "enabled",
        "trust_annotations",
        "last_discovered_at",
        "short_error",
        "last_error_at",
    )
    list_filter = ("transport", "enabled", "trust_annotations")
    search_fields = ("name",)
    readonly_fields = (
        "last_discovered_at",
        "last_error",
        "last_error_at",
        "created_at",
        "updated_at",
    )
    fieldsets = (
        (None, {"fields": ("name", "transport", "enabled", "trust_annotations")}),
        ("stdio", {"fields": ("command", "args", "cwd", "env_names")}),
        ("Streamable HTTP", {"fields": ("url", "header_env")}),
        ("Limits", {"fields": ("startup_timeout", "call_timeout", "retries")}),
        (
            "Discovery",
            {
                "fields": (
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

    @admin.display(description="last error")
    def short_error(self, obj: McpServer) -> str:
        return obj.last_error[:80]

    @admin.action(description="Discover tools (in the background)", permissions=["change"])
    def discover_tools(self, request: HttpRequest, queryset: QuerySet[McpServer]) -> None:
        for server in queryset:
            server_discovery_enqueue(server=server)
        self.message_user(
            request, f"Discovery queued for {queryset.count()} server(s).", messages.SUCCESS
        )


@admin.register(McpTool)
class McpToolAdmin(SuperuserWriteMixin, ToolDecisionsMixin, admin.ModelAdmin):
    list_display = (
        "exposed_name",
        "available",
        "enabled",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
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
        "parameters",
        "quarantine",
        "annotations",
        "available",
        "effective_effect",
        "effect_reason",
        "effective_requires_approval",
        "approval_reason",
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
        "timeout_override",
        "retries_override",
        "approval_deadline_override",
        "created_at",
        "updated_at",
    )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
