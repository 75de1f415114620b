"""Writes of the MCP registry (HackSoft "services")."""

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from asgiref.sync import async_to_sync
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from mcp_registry.function_specs import (
    ToolSchemaError,
    exposed_names_assign,
    function_parameters_build,
)
from mcp_registry.models import McpHttpSession, McpServer, McpServerProcess, McpTool
from mcp_registry.selectors import server_command_problems, server_spec_build

if TYPE_CHECKING:
    from mcp_registry.client import McpHttpSession as McpHttpSessionEvent
    from mcp_registry.client import McpProcessStatus
    from mcp_registry.config import ServerDeclaration

logger = logging.getLogger(__name__)

# Keep stored errors short: they are shown in the admin list.
LAST_ERROR_MAX_CHARS = 2000
DISCOVERY_TASK_NAME = "mcp_registry: discover the tools of every enabled MCP server"
#: ``McpTool.quarantine_reason`` of a tool listed with ``execution.taskSupport: "required"``.
TASK_REQUIRED_REASON = (
    "requires MCP task augmentation (execution.taskSupport: required), which this client "
    "does not support yet"
)


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
        from mcp_registry.client import McpClientError

        # The client's own errors are prose already; anything else names its kind.
        text = error.message if isinstance(error, McpClientError) else (
            f"{type(error).__name__}: {error}"
        )
        message = text[:LAST_ERROR_MAX_CHARS]
        server_record_discovery_error(server=server, message=message)
        logger.warning("Tool discovery failed for MCP server %s: %s", server.name, message)
        raise ToolDiscoveryError(message) from error
    return server_tools_replace(server=server, discovered=discovered)


@transaction.atomic
def server_tools_replace(*, server: McpServer, discovered: Iterable[Any]) -> list[McpTool]:
    """Upsert the discovered catalogue of ``server`` (see ``server_discover_tools``).

    Each input schema is converted with ``function_specs.function_parameters_build``. A tool
    is stored with ``quarantine_reason`` set and ``available=False``, so models are not
    offered it while the server's other tools stay usable, when its schema cannot be made
    valid, when the server's entry for it is not a valid MCP tool (``invalid_reason``), or
    when it requires MCP task augmentation (``execution.taskSupport: "required"``,
    MCP specification 2025-11-25 "Tasks"): the ``mcp`` client has no task API, so every
    call of such a tool fails with -32601. Tools whose task support is ``"optional"`` or
    ``"forbidden"`` are called normally and stay available. Exposed names are then
    reassigned across every tool (``tools_expose``).

    Args:
        discovered: Objects with ``name``, ``title``, ``description``, ``input_schema``,
            ``annotations`` and optionally ``output_schema`` and ``task_support`` attributes
            (``mcp_registry.client.DiscoveredTool``). A repeated name keeps the last entry.

    Returns:
        The server's available (listed and not quarantined) tools, ordered by name.
    """
    by_name = {tool.name: tool for tool in discovered}
    existing = {tool.name: tool for tool in McpTool.objects.filter(server=server)}
    for name, found in by_name.items():
        input_schema = found.input_schema if found.input_schema is not None else {}
        reasons: list[str] = []
        try:
            parameters = function_parameters_build(input_schema)
        except ToolSchemaError as error:
            parameters = {}
            reasons.append(str(error))
        if getattr(found, "invalid_reason", None):
            reasons.append(str(found.invalid_reason))
        if getattr(found, "task_support", None) == "required":
            reasons.append(TASK_REQUIRED_REASON)
        quarantine_reason = "; ".join(reasons)
        if quarantine_reason:
            logger.warning(
                "MCP tool %s of server %s quarantined: %s", name, server.name, quarantine_reason
            )
        values = {
            "title": (found.title or "")[:200],
            "description": found.description or "",
            "input_schema": input_schema if isinstance(input_schema, dict) else {},
            "annotations": dict(found.annotations or {}),
            "output_schema": _output_schema(found),
            "parameters": parameters,
            "quarantine_reason": quarantine_reason,
            "available": not quarantine_reason,
        }
        row = existing.get(name)
        if row is None:
            McpTool.objects.create(server=server, name=name, **values)
        else:
            for field_name, value in values.items():
                setattr(row, field_name, value)
            row.save(update_fields=[*values, "updated_at"])
    McpTool.objects.filter(server=server, available=True).exclude(name__in=by_name).update(
        available=False, updated_at=timezone.now()
    )
    tools_expose()
    server.last_discovered_at = timezone.now()
    server.last_error = ""
    server.last_error_at = None
    server.save(update_fields=["last_discovered_at", "last_error", "last_error_at", "updated_at"])
    return list(McpTool.objects.filter(server=server, available=True).order_by("name"))


def _output_schema(found: Any) -> dict[str, Any] | None:
    schema = getattr(found, "output_schema", None)
    return dict(schema) if isinstance(schema, dict) and schema else None


def tools_expose() -> int:
    """Reassign every tool's ``exposed_name`` (``function_specs.exposed_names_assign``).

    Names are assigned over all rows, available or not, so a tool that comes back keeps its
    name and two servers never offer the same name.

    Returns:
        The number of rows whose name changed.
    """
    tools = list(McpTool.objects.select_related("server").order_by("pk"))
    names = exposed_names_assign((tool.server.name, tool.name) for tool in tools)
    changed = 0
    for tool in tools:
        name = names[(tool.server.name, tool.name)]
        if tool.exposed_name != name:
            McpTool.objects.filter(pk=tool.pk).update(exposed_name=name)
            changed += 1
    return changed


def server_record_discovery_error(*, server: McpServer, message: str) -> None:
    """Store a failed discovery on ``server`` without touching its tools."""
    server.last_error = message[:LAST_ERROR_MAX_CHARS]
    server.last_error_at = timezone.now()
    server.save(update_fields=["last_error", "last_error_at", "updated_at"])


#: The registered name of ``tasks.discover_server_tools``.
DISCOVER_SERVER_TOOLS_TASK = "mcp_registry.discover_server_tools"


def server_discovery_enqueue(*, server: McpServer) -> None:
    """Queue ``tasks.discover_server_tools`` for ``server`` once the transaction commits.

    The task goes to the Celery queue that ``CELERY_TASK_ROUTES`` names for it (``discovery``
    in the dexagents project), which a worker of its own consumes, so a server that hangs
    delays no outbox delivery. It is queued by its registered name, which runs it exactly as
    its function would (``CELERY_TASK_ALWAYS_EAGER`` included): ``tasks`` imports this module,
    never the other way.
    """
    from celery import current_app

    signature = current_app.signature(DISCOVER_SERVER_TOOLS_TASK, args=(server.pk,))
    transaction.on_commit(signature.apply_async)


@dataclass(frozen=True)
class ServerSaveResult:
    """What ``server_save`` did: whether discovery was queued (``discovery_queued``) and what
    would keep the server from starting on this machine (``command_problems``, sentences of
    ``selectors.server_command_problems``)."""

    discovery_queued: bool
    command_problems: list[str]


def server_save(*, server: McpServer) -> ServerSaveResult:
    """Save ``server`` (created or changed in admin, already validated by its form) and, when
    it is enabled, queue its tool discovery once the transaction commits
    (``server_discovery_enqueue``), so the discovery sees the committed row and whatever else
    the same transaction saves (admin's tool inlines). A stdio command that is not found on
    this machine is reported, not refused: the worker may run elsewhere.

    Raises:
        kombu.exceptions.OperationalError: The Celery broker did not take the task (raised
            when the transaction commits, the server row saved).
    """
    server.save()
    if server.enabled:
        server_discovery_enqueue(server=server)
    return ServerSaveResult(
        discovery_queued=server.enabled, command_problems=server_command_problems(server=server)
    )


def servers_discovery_enqueue() -> list[str]:
    """Queue tool discovery for every enabled server (``manage.py dev`` does this at start).

    Returns:
        The names of the servers whose discovery was queued.
    """
    servers = list(McpServer.objects.filter(enabled=True).order_by("name"))
    for server in servers:
        server_discovery_enqueue(server=server)
    return [server.name for server in servers]


def server_discovery_enqueue_by_name(*, name: str) -> bool:
    """Queue discovery of the enabled server called ``name`` (a ``tools/list_changed``
    notification reached the worker).

    Returns:
        Whether a server with that name exists and is enabled.
    """
    server = McpServer.objects.filter(name=name, enabled=True).first()
    if server is None:
        return False
    server_discovery_enqueue(server=server)
    return True


def discovery_schedule_set(*, every_minutes: int) -> None:
    """Create or update the django-celery-beat PeriodicTask that runs
    ``tasks.discover_all_servers`` every ``every_minutes`` minutes (migration 0003 creates it
    with ``$DEXAGENTS_MCP_DISCOVERY_MINUTES``, default 60; it can also be edited in admin).

    Raises:
        ValueError: ``every_minutes`` is less than 1.
    """
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    if every_minutes < 1:
        raise ValueError("the discovery interval must be at least one minute")
    interval, _ = IntervalSchedule.objects.get_or_create(
        every=every_minutes, period=IntervalSchedule.MINUTES
    )
    PeriodicTask.objects.update_or_create(
        name=DISCOVERY_TASK_NAME,
        defaults={"task": "mcp_registry.discover_all_servers", "interval": interval},
    )


class ServersImportError(Exception):
    """A declared server or tool override failed the models' validation; nothing was saved."""


@dataclass
class ServersImportResult:
    """What ``servers_import`` did, by server name: created, updated, unchanged, whose
    discovery it queued (``discovery_queued``), and what looks wrong (``warnings``: sentences
    such as ``"server 'git': command 'uvx' is not on PATH ..."``)."""

    created: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    discovery_queued: list[str] = field(default_factory=list)


def _tool_overrides_apply(*, server: McpServer, declaration: "ServerDeclaration") -> bool:
    changed = False
    for tool_name, overrides in declaration.tools.items():
        values: dict[str, Any] = {
            "enabled": overrides.enabled,
            "effect_override": overrides.effect,
            "requires_approval_override": overrides.requires_approval,
            "timeout_override": overrides.timeout,
            "retries_override": overrides.retries,
        }
        tool = McpTool.objects.filter(server=server, name=tool_name).first()
        if tool is None:
            # Not discovered yet: the row waits, unavailable, for discovery to fill it in.
            tool = McpTool(server=server, name=tool_name, available=False, **values)
        elif all(getattr(tool, key) == value for key, value in values.items()):
            continue
        else:
            for key, value in values.items():
                setattr(tool, key, value)
        try:
            tool.full_clean(exclude=["server"], validate_unique=False)
        except ValidationError as error:
            raise ServersImportError(
                f"server {server.name!r}, tool {tool_name!r}: {_validation_text(error)}"
            ) from error
        tool.save()
        changed = True
    return changed


def _validation_text(error: ValidationError) -> str:
    if hasattr(error, "error_dict"):
        return "; ".join(
            f"{name}: {' '.join(str(message) for message in messages)}"
            for name, messages in error.message_dict.items()
        )
    return " ".join(error.messages)


@transaction.atomic
def servers_import(
    *, declarations: Iterable["ServerDeclaration"], discover: bool = True
) -> ServersImportResult:
    """Create or update the declared servers and tool overrides, all or nothing.

    Each server gets exactly its declared fields (``config.ServerDeclaration``); servers that
    are not declared are left alone. A declaration equal to the stored row writes nothing, so
    importing the same file twice changes nothing. With ``discover``, discovery is queued for
    every created or changed enabled server once the transaction commits. A stdio command
    that is neither on ``PATH`` nor an existing file, or a missing working directory, is
    reported in ``warnings`` (``selectors.server_command_problems``), not refused: the
    worker may run elsewhere.

    Raises:
        ServersImportError: A server or tool override failed the models' validation (for
            example a server name with capitals, a URL that is not one, an environment
            variable value where a name belongs). The transaction is rolled back.
    """
    result = ServersImportResult()
    for declaration in declarations:
        server = McpServer.objects.filter(name=declaration.name).first()
        created = server is None
        if server is None:
            server = McpServer(name=declaration.name)
        changed = created or any(
            getattr(server, key) != value for key, value in declaration.fields.items()
        )
        if changed:
            for key, value in declaration.fields.items():
                setattr(server, key, value)
            try:
                server.full_clean()
            except ValidationError as error:
                raise ServersImportError(
                    f"server {declaration.name!r}: {_validation_text(error)}"
                ) from error
            server.save()
        result.warnings.extend(
            f"server {server.name!r}: {problem}"
            for problem in server_command_problems(server=server)
        )
        tools_changed = _tool_overrides_apply(server=server, declaration=declaration)
        if created:
            result.created.append(server.name)
        elif changed or tools_changed:
            result.updated.append(server.name)
        else:
            result.unchanged.append(server.name)
        if changed and discover and server.enabled:
            server_discovery_enqueue(server=server)
            result.discovery_queued.append(server.name)
    if result.created or result.updated:
        tools_expose()
    return result


PROCESS_STDERR_MAX_CHARS = 8000
_workers_pruned = False


#: Ended process rows kept per server, of each kind (stopped; exited or failed to start).
PROCESS_ENDED_ROWS_KEPT = 20


def process_status_record(*, status: "McpProcessStatus", worker: str) -> McpServerProcess | None:
    """Upsert the row of the stdio server process that ``worker`` (``<host>:<pid>``) reports
    for one scope (``status.scope``).

    The first call in a process also deletes the live rows of workers on the same host whose
    process is gone (a worker killed without a chance to report; its guard stopped the
    server), so the admin does not show them as running. Ended rows are kept, the newest
    :data:`PROCESS_ENDED_ROWS_KEPT` per server of each kind (stopped; exited or failed), so a
    crash stays readable while per-session processes come and go.

    Returns:
        The row, or ``None`` when no server has ``status.server`` as its name (it was
        deleted or renamed meanwhile).
    """
    global _workers_pruned
    server = McpServer.objects.filter(name=status.server).first()
    if server is None:
        return None
    if not _workers_pruned:
        _workers_pruned = True
        _dead_workers_prune(host=worker.rpartition(":")[0])
    row, _ = McpServerProcess.objects.update_or_create(
        server=server,
        worker=worker,
        scope=status.scope[:300],
        started_at=status.started_at,
        defaults={
            "state": status.state,
            "guard_pid": status.guard_pid,
            "server_pid": status.server_pid,
            "restarts": status.restarts,
            "ended_at": status.ended_at,
            "exit_code": status.exit_code,
            "stderr_tail": "\n".join(status.stderr_tail)[-PROCESS_STDERR_MAX_CHARS:],
            "error": status.error[:LAST_ERROR_MAX_CHARS],
        },
    )
    if status.ended_at is not None:
        _ended_processes_prune(server=server)
    return row


def _ended_processes_prune(*, server: McpServer) -> None:
    for states in (
        [McpServerProcess.State.STOPPED],
        [McpServerProcess.State.EXITED, McpServerProcess.State.FAILED],
    ):
        stale = McpServerProcess.objects.filter(server=server, state__in=states).order_by(
            "-updated_at", "-pk"
        )[PROCESS_ENDED_ROWS_KEPT:]
        stale_ids = list(stale.values_list("pk", flat=True))
        if stale_ids:
            McpServerProcess.objects.filter(pk__in=stale_ids).delete()


def _worker_gone(worker: str, host: str) -> bool:
    """Whether ``worker`` (``<host>:<pid>``) ran on ``host`` and its process is gone."""
    import os

    worker_host, _, pid_text = worker.rpartition(":")
    if worker_host != host:
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except (ValueError, PermissionError):
        return False
    return False


def _dead_workers_prune(*, host: str) -> None:
    live = [McpServerProcess.State.STARTING, McpServerProcess.State.RUNNING]
    for row in McpServerProcess.objects.filter(worker__startswith=f"{host}:", state__in=live):
        if _worker_gone(row.worker, host):
            row.delete()


def http_session_record(*, session: "McpHttpSessionEvent", worker: str) -> None:
    """Keep the record of a Streamable-HTTP session ``worker`` opened (``session.open``), or
    drop it once the worker ended the session. A server that no longer exists is ignored."""
    server = McpServer.objects.filter(name=session.server).first()
    if server is None:
        return
    if session.open:
        McpHttpSession.objects.update_or_create(
            server=server,
            session_id=session.session_id[:300],
            defaults={
                "worker": worker,
                "scope": session.scope[:300],
                "protocol_version": (session.protocol_version or "")[:40],
            },
        )
    else:
        McpHttpSession.objects.filter(server=server, session_id=session.session_id).delete()


def http_sessions_orphaned(*, host: str) -> list[McpHttpSession]:
    """The recorded HTTP sessions of workers on ``host`` whose process is gone."""
    rows = McpHttpSession.objects.select_related("server").filter(worker__startswith=f"{host}:")
    return [row for row in rows if _worker_gone(row.worker, host)]


async def http_sessions_orphaned_close(*, host: str) -> int:
    """End the HTTP sessions that workers on ``host`` left open when they died (SIGKILL,
    power loss): ``DELETE`` each with its ``Mcp-Session-Id`` (MCP specification,
    "Transports/Session Management"), then drop its record, whatever the server answered.
    A worker calls it once at start. Sessions of dead workers on other hosts are left to
    their own host's next worker, or to the server's own expiry.

    Returns:
        How many sessions the servers confirmed ended (2xx, or 404: already gone).
    """
    from asgiref.sync import sync_to_async

    from mcp_registry.client import http_session_end

    rows = await sync_to_async(http_sessions_orphaned, thread_sensitive=False)(host=host)
    ended = 0
    for row in rows:
        spec = await sync_to_async(server_spec_build, thread_sensitive=False)(server=row.server)
        if await http_session_end(
            spec, session_id=row.session_id, protocol_version=row.protocol_version or None
        ):
            ended += 1
        await sync_to_async(row.delete, thread_sensitive=False)()
    return ended
