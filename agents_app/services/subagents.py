"""Subagents on the platform (issue 29): the ``dex_agents.SubagentDirectory`` of the shared Flow.

An agent definition lists other agents (``AgentSubagent``); its ``agent_config`` snapshot
names them (``subagents``), the runner offers them as ``agent__<slug>`` tools, and the
session runs a call of one as a child session: a Dex sub-flow of the parent's
``CallSubagent`` Step (``dex_agents._subagent_steps``). This module is the platform's side:

- ``child_start`` (``subagent_session_index``) writes the child's index row before Dex starts
  it, keyed by the child's deterministic ID, so the worker's observer finds the row from the
  child's first Step on: owner = the parent's owner, ``parent`` and ``parent_tool_call_id``
  link the two; the child starts with its own agent's snapshot and policies;
- ``child_cancel`` stops a child whose parent call was cancelled or steered;
- ``child_finished`` marks the child ``stopped`` once its one turn's answer reached the parent
  (its Flow completed: no message can reach it any more).

It runs on the Dex worker's event loop; database work goes through ``sync_to_async``.

May import: the sessions index, the gateway, the worker side and the foundation.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from asgiref.sync import sync_to_async

from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STARTING,
    AgentDefinition,
    AgentSession,
    TitleSource,
)
from agents_app.sessions import approval_index, session_index
from agents_app.worker.titles import title_from_message
from dex_agents import (
    SUBAGENT_TOOL_PREFIX,
    AgentSessionStartInput,
    SubagentRefusedError,
    SubagentRequest,
    SubagentResult,
    subagent_tool_name,
)

logger = logging.getLogger(__name__)


def subagent_slugs(agent_config: Mapping[str, Any] | None) -> list[str]:
    """The slugs an ``agent_config`` snapshot offers as subagents, in order."""
    items = (agent_config or {}).get("subagents") or ()
    return [str(item["slug"]) for item in items if isinstance(item, Mapping) and item.get("slug")]


def subagent_session_index(*, request: SubagentRequest) -> AgentSessionStartInput:
    """Write the child's index row (idempotent, keyed by ``request.child_session_id``) and
    build its start input: its agent's ``agent_config`` snapshot with the parent's owner as
    ``owner_id``, and its tool policies.

    Raises:
        SubagentRefusedError: The parent is not indexed, or the agent is not one of the
            parent's subagents or is disabled or gone.
    """
    slug = request.tool_name.removeprefix(SUBAGENT_TOOL_PREFIX)
    if slug not in subagent_slugs(request.agent_config):
        raise SubagentRefusedError(f"{request.tool_name!r} is not an agent this one may call")
    parent = AgentSession.objects.filter(pk=request.parent_session_id).first()
    if parent is None:
        raise SubagentRefusedError("this session is not indexed, so it cannot start agents")
    agent = AgentDefinition.objects.filter(slug=slug, enabled=True).first()
    if agent is None:
        raise SubagentRefusedError(f"the agent {slug!r} is not available")
    config = agent.agent_config()
    config["owner_id"] = str(parent.owner_id)
    title = title_from_message(request.task.task)
    AgentSession.objects.get_or_create(
        pk=request.child_session_id,
        defaults={
            "owner_id": parent.owner_id,
            "agent": agent,
            "title": (title or agent.name)[:200],
            "title_source": TitleSource.MESSAGE if title else TitleSource.AGENT,
            "status": SESSION_STATUS_STARTING,
            "parent": parent,
            "parent_tool_call_id": request.tool_call_id,
        },
    )
    return AgentSessionStartInput(
        agent_config=config, tool_policies=dex_gateway.tool_policies_build(agent_config=config)
    )


def subagent_session_ended(*, child_session_id: str) -> None:
    """Mark the child ``stopped`` in the index (its Flow completed or was stopped) and
    withdraw any approval it left pending."""
    child = AgentSession.objects.filter(pk=child_session_id).first()
    if child is not None and session_index.session_stopped_index(session=child):
        approval_index.approvals_changed_notify()


class PlatformSubagents:
    """The shared Flow's ``SubagentDirectory`` (``dexworker`` passes it to ``build_flow``)."""

    def is_subagent_tool(self, agent_config: dict[str, Any] | None, tool_name: str) -> bool:
        """Whether the snapshot lists ``tool_name`` as one of its subagents."""
        return tool_name in {subagent_tool_name(slug) for slug in subagent_slugs(agent_config)}

    async def child_start(self, request: SubagentRequest) -> AgentSessionStartInput:
        """``subagent_session_index`` on a database thread."""
        return await sync_to_async(subagent_session_index, thread_sensitive=False)(
            request=request
        )

    async def child_cancel(self, child_session_id: str, reason: str) -> None:
        """Stop the child's Flow (a Flow already gone is fine) and index it stopped."""
        await dex_gateway.session_stop(session_id=child_session_id, reason=reason)
        await sync_to_async(subagent_session_ended, thread_sensitive=False)(
            child_session_id=child_session_id
        )

    async def child_finished(self, child_session_id: str, result: SubagentResult) -> None:
        """Index the child stopped: its Flow completed with ``result``."""
        logger.info("subagent %s finished: %s", child_session_id, result.outcome)
        await sync_to_async(subagent_session_ended, thread_sensitive=False)(
            child_session_id=child_session_id
        )
