"""App configuration for agents."""

from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """Agent definitions, sessions and the REST API."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "agents_app"
    verbose_name = "Agents"

    def ready(self) -> None:
        """Connect the app's signal receivers (``agents_app.signals``)."""
        from agents_app import signals  # noqa: F401
