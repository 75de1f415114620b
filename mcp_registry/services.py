"""Writes of the MCP registry (HackSoft "services")."""

import logging
from collections.abc import Iterable
from typing import Any

from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone

from mcp_registry.models import McpServer, McpTool
from mcp_registry.selectors import server_spec_build

logger = logging.getLogger(__name__)

# Keep stored errors short: they are shown in the admin list.
LAST_ERROR_MAX_CHARS = 2000


class ToolDiscoveryError(Exception):
    """Listing a server's tools failed; the server keeps its last good catalogue."""


def server_discover_tools(*, server: McpServer) -> list[McpTool]:
    """Connect to ``server``, list its tools, and upsert them as McpTool rows.

    New tools are created enabled; known tools get the server's current title, description,
    input schema and annotations, and keep every administrator override (enabled,
    effect/approval/timeout/retries overrides). Tools the server no longer lists are marked
    ``available=False``, not deleted. On success ``last_discovered_at`` is set and the last
    error cleared.

    Returns:
        The server's available tools, ordered by name.

    Raises:
        ToolDiscoveryError: Connecting or listing failed. The catalogue is unchanged and
            ``last_error``/``last_error_at`` record the failure.
    """
    from mcp_registry.client import list_tools

    spec = server_spec_build(server=server)
    try:
        discovered = async_to_sync(list_tools)(spec)
    except Exception as error:
        message = f"{type(error).__name__}: {error}"[:LAST_ERROR_MAX_CHARS]
        server_record_discovery_error(server=server, message=message)
        logger.warning("Tool discovery failed for MCP server %s: %s", server.name, message)
        raise ToolDiscoveryError(message) from error
    return server_tools_replace(server=server, discovered=discovered)


@transaction.atomic
def server_tools_replace(*, server: McpServer, discovered: Iterable[Any]) -> list[McpTool]:
    """Upsert the discovered catalogue of ``server`` (see ``server_discover_tools``).

    Args:
        discovered: Objects with ``name``, ``title``, ``description``, ``input_schema`` and
            ``annotations`` attributes (``mcp_registry.client.DiscoveredTool``). A repeated
            name keeps the last entry.
    """
    by_name = {tool.name: tool for tool in discovered}
    existing = {tool.name: tool for tool in McpTool.objects.filter(server=server)}
    for name, found in by_name.items():
        values = {
            "title": (found.title or "")[:200],
            "description": found.description or "",
            "input_schema": dict(found.input_schema or {}),
            "annotations": dict(found.annotations or {}),
            "available": True,
        }
        row = existing.get(name)
        if row is None:
            McpTool.objects.create(server=server, name=name, **values)
        else:
            for field, value in values.items():
                setattr(row, field, value)
            row.save(update_fields=[*values, "updated_at"])
    McpTool.objects.filter(server=server, available=True).exclude(name__in=by_name).update(
        available=False, updated_at=timezone.now()
    )
    server.last_discovered_at = timezone.now()
    server.last_error = ""
    server.last_error_at = None
    server.save(update_fields=["last_discovered_at", "last_error", "last_error_at", "updated_at"])
    return list(McpTool.objects.filter(server=server, available=True).order_by("name"))


def server_record_discovery_error(*, server: McpServer, message: str) -> None:
    """Store a failed discovery on ``server`` without touching its tools."""
    server.last_error = message[:LAST_ERROR_MAX_CHARS]
    server.last_error_at = timezone.now()
    server.save(update_fields=["last_error", "last_error_at", "updated_at"])


def server_discovery_enqueue(*, server: McpServer) -> None:
    """Queue ``tasks.discover_server_tools`` for ``server`` once the transaction commits."""
    from mcp_registry.tasks import discover_server_tools

    server_id = server.pk
    transaction.on_commit(lambda: discover_server_tools.delay(server_id))


def servers_discovery_enqueue() -> list[str]:
    """Queue tool discovery for every enabled server (``manage.py dev`` does this at start).

    Returns:
        The names of the servers whose discovery was queued.
    """
    servers = list(McpServer.objects.filter(enabled=True).order_by("name"))
    for server in servers:
        server_discovery_enqueue(server=server)
    return [server.name for server in servers]
