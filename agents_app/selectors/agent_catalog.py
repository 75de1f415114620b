"""Reads of the agents users may start sessions with.

Owns the enabled agents (``agent_list_enabled``, ``agent_get_enabled``), why one cannot start
as a given user may read it (``agent_not_configured_reason``), and the tools a session of one
may use (``agent_tools_describe``).

May import: the foundation (tests/test_layering.py).
"""


from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from agents_app.models import AgentDefinition


def agent_list_enabled() -> QuerySet[AgentDefinition]:
    """Enabled agent definitions, by slug."""
    return AgentDefinition.objects.filter(enabled=True).order_by("slug")


def agent_get_enabled(*, slug: str) -> AgentDefinition:
    """Return the enabled agent ``slug``.

    Raises:
        AgentDefinition.DoesNotExist: No agent has that slug, or it is disabled.
    """
    return AgentDefinition.objects.get(slug=slug, enabled=True)


#: What the agents list and the portal tell non-staff about an unconfigured provider: the
#: provider check's own reason names environment variables, which only operators need.
NOT_CONFIGURED_FOR_USERS = "An administrator must configure its API key."


def agent_not_configured_reason(
    *, agent: AgentDefinition, user: AbstractBaseUser | AnonymousUser | None
) -> str | None:
    """Why ``agent`` cannot start, as ``user`` may read it: ``None`` when its provider is
    configured, the provider check's reason for staff, ``NOT_CONFIGURED_FOR_USERS`` otherwise."""
    status = agent.provider_status()
    if status.configured:
        return None
    return status.reason if getattr(user, "is_staff", False) else NOT_CONFIGURED_FOR_USERS


def agent_tools_describe(*, agent: AgentDefinition) -> list[dict[str, Any]]:
    """The tools a session of ``agent`` may use, for the portal.

    Returns:
        ``[{"name" (exposed), "server", "tool", "title", "description", "effect",
        "requires_approval"}]`` by server, then tool name.
    """
    return [
        {
            "name": tool.exposed_name,
            "server": tool.server.name,
            "tool": tool.name,
            "title": tool.title,
            "description": tool.description,
            "effect": tool.effective_effect,
            "requires_approval": tool.effective_requires_approval,
        }
        for tool in agent.exposed_tools()
    ]
