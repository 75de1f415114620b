"""Read-only built-in tools that let a model use MCP resources and prompts.

MCP servers offer more than tools: resources (MCP specification, "Server features/Resources")
and prompts ("Server features/Prompts"). The platform exposes them to models through five
functions, each taking the registry name of a server the agent may use:

================================  ==========================================================
``mcp_list_resources``            ``resources/list`` (one page; pass ``cursor`` for the next)
``mcp_read_resource``             ``resources/read`` of ``uri``
``mcp_list_resource_templates``   ``resources/templates/list`` (one page)
``mcp_list_prompts``              ``prompts/list`` (one page)
``mcp_get_prompt``                ``prompts/get`` of ``name`` with string ``arguments``
================================  ==========================================================

They only read, so their effect is ``read`` and they never wait for approval. Their names
hold no ``__``, so they cannot collide with a ``<server>__<tool>`` name. Definitions are
OpenAI-style function specs (chat completions shape); :func:`builtin_tool_content` runs one
call through the worker's :class:`~mcp_registry.client.McpClientPool` and returns what the
tool message carries (text, plus the images of a resource read by a model that accepts
images; :mod:`mcp_registry.content`), :func:`builtin_tool_execute` its text. Django-free.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from mcp_registry.client import (
    McpClientPool,
    McpScope,
    McpServerSpec,
    McpToolError,
)
from mcp_registry.content import (
    MediaLimits,
    ToolResultContent,
    render_block,
    render_resource_contents,
)

BUILTIN_TOOL_EFFECT = "read"
"""The effect of every built-in tool (a ``dex_agents.ToolEffect`` value)."""

LIST_RESOURCES = "mcp_list_resources"
READ_RESOURCE = "mcp_read_resource"
LIST_RESOURCE_TEMPLATES = "mcp_list_resource_templates"
LIST_PROMPTS = "mcp_list_prompts"
GET_PROMPT = "mcp_get_prompt"
BUILTIN_TOOL_NAMES = (
    LIST_RESOURCES,
    READ_RESOURCE,
    LIST_RESOURCE_TEMPLATES,
    LIST_PROMPTS,
    GET_PROMPT,
)

ServerResolver = Callable[[str], Awaitable[McpServerSpec]]
"""Returns the connection spec of a registered server by name (the runner's resolver)."""

_DESCRIPTIONS = {
    LIST_RESOURCES: (
        "List the resources (documents, files, records) an MCP server offers. Returns one "
        "page as JSON; pass next_cursor back as cursor for the next page."
    ),
    READ_RESOURCE: (
        "Read one resource of an MCP server by its URI (from mcp_list_resources, a resource "
        "template, or a resource link in a tool result)."
    ),
    LIST_RESOURCE_TEMPLATES: (
        "List the URI templates of an MCP server's parameterised resources; fill one in and "
        "read it with mcp_read_resource."
    ),
    LIST_PROMPTS: "List the prompt templates an MCP server offers, with their arguments.",
    GET_PROMPT: (
        "Get one prompt template of an MCP server, filled in with string arguments; returns "
        "its messages."
    ),
}


class BuiltinToolError(Exception):
    """A built-in call the model should see as failed: bad arguments, a server the agent may
    not use, or the server's own error. ``message`` is meant for the model."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def builtin_tool_is(name: str) -> bool:
    """Whether ``name`` is one of the built-in MCP tools."""
    return name in BUILTIN_TOOL_NAMES


def builtin_tool_definitions(*, server_names: Sequence[str]) -> list[dict[str, Any]]:
    """The five function specs for an agent that may use ``server_names``.

    Returns:
        ``[{"type": "function", "function": {"name", "description", "parameters"}}]``,
        chat-completions shape; ``server`` is an enum of the sorted names. Empty when
        ``server_names`` is empty (nothing to browse).
    """
    servers = sorted(set(server_names))
    if not servers:
        return []
    server = {
        "type": "string",
        "enum": servers,
        "description": "Registry name of the MCP server.",
    }
    cursor = {
        "type": "string",
        "description": "next_cursor from the previous page; omit for the first page.",
    }
    parameters: dict[str, dict[str, Any]] = {
        LIST_RESOURCES: {"server": server, "cursor": cursor},
        READ_RESOURCE: {
            "server": server,
            "uri": {"type": "string", "description": "The resource URI."},
        },
        LIST_RESOURCE_TEMPLATES: {"server": server, "cursor": cursor},
        LIST_PROMPTS: {"server": server, "cursor": cursor},
        GET_PROMPT: {
            "server": server,
            "name": {"type": "string", "description": "The prompt's name."},
            "arguments": {
                "type": "object",
                "additionalProperties": {"type": "string"},
                "description": "The prompt's arguments, all strings.",
            },
        },
    }
    required = {READ_RESOURCE: ["server", "uri"], GET_PROMPT: ["server", "name"]}
    return [
        {
            "type": "function",
            "function": {
                "name": name,
                "description": _DESCRIPTIONS[name],
                "parameters": {
                    "type": "object",
                    "properties": parameters[name],
                    "required": required.get(name, ["server"]),
                    "additionalProperties": False,
                },
            },
        }
        for name in BUILTIN_TOOL_NAMES
    ]


def _string(arguments: Mapping[str, Any], key: str, *, required: bool) -> str | None:
    value = arguments.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise BuiltinToolError(f"'{key}' must be a non-empty string.")
    return value


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=1)


def _page(items: list[dict[str, Any]], next_cursor: str | None, key: str) -> str:
    page: dict[str, Any] = {key: items}
    if next_cursor:
        page["next_cursor"] = next_cursor
    return _json(page)


def _dump(model: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    dumped.pop("_meta", None)
    return dumped


async def builtin_tool_execute(
    *,
    name: str,
    arguments: Mapping[str, Any],
    pool: McpClientPool,
    server_names: Sequence[str],
    resolve_server: ServerResolver,
    scope: McpScope | None = None,
) -> str:
    """Run the built-in tool ``name`` and return the text for the model's tool message: the
    text of :func:`builtin_tool_content` with no image attached (same arguments, results and
    errors)."""
    content = await builtin_tool_content(
        name=name,
        arguments=arguments,
        pool=pool,
        server_names=server_names,
        resolve_server=resolve_server,
        scope=scope,
    )
    return content.text


async def builtin_tool_content(
    *,
    name: str,
    arguments: Mapping[str, Any],
    pool: McpClientPool,
    server_names: Sequence[str],
    resolve_server: ServerResolver,
    scope: McpScope | None = None,
    media: MediaLimits | None = None,
) -> ToolResultContent:
    """Run the built-in tool ``name`` and return what the model's tool message carries.

    Args:
        name: One of ``BUILTIN_TOOL_NAMES``.
        arguments: The model's arguments, a JSON object.
        pool: The worker's MCP client pool (sessions are shared with tool calls).
        server_names: The servers the agent may use; any other ``server`` is refused.
        resolve_server: Loads a server's connection spec by name.
        scope: The agent session the call belongs to: resources and prompts are read on that
            session's connection (the server's isolation decides which), so one session never
            reads state another session's calls created there.
        media: Whether the images of a read resource are attached, and their bounds
            (``None``: never; :class:`~mcp_registry.content.MediaLimits`).

    Returns:
        ``ToolResultContent(text, images)``. Lists: text of a JSON object ``{"resources" |
        "resource_templates" | "prompts": [...], "next_cursor"?}`` with MCP's wire field
        names. A read: each content's text verbatim, a blob of a textual MIME type decoded,
        an image blob attached as ``media`` allows, any other blob a placeholder
        (``[binary resource <uri>: <mime type>, <size>]``), separated by blank lines
        (:func:`~mcp_registry.content.render_resource_contents`). A prompt: its description,
        then each message as ``<role>: <text>``. Only a read attaches images.

    Raises:
        BuiltinToolError: Unknown built-in, bad arguments, a server outside ``server_names``,
            or the server answered with an error (show it to the model; do not retry).
        McpTransportError: The server could not be reached or timed out (retryable).
    """
    if not builtin_tool_is(name):
        raise BuiltinToolError(f"{name!r} is not a built-in MCP tool.")
    server_name = _string(arguments, "server", required=True)
    assert server_name is not None
    if server_name not in server_names:
        allowed = ", ".join(sorted(server_names)) or "none"
        raise BuiltinToolError(
            f"This agent may not use MCP server {server_name!r} (allowed: {allowed})."
        )
    spec = await resolve_server(server_name)
    try:
        if name == READ_RESOURCE:
            uri = _string(arguments, "uri", required=True)
            assert uri is not None
            result = await pool.read_resource(spec, uri, scope=scope)
            return render_resource_contents(result.contents, media)
        return ToolResultContent(await _run(name, arguments, pool, spec, scope))
    except McpToolError as error:
        raise BuiltinToolError(error.message) from error


async def _run(
    name: str,
    arguments: Mapping[str, Any],
    pool: McpClientPool,
    spec: McpServerSpec,
    scope: McpScope | None,
) -> str:
    cursor = _string(arguments, "cursor", required=False)
    if name == LIST_RESOURCES:
        resources = await pool.list_resources(spec, cursor=cursor, scope=scope)
        return _page([_dump(r) for r in resources.resources], resources.next_cursor, "resources")
    if name == LIST_RESOURCE_TEMPLATES:
        templates = await pool.list_resource_templates(spec, cursor=cursor, scope=scope)
        return _page(
            [_dump(t) for t in templates.resource_templates],
            templates.next_cursor,
            "resource_templates",
        )
    if name == LIST_PROMPTS:
        prompts = await pool.list_prompts(spec, cursor=cursor, scope=scope)
        return _page([_dump(p) for p in prompts.prompts], prompts.next_cursor, "prompts")
    prompt_name = _string(arguments, "name", required=True)
    assert prompt_name is not None
    prompt_arguments = arguments.get("arguments") or {}
    if not isinstance(prompt_arguments, Mapping) or not all(
        isinstance(value, str) for value in prompt_arguments.values()
    ):
        raise BuiltinToolError("'arguments' must be an object of strings.")
    prompt = await pool.get_prompt(spec, prompt_name, dict(prompt_arguments), scope=scope)
    lines = [prompt.description] if prompt.description else []
    lines.extend(f"{message.role}: {render_block(message.content)}" for message in prompt.messages)
    return "\n".join(lines)
