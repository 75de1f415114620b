"""The LiteLLM runner: the platform's ``AgentFrameworkRunner`` (seed "The runner contract").

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

Images (issue 23 point 11; ``mcp_registry.content``): for a model that accepts images
(``supports_images``, else ``litellm.supports_vision``) a tool Step attaches the result's
images within the runner's ``MediaLimits`` and stores them with the text as one string in the
tool call record (``ToolResultContent.encode``). Every model call of that turn sends them as
``image_url`` content parts of the tool message (LiteLLM moves them where each provider wants
them); the turn's stored messages keep the text with its image labels only, so images leave
Dex state when the turn's records do. Other models read a placeholder naming the MIME type
and size.

Every ``framework_item`` is an OpenAI Chat Completions message dict (``role``, ``content``,
``tool_calls``, ``tool_call_id``), plus what a provider needs replayed verbatim on later calls:
``thinking_blocks`` (Anthropic thinking, signatures included), ``reasoning_items`` (OpenAI
Responses reasoning items with ``encrypted_content``) and, per tool call,
``provider_specific_fields`` (Gemini thought signatures). Tool call ``id`` values are the
provider's own; the Dex tool call ID is derived from them (non-empty, no ``/``, unique within the
turn) and the run state keeps the mapping.

``run_model_step`` rebuilds the model input from the stored messages (plus, while a turn waits
for tools, the turn's own items from the run state and each tool call's final record), makes
exactly one LiteLLM call (``acompletion`` or ``aresponses``, ``store=False``, LiteLLM retries
off so Dex owns retries) and returns ``ToolCallsRequested`` or ``TurnCompleted``.
``execute_deferred_tool_call`` runs one tool through the MCP client pool. A question the server
asks during the call (``elicitation/create``) becomes a question of the session
(``dex_agents.ToolCallElicitations``): the user answers it in the browser or the API while the
call waits, and the server gets ``accept`` with the form's values, ``decline`` or ``cancel``.

The runner is also a ``dex_agents.CompactingRunner``: it counts the input it would send with
LiteLLM's token counter against the window (agent definition, else LiteLLM's model
information), puts the session's summary (``turn.summary``) into the input as a system message
after the system prompt, and summarizes with one non-streamed Chat Completions call per chunk
(``summarize``). A provider's context-window error becomes ``ContextWindowExceededError``.

Keys come from the worker's environment at call time (``agents_app.providers``); they are never
stored, logged, or left in an error message.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from decimal import Decimal
from typing import Any, Literal, cast

from mcp.types import ElicitRequestParams, ElicitRequestURLParams, ElicitResult

from agents_app.log_context import bind_session
from agents_app.metrics import TOOL_CALLS, TURNS_COMPLETED, TURNS_FAILED, TURNS_STARTED
from agents_app.providers import (
    LOCAL_SERVER_KEY,
    ModelApi,
    ProviderNotConfiguredError,
    choose_api,
    context_window,
    count_text_tokens,
    count_tokens,
    litellm_warm,
    load_litellm,
    remember_served_window,
    resolve_api_key,
    supports_images,
    unpriced_model_pricing,
)
from agents_app.usage.pricing import PriceConfigError, config_price, usage_priced
from agents_app.worker.model_replies import (
    DeltaBuffer,
    ModelReply,
    ModelResponseError,
    ReasoningDeltaBuffer,
    ToolCallAccumulator,
    chat_response_reasoning,
    openai_chunk_stream,
    read_chat_response,
    read_chat_stream,
    read_responses_response,
    read_responses_stream,
    responses_input,
    tool_call_delta,
    usage_from,
)
from agents_app.worker.plan_prompts import executing_prompt, planning_prompt
from dex_agents import (
    TURN_CANCELLED_NOTE_HEADER,
    WRITE_TODOS_TOOL,
    AgentEventType,
    AgentMessage,
    AgentSessionClient,
    AgentToolCall,
    AgentTurnContext,
    AgentTurnOutcome,
    AgentUsage,
    ContextWindowExceededError,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    MessageRole,
    ModelCallError,
    ModelRateLimitError,
    SummarizeRequest,
    SummaryResult,
    ToolCallElicitations,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    ToolExecutionError,
    ToolExecutionResult,
    ToolPolicy,
    TurnCompleted,
    TurnMode,
    describe_tool_call_outcome,
    durable_wait_definition,
    render_summary,
    request_user_input_definition,
    tool_call_edit_note,
    write_todos_definition,
)
from mcp_registry.builtin_tools import (
    BUILTIN_TOOL_EFFECT,
    BuiltinToolError,
    builtin_tool_content,
    builtin_tool_definitions,
)
from mcp_registry.client import (
    ElicitCallback,
    McpClientPool,
    McpScope,
    McpServerSpec,
    McpToolError,
)
from mcp_registry.content import MediaLimits, ToolResultContent, replace_encoded_results

__all__ = [
    "DEMO_API_KEY",
    "AgentConfigError",
    "AgentModelConfig",
    "AgentToolEntry",
    "ContextMeasure",
    "LiteLLMRunner",
    "ModelResponseError",
    "PreparedToolCall",
    "ProviderCallError",
    "RedactedProviderError",
    "ServerResolver",
    "ToolCallAccumulator",
    "attach_tool_images",
    "build_model_input",
    "chat_message",
    "cut_tool_result",
    "decode_run_state",
    "encode_run_state",
    "exposed_tool_name",
    "finalize_tool_calls",
    "measure_context",
    "model_calls_warm",
    "parse_tool_arguments",
    "summary_request_messages",
    "tool_call_delta",
    "usage_from",
]

_litellm = load_litellm
"""Import LiteLLM lazily (see ``agents_app.providers.load_litellm``)."""


async def model_calls_warm() -> None:
    """Do before a worker serves what its first model Step would do on the event loop.

    LiteLLM's import and tokenizer (:func:`agents_app.providers.litellm_warm`, in a thread),
    then one streamed Chat Completions call answered by LiteLLM's ``mock_response`` (no
    network) and read with :func:`read_chat_stream`, which imports what a first real call
    imports lazily (anyio's asyncio backend, LiteLLM's stream wrapper and logging, OpenAI
    response types): ~1.5 s of a loaded 2-core machine. Every one of them ran synchronously in
    the first RunModel Step, blocking every RPC the worker was serving meanwhile.

    Raises:
        Whatever LiteLLM raises: the worker would fail its model calls the same way.
    """
    await asyncio.to_thread(litellm_warm)
    stream = await _litellm().acompletion(
        model="openai/dexagents-warm-up",
        messages=[{"role": "user", "content": "warm up"}],
        stream=True,
        stream_options={"include_usage": True},
        mock_response="ok",
    )
    await read_chat_stream(stream, DeltaBuffer(lambda _text: None),
                           DeltaBuffer(lambda _text: None))

ServerResolver = Callable[[str], Awaitable[McpServerSpec]]
"""``async (server_name) -> McpServerSpec``; supplied by the Django side (reads the registry)."""

SessionClientFactory = Callable[[], AgentSessionClient]
"""``() -> AgentSessionClient`` of the session Flow on the same engine, usable on the running
event loop (the Worker's); tool calls put MCP servers' questions to the user through it."""

DEFAULT_ELICITATION_TIMEOUT = 600.0
"""Seconds a user may take to answer an MCP server's question when the agent config names none."""

RUN_STATE_VERSION = 2
DEMO_API_KEY = LOCAL_SERVER_KEY
"""Sent when the agent names an ``api_base`` but no ``api_key_env`` (the local demo model)."""

TOOL_NAME_SEPARATOR = "__"
DEFAULT_MODEL_TIMEOUT = 600.0
"""Seconds one model call may take (the RunModel Step allows 15 minutes)."""

REJECTED_CALL_POLICY = ToolPolicy(ToolEffect.READ, requires_approval=False)
"""The policy of a call refused before it runs (invalid arguments, unknown tool): nothing runs,
so it needs no approval; its Step records the error for the model."""

_CHAT_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")
_DEX_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_DEX_ID_MAX = 64
_RAW_ARGUMENTS_SHOWN = 500
DEFAULT_TOOL_RESULT_MAX_CHARS = 100_000
"""How much of one tool result the model sees when neither the agent nor the window says."""
TOOL_RESULT_WINDOW_SHARE = 0.25
"""Without ``tool_result_max_chars``: one tool result may fill this share of the window."""
TOOL_RESULT_MAX_STORED_BYTES = 1024 * 1024
"""The most bytes of one tool result's text (or error) its tool call record keeps, counted in
the JSON the Dex SDK stores (ASCII-escaped: a non-ASCII character takes 6 or 12 bytes). Records
live in Dex state, one value must stay under the 4 MiB a worker loads at once, and the turn's
tool message keeps the record's text twice (its text and its framework item); a longer text
is cut here with a note for the model (the model sees at most ``tool_result_max_chars`` of it
anyway), and a longer result's whole text is stored apart, in parts, for people
(``ToolExecutionResult.full_text``; errors are not)."""
CHARS_PER_TOKEN = 4
INPUT_WINDOW_SHARE = 0.8
"""The share of the model's window this turn's tool results may bring the input to; the rest
is the answer's, and the margin of a token count that is not the provider's
(``fit_tool_results``)."""
TOOL_RESULT_MIN_CHARS = 500
"""However many results share the window, each shows at least this many characters."""
SUMMARY_INSTRUCTIONS = (
    "Summarize the conversation for context compaction. Merge the previous summary and the "
    "new messages into one faithful, self-contained summary that a model can continue the "
    "conversation from: keep the user's goals, decisions and preferences, unresolved work, "
    "tool calls with their outcomes, identifiers, numbers and facts that may be needed later. "
    "Write plain text, no preamble."
)
"""The summarizer's system message (the demo model recognises its first words)."""
_SUMMARY_MIN_MESSAGE_CHARS = 200
DEX_TOOL_CALL_KEY = "dex_tool_call_id"
"""Key of a tool message item naming the Dex record whose images the turn's model calls
attach (set only on results with images; providers never see it, ``chat_message`` drops it)."""
USAGE_KEY = "usage"
"""Key of an assistant message item holding the priced usage of the call that produced it
(``AgentUsage.as_dict()``); providers never see it, ``chat_message`` drops it."""
TURN_FAILURE_NOTE_HEADER = "[Dex] The previous turn failed after these tool calls ran:"
"""First line of ``dex_agents.build_turn_failure_note`` (seed "RecordTurnFailure")."""


#: ``LiteLLMRunner(budget_check=...)``: ``async (owner_id or None, agent slug) -> why a model
#: call may not be made now, or None``.
BudgetCheck = Callable[[str | None, str], Awaitable[str | None]]


class AgentConfigError(ValueError):
    """The session's ``agent_config`` is missing or malformed, or its key is not set; fails
    the Step. Messages name variables, never key values."""


class ProviderCallError(RuntimeError):
    """A model provider's failure that another attempt may fix (a timeout, a connection error,
    HTTP 429 without ``Retry-After``, 5xx), in a sentence with the provider's own words and
    the key redacted (``provider_failure``). Fails the attempt (retried); after the last one
    it is the turn's ``last_turn_error``."""


class RedactedProviderError(RuntimeError):
    """A provider error whose text contained the API key; the key is replaced by
    ``[redacted]`` and the original exception is not chained. Fails the attempt (retried)."""


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
            + AgentToolEntry.session_builtins(),
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


def chat_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions message LiteLLM receives for a stored or turn item.

    Keeps ``role``, ``content``, ``tool_calls`` (``id``, ``type``, ``function``,
    ``provider_specific_fields``), ``tool_call_id``, ``name`` and an assistant's
    ``thinking_blocks``; drops Responses-only ``reasoning_items``.
    """
    message = {key: item[key] for key in _CHAT_MESSAGE_KEYS if key in item}
    if message.get("tool_calls") is not None:
        message["tool_calls"] = [
            {
                key: value
                for key, value in call.items()
                if key in ("id", "type", "function", "provider_specific_fields")
            }
            for call in message["tool_calls"]
        ]
    if item.get("role") == "assistant" and item.get("thinking_blocks"):
        message["thinking_blocks"] = [dict(block) for block in item["thinking_blocks"]]
    return message


def stored_message_item(message: AgentMessage) -> dict[str, Any]:
    """The message dict for a stored ``AgentMessage``.

    Uses its ``framework_item`` when that is a message dict; otherwise falls back to
    ``{"role": <role>, "content": <text>}`` (a system role becomes ``user`` text).
    """
    item = message.framework_item
    if isinstance(item, Mapping) and isinstance(item.get("role"), str):
        return dict(item)
    role = str(message.role)
    return {"role": role if role in ("user", "assistant") else "user", "content": message.text}


def tool_result_items(
    assistant_item: Mapping[str, Any], dex_ids: Sequence[str], turn: AgentTurnContext
) -> list[dict[str, Any]]:
    """One ``role="tool"`` message per call of ``assistant_item``, from the turn's final records.

    ``dex_ids[i]`` is the Dex tool call ID of the ``i``-th call; the message carries the
    provider's ``id`` so the provider can pair them. Its ``content`` is the text of the outcome
    (``describe_tool_call_outcome``; a result with images gives its text, image labels
    included, and the item names its record under ``DEX_TOOL_CALL_KEY`` so
    :func:`attach_tool_images` can add the images to the turn's model calls).

    Raises:
        KeyError: If the turn has no record for one of the calls.
        ValueError: If a record is not final, or the ID list does not match the calls.
    """
    calls = list(assistant_item.get("tool_calls") or ())
    if len(calls) != len(dex_ids):
        raise ValueError("framework run state does not match its tool request")
    items: list[dict[str, Any]] = []
    for call, dex_id in zip(calls, dex_ids, strict=True):
        record = turn.recorded_tool_call(dex_id)
        outcome = describe_tool_call_outcome(record)
        item: dict[str, Any] = {"role": "tool", "tool_call_id": call["id"], "content": outcome}
        if record.status is ToolCallStatus.SUCCEEDED:
            content = ToolResultContent.decode(outcome)
            item["content"] = content.text
            if content.images:
                item[DEX_TOOL_CALL_KEY] = dex_id
        note = tool_call_edit_note(record)
        if note is not None:
            item["content"] = f"{note}\n\n{item['content']}"
        items.append(item)
    return items


def encode_run_state(turn_items: Sequence[Mapping[str, Any]], tool_call_ids: Sequence[str]) -> str:
    """Serialize the turn's items after its user message and the Dex IDs of the last item's
    tool calls, in order (non-empty JSON text)."""
    return json.dumps(
        {
            "version": RUN_STATE_VERSION,
            "turn_items": list(turn_items),
            "tool_call_ids": list(tool_call_ids),
        }
    )


def decode_run_state(run_state: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``(turn_items, tool_call_ids)`` stored by :func:`encode_run_state`.

    A version-1 state (no ID list) maps each call to its own ``id``.

    Raises:
        ValueError: If the text is not a run state of this runner, or does not end with a
            tool request.
    """
    data = json.loads(run_state)
    if not isinstance(data, dict) or data.get("version") not in (1, RUN_STATE_VERSION):
        raise ValueError("unrecognised framework run state")
    items = data.get("turn_items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("framework run state has no turn items")
    last = items[-1] if items else None
    if last is None or last.get("role") != "assistant" or not last.get("tool_calls"):
        raise ValueError("framework run state does not end with a tool request")
    ids = data.get("tool_call_ids")
    if ids is None:
        ids = [call.get("id") for call in last["tool_calls"]]
    if not isinstance(ids, list) or not all(isinstance(value, str) and value for value in ids):
        raise ValueError("framework run state has unusable tool call IDs")
    return items, ids


def build_model_input(
    config: AgentModelConfig, turn: AgentTurnContext
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rebuild the model input for one call of ``turn`` from committed state.

    Returns ``(messages, turn_items)``: ``messages`` is the system prompt, the session's summary
    (a system message, once a compaction ran), every stored message ``turn.messages`` holds,
    then ``turn_items``, each as stored (provider keys included; see :func:`chat_message` and
    ``responses_input`` for the wire forms) except that a tool result longer than
    ``config.tool_result_limit()`` is cut in ``messages`` and, for a model that accepts images,
    a tool result of this turn whose record holds images carries them there as ``image_url``
    parts (:func:`attach_tool_images`); ``turn_items`` are the items this
    turn produced after its user message (empty on the first call; restored from the run state
    plus one tool result per requested call, rendered with ``describe_tool_call_outcome``, when
    resuming), followed by the turn's steered user messages (``turn.steered_messages``, Steer),
    so they stay in the run state and the turn's stored messages.

    Raises:
        ValueError: If the run state is unusable or a tool call record is missing or not final.
    """
    messages: list[dict[str, Any]] = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    if turn.turn_mode is TurnMode.PLANNING:
        messages.append({"role": "system", "content": planning_prompt(turn.plan)})
    elif turn.turn_mode is TurnMode.EXECUTING and turn.plan is not None:
        messages.append({"role": "system", "content": executing_prompt(turn.plan)})
    if turn.summary is not None:
        messages.append({"role": "system", "content": render_summary(turn.summary)})
    messages.extend(stored_message_item(message) for message in turn.messages)
    turn_items: list[dict[str, Any]] = []
    if turn.framework_run_state is not None:
        turn_items, dex_ids = decode_run_state(turn.framework_run_state)
        turn_items.extend(tool_result_items(turn_items[-1], dex_ids, turn))
    turn_items.extend(
        dict(item.framework_item)
        if isinstance(item.framework_item, Mapping)
        else {"role": "user", "content": item.text}
        for item in turn.steered_messages
    )
    messages.extend(turn_items)
    limit = config.tool_result_limit()
    cut = [cut_tool_result(item, limit) for item in messages]
    batch = [
        index for index in range(len(cut) - len(turn_items), len(cut))
        if cut[index].get("role") == "tool" and isinstance(cut[index].get("content"), str)
    ]
    if batch:
        cut = fit_tool_results(config, messages, cut, batch, limit)
    if turn_items and config.accepts_images():
        first = len(cut) - len(turn_items)
        cut[first:] = [attach_tool_images(item, turn) for item in cut[first:]]
    return cut, turn_items


def attach_tool_images(item: dict[str, Any], turn: AgentTurnContext) -> dict[str, Any]:
    """``item``, or for a tool message of this turn whose record holds images, a copy whose
    ``content`` is its text followed by one ``image_url`` part per image
    (``ToolResultContent.chat_content``). The item itself is never changed; a record that is
    gone (an earlier turn) leaves the text alone."""
    dex_id = item.get(DEX_TOOL_CALL_KEY)
    text = item.get("content")
    if item.get("role") != "tool" or not isinstance(dex_id, str) or not isinstance(text, str):
        return item
    record = turn.tool_calls.get(dex_id)
    if (
        record is None
        or record.turn_id != turn.turn_id
        or record.status is not ToolCallStatus.SUCCEEDED
        or not record.output
    ):
        return item
    content = ToolResultContent.decode(record.output)
    if not content.images:
        return item
    return {**item, "content": content.chat_content(text)}


def fit_tool_results(
    config: AgentModelConfig,
    messages: Sequence[Mapping[str, Any]],
    cut: list[dict[str, Any]],
    batch: Sequence[int],
    limit: int,
) -> list[dict[str, Any]]:
    """``cut`` with this turn's tool results (``batch``: their indexes) cut further, together,
    when the whole input would not fit :data:`INPUT_WINDOW_SHARE` of the model's window.

    Each result alone is cut to ``limit`` (a quarter of the window by default); four parallel
    large results at that size filled the window, the provider refused the call and the turn
    failed (issue 25). The room left by everything else the call carries (system prompt,
    history, tools) is shared among the batch: a result shorter than its share keeps its whole
    text and leaves the rest to the others. Counted with LiteLLM's counter, checked again after
    the cut (at most four times); each result keeps at least :data:`TOOL_RESULT_MIN_CHARS`. If
    the history alone leaves no room, the results keep that minimum and the session's
    compaction (or the provider's refusal, which compacts) decides. Without a known window,
    ``cut`` as it is.
    """
    window = config.window()
    if window is None:
        return cut
    target = int(window * INPUT_WINDOW_SHARE)
    tools = [entry.as_openai_tool() for entry in config.tools]

    def tokens(items: Sequence[Mapping[str, Any]]) -> int:
        return count_tokens(config.model, [chat_message(item) for item in items], tools)

    if sum(len(json.dumps(item, default=str)) for item in cut) + len(json.dumps(tools)) <= target:
        # Fewer characters than the target's tokens cannot come to more tokens: most calls
        # stop here without a count (it runs on the worker's event loop).
        return cut
    total = tokens(cut)
    if total <= target:
        return cut
    texts = [str(messages[index].get("content") or "") for index in batch]
    emptied = list(cut)
    for index in batch:
        emptied[index] = {**cut[index], "content": ""}
    other = tokens(emptied)
    room = target - other
    shown = sum(len(str(cut[index]["content"])) for index in batch)
    chars_per_token = max(1.0, shown / max(1, total - other))
    budget = int(max(0, room) * chars_per_token)
    fitted = cut
    for _ in range(4):
        shares = _water_fill([min(len(text), limit) for text in texts], budget)
        fitted = list(cut)
        for index, share in zip(batch, shares, strict=True):
            fitted[index] = cut_tool_result(messages[index], max(TOOL_RESULT_MIN_CHARS, share))
        if room <= 0 or tokens(fitted) <= target:
            return fitted
        budget = int(budget * 0.8)
    return fitted


def _water_fill(lengths: Sequence[int], budget: int) -> list[int]:
    """Shares of ``budget`` characters for texts of ``lengths``: equal, except that a text
    shorter than its share keeps its length and the rest goes to the others."""
    shares = [0] * len(lengths)
    left = budget
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    for position, index in enumerate(order):
        fair = left // (len(order) - position)
        shares[index] = min(lengths[index], fair)
        left -= shares[index]
    return shares


def cut_tool_result(item: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``item``, or a copy whose tool result text is cut to ``limit`` characters plus a note
    saying how much was left out (the stored item is never changed)."""
    content = item.get("content")
    if item.get("role") != "tool" or not isinstance(content, str) or len(content) <= limit:
        return item if isinstance(item, dict) else dict(item)
    omitted = len(content) - limit
    note = f"\n[... {omitted} more characters of this tool result are not shown]"
    return {**item, "content": content[:limit] + note}


def _transcript_text(item: Mapping[str, Any]) -> str:
    """One stored item as the summarizer reads it: its text, plus its tool calls."""
    content = item.get("content")
    text = content if isinstance(content, str) else ""
    functions = [
        call.get("function") or {}
        for call in item.get("tool_calls") or ()
        if isinstance(call, Mapping)
    ]
    calls = [f"{function.get('name')}({function.get('arguments')})" for function in functions]
    if calls:
        text = (text + "\n" if text else "") + "called " + ", ".join(calls)
    return text


def summary_request_messages(
    model: str,
    previous_summary: str,
    items: Sequence[Mapping[str, Any]],
    sequences: Sequence[int],
    budget_tokens: int,
) -> list[dict[str, str]]:
    """The summarizer's input: ``SUMMARY_INSTRUCTIONS`` and one user message with the previous
    summary and the transcript, one ``[<role> #<sequence>]`` header per message followed by its
    text. Each text is cut (halving, down to 200 characters) until the whole input fits
    ``budget_tokens`` by LiteLLM's count, so compaction never overflows itself."""
    texts = [_transcript_text(item) for item in items]
    cap = max((len(text) for text in texts), default=0)
    while True:
        transcript = "\n\n".join(
            f"[{item.get('role')} #{sequence}]\n{text[:cap]}"
            + (" [...]" if len(text) > cap else "")
            for item, sequence, text in zip(items, sequences, texts, strict=True)
        )
        messages = [
            {"role": "system", "content": SUMMARY_INSTRUCTIONS},
            {
                "role": "user",
                "content": f"Previous summary:\n{previous_summary or '(none)'}\n\n"
                f"New messages:\n{transcript}",
            },
        ]
        if cap <= _SUMMARY_MIN_MESSAGE_CHARS or count_tokens(model, messages) <= budget_tokens:
            return messages
        cap = max(_SUMMARY_MIN_MESSAGE_CHARS, cap // 2)


def parse_tool_arguments(tool_name: str, arguments: str) -> dict[str, Any]:
    """Check a call's arguments: JSON text of an object (empty text counts as ``{}``).

    Raises:
        ModelResponseError: If the text is not JSON or not an object; the message quotes the
            start of the text so the model can correct it.
    """
    if not arguments.strip():
        return {}
    shown = arguments[:_RAW_ARGUMENTS_SHOWN]
    try:
        value = json.loads(arguments)
    except ValueError as error:
        raise ModelResponseError(
            f"the arguments for tool {tool_name!r} are not valid JSON ({error}): {shown}"
        ) from error
    if not isinstance(value, dict):
        raise ModelResponseError(
            f"the arguments for tool {tool_name!r} are not a JSON object: {shown}"
        )
    return value


@dataclass(frozen=True)
class PreparedToolCall:
    """One tool call of a model reply, checked and ready to store and defer.

    Attributes:
        provider_id: The provider's call ID (generated when the provider sent none); replayed.
        dex_id: The Dex tool call ID: non-empty, no ``/``, unique within the turn.
        name: The exposed tool name.
        arguments: The raw argument text, as the Dex record keeps it.
        history_arguments: What the stored assistant item carries: the arguments, or ``"{}"``
            when they are not a JSON object, so the history stays valid for every provider.
        error: Why the call cannot run (invalid arguments, unknown tool), or ``None``.
        provider_specific_fields: Provider data to replay with the call, or ``None``.
    """

    provider_id: str
    dex_id: str
    name: str
    arguments: str
    history_arguments: str
    error: str | None = None
    provider_specific_fields: dict[str, Any] | None = None

    def history_item(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of the stored assistant item."""
        item: dict[str, Any] = {
            "id": self.provider_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.history_arguments},
        }
        if self.provider_specific_fields:
            item["provider_specific_fields"] = dict(self.provider_specific_fields)
        return item


def _dex_id(provider_id: str, used: set[str]) -> str:
    base = _DEX_ID_UNSAFE.sub("_", provider_id)[:_DEX_ID_MAX] or "call"
    candidate, suffix = base, 1
    while candidate in used:
        suffix += 1
        candidate = f"{base}_{suffix}"
    used.add(candidate)
    return candidate


def finalize_tool_calls(
    merged: Sequence[Mapping[str, Any]],
    config: AgentModelConfig,
    turn_items: Iterable[Mapping[str, Any]],
    used_dex_ids: Iterable[str] = (),
) -> list[PreparedToolCall]:
    """Check a reply's tool calls and give each usable IDs, in model order.

    Arguments are checked as JSON before anything is stored (issue 6): a call whose arguments
    are not a JSON object, or that names a tool the agent does not offer, gets an ``error`` and
    ``"{}"`` as its history arguments; it is still deferred, and its Step records the error as
    a failed tool call the model sees. A missing provider ID becomes ``call_<n>``.

    Args:
        merged: ``{"id", "name", "arguments", "provider_specific_fields"?}`` per call.
        config: The agent config (its tools).
        turn_items: This turn's earlier items (their provider IDs stay unique).
        used_dex_ids: Dex IDs this turn already used (its records).

    Raises:
        ModelResponseError: If a call has no name (nothing can replay it).
    """
    used_provider = {
        str(call.get("id")) for item in turn_items for call in item.get("tool_calls") or ()
    }
    used_dex = set(used_dex_ids) | used_provider
    prepared: list[PreparedToolCall] = []
    for call in merged:
        name = str(call.get("name") or "")
        if not name:
            raise ModelResponseError("the model requested a tool call without a name")
        provider_id = str(call.get("id") or "")
        if not provider_id or provider_id in used_provider:
            number = len(used_provider) + 1
            while f"call_{number}" in used_provider:
                number += 1
            provider_id = f"call_{number}"
        used_provider.add(provider_id)
        arguments = str(call.get("arguments") or "")
        history_arguments = arguments if arguments.strip() else "{}"
        error: str | None = None
        try:
            parse_tool_arguments(name, arguments)
        except ModelResponseError as invalid:
            error = str(invalid)
            history_arguments = "{}"
        if error is None and config.tool(name) is None:
            error = f"Tool {name!r} is not enabled for this session."
        extra = call.get("provider_specific_fields")
        prepared.append(
            PreparedToolCall(
                provider_id=provider_id,
                dex_id=_dex_id(provider_id, used_dex),
                name=name,
                arguments=arguments if arguments.strip() else "{}",
                history_arguments=history_arguments,
                error=error,
                provider_specific_fields=dict(extra) if isinstance(extra, Mapping) else None,
            )
        )
    return prepared


def _assistant_item(
    reply: ModelReply,
    calls: Sequence[PreparedToolCall],
    usage: AgentUsage,
    reasoning: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The stored Chat Completions item of one reply; ``usage`` (``USAGE_KEY``) is the priced
    usage of the call that produced it and ``reasoning`` (``ReasoningDeltaBuffer.summary``)
    its readable reasoning, both kept for people (:func:`chat_message` never sends them
    back to a provider)."""
    item: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        item["tool_calls"] = [call.history_item() for call in calls]
    if reply.thinking_blocks:
        item["thinking_blocks"] = [dict(block) for block in reply.thinking_blocks]
    if reply.reasoning_items:
        item["reasoning_items"] = [dict(entry) for entry in reply.reasoning_items]
    if reasoning:
        item["reasoning"] = dict(reasoning)
    item[USAGE_KEY] = usage.as_dict()
    return item


def _framework_message(item: Mapping[str, Any]) -> FrameworkMessage:
    role = MessageRole(item["role"])
    content = item.get("content")
    answered = item.get("tool_call_id") if role is MessageRole.TOOL else None
    return FrameworkMessage(
        role=role,
        framework_item=dict(item),
        text=content if isinstance(content, str) else "",
        tool_call_id=answered if isinstance(answered, str) else None,
    )


@dataclass(frozen=True)
class ContextMeasure:
    """How full the model's context is for one call.

    Attributes:
        context_window: The window in tokens (agent definition, else LiteLLM's model
            information), or ``None`` when unknown.
        input_tokens: LiteLLM's count of the rebuilt input.
    """

    context_window: int | None
    input_tokens: int


def measure_context(
    config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]
) -> ContextMeasure:
    """Count the tokens of ``messages`` (as :func:`build_model_input` returns them) against
    the model's context window. Imports LiteLLM."""
    return ContextMeasure(
        context_window=context_window(config.model, config.context_window),
        input_tokens=count_tokens(config.model, [chat_message(item) for item in messages]),
    )


def _wants_reasoning(model: str) -> bool:
    """Whether a Responses call asks for reasoning summaries and encrypted reasoning: yes for
    reasoning models and for models LiteLLM does not know (new OpenAI models reason); no for
    known models without reasoning, which reject the parameter."""
    try:
        info = _litellm().get_model_info(model)
    except Exception:  # unknown to LiteLLM's map
        return True
    return bool(info.get("supports_reasoning"))


def _redact(error: Exception, secret: str | None) -> Exception | None:
    """A :class:`RedactedProviderError` when ``secret`` shows in the error's text, else
    ``None``."""
    if not secret or len(secret) < 4:
        return None
    text = f"{type(error).__name__}: {error}"
    if secret not in text and secret not in repr(error):
        return None
    return RedactedProviderError(text.replace(secret, "[redacted]"))


#: Longest ``Retry-After`` a rate-limited model call waits for before its next attempt
#: (seconds); RunModel's attempts must fit in its 30 minutes.
RETRY_AFTER_MAX_SECONDS = 600
#: How much of a provider's refusal ``last_turn_error`` keeps (characters).
REFUSAL_MAX_CHARS = 1000
#: HTTP statuses of a request the provider refused itself: the same request would be refused
#: again (invalid, key not accepted, payment required, no access, no such model, unprocessable).
REFUSAL_STATUSES = frozenset({400, 401, 402, 403, 404, 422})
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)?(?:\w+Error:\s*)?(?:\w+Exception\s*-\s*)?")


def provider_failure(
    error: Exception, api_key: str | None, *, refusals: bool = True
) -> BaseException:
    """What a model call that raised ``error`` raises in turn (issue 25: retry only what a
    retry can fix).

    - a context-window error: ``ContextWindowExceededError`` (the session compacts);
    - with ``refusals``, a request the provider refused itself (LiteLLM's ``BadRequestError``
      family, ``AuthenticationError``, ``PermissionDeniedError``, ``NotFoundError``,
      ``UnprocessableEntityError``, or LiteLLM's ``APIError`` with one of
      :data:`REFUSAL_STATUSES`):
      ``dex_agents.ModelCallError`` with the provider's message, so RunModel fails the turn
      at once instead of sending the same request twice more;
    - HTTP 429 with a ``Retry-After`` in seconds: ``dex_agents.ModelRateLimitError`` (the next
      attempt waits that long, at most :data:`RETRY_AFTER_MAX_SECONDS`);
    - LiteLLM's other provider errors (timeouts, connection errors, 429 without
      ``Retry-After``, 5xx): :class:`ProviderCallError` with the provider's words; the attempt
      fails and is retried;
    - anything else: ``error`` itself, or its :class:`RedactedProviderError` when its text
      holds the key.

    The key never shows in what this returns.
    """
    litellm = _litellm()
    shown: Exception = _redact(error, api_key) or error
    # LiteLLM prefixes its class names ("litellm.BadRequestError: BadRequestError:
    # OpenAIException - "); the provider's own words follow, and they are what a user reads.
    text = _LITELLM_PREFIX.sub("", str(shown)) or str(shown)
    if len(text) > REFUSAL_MAX_CHARS:
        text = text[: REFUSAL_MAX_CHARS - 1] + "…"
    if isinstance(error, litellm.ContextWindowExceededError):
        return ContextWindowExceededError(
            f"The model provider refused the input as too long: {text}"
        )
    refused = (
        litellm.BadRequestError,
        litellm.AuthenticationError,
        litellm.PermissionDeniedError,
        litellm.NotFoundError,
        litellm.UnprocessableEntityError,
    )
    status = getattr(error, "status_code", None)
    # LiteLLM maps some refusals to its generic APIError (an OpenAI-compatible 403 is one);
    # their status tells.
    if refusals and (isinstance(error, refused) or (
        isinstance(error, litellm.APIError) and status in REFUSAL_STATUSES
    )):
        return ModelCallError(f"The model provider refused the request (HTTP {status}): {text}")
    if isinstance(error, litellm.RateLimitError):
        seconds = _retry_after_seconds(error)
        if seconds is not None:
            return ModelRateLimitError(
                f"The model provider asked to wait {seconds} s (HTTP 429): {text}", seconds
            )
    import openai  # LiteLLM's provider errors all derive from the OpenAI SDK's APIError

    if not isinstance(error, openai.APIError):
        return shown
    if isinstance(error, litellm.Timeout):
        return ProviderCallError(f"The model provider did not answer in time: {text}")
    if isinstance(error, litellm.APIConnectionError):
        return ProviderCallError(f"The model provider could not be reached: {text}")
    where = f" (HTTP {status})" if isinstance(status, int) else ""
    return ProviderCallError(f"The model provider failed{where}: {text}")


def _retry_after_seconds(error: Exception) -> int | None:
    """The whole seconds of a rate-limit error's ``Retry-After`` header (1 to
    :data:`RETRY_AFTER_MAX_SECONDS`), or None without one in seconds."""
    response = getattr(error, "response", None)
    headers = getattr(response, "headers", None) or getattr(error, "headers", None) or {}
    try:
        value = headers.get("retry-after")
    except AttributeError:
        return None
    try:
        seconds = float(str(value).strip())
    except (TypeError, ValueError):
        return None
    if seconds != seconds or seconds <= 0:  # NaN or none
        return None
    return max(1, min(RETRY_AFTER_MAX_SECONDS, int(-(-seconds // 1))))


#: RunModel's attempts (seed "run_model_step": 3 attempts within 30 minutes); the last one
#: failing fails the turn.
_RUN_MODEL_ATTEMPTS = 3


_LOG = logging.getLogger(__name__)
#: How many abandoned calls' reported usage ``LiteLLMRunner`` keeps for the Step to read.
_ABANDONED_KEPT = 64


class LiteLLMRunner:
    """``AgentFrameworkRunner`` over LiteLLM (model calls) and MCP (tools).

    Stateless between calls apart from the MCP session pool. One instance serves every session
    of the shared Flow; the agent comes from each session's ``agent_config`` (``default_config``
    is used when a session has none).

    Args:
        server_resolver: ``async (server_name) -> McpServerSpec`` for tool calls. An exception
            it raises fails the tool Step (raise ``ToolExecutionError`` for a failure the model
            should see, e.g. a server that was disabled).
        pool: The MCP session pool; a new one by default. ``aclose()`` closes it.
        default_config: An ``agent_config`` dict for sessions that carry none.
        media_limits: The bounds of the images a tool result attaches for a model that
            accepts them (``accept_images`` is decided per agent); the defaults of
            ``mcp_registry.content`` when omitted.
        session_client: Gives a client of the session Flow for the running loop; a server's
            questions during a call wait for the user's answer through it. ``None``: every
            question is declined (the MCP client's default).
        budget_check: ``async (owner_id, agent_slug) -> refusal or None``, asked before each
            model call (issue 27 "Budgets", ``agents_app.usage.budgets``); a refusal fails the turn
            at once with it as the note. The call that crossed a budget already stops its own
            turn before its tool calls run (the Flow's ``turn_guard``); this catches a budget
            that another session spent meanwhile.
    """

    def __init__(
        self,
        server_resolver: ServerResolver,
        *,
        pool: McpClientPool | None = None,
        default_config: Mapping[str, Any] | None = None,
        media_limits: MediaLimits | None = None,
        session_client: SessionClientFactory | None = None,
        budget_check: BudgetCheck | None = None,
    ) -> None:
        self._server_resolver = server_resolver
        self._pool = pool if pool is not None else McpClientPool()
        self._default_config = dict(default_config) if default_config is not None else None
        self._media_limits = media_limits or MediaLimits()
        self._session_client = session_client
        self._budget_check = budget_check
        #: Usage the provider had reported when a call was abandoned, by (flow, turn, attempt).
        self._abandoned: dict[tuple[str, str, int], Any] = {}

    @property
    def media_limits(self) -> MediaLimits:
        """The bounds of the images a tool result attaches (``accept_images`` is per agent)."""
        return self._media_limits

    def _remember_abandoned(self, turn: AgentTurnContext, raw_usage: Any) -> None:
        """Keep what a cancelled call's provider reported until ``abandoned_call_usage``
        reads it (at most ``_ABANDONED_KEPT`` calls: one the Step never asks for is dropped)."""
        while len(self._abandoned) >= _ABANDONED_KEPT:
            del self._abandoned[next(iter(self._abandoned))]
        self._abandoned[(turn.flow_id, turn.turn_id, turn.attempt)] = raw_usage

    def abandoned_call_usage(self, turn: AgentTurnContext, streamed_text: str) -> AgentUsage:
        """The usage of ``turn``'s model call that ``cancel_turn`` abandoned (``dex_agents``
        calls it once the call's task was cancelled), priced as every call is.

        What the provider reported, when its usage arrived before the call was abandoned (a
        Chat Completions stream sends it in its last chunk, so this is rare). Otherwise an
        estimate made the way LiteLLM builds the usage of a stream that sent none (its
        ``token_counter``): the input as ``count_input_tokens(turn)`` counts it, and the
        output as the tokens of ``streamed_text``, what had arrived. A provider that goes on
        generating until it notices the closed connection bills a few tokens more; reasoning
        the call streamed is not in the estimate. Never raises: a count that fails leaves
        the request counted with no tokens (``requests=1``).
        """
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        raw = self._abandoned.pop((turn.flow_id, turn.turn_id, turn.attempt), None)
        if raw is not None:
            usage = usage_from(raw)
        else:
            usage = AgentUsage(requests=1)
            try:
                usage = AgentUsage(
                    input_tokens=self.count_input_tokens(turn),
                    output_tokens=count_text_tokens(config.model, streamed_text),
                    requests=1,
                )
            except Exception:
                _LOG.warning("Could not estimate the usage of a cancelled model call",
                             exc_info=True)
        try:
            return usage_priced(
                usage,
                model=config.model,
                input_price_per_mtok=config.input_price_per_mtok,
                output_price_per_mtok=config.output_price_per_mtok,
            )
        except Exception:
            _LOG.warning("Could not price a cancelled model call", exc_info=True)
            return usage

    def _config(self, agent_config: Mapping[str, Any] | None) -> AgentModelConfig:
        return AgentModelConfig.parse(
            agent_config if agent_config is not None else self._default_config
        )

    def describe_outcome_for_note(self, record: AgentToolCall) -> str:
        """A record's outcome as the note of a failed turn quotes it (before the note cuts it,
        ``dex_agents.build_turn_failure_note``): its text, an encoded result with images
        replaced by its text, so no image data reaches the note even in part."""
        return replace_encoded_results(describe_tool_call_outcome(record))

    def build_user_message(self, text: str) -> FrameworkMessage:
        """A user message: ``framework_item={"role": "user", "content": text}``.

        The note of a failed or cancelled turn (``TURN_FAILURE_NOTE_HEADER``,
        ``dex_agents.TURN_CANCELLED_NOTE_HEADER``) quotes each record's output;
        a result with images is replaced by its text there, so no image data is stored in a
        message or shown to people."""
        if text.startswith((TURN_FAILURE_NOTE_HEADER, TURN_CANCELLED_NOTE_HEADER)):
            text = replace_encoded_results(text)
        return FrameworkMessage(
            role=MessageRole.USER, framework_item={"role": "user", "content": text}, text=text
        )

    def build_assistant_message(
        self, text: str, usage: AgentUsage | None = None
    ) -> FrameworkMessage:
        """The text a cancelled model call had streamed (``dex_agents`` ``cancel_turn``):
        ``framework_item={"role": "assistant", "content": text}``, replayed to the model as
        its own earlier words, with the abandoned call's priced ``usage``
        (``abandoned_call_usage``) under ``USAGE_KEY`` when it is known, as every answered
        call's (:func:`chat_message` never sends it back to a provider)."""
        item: dict[str, Any] = {"role": "assistant", "content": text}
        if usage is not None:
            item[USAGE_KEY] = usage.as_dict()
        return FrameworkMessage(role=MessageRole.ASSISTANT, framework_item=item, text=text)

    def _chat_request(
        self, config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        request: dict[str, Any] = {
            "model": config.model,
            "messages": [chat_message(item) for item in messages],
            "stream": config.stream,
        }
        if config.stream:
            request["stream_options"] = {"include_usage": True}
        if config.tools:
            request["tools"] = [entry.as_openai_tool() for entry in config.tools]
        if config.reasoning_effort:
            request["reasoning_effort"] = config.reasoning_effort
        request.update(unpriced_model_pricing(config.model))
        return request

    def _responses_request(
        self, config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        instructions, items = responses_input(messages)
        request: dict[str, Any] = {
            "model": config.model,
            "input": items,
            "stream": config.stream,
            "store": False,
        }
        if instructions:
            request["instructions"] = instructions
        if config.tools:
            request["tools"] = [entry.as_responses_tool() for entry in config.tools]
        if _wants_reasoning(config.model):
            reasoning: dict[str, Any] = {"summary": "auto"}
            if config.reasoning_effort:
                reasoning["effort"] = config.reasoning_effort
            request["reasoning"] = reasoning
            request["include"] = ["reasoning.encrypted_content"]
        return request

    async def _call_model(
        self,
        config: AgentModelConfig,
        messages: Sequence[Mapping[str, Any]],
        text: DeltaBuffer,
        reasoning: DeltaBuffer,
        usage_seen: list[Any] | None = None,
    ) -> ModelReply:
        """Make the one LiteLLM call and read its reply (streamed deltas go to the buffers,
        a streamed Chat Completions usage to ``usage_seen`` as it arrives)."""
        litellm = _litellm()
        api_key = config.api_key()
        if config.api == "responses":
            request = self._responses_request(config, messages)
        else:
            request = self._chat_request(config, messages)
        request.update(timeout=DEFAULT_MODEL_TIMEOUT, max_retries=0, num_retries=0)
        if config.api_base:
            request["api_base"] = config.api_base
        if api_key is not None:
            request["api_key"] = api_key
        try:
            if config.api == "responses":
                response = await litellm.aresponses(**request)
                if config.stream:
                    return await read_responses_stream(response, text, reasoning)
                reply = read_responses_response(response)
                for item in reply.reasoning_items:
                    for part in item.get("summary") or ():
                        reasoning.add(str(part.get("text") or ""))
            else:
                response = await litellm.acompletion(**request, drop_params=True)
                if config.stream:
                    chunks = openai_chunk_stream(response)
                    if chunks is None:
                        return await read_chat_stream(response, text, reasoning, usage_seen)
                    try:
                        return await read_chat_stream(chunks, text, reasoning, usage_seen)
                    finally:
                        # Ends the HTTP response however the read ended.
                        await response.aclose()
                reply = read_chat_response(response)
                reasoning.add(chat_response_reasoning(response))
            text.add(reply.text)
            return reply
        except ModelResponseError:
            raise
        except Exception as error:
            failure = provider_failure(error, api_key)
            if isinstance(failure, ContextWindowExceededError):
                # A smaller window learned now: the next attempt cuts this turn's tool results
                # for it (fit_tool_results), so it may fit without any compaction.
                failure.retry_may_fit = remember_served_window(
                    config.model, config.context_window, config.api_base, str(failure)
                )
            if failure is error:
                raise
            raise failure from None

    # --- dex_agents.CompactingRunner (context compaction) -------------------------------------

    def context_window(self, agent_config: dict[str, Any] | None) -> int | None:
        """The session's context window: the agent definition's, else LiteLLM's model
        information, else ``None``."""
        return self._config(agent_config).window()

    def count_input_tokens(self, turn: AgentTurnContext) -> int:
        """LiteLLM's token count of the input ``run_model_step(turn)`` would send, the tools
        offered with it included."""
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        messages, _ = build_model_input(config, turn)
        tools = [entry.as_openai_tool() for entry in config.tools]
        return count_tokens(config.model, [chat_message(item) for item in messages], tools)

    def count_message_tokens(
        self, message: AgentMessage, agent_config: dict[str, Any] | None
    ) -> int:
        """LiteLLM's token count of one stored message as the model sees it (tool results
        cut)."""
        config = self._config(agent_config)
        item = cut_tool_result(stored_message_item(message), config.tool_result_limit())
        return count_tokens(config.model, [chat_message(item)])

    async def summarize(self, request: SummarizeRequest) -> SummaryResult:
        """``_summarize`` with the session ID on its log lines."""
        with bind_session(request.flow_id, request_id=f"{request.flow_id}/compaction"):
            return await self._summarize(request)

    async def _summarize(self, request: SummarizeRequest) -> SummaryResult:
        """Fold ``request.messages`` into the previous summary with one non-streamed Chat
        Completions call (``compaction_model``, else the agent's model); the call's usage is
        priced like a turn's model call (the agent's prices when the summarizer is its
        model) and the session counts it (``SummaryResult``).

        The input stays within ``request.input_budget_tokens``: each message is cut (to no
        less than 200 characters) until it fits; the answer is asked for with ``max_tokens``
        and cut to the summary budget.

        Raises:
            ModelResponseError: An empty summary.
            AgentConfigError, RedactedProviderError, Exception: As ``run_model_step`` (a
                refusal is retried here: CompactContext has its own attempts).
        """
        config = self._config(request.agent_config)
        model = config.compaction_model or config.model
        messages = summary_request_messages(
            model,
            request.previous_summary,
            [stored_message_item(message) for message in request.messages],
            [message.sequence for message in request.messages],
            request.input_budget_tokens,
        )
        litellm = _litellm()
        api_key = config.api_key()
        call: dict[str, Any] = {
            "model": model,
            "messages": messages,
            "stream": False,
            "max_tokens": request.summary_budget_tokens,
            "timeout": DEFAULT_MODEL_TIMEOUT,
            "max_retries": 0,
            "num_retries": 0,
            **unpriced_model_pricing(model),
        }
        if config.api_base:
            call["api_base"] = config.api_base
        if api_key is not None:
            call["api_key"] = api_key
        try:
            response = await litellm.acompletion(**call, drop_params=True)
        except Exception as error:
            failure = provider_failure(error, api_key, refusals=False)
            if failure is error:
                raise
            raise failure from None
        reply = read_chat_response(response)
        text = reply.text.strip()
        if not text:
            raise ModelResponseError("the summarizer returned an empty summary")
        # The agent's own prices are for its model; another summarizer model is priced from
        # LiteLLM's cost map.
        own_prices = model == config.model
        usage = usage_priced(
            reply.usage,
            model=model,
            input_price_per_mtok=config.input_price_per_mtok if own_prices else None,
            output_price_per_mtok=config.output_price_per_mtok if own_prices else None,
        )
        return SummaryResult(text[: request.summary_budget_tokens * CHARS_PER_TOKEN], usage)

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """``_run_model_step`` with the session ID on its log lines and the turn counters
        (``agents_app.metrics``): started on a turn's first model call (first attempt),
        completed when the call ends the turn, failed when the last of RunModel's
        ``_RUN_MODEL_ATTEMPTS`` attempts raises."""
        with bind_session(turn.flow_id, request_id=f"{turn.flow_id}/{turn.turn_id}"):
            if turn.framework_run_state is None and turn.attempt == 1:
                TURNS_STARTED.inc()
            try:
                outcome = await self._run_model_step(turn)
            except ModelCallError:
                TURNS_FAILED.inc()  # RunModel does not retry it
                raise
            except Exception:
                if turn.attempt >= _RUN_MODEL_ATTEMPTS:
                    TURNS_FAILED.inc()
                raise
            if isinstance(outcome, TurnCompleted):
                TURNS_COMPLETED.inc()
            return outcome

    async def _run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """Make one model call for ``turn`` (seed "run_model_step(turn)").

        Text and reasoning deltas go to ``turn.events`` through 1 s / 16 KiB buffers, flushed
        before this returns or raises. Returns ``ToolCallsRequested`` (run state: the turn's
        items so far and the Dex IDs of the requested calls) or ``TurnCompleted`` (every item
        after the user message), with this call's usage.

        Raises:
            AgentConfigError: The agent config is missing or its key variable is unset.
            ModelResponseError: Empty response, a tool call without a name, or a failed
                Responses stream.
            dex_agents.ModelCallError: The provider refused the request itself (HTTP 400,
                401, 402, 403, 404 or 422 other than a context-window error), or a budget is
                spent (``budget_check``): RunModel does not retry it, the turn fails with this
                message (issues 25, 27).
            ContextWindowExceededError: The input is longer than the model's window (the
                session compacts, or fails the turn at once).
            dex_agents.ModelRateLimitError: HTTP 429 with ``Retry-After``: retried after that
                many seconds (at most 600).
            RedactedProviderError: A provider error whose text held the key (redacted).
            ValueError: Unusable run state or missing tool call records.
            Exception: Any other LiteLLM/provider error (timeouts, connection errors, 429
                without ``Retry-After``, 5xx). All but the first three fail the attempt
                (retried).
        """
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        if self._budget_check is not None:
            refusal = await self._budget_check(
                config.owner_id, str((turn.agent_config or {}).get("agent") or "")
            )
            if refusal:
                raise ModelCallError(refusal)
        messages, turn_items = build_model_input(config, turn)
        text_events = DeltaBuffer(turn.events.write_text_delta)
        reasoning_events = ReasoningDeltaBuffer(
            turn.events.write_reasoning_delta, started=time.monotonic()
        )
        usage_seen: list[Any] = []
        try:
            reply = await self._call_model(
                config, messages, text_events, reasoning_events, usage_seen
            )
        except asyncio.CancelledError:
            # cancel_turn abandoned the call: abandoned_call_usage reads what it reported.
            self._remember_abandoned(turn, usage_seen[-1] if usage_seen else None)
            raise
        finally:
            reasoning_events.flush()
            text_events.flush()
        usage = usage_priced(
            reply.usage,
            model=config.model,
            input_price_per_mtok=config.input_price_per_mtok,
            output_price_per_mtok=config.output_price_per_mtok,
        )

        if reply.tool_calls:
            calls = finalize_tool_calls(reply.tool_calls, config, turn_items, turn.tool_calls)
            turn_items.append(_assistant_item(reply, calls, usage, reasoning_events.summary()))
            deferred = []
            for call in calls:
                if call.error is not None:
                    policy = REJECTED_CALL_POLICY
                else:
                    entry = config.tool(call.name)
                    policy = turn.resolve_tool_policy(
                        call.name, entry.effect if entry is not None else None
                    )
                deferred.append(
                    DeferredToolCall(
                        tool_call_id=call.dex_id,
                        tool_name=call.name,
                        arguments=call.arguments,
                        policy=policy,
                    )
                )
            return ToolCallsRequested(
                framework_run_state=encode_run_state(turn_items, [c.dex_id for c in calls]),
                tool_calls=deferred,
                usage=usage,
            )
        if not reply.text.strip():
            raise ModelResponseError("the model returned an empty response")
        turn_items.append(_assistant_item(reply, (), usage, reasoning_events.summary()))
        return TurnCompleted(
            new_messages=[_framework_message(item) for item in turn_items], usage=usage
        )

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        """``_execute_deferred_tool_call`` with the session ID on its log lines, counted in
        ``dexagents_tool_calls_total`` by effect and status (``succeeded``; ``failed``: a
        ``ToolExecutionError`` the model sees; ``error``: anything else, a failed attempt)."""
        record = call.tool_call
        effect = str(getattr(record.effect, "value", record.effect))
        with bind_session(call.flow_id, request_id=call.idempotency_key):
            try:
                result = await self._execute_deferred_tool_call(call)
            except ToolExecutionError:
                TOOL_CALLS.labels(effect=effect, status="failed").inc()
                raise
            except Exception:
                TOOL_CALLS.labels(effect=effect, status="error").inc()
                raise
            TOOL_CALLS.labels(effect=effect, status="succeeded").inc()
            return result

    async def _execute_deferred_tool_call(
        self, call: DeferredToolExecution
    ) -> ToolExecutionResult:
        """Run one approved tool call on its MCP server, once, with the call's idempotency key.

        MCP progress notifications and server log messages received during the call become
        ``tool_progress`` and ``tool_log`` events. Built-in tools (resources and prompts) run
        through the same pool. The server's questions (``elicitation/create``) wait for the
        user's answer as questions of the session (``_elicit_handler``).

        Returns:
            The model-visible result: the tool's text, its resource links and its structured
            content in one form, with the images the runner's ``MediaLimits`` allow when the
            model accepts images (``McpToolOutput.for_model_content``,
            ``ToolResultContent.encode``), followed by a note on each of the server's questions
            the user did not answer (expired, withdrawn, declined unasked).

        Raises:
            ToolExecutionError: Unknown tool, arguments that are not a JSON object (both
                checked before any server is contacted), or an MCP tool error (``isError`` or
                a server error response): recorded ``failed`` for the model to see.
            McpTransportError: The server could not be reached, or the request took longer than
                the tool's ``timeout_seconds`` (else the server's ``call_timeout``): a Step
                failure, so read and idempotent-write calls are retried as their policy says.
            AgentConfigError: The session has no agent config.
        """
        config = self._config(call.agent_config)
        record = call.tool_call
        entry = config.tool(record.tool_name)
        if entry is None:
            raise ToolExecutionError(f"Tool {record.tool_name!r} is not enabled for this session.")
        try:
            arguments = parse_tool_arguments(record.tool_name, record.arguments)
        except ModelResponseError as error:
            raise ToolExecutionError(
                f"{error}. Call the tool again with a JSON object as its arguments."
            ) from error
        limits = replace(self._media_limits, accept_images=config.accepts_images())
        if entry.builtin:
            try:
                content = await builtin_tool_content(
                    name=entry.name,
                    arguments=arguments,
                    pool=self._pool,
                    server_names=sorted({tool.server for tool in config.tools if tool.server}),
                    resolve_server=self._server_resolver,
                    scope=config.scope(call.flow_id),
                    media=limits,
                )
            except BuiltinToolError as error:
                raise ToolExecutionError(stored_text(error.message)) from error
            return tool_execution_result(content)

        def on_progress(progress: float, total: float | None, message: str | None) -> None:
            call.events.write_event(AgentEventType.TOOL_PROGRESS, {
                "tool_call_id": record.tool_call_id, "tool_name": record.tool_name,
                "progress": progress, "total": total, "message": message,
            })

        def on_log(level: str, data: Any) -> None:
            call.events.write_event(AgentEventType.TOOL_LOG, {
                "tool_call_id": record.tool_call_id, "tool_name": record.tool_name,
                "level": str(level), "data": data,
            })

        spec = await self._server_resolver(entry.server)
        asker, on_elicit = self._elicit_handler(call, config, entry.server)
        try:
            output = await self._pool.call_tool(
                spec, entry.tool, arguments, idempotency_key=call.idempotency_key,
                timeout=entry.timeout_seconds, on_progress=on_progress, on_log=on_log,
                on_elicit=on_elicit, scope=config.scope(call.flow_id),
            )
        except McpToolError as error:
            raise ToolExecutionError(stored_text(_with_notes(error.message, asker))) from error
        content = output.for_model_content(limits)
        return tool_execution_result(replace(content, text=_with_notes(content.text, asker)))

    def _elicit_handler(
        self, call: DeferredToolExecution, config: AgentModelConfig, server: str
    ) -> tuple[ToolCallElicitations | None, ElicitCallback | None]:
        """The MCP client's ``on_elicit`` for one attempt of ``call``, and the asker that keeps
        its notes; ``(None, None)`` without a session client (questions are then declined).

        Form mode shows the server's form, URL mode its message and URL (never opened for
        the user); the answer, or ``cancel`` once ``config.elicitation_timeout`` seconds pass
        or the session withdraws the question, goes back to the server.
        """
        if self._session_client is None:
            return None, None
        asker = ToolCallElicitations(
            self._session_client(),
            call,
            server_name=server,
            timeout=timedelta(seconds=config.elicitation_timeout),
        )

        async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
            if isinstance(params, ElicitRequestURLParams):
                outcome = await asker.ask(
                    mode="url",
                    message=params.message,
                    url=params.url,
                    server_elicitation_id=params.elicitation_id or "",
                )
            else:
                outcome = await asker.ask(
                    mode="form",
                    message=params.message,
                    requested_schema=dict(params.requested_schema),
                )
            action = cast(Literal["accept", "decline", "cancel"], outcome.action)
            return ElicitResult(action=action, content=outcome.content)

        return asker, on_elicit

    async def aclose(self) -> None:
        """Close the MCP sessions this runner opened."""
        await self._pool.aclose()


def tool_execution_result(content: ToolResultContent) -> ToolExecutionResult:
    """The result a tool Step records for ``content``: its text cut by :func:`stored_text`
    (with its images, encoded), and the whole text as ``full_text`` when the cut left some
    out, which the session stores in parts for people (``dex_agents._text_parts``)."""
    shown = stored_text(content.text)
    output = replace(content, text=shown).encode()
    return ToolExecutionResult(output, full_text=content.text if shown != content.text else None)


def stored_text(text: str, limit: int = TOOL_RESULT_MAX_STORED_BYTES) -> str:
    """``text`` as a tool call record keeps it: whole when its JSON form, ASCII-escaped as the
    Dex SDK stores it (a non-ASCII character takes 6 or 12 bytes), fits ``limit`` bytes; else
    its longest start that leaves room for a note, followed by the note saying how much was
    left out.
    """
    if _json_bytes_len(text) <= limit:
        return text
    low, high = 0, min(len(text), limit)
    while low < high:  # the longest start of at most limit - 512 bytes of JSON
        middle = (low + high + 1) // 2
        if _json_bytes_len(text[:middle]) <= limit - 512:
            low = middle
        else:
            high = middle - 1
    return (
        f"{text[:low]}\n\n[dexagents] The result was cut to its first {low:,} of "
        f"{len(text):,} characters ({limit:,} bytes of JSON) to fit the session's storage; ask "
        "the tool for a smaller part if you need the rest."
    )


_json_encode = json.JSONEncoder().encode


def _json_bytes_len(text: str) -> int:
    return len(_json_encode(text))


def _with_notes(text: str, asker: ToolCallElicitations | None) -> str:
    """``text`` followed by the notes on the server's questions the user did not answer (one
    line each, marked ``[dexagents]``), so the model knows why the server got ``cancel``."""
    if asker is None or not asker.notes:
        return text
    notes = "\n".join(f"[dexagents] {note}" for note in asker.notes)
    return f"{text}\n\n{notes}" if text else notes
