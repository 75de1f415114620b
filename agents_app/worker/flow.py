"""The platform's single shared agent session Flow (ARCHITECTURE.md, "One shared Flow").

Every session of every agent definition runs as one ``AgentSessionFlow`` of flow type
``AgentSession``; the session's start input carries a snapshot of its agent definition
(``AgentDefinition.agent_config()``), so a new or edited agent needs no worker restart.
"""

from __future__ import annotations

from collections.abc import Callable

from agents_app.conf import dexagents_setting
from agents_app.worker.runner import LiteLLMRunner
from dex_agents import (
    QUEUED_MESSAGES_BYTES,
    AgentSessionClient,
    AgentSessionFlow,
    AgentSessionObserver,
    AgentSessionOptions,
    CompactionOptions,
    SubagentDirectory,
    SubagentOptions,
    ToolEffect,
    TurnGuardCheck,
)
from mcp_registry.client import McpClientPool, McpServerSpec
from mcp_registry.content import MediaLimits

FLOW_TYPE = "AgentSession"


async def _resolve_server(name: str) -> McpServerSpec:
    """Load the registered MCP server ``name`` from the Django database.

    Raises:
        mcp_registry.models.McpServer.DoesNotExist: No enabled server has that name.
    """
    from asgiref.sync import sync_to_async

    from mcp_registry.selectors import server_spec_get

    return await sync_to_async(server_spec_get, thread_sensitive=False)(name=name)


async def _budget_check(owner_id: str | None, agent_slug: str) -> str | None:
    """``LiteLLMRunner``'s budget check: ``budgets.budget_refusal`` from the Django database."""
    from asgiref.sync import sync_to_async

    from agents_app.usage.budgets import budget_refusal

    return await sync_to_async(budget_refusal, thread_sensitive=False)(
        owner_id=owner_id, agent_slug=agent_slug
    )


async def _turn_guard(check: TurnGuardCheck) -> str | None:
    """``AgentSessionOptions.turn_guard``: a spent budget (``budgets.budget_refusal``) stops
    the turn right after the model call that crossed it, before its tool calls run. The
    observer has already indexed that call's usage, so the sum counts it."""
    config = check.agent_config or {}
    owner_id = config.get("owner_id")
    return await _budget_check(
        str(owner_id) if owner_id is not None else None, str(config.get("agent") or "")
    )


def build_flow(
    *,
    pool: McpClientPool | None = None,
    observer: AgentSessionObserver | None = None,
    session_client: Callable[[], AgentSessionClient] | None = None,
    subagents: SubagentDirectory | None = None,
) -> AgentSessionFlow:
    """Build the shared Flow.

    The web process builds it only to describe the Flow to its Dex client; the worker passes
    the MCP client pool its tool Steps call through and the observer that keeps the Django
    index current (``agents_app.sessions.session_index.SessionIndexObserver``).

    Args:
        pool: The worker's MCP client pool; ``None`` creates an idle one (clients never use it).
        observer: The Steps' session observer; ``None`` for clients.
        session_client: Returns the worker's session Flow client (the worker passes
            ``engine_connection.session_client``), through which a tool Step puts an MCP server's
            question to the user; ``None`` for clients (a server's question is declined).
        subagents: The platform's ``SubagentDirectory`` (the worker passes
            ``services.subagents.PlatformSubagents``): an agent's ``agent__<slug>`` calls run
            as child sessions, at most ``DEXAGENTS["SUBAGENT_MAX_DEPTH"]`` deep and
            ``DEXAGENTS["SUBAGENT_MAX_CHILDREN_PER_TURN"]`` per turn (issue 29); ``None`` for
            clients.

    Returns:
        An ``AgentSessionFlow`` with flow type ``AgentSession``. Tools the platform did not
        classify default to ``unclassified`` (single attempt, approval first). Its AgentEvents
        Stream budget is ``DEXAGENTS["EVENTS_STREAM_CAPACITY_BYTES"]``. Steering is on: a
        queued message can be steered into the running turn (``LiteLLMRunner`` appends
        ``AgentTurnContext.steered_messages`` to the model input); so are the built-in
        ``durable_wait`` and ``request_user_input`` tools, which every agent is offered, and
        plans (a ``plan_mode`` message plans with ``write_todos``; ``execute_plan`` runs it).
        Context compaction is on (``CompactionOptions`` defaults; an agent definition's
        ``context_window``, ``message_retention_limit`` and ``tool_result_max_chars`` override
        them through its ``agent_config``). Tool results' images go to models that accept
        them within ``DEXAGENTS["TOOL_IMAGE_MAX_BYTES"]`` and
        ``DEXAGENTS["TOOL_RESULT_IMAGES_MAX_BYTES"]``. A question an MCP server asks during a
        tool call waits for the session owner's answer (``elicitation_timeout_seconds`` of the
        ``agent_config``) through ``session_client``.
        Each model call is priced and checked against the owner's and the agent's budgets
        first (``agents_app.usage.budgets``), and a call that crossed a budget stops its turn
        before the tool calls it requested run (``turn_guard``).
    """
    runner = LiteLLMRunner(
        server_resolver=_resolve_server,
        pool=pool or McpClientPool(),
        media_limits=MediaLimits(
            image_max_bytes=dexagents_setting("TOOL_IMAGE_MAX_BYTES"),
            result_images_max_bytes=dexagents_setting("TOOL_RESULT_IMAGES_MAX_BYTES"),
        ),
        session_client=session_client,
        budget_check=_budget_check,
    )
    return AgentSessionFlow(
        runner,
        flow_type=FLOW_TYPE,
        options=AgentSessionOptions(
            default_tool_effect=ToolEffect.UNCLASSIFIED,
            agent_events_capacity_bytes=dexagents_setting("EVENTS_STREAM_CAPACITY_BYTES"),
            observer=observer,
            steering=True,
            durable_waits=True,
            user_input=True,
            plans=True,
            max_queued_messages=dexagents_setting("MAX_QUEUED_MESSAGES"),
            max_queued_bytes=QUEUED_MESSAGES_BYTES,
            compaction=CompactionOptions(),
            turn_guard=_turn_guard,
            subagents=(
                None
                if subagents is None
                else SubagentOptions(
                    subagents,
                    max_depth=int(dexagents_setting("SUBAGENT_MAX_DEPTH")),
                    max_children_per_turn=int(
                        dexagents_setting("SUBAGENT_MAX_CHILDREN_PER_TURN")
                    ),
                )
            ),
        ),
    )
