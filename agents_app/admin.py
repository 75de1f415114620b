"""Django admin for agent definitions and the session index."""

from typing import Any

from django.contrib import admin
from django.db import models
from django.http import HttpRequest

from agents_app.models import AgentDefinition, AgentSession


@admin.register(AgentDefinition)
class AgentDefinitionAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "model", "enabled", "tool_count", "updated_at")
    list_filter = ("enabled",)
    search_fields = ("slug", "name", "model")
    filter_horizontal = ("tools",)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    readonly_fields = ("created_at", "updated_at")
    prepopulated_fields = {"slug": ("name",)}

    @admin.display(description="tools")
    def tool_count(self, obj: AgentDefinition) -> int:
        return obj.tools.count()


@admin.register(AgentSession)
class AgentSessionAdmin(admin.ModelAdmin):
    """Read-only: sessions are started through the API, and Dex holds their content."""

    list_display = ("id", "owner", "agent", "title", "status", "created_at")
    list_filter = ("status", "agent")
    list_select_related = ("owner", "agent")
    search_fields = ("id", "title", "owner__username")
    readonly_fields = ("id", "owner", "agent", "title", "status", "created_at", "updated_at")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
