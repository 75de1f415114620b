"""Reads of inbound triggers (issue 29): the trigger a delivery's URL names, and its URL.

May import: everything below the domain (tests/test_layering.py).
"""

from __future__ import annotations

from django.urls import reverse

from agents_app.conf import dexagents_setting
from agents_app.models import AgentTrigger


def trigger_get_enabled(*, agent_slug: str, name: str) -> AgentTrigger:
    """The enabled trigger ``name`` of the enabled agent ``agent_slug``, with its agent and
    run-as user.

    Raises:
        AgentTrigger.DoesNotExist: No such trigger, or it or its agent is disabled, or its
            run-as user is inactive (no sessions start for a deactivated account).
    """
    return AgentTrigger.objects.select_related("agent", "run_as").get(
        agent__slug=agent_slug, agent__enabled=True, name=name, enabled=True,
        run_as__is_active=True,
    )


def trigger_path(*, trigger: AgentTrigger) -> str:
    """The path deliveries of ``trigger`` are POSTed to: ``/api/v1/agents/<slug>/triggers/
    <name>/``."""
    return reverse(
        "agents_api:agent-trigger", kwargs={"slug": trigger.agent.slug, "name": trigger.name}
    )


def trigger_url(*, trigger: AgentTrigger) -> str:
    """``trigger_path`` as a full URL on ``DEXAGENTS_PUBLIC_URL`` (the site's address as
    people, and so the senders of events, reach it)."""
    return str(dexagents_setting("PUBLIC_URL")).rstrip("/") + trigger_path(trigger=trigger)
