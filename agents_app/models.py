"""Agent definitions and the index of agent sessions.

Dex owns the conversation; ``AgentSession`` only indexes who owns which session of which
agent (ARCHITECTURE.md "Who owns which data"). Credentials are referenced by environment
variable name (``api_key_env``), never stored.
"""

from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from mcp_registry.models import McpTool

ENV_NAME_VALIDATOR = RegexValidator(
    r"^[A-Za-z_][A-Za-z0-9_]*$", "Enter an environment variable NAME, not a key."
)


if TYPE_CHECKING:
    from agents_app.providers import ProviderStatus


class AgentDefinition(models.Model):
    """An agent users can start sessions with: model, prompt and enabled tools.

    ``model`` is a LiteLLM model name such as ``openai/dexagents-demo``; a blank
    ``api_base`` means the provider's default endpoint.
    """

    slug = models.SlugField(max_length=64, unique=True)
    name = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    model = models.CharField(max_length=200, help_text="LiteLLM model, e.g. openai/gpt-4o-mini.")
    api_base = models.URLField(max_length=2000, blank=True, help_text="Blank: provider default.")
    api_key_env = models.CharField(
        max_length=200,
        blank=True,
        validators=[ENV_NAME_VALIDATOR],
        help_text="NAME of the worker environment variable holding the API key.",
    )
    system_prompt = models.TextField(blank=True)
    enabled = models.BooleanField(default=True)
    tools = models.ManyToManyField(McpTool, blank=True, related_name="agents")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("slug",)

    def __str__(self) -> str:
        return self.slug

    def exposed_tools(self) -> list[McpTool]:
        """The agent's tools a model may be offered: enabled and available, on enabled servers."""
        return list(
            self.tools.select_related("server")
            .filter(enabled=True, available=True, server__enabled=True)
            .order_by("server__name", "name")
        )

    def provider_status(self) -> "ProviderStatus":
        """Whether this agent's model provider can be called (its key variable is set, etc.).

        Read in the web process's environment, which is expected to match the worker's; see
        ``agents_app.providers.provider_status`` for the rules. Never raises.
        """
        from agents_app.providers import provider_status

        return provider_status(self.model, self.api_key_env or None, self.api_base or None)

    def agent_config(self) -> dict[str, Any]:
        """Snapshot this definition as the session's ``agent_config`` start input.

        Returns:
            ``{"agent", "model", "api_base" (or None), "api_key_env" (or None),
            "system_prompt", "tools": [{"name" (<server>__<tool>), "server", "tool",
            "description", "parameters" (JSON Schema), "effect", "requires_approval"}]}``.
            The snapshot travels in the Flow's start input, so later edits do not change
            a running session (ARCHITECTURE.md "One shared Flow").
        """
        return {
            "agent": self.slug,
            "model": self.model,
            "api_base": self.api_base or None,
            "api_key_env": self.api_key_env or None,
            "system_prompt": self.system_prompt,
            "tools": [
                {
                    "name": tool.exposed_name,
                    "server": tool.server.name,
                    "tool": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters or tool.input_schema,
                    "effect": tool.effective_effect,
                    "requires_approval": tool.effective_requires_approval,
                }
                for tool in self.exposed_tools()
            ],
        }


class AgentSession(models.Model):
    """The index row of one agent session; ``id`` is the Dex Flow ID (``ses_<uuid hex>``).

    ``status`` is the last AgentState status seen (``starting``,
    ``waiting_for_user_message``, ``running_model``, ``running_tools``); Dex has the truth.
    """

    id = models.CharField(primary_key=True, max_length=64, editable=False)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="agent_sessions"
    )
    agent = models.ForeignKey(AgentDefinition, on_delete=models.PROTECT, related_name="sessions")
    title = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=64, default="starting")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ("-created_at",)
        indexes = [models.Index(fields=("owner", "-created_at"), name="agent_session_owner_idx")]

    def __str__(self) -> str:
        return self.id


class ApprovalDecision(models.Model):
    """The audit row of one approval decision on a tool call of a session.

    Written only after Dex accepted the decision (``resolve_interrupt`` returned True), so the
    table lists decisions that took effect. ``arguments`` is the tool call's JSON text exactly
    as the model produced it; ``rejection_message`` is blank for approvals (seed "RPCs": an
    approval drops it). Rows outlive nothing they point at: sessions and deciders are
    protected, so users with an audit trail are deactivated rather than deleted.
    """

    session = models.ForeignKey(
        AgentSession, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    interrupt_id = models.CharField(max_length=255)
    tool_call_id = models.CharField(max_length=255)
    tool_name = models.CharField(max_length=255)
    arguments = models.TextField(blank=True, help_text="JSON text, as the model produced it.")
    approved = models.BooleanField()
    rejection_message = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="approval_decisions"
    )
    decided_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ("-decided_at",)
        constraints = [
            models.UniqueConstraint(
                fields=("session", "interrupt_id"), name="approval_decision_unique_interrupt"
            )
        ]

    def __str__(self) -> str:
        verdict = "approved" if self.approved else "rejected"
        return f"{self.session_id} {self.interrupt_id} {verdict}"
