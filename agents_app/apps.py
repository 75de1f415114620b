"""App configuration for agents."""

from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    """Agent definitions, sessions and the REST API."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "agents_app"
    verbose_name = "Agents"

    def ready(self) -> None:
        """Connect the budget signals (``budgets.budget_changed``)."""
        from agents_app import budgets  # noqa: F401
