"""The agent definition a session carries, as the LiteLLM runner reads it (``AgentModelConfig``).

Each session carries a snapshot of its agent definition as ``agent_config`` (a plain dict, read
through ``turn.agent_config`` and ``call.agent_config``)::

    {"agent": "demo", "model": "openai/dexagents-demo",
     "api_base": "http://127.0.0.1:8811/v1" or None, "api_key_env": "DEMO_MODEL_API_KEY" or None,
     "system_prompt": "...",
     "tools": [{"name": "search__web_search", "server": "search", "tool": "web_search",
                "description": "...", "parameters": {...JSON schema...},
                "effect": "read", "requires_approval": False,
                # optional, absent from older sessions' snapshots (issue 23):
                "timeout_seconds": 60,       # the MCP request timeout of one call
                "retries": 2, "step_timeout_seconds": 100}],  # for the session's ToolPolicy
     # optional:
     "context_window": 128000,      # tokens; default: LiteLLM's model information
     "api": "chat" | "responses" | None,   # None = auto: Responses for ``openai/`` models
                                           # with no custom api_base, Chat Completions otherwise
     "stream": True,                # False makes one whole (non-streamed) call
     "reasoning_effort": "low" | "medium" | "high" | None,
     "supports_images": True | False | None,  # None: LiteLLM's model information
     # context compaction (the platform Flow compacts; see dex_agents._compaction):
     "tool_result_max_chars": 4000, # a longer tool result is cut in the model input (the
                                    # stored copy stays whole up to
                                    # TOOL_RESULT_MAX_STORED_BYTES); default: a quarter of the
                                    # context window (4 characters a token), else 100,000
     "compaction_model": "openai/gpt-4o-mini",  # the summarizer's model; default: "model"
     "message_retention_limit": 2000,           # read by the session, not the runner
     "compaction_trigger_fraction": 0.85, "compaction_keep_fraction": 0.10,
     # whom MCP requests are made for (a server's "user" isolation): the session owner's ID
     "owner_id": "7",
     # seconds a user may take to answer an MCP server's question (elicitation); default 600
     "elicitation_timeout_seconds": 600,
     # optional: USD per million tokens, decimal strings; they replace LiteLLM's cost map
     # for this agent (agents_app.usage.pricing)
     "input_price_per_mtok": "0.15", "output_price_per_mtok": "0.60"}

A model call offers the tools of ``tools`` plus the read-only built-ins of the agent's servers
(``mcp_registry.builtin_tools``) and the session's own tools (``durable_wait``,
``request_user_input``, ``write_todos``), as the turn's mode allows
(``AgentModelConfig.for_turn_mode``).

Keys come from the worker's environment at call time (``agents_app.providers``); they are never
stored, logged, or left in an error message.

May import: ``agents_app.providers``, ``agents_app.usage.pricing``, ``dex_agents`` and
``mcp_registry``; no other module of the worker.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from agents_app.providers import (
    LOCAL_SERVER_KEY,
    ModelApi,
    ProviderNotConfiguredError,
    choose_api,
    context_window,
    resolve_api_key,
    supports_images,
)
from agents_app.usage.pricing import PriceConfigError, config_price
from dex_agents import (
    WRITE_TODOS_TOOL,
    ToolEffect,
    TurnMode,
    durable_wait_definition,
    request_user_input_definition,
    subagent_tool_name,
    subagent_tool_parameters,
    write_todos_definition,
)
from mcp_registry.builtin_tools import BUILTIN_TOOL_EFFECT, builtin_tool_definitions
from mcp_registry.client import McpScope

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_ELICITATION_TIMEOUT",
    "DEFAULT_TOOL_RESULT_MAX_CHARS",
    "DEMO_API_KEY",
    "AgentConfigError",
    "AgentModelConfig",
    "AgentToolEntry",
    "exposed_tool_name",
]

DEFAULT_ELICITATION_TIMEOUT = 600.0
"""Seconds a user may take to answer an MCP server's question when the agent config names none."""

DEMO_API_KEY = LOCAL_SERVER_KEY
"""Sent when the agent names an ``api_base`` but no ``api_key_env`` (the local demo model)."""

TOOL_NAME_SEPARATOR = "__"
DEFAULT_TOOL_RESULT_MAX_CHARS = 100_000
"""How much of one tool result the model sees when neither the agent nor the window says."""
TOOL_RESULT_WINDOW_SHARE = 0.25
"""Without ``tool_result_max_chars``: one tool result may fill this share of the window."""
CHARS_PER_TOKEN = 4
"""Characters a token is taken to hold where a budget in tokens becomes one in characters."""


class AgentConfigError(ValueError):
    """The session's ``agent_config`` is missing or malformed, or its key is not set; fails
    the Step. Messages name variables, never key values."""


def exposed_tool_name(server: str, tool: str) -> str:
    """The name a model sees for ``tool`` on ``server``: ``<server>__<tool>``."""
    return f"{server}{TOOL_NAME_SEPARATOR}{tool}"


@dataclass(frozen=True)
class AgentToolEntry:
    """One enabled tool of an agent (an item of ``agent_config["tools"]``).

    Attributes:
        name: Exposed name, ``<server>__<tool>``.
        server: MCP server registry name.
        tool: The tool's name on its server.
        description: Shown to the model.
        parameters: JSON schema of the arguments.
        effect: ``read``, ``idempotent_write``, ``non_idempotent_write`` or ``unclassified``;
            ``None`` when absent or unknown.
        requires_approval: The platform's per-tool approval setting, if any.
        builtin: One of ``mcp_registry.builtin_tools`` (resources and prompts of the agent's
            servers) rather than a server's own tool; ``server`` is then empty.
        timeout_seconds: Seconds one call's MCP request may take (``McpTool.effective_timeout``
            when the session started); ``None`` (absent, or not a positive number): the
            server's ``call_timeout`` at call time.
    """

    name: str
    server: str
    tool: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    effect: ToolEffect | None = None
    requires_approval: bool | None = None
    builtin: bool = False
    timeout_seconds: float | None = None
    subagent: bool = False

    @classmethod
    def subagents_of(cls, config: Mapping[str, Any]) -> tuple[AgentToolEntry, ...]:
        """The agent's subagents (issue 29) as ``agent__<slug>`` tools, from
        ``agent_config["subagents"]``; the session runs their calls as child sessions
        (``agents_app.worker.subagents``), never the runner."""
        entries = []
        for item in config.get("subagents") or ():
            if not isinstance(item, Mapping) or not item.get("slug"):
                continue
            slug = str(item["slug"])
            name = subagent_tool_name(slug)
            entries.append(
                cls(
                    name=name,
                    server="",
                    tool=name,
                    description=str(item.get("description") or f"Ask the agent {slug}."),
                    parameters=subagent_tool_parameters(),
                    effect=ToolEffect.IDEMPOTENT_WRITE,
                    requires_approval=False,
                    subagent=True,
                )
            )
        return tuple(entries)

    @classmethod
    def builtins_for(cls, servers: Sequence[str]) -> tuple[AgentToolEntry, ...]:
        """The read-only built-in tools for an agent that may use ``servers`` (none if empty)."""
        return tuple(
            cls(
                name=spec["function"]["name"],
                server="",
                tool=spec["function"]["name"],
                description=spec["function"].get("description", ""),
                parameters=spec["function"]["parameters"],
                effect=ToolEffect(BUILTIN_TOOL_EFFECT),
                requires_approval=False,
                builtin=True,
            )
            for spec in builtin_tool_definitions(server_names=servers)
        )

    @classmethod
    def session_builtins(cls) -> tuple[AgentToolEntry, ...]:
        """The tools the session runs itself (``durable_wait``, ``request_user_input``,
        ``write_todos``; the platform Flow enables all three). Which a model call is offered
        depends on the turn's mode (``AgentModelConfig.for_turn_mode``)."""
        return tuple(
            cls(
                name=spec["name"],
                server="",
                tool=spec["name"],
                description=spec["description"],
                parameters=spec["parameters"],
                effect=ToolEffect.READ,
                requires_approval=False,
                builtin=True,
            )
            for spec in (
                durable_wait_definition(),
                request_user_input_definition(),
                write_todos_definition(),
            )
        )

    @classmethod
    def from_config(cls, item: Mapping[str, Any]) -> AgentToolEntry:
        """Parse one ``agent_config["tools"]`` item.

        Raises:
            AgentConfigError: If ``server`` or ``tool`` is missing.
        """
        try:
            server = str(item["server"])
            tool = str(item["tool"])
        except KeyError as error:
            raise AgentConfigError(f"tool entry without {error.args[0]!r}") from error
        effect_value = item.get("effect")
        effect = ToolEffect(effect_value) if effect_value in {e.value for e in ToolEffect} else None
        requires_approval = item.get("requires_approval")
        timeout = item.get("timeout_seconds")
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            timeout = None
        return cls(
            name=str(item.get("name") or exposed_tool_name(server, tool)),
            server=server,
            tool=tool,
            description=str(item.get("description") or ""),
            parameters=dict(item.get("parameters") or {"type": "object", "properties": {}}),
            effect=effect,
            requires_approval=requires_approval if isinstance(requires_approval, bool) else None,
            timeout_seconds=None if timeout is None else float(timeout),
        )

    def as_openai_tool(self) -> dict[str, Any]:
        """The Chat Completions ``tools`` item for this tool."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
            },
        }

    def as_responses_tool(self) -> dict[str, Any]:
        """The Responses API ``tools`` item for this tool (``strict`` off: MCP schemas are not
        always strict-compatible)."""
        return {
            "type": "function",
            "name": self.name,
            "description": self.description,
            "parameters": dict(self.parameters),
            "strict": False,
        }


@dataclass(frozen=True)
class AgentModelConfig:
    """The parsed ``agent_config`` a runner call works from (shape in the module docstring)."""

    model: str
    api_base: str | None
    api_key_env: str | None
    system_prompt: str
    tools: tuple[AgentToolEntry, ...]
    api: ModelApi = "chat"
    context_window: int | None = None
    stream: bool = True
    reasoning_effort: str | None = None
    tool_result_max_chars: int | None = None
    compaction_model: str | None = None
    owner_id: str | None = None
    supports_images: bool | None = None
    elicitation_timeout: float = DEFAULT_ELICITATION_TIMEOUT
    input_price_per_mtok: Decimal | None = None
    output_price_per_mtok: Decimal | None = None

    @classmethod
    def parse(cls, config: Mapping[str, Any] | None) -> AgentModelConfig:
        """Parse an ``agent_config`` dict.

        Raises:
            AgentConfigError: If ``config`` is ``None``, has no ``model``, or has an invalid
                ``api``, ``context_window``, ``tool_result_max_chars``, ``supports_images`` or
                ``elicitation_timeout_seconds``, or a price (``input_price_per_mtok``,
                ``output_price_per_mtok``) that is not a non-negative decimal number.
        """
        if not config:
            raise AgentConfigError("the session has no agent_config")
        model = config.get("model")
        if not model:
            raise AgentConfigError("agent_config has no 'model'")
        api_base = config.get("api_base") or None
        try:
            api = choose_api(str(model), api_base, config.get("api"))
        except ValueError as error:
            raise AgentConfigError(str(error)) from error
        window = config.get("context_window")
        if window is not None and (not isinstance(window, int) or window <= 0):
            raise AgentConfigError("agent_config 'context_window' must be a positive integer")
        effort = config.get("reasoning_effort")
        cut = config.get("tool_result_max_chars")
        if cut is not None and (not isinstance(cut, int) or isinstance(cut, bool) or cut <= 0):
            raise AgentConfigError(
                "agent_config 'tool_result_max_chars' must be a positive integer"
            )
        images = config.get("supports_images")
        if images is not None and not isinstance(images, bool):
            raise AgentConfigError("agent_config 'supports_images' must be true, false or null")
        waits = config.get("elicitation_timeout_seconds", DEFAULT_ELICITATION_TIMEOUT)
        if isinstance(waits, bool) or not isinstance(waits, int | float) or waits <= 0:
            raise AgentConfigError(
                "agent_config 'elicitation_timeout_seconds' must be a positive number"
            )
        try:
            input_price = config_price(config, "input_price_per_mtok")
            output_price = config_price(config, "output_price_per_mtok")
        except PriceConfigError as error:
            raise AgentConfigError(str(error)) from error
        tools = tuple(AgentToolEntry.from_config(item) for item in config.get("tools") or ())
        servers = sorted({entry.server for entry in tools})
        return cls(
            model=str(model),
            api_base=api_base,
            api_key_env=config.get("api_key_env") or None,
            system_prompt=str(config.get("system_prompt") or ""),
            tools=tools
            + AgentToolEntry.builtins_for(servers)
            + AgentToolEntry.session_builtins()
            + AgentToolEntry.subagents_of(config),
            api=api,
            context_window=window,
            stream=config.get("stream", True) is not False,
            reasoning_effort=str(effort) if effort else None,
            tool_result_max_chars=cut,
            compaction_model=str(config.get("compaction_model") or "") or None,
            owner_id=str(config["owner_id"]) if config.get("owner_id") is not None else None,
            supports_images=images,
            elicitation_timeout=float(waits),
            input_price_per_mtok=input_price,
            output_price_per_mtok=output_price,
        )

    def for_turn_mode(self, mode: TurnMode) -> AgentModelConfig:
        """The config a model call of a ``mode`` turn uses (AI Agent "Durable plans"):
        ``planning`` offers only ``write_todos``; ``executing`` every tool; ``chat`` every tool
        but ``write_todos``."""
        if mode is TurnMode.PLANNING:
            tools = tuple(entry for entry in self.tools if entry.name == WRITE_TODOS_TOOL)
        elif mode is TurnMode.EXECUTING:
            tools = self.tools
        else:
            tools = tuple(entry for entry in self.tools if entry.name != WRITE_TODOS_TOOL)
        return replace(self, tools=tools)
    def scope(self, session_id: str) -> McpScope:
        """Whom the session's MCP requests are made for: the session and its owner (sessions
        started before ``owner_id`` was recorded count as their own user)."""
        return McpScope(session_id=session_id, user_id=self.owner_id)

    def window(self) -> int | None:
        """The context window in tokens: the agent's, else LiteLLM's, or the smaller one the
        provider named when it refused an input (``providers.remember_served_window``;
        imports LiteLLM)."""
        return context_window(self.model, self.context_window, self.api_base)

    def tool_result_limit(self) -> int:
        """How many characters of one tool result the model sees (see the module docstring)."""
        if self.tool_result_max_chars is not None:
            return self.tool_result_max_chars
        window = self.window()
        if window is None:
            return DEFAULT_TOOL_RESULT_MAX_CHARS
        return max(1000, int(window * TOOL_RESULT_WINDOW_SHARE) * CHARS_PER_TOKEN)

    def accepts_images(self) -> bool:
        """Whether the model is sent images: ``supports_images``, else LiteLLM's model
        information (imports LiteLLM)."""
        return supports_images(self.model, self.supports_images)

    def tool(self, name: str) -> AgentToolEntry | None:
        """The enabled tool with exposed ``name``, or ``None``."""
        return next((entry for entry in self.tools if entry.name == name), None)

    def api_key(self) -> str | None:
        """The API key, read from the environment now (``agents_app.providers``).

        ``None`` for a provider that needs no key; a placeholder for an ``api_base`` server
        without ``api_key_env``.

        Raises:
            AgentConfigError: If the key's variable is not set (the message names the
                variable, never a value).
        """
        try:
            return resolve_api_key(self.model, self.api_key_env, self.api_base)
        except ProviderNotConfiguredError as error:
            raise AgentConfigError(str(error)) from None
