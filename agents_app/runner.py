"""The LiteLLM runner: the platform's ``AgentFrameworkRunner`` (seed "The runner contract").

Each session carries a snapshot of its agent definition as ``agent_config`` (a plain dict, read
through ``turn.agent_config`` and ``call.agent_config``)::

    {"agent": "demo", "model": "openai/dexagents-demo",
     "api_base": "http://127.0.0.1:8811/v1" or None, "api_key_env": "DEMO_MODEL_API_KEY" or None,
     "system_prompt": "...",
     "tools": [{"name": "search__web_search", "server": "search", "tool": "web_search",
                "description": "...", "parameters": {...JSON schema...},
                "effect": "read", "requires_approval": False}]}

Every ``framework_item`` is an OpenAI Chat Completions message dict. ``run_model_step`` rebuilds
the model input from stored messages (plus, while a turn waits for tools, the turn's own items from
the run state and each tool call's final record), makes exactly one streamed
``litellm.acompletion`` call, and returns ``ToolCallsRequested`` or ``TurnCompleted``.
``execute_deferred_tool_call`` runs one tool through the MCP client pool.

The API key is read from the environment variable named by ``api_key_env`` at call time; it is
never stored, logged, or put in an error message.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dex_agents import (
    AgentMessage,
    AgentTurnContext,
    AgentTurnOutcome,
    AgentUsage,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    MessageRole,
    ToolCallsRequested,
    ToolEffect,
    ToolExecutionError,
    ToolExecutionResult,
    TurnCompleted,
    describe_tool_call_outcome,
)
from mcp_registry.client import (
    McpClientPool,
    McpServerSpec,
    McpToolError,
)


@functools.cache
def _litellm() -> Any:
    """Import LiteLLM on first use: it takes seconds, and only the worker calls models.

    LiteLLM reads two variables at import time: use its bundled model cost map instead of fetching
    one, and do not load stray ``.env`` files (which could carry real API keys into tests).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
    module: Any = importlib.import_module("litellm")
    module.suppress_debug_info = True
    module.telemetry = False
    return module

ServerResolver = Callable[[str], Awaitable[McpServerSpec]]
"""``async (server_name) -> McpServerSpec``; supplied by the Django side (reads the registry)."""

RUN_STATE_VERSION = 1
DEMO_API_KEY = "dexagents-demo-key"
"""Sent when the agent names an ``api_base`` but no ``api_key_env`` (the local demo model)."""

TOOL_NAME_SEPARATOR = "__"
DEFAULT_MODEL_TIMEOUT = 600.0
TEXT_DELTA_MIN_CHARS = 16
TEXT_DELTA_MAX_DELAY = 0.1


class ModelResponseError(RuntimeError):
    """The model's response cannot continue the turn (empty, unknown tool, bad arguments).

    Raised from ``run_model_step``, so it fails the ``RunModel`` attempt and the Step is retried.
    """


class AgentConfigError(ValueError):
    """The session's ``agent_config`` is missing or malformed; fails the Step."""


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
    """

    name: str
    server: str
    tool: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    effect: ToolEffect | None = None
    requires_approval: bool | None = None

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
        return cls(
            name=str(item.get("name") or exposed_tool_name(server, tool)),
            server=server,
            tool=tool,
            description=str(item.get("description") or ""),
            parameters=dict(item.get("parameters") or {"type": "object", "properties": {}}),
            effect=effect,
            requires_approval=requires_approval if isinstance(requires_approval, bool) else None,
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


@dataclass(frozen=True)
class AgentModelConfig:
    """The parsed ``agent_config`` a runner call works from (shape in the module docstring)."""

    model: str
    api_base: str | None
    api_key_env: str | None
    system_prompt: str
    tools: tuple[AgentToolEntry, ...]

    @classmethod
    def parse(cls, config: Mapping[str, Any] | None) -> AgentModelConfig:
        """Parse an ``agent_config`` dict.

        Raises:
            AgentConfigError: If ``config`` is ``None`` or has no ``model``.
        """
        if not config:
            raise AgentConfigError("the session has no agent_config")
        model = config.get("model")
        if not model:
            raise AgentConfigError("agent_config has no 'model'")
        return cls(
            model=str(model),
            api_base=config.get("api_base") or None,
            api_key_env=config.get("api_key_env") or None,
            system_prompt=str(config.get("system_prompt") or ""),
            tools=tuple(AgentToolEntry.from_config(item) for item in config.get("tools") or ()),
        )

    def tool(self, name: str) -> AgentToolEntry | None:
        """The enabled tool with exposed ``name``, or ``None``."""
        return next((entry for entry in self.tools if entry.name == name), None)

    def api_key(self) -> str | None:
        """The API key, read from the environment now.

        ``None`` lets LiteLLM use the provider's usual variable; the demo key is used when an
        ``api_base`` is set without ``api_key_env``.

        Raises:
            AgentConfigError: If ``api_key_env`` names a variable that is not set (the message
                names the variable, never a value).
        """
        if self.api_key_env:
            key = os.environ.get(self.api_key_env)
            if not key:
                raise AgentConfigError(f"environment variable {self.api_key_env} is not set")
            return key
        return DEMO_API_KEY if self.api_base else None


def stored_message_item(message: AgentMessage) -> dict[str, Any]:
    """The Chat Completions message for a stored ``AgentMessage``.

    Uses its ``framework_item`` when that is a message dict; otherwise falls back to
    ``{"role": <role>, "content": <text>}`` (a system role becomes ``user`` text).
    """
    item = message.framework_item
    if isinstance(item, Mapping) and isinstance(item.get("role"), str):
        return dict(item)
    role = str(message.role)
    return {"role": role if role in ("user", "assistant") else "user", "content": message.text}


def tool_result_items(
    assistant_item: Mapping[str, Any], turn: AgentTurnContext
) -> list[dict[str, Any]]:
    """One ``role="tool"`` message per call of ``assistant_item``, from the turn's final records.

    Raises:
        KeyError: If the turn has no record for one of the calls.
        ValueError: If a record is not final.
    """
    return [
        {
            "role": "tool",
            "tool_call_id": call["id"],
            "content": describe_tool_call_outcome(turn.recorded_tool_call(call["id"])),
        }
        for call in assistant_item.get("tool_calls") or ()
    ]


def encode_run_state(turn_items: Sequence[Mapping[str, Any]]) -> str:
    """Serialize the items this turn produced after its user message (non-empty JSON text)."""
    return json.dumps({"version": RUN_STATE_VERSION, "turn_items": list(turn_items)})


def decode_run_state(run_state: str) -> list[dict[str, Any]]:
    """The turn items stored by :func:`encode_run_state`.

    Raises:
        ValueError: If the text is not a run state of this runner.
    """
    data = json.loads(run_state)
    if not isinstance(data, dict) or data.get("version") != RUN_STATE_VERSION:
        raise ValueError("unrecognised framework run state")
    items = data.get("turn_items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("framework run state has no turn items")
    return items


def build_model_input(
    config: AgentModelConfig, turn: AgentTurnContext
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rebuild the model input for one call of ``turn``.

    Returns ``(messages, turn_items)``: ``messages`` is the system prompt, every stored message,
    then ``turn_items``; ``turn_items`` are the items this turn produced after its user message
    (empty on the first call; restored from the run state plus one tool result per requested
    call, rendered with ``describe_tool_call_outcome``, when resuming).

    Raises:
        ValueError: If the run state is unusable or a tool call record is missing or not final.
    """
    messages: list[dict[str, Any]] = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    messages.extend(stored_message_item(message) for message in turn.messages)
    turn_items: list[dict[str, Any]] = []
    if turn.framework_run_state is not None:
        turn_items = decode_run_state(turn.framework_run_state)
        last = turn_items[-1] if turn_items else None
        if last is None or last.get("role") != "assistant" or not last.get("tool_calls"):
            raise ValueError("framework run state does not end with a tool request")
        turn_items.extend(tool_result_items(last, turn))
    messages.extend(turn_items)
    return messages, turn_items


@dataclass
class ToolCallAccumulator:
    """Merges streamed tool-call deltas into whole calls, in the order they first appear.

    A delta is matched to a call by ``index``; without an index, by ``id``; with neither, it
    continues the most recent call. Names are set once (a repeated identical name is ignored,
    a different piece is appended); argument pieces are concatenated.
    """

    calls: list[dict[str, str]] = field(default_factory=list)
    _by_index: dict[int, int] = field(default_factory=dict)
    _by_id: dict[str, int] = field(default_factory=dict)

    def add(self, delta: Mapping[str, Any]) -> None:
        """Add one delta: ``{"index"?: int, "id"?: str, "name"?: str, "arguments"?: str}``."""
        index = delta.get("index")
        call_id = delta.get("id") or None
        position: int | None = None
        if index is not None:
            position = self._by_index.get(int(index))
        elif call_id is not None:
            position = self._by_id.get(call_id)
        elif self.calls:
            position = len(self.calls) - 1
        if position is None:
            if call_id is not None and call_id in self._by_id:
                position = self._by_id[call_id]
            else:
                position = len(self.calls)
                self.calls.append({"id": "", "name": "", "arguments": ""})
            if index is not None:
                self._by_index[int(index)] = position
        call = self.calls[position]
        if call_id is not None and not call["id"]:
            call["id"] = call_id
            self._by_id[call_id] = position
        name = delta.get("name") or ""
        if name and name != call["name"]:
            call["name"] += name
        call["arguments"] += delta.get("arguments") or ""


class TextDeltaBatcher:
    """Groups streamed text into fewer ``text_delta`` events (seed "Limits": one call is one
    Stream message, so batch very small chunks).

    Buffered text is written once it reaches ``min_chars`` characters, contains a newline, or
    is older than ``max_delay`` seconds when the next piece arrives; ``flush`` writes the rest.
    """

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        min_chars: int = TEXT_DELTA_MIN_CHARS,
        max_delay: float = TEXT_DELTA_MAX_DELAY,
    ) -> None:
        self._write = write
        self._min_chars = min_chars
        self._max_delay = max_delay
        self._buffer: list[str] = []
        self._size = 0
        self._since = 0.0

    def add(self, text: str) -> None:
        """Buffer ``text`` and write the buffer when it is due."""
        if not self._buffer:
            self._since = time.monotonic()
        self._buffer.append(text)
        self._size += len(text)
        if (
            self._size >= self._min_chars
            or "\n" in text
            or time.monotonic() - self._since >= self._max_delay
        ):
            self.flush()

    def flush(self) -> None:
        """Write whatever is buffered (nothing when empty)."""
        if self._buffer:
            self._write("".join(self._buffer))
            self._buffer.clear()
            self._size = 0


def tool_call_delta(raw: Any) -> dict[str, Any]:
    """A plain delta dict from a LiteLLM/OpenAI streamed tool call (object or dict)."""
    if isinstance(raw, Mapping):
        function = raw.get("function") or {}
        return {
            "index": raw.get("index"),
            "id": raw.get("id"),
            "name": function.get("name"),
            "arguments": function.get("arguments"),
        }
    function = getattr(raw, "function", None)
    return {
        "index": getattr(raw, "index", None),
        "id": getattr(raw, "id", None),
        "name": getattr(function, "name", None),
        "arguments": getattr(function, "arguments", None),
    }


def parse_tool_arguments(tool_name: str, arguments: str) -> dict[str, Any]:
    """Check a call's arguments: JSON text of an object (empty text counts as ``{}``).

    Raises:
        ModelResponseError: If the text is not JSON or not an object.
    """
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError as error:
        raise ModelResponseError(
            f"the model sent invalid JSON arguments for tool {tool_name!r}: {error}"
        ) from error
    if not isinstance(value, dict):
        raise ModelResponseError(
            f"the model sent arguments for tool {tool_name!r} that are not a JSON object"
        )
    return value


def usage_from(raw: Any) -> AgentUsage:
    """This call's ``AgentUsage`` from a LiteLLM/OpenAI usage object or dict (``requests=1``)."""
    if raw is None:
        return AgentUsage(requests=1)
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else raw.model_dump()
    completion_details = data.get("completion_tokens_details") or {}
    prompt_details = data.get("prompt_tokens_details") or {}
    return AgentUsage(
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        reasoning_tokens=int(completion_details.get("reasoning_tokens") or 0),
        cached_input_tokens=int(prompt_details.get("cached_tokens") or 0),
        requests=1,
    )


def finalize_tool_calls(
    merged: Sequence[Mapping[str, str]],
    config: AgentModelConfig,
    turn_items: Iterable[Mapping[str, Any]],
) -> list[dict[str, str]]:
    """Check merged calls and give each a usable ID, in model order.

    IDs must be non-empty, contain no ``/`` and be unique within the turn (seed "run_model_step"):
    a missing ID becomes ``call_<n>``, ``/`` becomes ``_``, and a repeat gets a ``_<n>`` suffix.

    Raises:
        ModelResponseError: If a call has no name, names a tool the agent does not offer, or has
            arguments that are not a JSON object.
    """
    used = {call.get("id") for item in turn_items for call in item.get("tool_calls") or ()}
    calls: list[dict[str, str]] = []
    for number, call in enumerate(merged, start=1):
        name = call.get("name", "")
        if not name:
            raise ModelResponseError("the model requested a tool call without a name")
        if config.tool(name) is None:
            raise ModelResponseError(f"the model requested unknown tool {name!r}")
        arguments = call.get("arguments", "")
        parse_tool_arguments(name, arguments)
        call_id = (call.get("id") or f"call_{len(used) + number}").replace("/", "_")
        candidate, suffix = call_id, 1
        while candidate in used:
            suffix += 1
            candidate = f"{call_id}_{suffix}"
        used.add(candidate)
        calls.append({"id": candidate, "name": name, "arguments": arguments or "{}"})
    return calls


def _framework_message(item: Mapping[str, Any]) -> FrameworkMessage:
    role = MessageRole(item["role"])
    content = item.get("content")
    return FrameworkMessage(
        role=role, framework_item=dict(item), text=content if isinstance(content, str) else ""
    )


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
    """

    def __init__(
        self,
        server_resolver: ServerResolver,
        *,
        pool: McpClientPool | None = None,
        default_config: Mapping[str, Any] | None = None,
    ) -> None:
        self._server_resolver = server_resolver
        self._pool = pool if pool is not None else McpClientPool()
        self._default_config = dict(default_config) if default_config is not None else None

    def _config(self, agent_config: Mapping[str, Any] | None) -> AgentModelConfig:
        return AgentModelConfig.parse(
            agent_config if agent_config is not None else self._default_config
        )

    def build_user_message(self, text: str) -> FrameworkMessage:
        """A user message: ``framework_item={"role": "user", "content": text}``."""
        return FrameworkMessage(
            role=MessageRole.USER, framework_item={"role": "user", "content": text}, text=text
        )

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """Make one streamed model call for ``turn`` (seed "run_model_step(turn)").

        Text deltas go to ``turn.events`` as they arrive, tiny chunks grouped by
        :class:`TextDeltaBatcher`. Returns ``ToolCallsRequested`` (run
        state: the turn's items so far as JSON) or ``TurnCompleted`` (every item after the
        user message), with this call's usage.

        Raises:
            AgentConfigError: The agent config is missing or its key variable is unset.
            ModelResponseError: Empty response, unknown tool, or invalid tool arguments.
            ValueError: Unusable run state or missing tool call records.
            Exception: Any LiteLLM/provider error. All of these fail the attempt (retried).
        """
        config = self._config(turn.agent_config)
        messages, turn_items = build_model_input(config, turn)
        request: dict[str, Any] = {
            "model": config.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "timeout": DEFAULT_MODEL_TIMEOUT,
        }
        if config.tools:
            request["tools"] = [entry.as_openai_tool() for entry in config.tools]
        if config.api_base:
            request["api_base"] = config.api_base
        api_key = config.api_key()
        if api_key is not None:
            request["api_key"] = api_key

        text_parts: list[str] = []
        text_events = TextDeltaBatcher(turn.events.write_text_delta)
        accumulator = ToolCallAccumulator()
        raw_usage: Any = None
        response = await _litellm().acompletion(**request)
        async for chunk in response:
            usage = getattr(chunk, "usage", None)
            if usage is not None:
                raw_usage = usage
            for choice in getattr(chunk, "choices", None) or ():
                delta = getattr(choice, "delta", None)
                if delta is None:
                    continue
                reasoning = getattr(delta, "reasoning_content", None)
                if reasoning:
                    turn.events.write_reasoning_delta(reasoning)
                content = getattr(delta, "content", None)
                if content:
                    text_parts.append(content)
                    text_events.add(content)
                for raw_call in getattr(delta, "tool_calls", None) or ():
                    accumulator.add(tool_call_delta(raw_call))
        text_events.flush()

        text = "".join(text_parts)
        usage = usage_from(raw_usage)
        if accumulator.calls:
            calls = finalize_tool_calls(accumulator.calls, config, turn_items)
            turn_items.append(
                {
                    "role": "assistant",
                    "content": text or None,
                    "tool_calls": [
                        {
                            "id": call["id"],
                            "type": "function",
                            "function": {"name": call["name"], "arguments": call["arguments"]},
                        }
                        for call in calls
                    ],
                }
            )
            deferred = []
            for call in calls:
                entry = config.tool(call["name"])
                effect = entry.effect if entry is not None else None
                deferred.append(
                    DeferredToolCall(
                        tool_call_id=call["id"],
                        tool_name=call["name"],
                        arguments=call["arguments"],
                        policy=turn.resolve_tool_policy(call["name"], effect),
                    )
                )
            return ToolCallsRequested(
                framework_run_state=encode_run_state(turn_items), tool_calls=deferred, usage=usage
            )
        if not text.strip():
            raise ModelResponseError("the model returned an empty response")
        turn_items.append({"role": "assistant", "content": text})
        return TurnCompleted(
            new_messages=[_framework_message(item) for item in turn_items], usage=usage
        )

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        """Run one approved tool call on its MCP server, once, with the call's idempotency key.

        Returns the tool's text (its structured content as JSON when it has no text).

        Raises:
            ToolExecutionError: Unknown tool, arguments that are not a JSON object, or an MCP
                tool error (``isError`` or a server error response): recorded ``failed``.
            McpTransportError: The server could not be reached or timed out (Step failure, so
                read and idempotent-write calls are retried).
            AgentConfigError: The session has no agent config.
        """
        config = self._config(call.agent_config)
        record = call.tool_call
        entry = config.tool(record.tool_name)
        if entry is None:
            raise ToolExecutionError(f"Tool {record.tool_name!r} is not enabled for this agent.")
        try:
            arguments = parse_tool_arguments(record.tool_name, record.arguments)
        except ModelResponseError as error:
            raise ToolExecutionError(str(error)) from error
        spec = await self._server_resolver(entry.server)
        try:
            output = await self._pool.call_tool(
                spec, entry.tool, arguments, idempotency_key=call.idempotency_key, timeout=None
            )
        except McpToolError as error:
            raise ToolExecutionError(error.message) from error
        if not output.text and output.structured_content is not None:
            return ToolExecutionResult(json.dumps(output.structured_content))
        return ToolExecutionResult(output.text)

    async def aclose(self) -> None:
        """Close the MCP sessions this runner opened."""
        await self._pool.aclose()
