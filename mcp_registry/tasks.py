"""Celery tasks of the MCP registry; thin wrappers over services."""

import logging
from typing import TYPE_CHECKING

from celery import shared_task

from mcp_registry.models import McpServer
from mcp_registry.services import (
    DISCOVER_SERVER_TOOLS_TASK,
    ToolDiscoveryError,
    server_discover_tools,
    server_discovery_enqueue_by_name,
    servers_discovery_enqueue,
)

if TYPE_CHECKING:
    from mcp_registry.client import McpHttpSession, McpProcessStatus

logger = logging.getLogger(__name__)


@shared_task(name=DISCOVER_SERVER_TOOLS_TASK)
def discover_server_tools(server_id: int) -> int | None:
    """Discover the tools of the server with primary key ``server_id``.

    Routed to the Celery queue ``discovery`` (``CELERY_TASK_ROUTES``): it may wait on a
    hanging server for the server's whole start-up timeout, and must not hold the worker that
    delivers the outbox.

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


@shared_task(name="mcp_registry.discover_all_servers")
def discover_all_servers() -> list[str]:
    """Queue discovery of every enabled server; django-celery-beat runs this periodically
    (PeriodicTask created by migration 0003, interval editable in admin).

    It only queues (``services.servers_discovery_enqueue``), so it stays on the default Celery
    queue; each ``discover_server_tools`` it queues goes to the discovery queue.

    Returns:
        The names of the servers whose discovery was queued.
    """
    return servers_discovery_enqueue()


async def tools_list_changed_enqueue(server_name: str) -> None:
    """Queue discovery of ``server_name`` after it sent ``notifications/tools/list_changed``.

    Pass it to the worker's pool: ``McpClientPool(on_tools_list_changed=...)``. Runs the
    database work in a thread (the worker's event loop must not block on the ORM).
    """
    from asgiref.sync import sync_to_async

    queued = await sync_to_async(server_discovery_enqueue_by_name, thread_sensitive=False)(
        name=server_name
    )
    if queued:
        logger.info("MCP server %s changed its tool list; discovery queued", server_name)


def worker_id() -> str:
    """``<host>:<pid>`` of this process, the ``McpServerProcess.worker`` it reports as."""
    import os
    import socket

    return f"{socket.gethostname()}:{os.getpid()}"


async def process_status_record(status: "McpProcessStatus") -> None:
    """Store a stdio server process's status for the admin (``services.process_status_record``).

    Pass it to the worker's pool: ``McpClientPool(on_process_status=...)``. Runs the database
    work in a thread; a failure is logged, never raised into the worker.
    """
    from asgiref.sync import sync_to_async

    from mcp_registry.services import process_status_record as record

    try:
        await sync_to_async(record, thread_sensitive=False)(status=status, worker=worker_id())
    except Exception:
        logger.exception("Could not record the process status of MCP server %s", status.server)


async def http_session_record(session: "McpHttpSession") -> None:
    """Keep the record of a Streamable-HTTP session the worker opened or closed
    (``services.http_session_record``), so a later worker can end what a killed one left.

    Pass it to the worker's pool: ``McpClientPool(on_http_session=...)``. A failure is logged,
    never raised into the worker.
    """
    from asgiref.sync import sync_to_async

    from mcp_registry.services import http_session_record as record

    try:
        await sync_to_async(record, thread_sensitive=False)(session=session, worker=worker_id())
    except Exception:
        logger.exception("Could not record the HTTP session of MCP server %s", session.server)
