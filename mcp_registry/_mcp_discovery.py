"""Tool discovery: every tool a server lists, on a short-lived connection of its own.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). Owns
:func:`list_tools` (``tools/list`` through every ``nextCursor`` page) and the reading of a page
the SDK refuses as a whole because of one bad entry (:func:`lenient_tools`, issue 25): each entry
is then checked on its own, a schema without a type is read as an object schema, and what stays
invalid is kept with its reason for discovery to quarantine. Discovery never uses the pool's
connections, so it neither waits for nor disturbs an agent session's calls. Imports
``mcp_registry._mcp_spec``, ``mcp_registry._mcp_stdio``, ``mcp_registry._mcp_transport`` and
``mcp_registry._mcp_connection``.
"""

from __future__ import annotations

import logging
from typing import Any

from mcp import Client, MCPError
from pydantic import ValidationError

from mcp_registry._mcp_connection import Connection
from mcp_registry._mcp_spec import (
    DiscoveredTool,
    McpClientError,
    McpServerSpec,
    McpToolError,
    McpTransportError,
)
from mcp_registry._mcp_stdio import with_stderr
from mcp_registry._mcp_transport import call_failure, connection_failure_text

logger = logging.getLogger("mcp_registry.client")

_MAX_TOOL_PAGES = 1000


def _discovered(tool: Any) -> DiscoveredTool:
    annotations: dict[str, Any] = (
        tool.annotations.model_dump(by_alias=True, exclude_none=True) if tool.annotations else {}
    )
    return DiscoveredTool(
        name=tool.name,
        title=tool.title or annotations.get("title"),
        description=tool.description or "",
        input_schema=dict(tool.input_schema),
        annotations=annotations,
        output_schema=dict(tool.output_schema) if tool.output_schema else None,
        task_support=tool.execution.task_support if tool.execution else None,
    )


async def _list_all_tools(client: Client, spec: McpServerSpec) -> list[DiscoveredTool]:
    tools: list[DiscoveredTool] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        try:
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        except ValidationError:
            # One tool the MCP schema refuses made the SDK refuse the whole page (issue 25:
            # 0 of a server's 41 tools usable). Read the page again and take its tools one
            # by one.
            raw = await _raw_tools_page(client, spec, cursor)
            tools.extend(lenient_tools(spec, raw, client.protocol_version))
            next_cursor = raw.get("nextCursor")
            cursor = next_cursor if isinstance(next_cursor, str) and next_cursor else None
        else:
            tools.extend(_discovered(tool) for tool in page.tools)
            cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpTransportError(
        f"MCP server {spec.name!r} listed more than {_MAX_TOOL_PAGES} pages of tools"
    )


async def _raw_tools_page(
    client: Client, spec: McpServerSpec, cursor: str | None
) -> dict[str, Any]:
    """One ``tools/list`` page as the server sent it, not validated.

    ``mcp`` 2.3 has no public request without its result check, so this uses the session's
    request stamp and dispatcher (private; ``mcp`` is pinned). Should they move, the listing
    fails as before ("returned an invalid tool list") and the tests of lenient listing fail.

    Raises:
        McpToolError: The SDK's private request path is not there, or the answer is not a
            JSON object.
        MCPError: The server answered with an error.
    """
    session = client.session
    stamp = getattr(session, "_stamp", None)
    dispatcher = getattr(session, "_dispatcher", None)
    if stamp is None or dispatcher is None:
        raise McpToolError(f"MCP server {spec.name!r} returned an invalid tool list")
    data: dict[str, Any] = {"method": "tools/list", "params": {"cursor": cursor} if cursor else {}}
    opts: dict[str, Any] = {"timeout": spec.call_timeout}
    stamp(data, opts)
    raw = await dispatcher.send_raw_request("tools/list", data.get("params"), opts)
    if not isinstance(raw, dict):
        raise McpToolError(f"MCP server {spec.name!r} returned an invalid tool list")
    return raw


def lenient_tools(
    spec: McpServerSpec, page: dict[str, Any], version: str
) -> list[DiscoveredTool]:
    """The tools of a raw ``tools/list`` ``page``, each checked on its own (issue 25), inside
    the page's own envelope (the 2026-07-28 result carries ``cacheScope``, ``ttlMs`` and
    ``resultType`` besides ``tools``; an envelope that is itself invalid is set aside and the
    entries are checked as 2025-11-25 tools).

    A valid entry is read as the SDK reads it. An ``inputSchema`` without a top-level ``type``
    (``{}``, or a bare ``oneOf``) is read as an object schema (tool arguments are always a JSON
    object): ``{}`` becomes ``{"type": "object", "properties": {}}`` (any arguments), otherwise
    ``"type": "object"`` is added; the schema conversion for models then decides as for any
    tool. Any other invalid entry is kept with ``invalid_reason`` (discovery quarantines it);
    an entry without a name is skipped and logged.
    """
    from mcp.shared.inbound import find_invalid_x_mcp_header
    from mcp.types import Tool
    from mcp_types.methods import validate_server_result

    envelope = {key: value for key, value in page.items() if key not in ("tools", "nextCursor")}
    try:
        validate_server_result("tools/list", version, {**envelope, "tools": []})
    except ValidationError:
        envelope, version = {}, "2025-11-25"

    def check(item: dict[str, Any]) -> DiscoveredTool:
        validate_server_result("tools/list", version, {**envelope, "tools": [item]})
        return _discovered(Tool.model_validate(item))

    items = page.get("tools")
    tools: list[DiscoveredTool] = []
    for item in items if isinstance(items, list) else []:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            logger.warning("MCP server %s listed a tool without a name; skipped", spec.name)
            continue
        header_problem = find_invalid_x_mcp_header(item.get("inputSchema"))
        if header_problem is not None:
            # The SDK drops such a tool from a 2026 listing (the specification's MUST).
            logger.warning("MCP tool %s of server %s dropped: invalid x-mcp-header (%s)",
                           name, spec.name, header_problem)
            continue
        try:
            tools.append(check(item))
            continue
        except ValidationError as error:
            problem = error
        schema = item.get("inputSchema")
        if isinstance(schema, dict) and "type" not in schema:
            normalized = {"type": "object", **schema} if schema else {
                "type": "object", "properties": {}}
            try:
                tools.append(check({**item, "inputSchema": normalized}))
                logger.warning(
                    "MCP tool %s of server %s has an input schema without a type; read as an "
                    "object schema", name, spec.name,
                )
                continue
            except ValidationError as again:
                problem = again
        tools.append(DiscoveredTool(
            name=name,
            title=None,
            description=str(item.get("description") or ""),
            input_schema={},
            annotations={},
            invalid_reason=_entry_problem(problem),
        ))
    return tools


def _entry_problem(error: ValidationError) -> str:
    """A short admin-readable reason from a tool entry's validation errors."""
    parts = []
    for detail in error.errors()[:3]:
        where = ".".join(str(step) for step in detail.get("loc", ()) if step not in ("tools", 0))
        parts.append(f"{where or 'entry'}: {detail.get('msg', 'invalid')}")
    return "the server's tools/list entry is not a valid MCP tool (" + "; ".join(parts) + ")"


async def list_tools(spec: McpServerSpec) -> list[DiscoveredTool]:
    """Discover every tool ``spec`` offers, following ``nextCursor`` through all pages.

    Opens a short-lived session (``startup_timeout`` for the handshake, ``call_timeout`` per
    page) and closes it, stopping a stdio server's process group.

    Raises:
        McpTransportError: The server could not be started (a stdio server's message ends with
            the last lines of its stderr, e.g. ``No such file or directory``), a secret
            reference is not set, the server timed out, or it dropped the connection.
        McpToolError: The server answered ``tools/list`` with an error or an invalid result.
    """
    connection = Connection(spec)
    try:
        client = await connection.wait_ready()
        try:
            return await _list_all_tools(client, spec)
        except MCPError as error:
            failure = call_failure(spec, "tools/list", error, None)
            if isinstance(failure, McpTransportError):
                await connection.close()
                failure = McpTransportError(
                    with_stderr(failure.message, await connection.stderr_tail_after_exit())
                )
            raise failure from error
        except ValidationError as error:
            raise McpToolError(f"MCP server {spec.name!r} returned an invalid tool list") from error
        except McpClientError:
            raise
        except Exception as error:
            await connection.close()
            raise McpTransportError(
                with_stderr(
                    f"MCP server {spec.name!r} connection failed during tools/list: "
                    f"{connection_failure_text(error)}",
                    await connection.stderr_tail_after_exit(),
                )
            ) from error
    finally:
        await connection.close()
