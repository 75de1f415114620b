"""Celery tasks of the MCP registry; thin wrappers over services."""

import logging

from celery import shared_task

from mcp_registry.models import McpServer
from mcp_registry.services import ToolDiscoveryError, server_discover_tools

logger = logging.getLogger(__name__)


@shared_task(name="mcp_registry.discover_server_tools")
def discover_server_tools(server_id: int) -> int | None:
    """Discover the tools of the server with primary key ``server_id``.

    Returns:
        The number of available tools, or ``None`` when the server is gone or discovery
        failed (the failure is stored on the server row, so it is not raised again here).
    """
    server = McpServer.objects.filter(pk=server_id).first()
    if server is None:
        logger.info("MCP server %s no longer exists; discovery skipped", server_id)
        return None
    try:
        return len(server_discover_tools(server=server))
    except ToolDiscoveryError:
        return None
