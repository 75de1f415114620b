"""App configuration for the MCP registry."""

from django.apps import AppConfig


class McpRegistryConfig(AppConfig):
    """Trusted MCP servers and their tools."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "mcp_registry"
    verbose_name = "MCP registry"
