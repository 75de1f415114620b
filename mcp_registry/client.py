"""The MCP client the Dex worker uses to discover and call tools on trusted MCP servers.

Django-free: the caller describes a server with an :class:`McpServerSpec` (the Django side builds
one from its ``McpServer`` row) and this module does the protocol work through the ``mcp`` SDK
(2.x ``mcp.Client``), for both transports. It is the client's public face: discovery, the pool
and the checks of a call live here; the spec and errors in ``_mcp_spec``, stdio processes in
``_mcp_stdio``, one connection in ``_mcp_connection``, and what the model reads of a result in
``content``; every public name of those is importable from here.

* ``stdio``: the server command runs as a child process in its own process group (a new session).
  A small guard process sits between the worker and the server: it watches the worker and, should
  the worker die without closing the connection (even by SIGKILL), stops the whole group, SIGTERM
  first and SIGKILL two seconds later. It also reports how the server ended (exit code or
  signal). Normal shutdown follows the SDK: close stdin, wait, then SIGTERM and SIGKILL the group.
* ``streamable_http``: the server URL, with headers whose values are read from the environment.
  A clean close ends the server's MCP session with ``DELETE`` (MCP specification, "Transports/
  Session Management").

Credentials are referenced by environment-variable name in the spec and read from ``os.environ``
only when a connection opens; values are never stored on the spec, logged, or put in errors.

Connections are opened with the ``initialize`` handshake first (every released server answers
it); only a server that refuses it as a modern-only server (error -32022) is probed with
``server/discover``.

Isolation (docs/mcp-registry.md, "Isolation"): :class:`McpClientPool`
keeps one connection per server per *scope key*. Every request names an :class:`McpScope` (the
agent session and its owner), and the server's ``isolation`` decides the key: ``session`` (the
default: one connection, so one stdio process or one Streamable-HTTP ``Mcp-Session-Id``, per
agent session), ``user`` (one per owner, shared by that user's sessions) or ``shared`` (one for
the whole worker). A connection opens on its scope's first request and closes when it has been
idle for the server's ``idle_timeout``, when its agent session has ended (``sessions_ended``),
when the pool needs its slot for another (``max_processes`` bounds live stdio processes; the
least recently used idle one is closed first) or when the pool closes.
:func:`list_tools` opens a short-lived connection of its own for discovery.

Notifications (MCP specification, "Utilities/Progress", "Server features/Logging" and
"Server features/Tools/List Changed Notification"): progress for a call goes to that call's
``on_progress``. A log message names no request: on a ``session`` connection it goes to the
oldest call in flight (every call on it belongs to the same agent session); on a ``user``
connection to a call's ``on_log`` only while that call is the one request in flight (every
request there is the same user's); on a ``shared`` connection to no call, since any user's
request may have caused it. Otherwise it goes to the pool's ``on_log`` (the worker's
log), never to another user's call. A server's question (``elicitation/create``) is routed the
same way, and declined when no call owns it.
A ``notifications/tools/list_changed`` marks the server's catalogue stale and is passed to the
pool's ``on_tools_list_changed``.

Results: a ``tools/call`` result that arrived is the call's outcome, whatever happens to the
connection afterwards. Structured content is validated against the output schema stored at
discovery (``McpServerSpec.tool_output_schemas``), never by asking the server for its tool list
in the middle of a call.

Errors: :class:`McpToolError` carries a model-readable message (an ``isError`` result, a
JSON-RPC error the server answered with, a result that breaks its schema, or a call that was
not sent because the pool was full); :class:`McpTransportError` means no answer was obtained
(the server could not start, timed out, crashed or dropped the connection), which a caller
should treat as a retryable failure. Every message is plain prose: it names the server, the
request, how long a timeout waited, and for a crashed stdio server its exit code or signal and
the last lines of its stderr; never a Python class.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar, cast

import httpx2
from mcp import Client, MCPError
from mcp.types import (
    CallToolResult,
    ElicitRequestParams,
    ElicitResult,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ReadResourceResult,
)
from mcp_types import (
    RequestParamsMeta,
)
from pydantic import ValidationError

# The client's parts live in private modules; this module is their public face.
from mcp_registry._mcp_connection import (
    Connection,
    call_failure,
    invoke,
    log_idle_message,
    raised_here,
)
from mcp_registry._mcp_connection import ElicitCallback as ElicitCallback
from mcp_registry._mcp_connection import HttpSessionCallback as HttpSessionCallback
from mcp_registry._mcp_connection import LogCallback as LogCallback
from mcp_registry._mcp_connection import McpHttpSession as McpHttpSession
from mcp_registry._mcp_connection import ProgressCallback as ProgressCallback
from mcp_registry._mcp_connection import ToolsChangedCallback as ToolsChangedCallback
from mcp_registry._mcp_connection import connection_failure_text as connection_failure_text
from mcp_registry._mcp_spec import IDEMPOTENCY_KEY_META as IDEMPOTENCY_KEY_META
from mcp_registry._mcp_spec import ISOLATION_LEVELS as ISOLATION_LEVELS
from mcp_registry._mcp_spec import DiscoveredTool as DiscoveredTool
from mcp_registry._mcp_spec import Isolation as Isolation
from mcp_registry._mcp_spec import McpClientError as McpClientError
from mcp_registry._mcp_spec import McpPoolFullError as McpPoolFullError
from mcp_registry._mcp_spec import McpScope as McpScope
from mcp_registry._mcp_spec import McpServerSpec as McpServerSpec
from mcp_registry._mcp_spec import McpToolError as McpToolError
from mcp_registry._mcp_spec import McpTransportError as McpTransportError
from mcp_registry._mcp_spec import Transport as Transport
from mcp_registry._mcp_spec import http_headers
from mcp_registry._mcp_spec import scope_key as scope_key
from mcp_registry._mcp_stdio import STDERR_TAIL_LINES as STDERR_TAIL_LINES
from mcp_registry._mcp_stdio import McpProcessStatus as McpProcessStatus
from mcp_registry._mcp_stdio import ProcessState as ProcessState
from mcp_registry._mcp_stdio import ProcessStatusCallback as ProcessStatusCallback
from mcp_registry._mcp_stdio import exit_status_text as exit_status_text
from mcp_registry._mcp_stdio import with_stderr

# Rendering for the model lives in mcp_registry.content; these names stay importable from here.
from mcp_registry.content import McpResourceLink as McpResourceLink
from mcp_registry.content import McpToolOutput as McpToolOutput
from mcp_registry.content import render_block as render_block
from mcp_registry.content import render_content as render_content
from mcp_registry.content import resource_links as _resource_links
from mcp_registry.content import structured_adds_information as structured_adds_information

logger = logging.getLogger(__name__)

_MAX_TOOL_PAGES = 1000
_T = TypeVar("_T")
# A tools/call is bounded by the pool's own call clock, not by the SDK's request timeout.
_NO_SDK_TIMEOUT = 30 * 24 * 3600.0


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
            tools.extend(_lenient_tools(spec, raw, client.protocol_version))
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


def _lenient_tools(
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
                    with_stderr(failure.message, await connection._stderr_tail_after_exit())
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
                    await connection._stderr_tail_after_exit(),
                )
            ) from error
    finally:
        await connection.close()


async def http_session_end(
    spec: McpServerSpec, *, session_id: str, protocol_version: str | None = None
) -> bool:
    """End a Streamable-HTTP MCP session this side no longer holds a connection for (one a
    killed worker left open): ``DELETE`` to the server URL with its ``Mcp-Session-Id`` and the
    server's headers (MCP specification, "Transports/Session Management").

    Returns:
        ``True`` when the server answered 2xx, or 404 (the session had already ended);
        ``False`` for any other answer, an unreachable server, or an unset header variable.
        Never raises for those.
    """
    try:
        headers = http_headers(spec)
    except McpTransportError as error:
        logger.warning("Cannot end MCP session of %r: %s", spec.name, error.message)
        return False
    headers["mcp-session-id"] = session_id
    if protocol_version:
        headers["mcp-protocol-version"] = protocol_version
    try:
        async with httpx2.AsyncClient(timeout=spec.startup_timeout) as http:
            response = await http.delete(spec.url, headers=headers)
    except httpx2.HTTPError as error:
        logger.warning(
            "Cannot end MCP session of %r: %s", spec.name, connection_failure_text(error)
        )
        return False
    return response.is_success or response.status_code == 404


def _skip_sdk_result_check(client: Client, tool_name: str) -> None:
    """Keep the SDK from asking the server for its tool list in the middle of a call.

    ``mcp`` 2.3 checks a result's structured content against the tool's output schema and,
    for a tool it has not listed on this connection, sends ``tools/list`` first; a server that
    answered the call and then failed that request turned an answered call into a failure
    (retried, so the tool ran again). The client checks the schema stored at discovery
    itself (:func:`structured_content_problem`), so the SDK is told the tool has none. The
    SDK keeps that table in a private attribute; should it move, the SDK's own check runs as
    before and the tests of this behaviour fail.
    """
    schemas = getattr(client.session, "_tool_output_schemas", None)
    if isinstance(schemas, dict):
        schemas[tool_name] = None


@functools.lru_cache(maxsize=256)
def _schema_validator(schema_json: str) -> Any:
    import jsonschema

    schema = json.loads(schema_json)
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema)


def structured_content_problem(
    schema: Mapping[str, Any] | None, result: CallToolResult
) -> str | None:
    """Why ``result``'s structured content breaks the tool's output ``schema``, or ``None``.

    MCP ("Tools/Output Schema"): a tool that declares an output schema must return structured
    content that conforms to it, and clients should check. ``None`` when the tool declared no
    schema, the result is an error, or the stored schema is itself invalid (logged; a bad
    schema is the server's bug, not the call's).
    """
    if not schema or result.is_error:
        return None
    import jsonschema

    try:
        validator = _schema_validator(json.dumps(schema, sort_keys=True))
    except (jsonschema.SchemaError, TypeError, ValueError) as error:
        logger.warning("The stored output schema is invalid and is not checked: %s", error)
        return None
    if result.structured_content is None:
        return "it returned no structured content although the tool declares an output schema"
    mismatch = jsonschema.exceptions.best_match(
        validator.iter_errors(result.structured_content)
    )
    if mismatch is None:
        return None
    where = "/".join(str(part) for part in mismatch.absolute_path)
    at = f" at {where}" if where else ""
    return f"its structured content does not match the output schema{at}: {mismatch.message}"


class _CancelledBySessionEnd(Exception):
    """A request this pool cancelled because its agent session ended."""


class _CallTimedOut(Exception):
    """The call clock ran out; the request was cancelled."""


class _CallClock:
    """The time a call may wait for its answer, ``limit`` seconds, not counting the time a
    user spends answering the server's questions (elicitation), which has its own bound."""

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self._started = time.monotonic()
        self._paused_for = 0.0
        self._pauses = 0
        self._paused_at = 0.0

    def start(self) -> None:
        """Start counting now (when the request is sent: opening the connection has its own
        bound, the startup timeout)."""
        self._started = time.monotonic()
        self._paused_for = 0.0

    @property
    def paused(self) -> bool:
        return self._pauses > 0

    def pause(self) -> None:
        if self._pauses == 0:
            self._paused_at = time.monotonic()
        self._pauses += 1

    def resume(self) -> None:
        self._pauses -= 1
        if self._pauses == 0:
            self._paused_for += time.monotonic() - self._paused_at

    def remaining(self) -> float:
        """Seconds left; while paused, what was left when the pause began."""
        now = self._paused_at if self.paused else time.monotonic()
        return self.limit - (now - self._started - self._paused_for)


async def _await_request(request: asyncio.Future[_T], clock: _CallClock | None) -> _T:
    """Wait for ``request`` within ``clock``; at its end cancel the request (the SDK then
    sends ``notifications/cancelled``) and raise :class:`_CallTimedOut`. A cancelled caller
    cancels the request too."""
    try:
        while True:
            if clock is None:
                return await asyncio.shield(request)
            wait = 1.0 if clock.paused else clock.remaining()
            if wait <= 0:
                request.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await request
                raise _CallTimedOut
            done, _ = await asyncio.wait({request}, timeout=wait)
            if done:
                return request.result()
    except asyncio.CancelledError:
        if not request.cancelled() or _current_task_cancelling():
            request.cancel()
        raise


def _crash_message(spec: McpServerSpec, what: str, connection: Connection) -> str:
    capture = connection.stderr
    code = capture.exit_code if capture else None
    return with_stderr(
        f"MCP server {spec.name!r} {exit_status_text(code)} during {what}",
        capture.tail() if capture else (),
    )


def _current_task_cancelling() -> bool:
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class McpClientPool:
    """Long-lived MCP connections, one per server and scope key, in one event loop.

    Create one per worker process and ``await pool.aclose()`` on shutdown, or use it as an
    async context manager. The pool binds to the event loop of its first call; using it from
    another loop raises ``RuntimeError``. A request names its :class:`McpScope`; the server's
    ``isolation`` decides which connection it travels on (module docstring). The first
    request of a scope connects; a failed or dropped connection is reopened by the next one,
    and a changed spec for the same server replaces it.

    Args:
        on_tools_list_changed: Called with the server's name for every
            ``notifications/tools/list_changed`` (MCP specification, "Tools/List Changed
            Notification"); the worker passes ``mcp_registry.tasks.tools_list_changed_enqueue``
            so discovery refreshes the stored catalogue. The name is also added to
            :attr:`stale_catalogues` either way.
        on_log: Called as ``on_log(server_name, level, data)`` for log messages no call
            owns (module docstring); default: this module's logger at INFO.
        on_process_status: Called with an :class:`McpProcessStatus` whenever a stdio server
            process of the pool starts, becomes ready, stops, exits or fails, and (at most
            twice a second) when it writes to stderr; calls are serialized, in order. The
            worker passes ``mcp_registry.tasks.process_status_record``, which keeps the rows
            the admin shows.
        on_http_session: Called with an :class:`McpHttpSession` when a Streamable-HTTP
            session opens or this side closes it (``mcp_registry.tasks.http_session_record``).
        sessions_ended: ``await sessions_ended(session_ids)`` returns which of the given agent
            session IDs have ended (stopped); their connections are closed and their requests
            in flight cancelled (``notifications/cancelled``). Asked every
            ``ended_check_interval`` seconds while such connections are open.
        max_processes: At most this many stdio server processes run at once. A new one
            closes the least recently used idle one; when every one is busy, the request
            waits up to the server's ``startup_timeout`` for one to become idle, then fails
            with :class:`McpPoolFullError` without reaching the server.
        reap_interval: Seconds between checks for connections idle past their server's
            ``idle_timeout``.
        ended_check_interval: Seconds between ``sessions_ended`` checks.
    """

    def __init__(
        self,
        *,
        on_tools_list_changed: ToolsChangedCallback | None = None,
        on_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
        on_process_status: ProcessStatusCallback | None = None,
        on_http_session: HttpSessionCallback | None = None,
        sessions_ended: Callable[[set[str]], Awaitable[set[str]]] | None = None,
        max_processes: int = 32,
        reap_interval: float = 5.0,
        ended_check_interval: float = 15.0,
    ) -> None:
        if max_processes < 1:
            raise ValueError("max_processes must be at least 1")
        self._connections: dict[tuple[str, str], Connection] = {}
        self._on_process_status = on_process_status
        self._on_http_session = on_http_session
        self._sessions_ended = sessions_ended
        self._max_processes = max_processes
        self._reap_interval = reap_interval
        self._ended_check_interval = ended_check_interval
        self._status_lock: asyncio.Lock | None = None
        self._admission: asyncio.Lock | None = None
        self._slot_freed: asyncio.Event | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self._starts: dict[tuple[str, str], int] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_tools_list_changed = on_tools_list_changed
        self._on_log = on_log or log_idle_message
        self.stale_catalogues: set[str] = set()
        """Names of servers that announced a changed tool list since this pool connected."""

    async def __aenter__(self) -> McpClientPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def open_connections(self, server_name: str | None = None) -> list[str]:
        """The scope keys of the open connections (of ``server_name`` only, when given)."""
        return sorted(
            key
            for (name, key), connection in self._connections.items()
            if not connection.broken and (server_name is None or name == server_name)
        )

    async def _tools_list_changed(self, server_name: str) -> None:
        self.stale_catalogues.add(server_name)
        if self._on_tools_list_changed is not None:
            await invoke(self._on_tools_list_changed, server_name)

    def _bind_loop(self) -> None:
        if self._closed:
            raise McpTransportError("the MCP client pool is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
            self._status_lock = asyncio.Lock()
            self._admission = asyncio.Lock()
            self._slot_freed = asyncio.Event()
        elif self._loop is not loop:
            # Sessions are owned by tasks of the first loop; they cannot serve another one.
            raise RuntimeError("an McpClientPool serves the event loop it was first used in")
        if self._reaper is None or self._reaper.done():
            self._reaper = loop.create_task(self._reap(), name="mcp-pool-reaper")

    async def _admit(self, spec: McpServerSpec) -> None:
        """Make room for one more stdio process (caller holds ``_admission``)."""
        assert self._slot_freed is not None
        deadline = time.monotonic() + spec.startup_timeout
        while True:
            live = [
                connection
                for connection in self._connections.values()
                if connection.spec.transport == "stdio"
            ]
            if len(live) < self._max_processes:
                return
            idle = [connection for connection in live if connection.requests_in_flight == 0]
            if idle:
                # Closed in the background: stopping a process may take seconds, which the
                # new request need not wait for.
                self._drop_soon(min(idle, key=lambda connection: connection.last_used))
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise McpPoolFullError(
                    f"MCP server {spec.name!r} was not called: this worker already runs "
                    f"{len(live)} MCP server processes (its limit) and none became free "
                    f"within {spec.startup_timeout:g} s. Nothing was sent; try again later."
                )
            self._slot_freed.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._slot_freed.wait()

    async def _connection(self, spec: McpServerSpec, scope: McpScope | None) -> Connection:
        """The connection for ``scope``, opened if needed, with one request admitted on it
        (the caller must ``_release`` it)."""
        self._bind_loop()
        assert self._admission is not None and self._status_lock is not None
        key = (spec.name, scope_key(spec, scope))
        connection = self._connections.get(key)
        if self._usable(connection, spec):
            # The common case takes no lock: a start or an eviction elsewhere never delays a
            # request on a connection that is already open.
            assert connection is not None
            return self._admitted(connection, spec)
        async with self._admission:
            connection = self._connections.get(key)
            if connection is not None and not self._usable(connection, spec):
                self._drop_soon(connection)
                connection = None
            if connection is None:
                if spec.transport == "stdio":
                    await self._admit(spec)
                if self._closed:
                    raise McpTransportError("the MCP client pool is closed")
                starts = self._starts.get(key, 0)
                self._starts[key] = starts + 1
                connection = Connection(
                    spec,
                    key=key[1],
                    on_idle_log=self._on_log,
                    on_tools_list_changed=self._tools_list_changed,
                    on_status=self._on_process_status,
                    on_http_session=self._on_http_session,
                    status_lock=self._status_lock,
                    restarts=starts,
                )
                self._connections[key] = connection
            return self._admitted(connection, spec)

    @staticmethod
    def _usable(connection: Connection | None, spec: McpServerSpec) -> bool:
        return (
            connection is not None
            and not connection.broken
            and connection.spec.fingerprint() == spec.fingerprint()
        )

    @staticmethod
    def _admitted(connection: Connection, spec: McpServerSpec) -> Connection:
        # Later requests use the newest stored schemas and idle timeout without reconnecting.
        connection.spec = spec
        connection.requests_in_flight += 1
        connection.last_used = time.monotonic()
        return connection

    def _release(self, connection: Connection) -> None:
        connection.requests_in_flight -= 1
        connection.last_used = time.monotonic()
        if connection.requests_in_flight == 0:
            key = (connection.spec.name, connection.key)
            if connection.broken and self._connections.get(key) is connection:
                # A server that exited while a request was in flight is closed now.
                self._drop_soon(connection)
            if self._slot_freed is not None:
                self._slot_freed.set()

    def _drop_soon(self, connection: Connection) -> None:
        key = (connection.spec.name, connection.key)
        if self._connections.get(key) is connection:
            del self._connections[key]
        task = asyncio.get_running_loop().create_task(self._drop(connection))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _drop(self, connection: Connection) -> None:
        key = (connection.spec.name, connection.key)
        if self._connections.get(key) is connection:
            del self._connections[key]
        await connection.close()
        if self._slot_freed is not None:
            self._slot_freed.set()

    async def _reap(self) -> None:
        """Close connections idle past their ``idle_timeout``, and those of ended sessions."""
        next_ended_check = time.monotonic() + self._ended_check_interval
        while not self._closed:
            await asyncio.sleep(self._reap_interval)
            now = time.monotonic()
            for connection in list(self._connections.values()):
                if connection.requests_in_flight == 0 and connection.broken:
                    await self._drop(connection)
                elif (
                    connection.requests_in_flight == 0
                    and now - connection.last_used >= connection.spec.idle_timeout
                ):
                    logger.info(
                        "Closing MCP server %r connection (%s): idle for %.0f s",
                        connection.spec.name, connection.key, now - connection.last_used,
                    )
                    await self._drop(connection)
            if self._sessions_ended is not None and now >= next_ended_check:
                next_ended_check = now + self._ended_check_interval
                await self._close_ended_sessions()

    async def _close_ended_sessions(self) -> None:
        assert self._sessions_ended is not None
        candidates = {
            scope.session_id
            for connection in self._connections.values()
            for scope in connection.requests.values()
            if scope is not None
        } | {
            connection.key.removeprefix("session ")
            for connection in self._connections.values()
            if connection.single_session
        }
        if not candidates:
            return
        try:
            ended = await self._sessions_ended(candidates)
        except Exception:
            logger.exception("Could not learn which agent sessions ended")
            return
        for session_id in ended:
            await self.session_close(session_id)

    async def session_close(self, session_id: str) -> int:
        """Cancel the requests of agent session ``session_id`` and close its connections.

        Each cancelled request sends ``notifications/cancelled`` (MCP specification,
        "Utilities/Cancellation") and fails with :class:`McpTransportError`; a ``session``
        connection is closed (its stdio process stopped, its HTTP session ended with
        ``DELETE``). Connections other sessions share stay open.

        Returns:
            How many requests were cancelled.
        """
        cancelled = 0
        for connection in list(self._connections.values()):
            for task, scope in list(connection.requests.items()):
                if scope is not None and scope.session_id == session_id and not task.done():
                    task.cancel(_CancelledBySessionEnd.__name__)
                    cancelled += 1
            if connection.key == f"session {session_id}":
                with contextlib.suppress(Exception):
                    await asyncio.wait(set(connection.requests), timeout=5.0)
                await self._drop(connection)
        return cancelled

    async def _request(
        self,
        spec: McpServerSpec,
        scope: McpScope | None,
        what: str,
        send: Callable[[Client], Awaitable[_T]],
        *,
        on_log: LogCallback | None = None,
        on_elicit: ElicitCallback | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
        clock: _CallClock | None = None,
    ) -> _T:
        """Send one request for ``scope`` and map failures to this module's errors.

        ``clock``, when given, bounds the wait for the answer (its time stands still while
        the user answers an elicitation); ``timeout`` only words the SDK's own timeouts.
        """
        connection = await self._connection(spec, scope)
        try:
            try:
                client = await connection.wait_ready()
            except McpTransportError:
                await self._drop(connection)
                raise
            if on_log is not None:
                connection.log_listeners.append(on_log)
            if on_elicit is not None:
                connection.elicit_handlers.append(on_elicit)
            if clock is not None:
                clock.start()
            request = asyncio.ensure_future(send(client))
            connection.requests[request] = scope
            try:
                return await _await_request(request, clock)
            except _CallTimedOut:
                raise McpTransportError(
                    f"MCP server {spec.name!r} did not answer {what} within "
                    f"{clock.limit if clock else 0:g} s; the request was cancelled"
                ) from None
            except asyncio.CancelledError:
                if request.cancelled() and not _current_task_cancelling():
                    # session_close cancelled the request itself, not the caller.
                    raise McpTransportError(
                        f"MCP server {spec.name!r}: {what} was cancelled because its agent "
                        "session ended"
                    ) from None
                request.cancel()
                raise
            except MCPError as error:
                # A JSON-RPC error is the server's answer; a timeout is the client giving up.
                cause = raised_here(error)
                failure = call_failure(spec, what, error, timeout)
                if cause == "closed":
                    if await connection.ended_on_its_own():
                        failure = McpTransportError(_crash_message(spec, what, connection))
                    await self._drop(connection)
                raise failure from error
            except ValidationError as error:
                raise McpToolError(
                    f"MCP server {spec.name!r} returned an invalid result for {what}"
                ) from error
            except Exception as error:
                crashed = await connection.ended_on_its_own()
                await self._drop(connection)
                if crashed:
                    raise McpTransportError(_crash_message(spec, what, connection)) from error
                raise McpTransportError(
                    f"MCP server {spec.name!r} connection failed during {what}: "
                    f"{connection_failure_text(error)}"
                ) from error
            finally:
                connection.requests.pop(request, None)
                if on_log is not None:
                    with contextlib.suppress(ValueError):
                        connection.log_listeners.remove(on_log)
                if on_elicit is not None:
                    with contextlib.suppress(ValueError):
                        connection.elicit_handlers.remove(on_elicit)
        finally:
            self._release(connection)

    async def call_tool(
        self,
        spec: McpServerSpec,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        # The platform passes per-call limits through; the SDK enforces them per request.
        timeout: float | None,  # noqa: ASYNC109
        on_progress: ProgressCallback | None = None,
        on_log: LogCallback | None = None,
        on_elicit: ElicitCallback | None = None,
        scope: McpScope | None = None,
    ) -> McpToolOutput:
        """Call ``tool_name`` on ``spec``'s server with ``arguments`` (a JSON object).

        ``scope`` names the agent session (and owner) the call is made for, which decides its
        connection (module docstring); ``None`` uses the server's shared one.
        ``idempotency_key`` is sent in the request ``_meta`` under ``dexagents/idempotency_key``.
        ``timeout`` is in seconds (``None``: ``spec.call_timeout``); at the timeout the request
        is cancelled (``notifications/cancelled``). Opening the connection is bounded
        separately by ``spec.startup_timeout``.

        ``on_progress(progress, total, message)`` receives the call's progress notifications (a
        progress token is sent only when it is given); ``on_log(level, data)`` receives the
        server's log messages the module docstring attributes to this call. Both may be plain
        or async functions; they run in their own tasks, so a slow callback never delays the
        call, and an exception in one is logged and otherwise ignored. ``on_elicit(params)``
        answers the questions (``elicitation/create``) the server asks during the call, routed
        as log messages are; the call's ``timeout`` does not run while it waits. Without it, a
        question is declined.

        Once the result has arrived it is the call's outcome: nothing sent afterwards on the
        connection can turn it into a failure. Its structured content is checked against
        ``spec.tool_output_schemas[tool_name]``.

        Returns:
            ``McpToolOutput(text, structured_content, resource_links)``; give the model
            ``output.for_model()``.

        Raises:
            McpToolError: The result has ``isError`` set (``message`` is its text), its
                structured content breaks the stored output schema (the message quotes its
                text), or the server answered with a JSON-RPC error or an invalid result.
            McpPoolFullError: Not sent: every stdio slot of the pool stayed busy.
            McpTransportError: The server could not be started or reached, the call timed out
                (the message says after how long), the server crashed (its exit status and
                last stderr lines) or the connection dropped; the next call reopens it.
        """
        meta: RequestParamsMeta | None = None
        if idempotency_key is not None:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_KEY_META: idempotency_key})
        call_timeout = spec.call_timeout if timeout is None else timeout
        progress_callback = None
        if on_progress is not None:
            progress_tasks: set[asyncio.Task[None]] = set()

            async def progress_callback(
                progress: float, total: float | None, message: str | None
            ) -> None:
                assert on_progress is not None
                task = asyncio.create_task(invoke(on_progress, progress, total, message))
                progress_tasks.add(task)
                task.add_done_callback(progress_tasks.discard)

        clock = _CallClock(call_timeout)
        elicit: ElicitCallback | None = None
        if on_elicit is not None:
            answer = on_elicit

            async def elicit(params: ElicitRequestParams) -> ElicitResult:
                clock.pause()
                try:
                    return await answer(params)
                finally:
                    clock.resume()

        async def send(client: Client) -> CallToolResult:
            _skip_sdk_result_check(client, tool_name)
            return await client.call_tool(
                tool_name,
                dict(arguments),
                # The call clock bounds the wait (it stands still while the user answers a
                # question); the SDK's own timeout would not.
                read_timeout_seconds=_NO_SDK_TIMEOUT,
                progress_callback=progress_callback,
                meta=meta,
            )

        what = f"the call to tool {tool_name!r}"
        result = await self._request(
            spec, scope, what, send, on_log=on_log, on_elicit=elicit, timeout=call_timeout,
            clock=clock,
        )
        if on_progress is not None and progress_tasks:
            # Deliver every progress event before the result, in arrival order.
            await asyncio.gather(*progress_tasks, return_exceptions=True)
        text = render_content(result)
        if result.is_error:
            raise McpToolError(
                text or f"Tool {tool_name!r} failed without a message.",
                structured_content=result.structured_content,
            )
        problem = structured_content_problem(spec.tool_output_schemas.get(tool_name), result)
        if problem is not None:
            quoted = f" Its text content was:\n{text}" if text else ""
            raise McpToolError(
                f"MCP server {spec.name!r} answered {what}, but {problem}.{quoted}",
                structured_content=result.structured_content,
            )
        return McpToolOutput(
            text=text,
            structured_content=result.structured_content,
            resource_links=_resource_links(result),
            content=tuple(result.content),
        )

    async def list_resources(
        self, spec: McpServerSpec, *, cursor: str | None = None, scope: McpScope | None = None
    ) -> ListResourcesResult:
        """One page of ``resources/list`` (MCP specification, "Resources/Listing Resources"),
        on ``scope``'s connection.

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            scope,
            "resources/list",
            lambda client: client.list_resources(cursor=cursor, cache_mode="bypass"),
        )

    async def list_resource_templates(
        self, spec: McpServerSpec, *, cursor: str | None = None, scope: McpScope | None = None
    ) -> ListResourceTemplatesResult:
        """One page of ``resources/templates/list`` ("Resources/Resource Templates").

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            scope,
            "resources/templates/list",
            lambda client: client.list_resource_templates(cursor=cursor, cache_mode="bypass"),
        )

    async def read_resource(
        self, spec: McpServerSpec, uri: str, *, scope: McpScope | None = None
    ) -> ReadResourceResult:
        """``resources/read`` of ``uri`` ("Resources/Reading Resources").

        Raises McpToolError (unknown resource, invalid result) or McpTransportError.
        """
        return await self._request(
            spec,
            scope,
            f"resources/read of {uri!r}",
            lambda client: client.read_resource(uri, cache_mode="bypass"),
        )

    async def list_prompts(
        self, spec: McpServerSpec, *, cursor: str | None = None, scope: McpScope | None = None
    ) -> ListPromptsResult:
        """One page of ``prompts/list`` (MCP specification, "Prompts/Listing Prompts").

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            scope,
            "prompts/list",
            lambda client: client.list_prompts(cursor=cursor, cache_mode="bypass"),
        )

    async def get_prompt(
        self,
        spec: McpServerSpec,
        name: str,
        arguments: Mapping[str, str] | None = None,
        *,
        scope: McpScope | None = None,
    ) -> GetPromptResult:
        """``prompts/get`` of ``name`` with string ``arguments`` ("Prompts/Getting a Prompt").

        Raises McpToolError (unknown prompt, missing argument) or McpTransportError.
        """
        return await self._request(
            spec,
            scope,
            f"prompts/get of {name!r}",
            lambda client: client.get_prompt(name, dict(arguments or {})),
        )

    async def aclose(self) -> None:
        """Close every connection and stop stdio servers. Later calls raise
        McpTransportError."""
        self._closed = True
        reaper, self._reaper = self._reaper, None
        if reaper is not None and not reaper.done():
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reaper
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(
            *(connection.close() for connection in connections), *list(self._closing)
        )
