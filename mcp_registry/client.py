"""The MCP client the Dex worker uses to discover and call tools on trusted MCP servers.

Django-free: the caller describes a server with an :class:`McpServerSpec` (the Django side builds
one from its ``McpServer`` row) and this module does the protocol work through the ``mcp`` SDK
(2.x ``mcp.Client``), for both transports:

* ``stdio``: the server command runs as a child process in its own process group (a new session).
  A small guard process sits between the worker and the server: it watches the worker and, should
  the worker die without closing the connection (even by SIGKILL), stops the whole group, SIGTERM
  first and SIGKILL two seconds later. Normal shutdown follows the SDK: close stdin, wait, then
  SIGTERM and SIGKILL the group.
* ``streamable_http``: the server URL, with headers whose values are read from the environment.

Credentials are referenced by environment-variable name in the spec and read from ``os.environ``
only when a connection opens; values are never stored on the spec, logged, or put in errors.

:class:`McpClientPool` keeps one long-lived session per server per worker process (per event
loop) and multiplexes concurrent calls over it; a broken session is dropped and reopened on the
next call. :func:`list_tools` opens a short-lived session for discovery.

Notifications (MCP specification, "Utilities/Progress", "Server features/Logging" and
"Server features/Tools/List Changed Notification"): progress for a call goes to that call's
``on_progress``; a log message goes to the ``on_log`` of every call in flight on the server's
session (log messages name no request), or to the pool's ``on_log`` when none is; a
``notifications/tools/list_changed`` marks the server's catalogue stale and is passed to the pool's
``on_tools_list_changed``.

Errors: :class:`McpToolError` carries a model-readable message (an ``isError`` result, or a JSON-RPC
error the server answered with); :class:`McpTransportError` means no answer was obtained (the
server could not start, timed out, or the connection dropped), which a caller should treat as a
retryable failure rather than something to show the model.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO, TypeVar, cast

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import IncomingMessage, LoggingFnT, MessageHandlerFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    AudioContent,
    CallToolResult,
    ContentBlock,
    EmbeddedResource,
    GetPromptResult,
    ImageContent,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    LoggingMessageNotificationParams,
    ReadResourceResult,
    ResourceLink,
    TextContent,
    TextResourceContents,
    ToolListChangedNotification,
)
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, RequestParamsMeta
from pydantic import ValidationError

logger = logging.getLogger(__name__)

Transport = Literal["stdio", "streamable_http"]

IDEMPOTENCY_KEY_META = "dexagents/idempotency_key"
"""The request ``_meta`` key that carries a tool call's idempotency key to the server."""

_MAX_TOOL_PAGES = 1000
# Log messages at this level and above are requested from servers on the 2026-07-28 protocol,
# where delivery is opted into per request (SEP-2577); older servers send what they like.
_LOG_LEVEL = "info"

_T = TypeVar("_T")

ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None] | None]
"""``on_progress(progress, total, message)``: one MCP progress notification of a call.

``progress`` increases with every notification; ``total`` is ``None`` when unknown; units are
the server's (MCP specification, "Utilities/Progress"). May be a plain or an async function."""

LogCallback = Callable[[str, Any], Awaitable[None] | None]
"""``on_log(level, data)``: one MCP log message (``notifications/message``).

``level`` is a syslog level name (``debug`` ... ``emergency``), ``data`` any JSON value
(MCP specification, "Server features/Logging"). May be a plain or an async function."""

ToolsChangedCallback = Callable[[str], Awaitable[None] | None]
"""``on_tools_list_changed(server_name)``: the server sent ``notifications/tools/list_changed``."""
_HTTP_CONNECT_TIMEOUT = 30.0
_HTTP_READ_TIMEOUT = 300.0

# Runs as ``python -I -c _GUARD_SOURCE <worker pid> <command> [args...]`` in the server's new
# process group. It starts the server with the inherited stdin/stdout, drops its own copies of
# those pipes, and stops the group when the worker is gone, when it is asked to stop (SIGTERM),
# or once the server exits, so no member of the group outlives the connection.
_GUARD_SOURCE = """
import os, signal, subprocess, sys, threading, time
worker = int(sys.argv[1])
stopping = threading.Event()
def escalate():
    try:
        os.killpg(0, signal.SIGTERM)
    except OSError:
        pass
    time.sleep(2.0)
    os.killpg(0, signal.SIGKILL)
def stop(*_):
    if not stopping.is_set():
        stopping.set()
        threading.Thread(target=escalate, daemon=True).start()
def watch_worker():
    while os.getppid() == worker:
        time.sleep(0.2)
    stop()
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    server = subprocess.Popen(sys.argv[2:])
except OSError as error:
    sys.stderr.write("cannot start MCP server %r: %s\\n" % (sys.argv[2], error))
    sys.exit(127)
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
threading.Thread(target=watch_worker, daemon=True).start()
server.wait()
os.killpg(0, signal.SIGKILL)
"""


@dataclass(frozen=True)
class McpServerSpec:
    """How to reach one MCP server; holds environment-variable names, never secret values.

    Attributes:
        name: The server's registry name (``search``); tools are exposed as ``<name>__<tool>``.
        transport: ``"stdio"`` or ``"streamable_http"``.
        command: stdio: the executable to run.
        args: stdio: its arguments.
        cwd: stdio: its working directory (``None``: the worker's).
        env_names: stdio: variables copied from ``os.environ`` into the server's environment at
            connect time (on top of a minimal safe set: ``HOME``, ``PATH``, ...). Unset names are
            skipped.
        url: streamable_http: the endpoint URL.
        header_env: streamable_http: HTTP header name -> name of the variable holding its value.
        startup_timeout: Seconds allowed to spawn or connect and finish the MCP handshake.
        call_timeout: Default seconds allowed for one request (``tools/call``, one
            ``tools/list`` page).
    """

    name: str
    transport: Transport
    command: str = ""
    args: Sequence[str] = ()
    cwd: str | None = None
    env_names: Sequence[str] = ()
    url: str = ""
    header_env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 30.0
    call_timeout: float = 60.0

    def fingerprint(self) -> str:
        """A stable string identifying this configuration (names only, no secret values)."""
        fields = asdict(self)
        fields["args"] = list(self.args)
        fields["env_names"] = list(self.env_names)
        fields["header_env"] = dict(self.header_env)
        return json.dumps(fields, sort_keys=True)


@dataclass(frozen=True)
class DiscoveredTool:
    """One tool a server lists (``tools/list``).

    Attributes:
        name: The tool's name on its server.
        title: Display title: ``title``, else ``annotations.title``, else ``None``.
        description: The description, ``""`` when absent.
        input_schema: The JSON Schema of the arguments (an object schema).
        annotations: The tool annotations with wire names (``readOnlyHint``,
            ``destructiveHint``, ``idempotentHint``, ``openWorldHint``, ``title``); unset hints
            are omitted.
    """

    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]


@dataclass(frozen=True)
class McpResourceLink:
    """A ``resource_link`` content block of a tool result (MCP specification, "Tools/Resource
    Links"): a resource the model may read with the ``mcp_read_resource`` built-in tool."""

    uri: str
    name: str
    description: str | None = None
    mime_type: str | None = None


@dataclass(frozen=True)
class McpToolOutput:
    """A successful ``tools/call`` result.

    Attributes:
        text: Model-readable text of the content blocks (see :func:`render_content`).
        structured_content: The result's ``structuredContent`` (any JSON value) or ``None``.
        resource_links: The result's ``resource_link`` blocks, in order.
    """

    text: str
    structured_content: Any = None
    resource_links: tuple[McpResourceLink, ...] = ()

    def for_model(self) -> str:
        """The whole result as one string for the model's tool message.

        The rendered content (resource links included, one per line), followed by the
        structured content as JSON under ``Structured content:`` unless the text already is
        that same JSON value (MCP asks servers to mirror structured content in a text block,
        "Tools/Structured Content"). An empty result reads ``(no content)``.
        """
        parts = [self.text] if self.text else []
        if self.structured_content is not None and not _text_is_json_of(
            self.text, self.structured_content
        ):
            rendered = json.dumps(self.structured_content, ensure_ascii=False, sort_keys=True)
            parts.append(f"Structured content:\n{rendered}" if parts else rendered)
        return "\n".join(parts) if parts else "(no content)"


def _text_is_json_of(text: str, value: Any) -> bool:
    try:
        return bool(json.loads(text) == value)
    except ValueError:
        return False


class McpClientError(Exception):
    """Base class of this module's errors. ``message`` is safe to log (it holds no secrets)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class McpToolError(McpClientError):
    """The server answered the call with a failure; ``message`` is meant for the model.

    Raised for an ``isError`` result (``message`` is the result's text) and for a JSON-RPC error
    response or an invalid result (``message`` names the server, tool and the server's reason).
    Retrying the same call is not expected to help.
    """

    def __init__(self, message: str, *, structured_content: Any = None) -> None:
        super().__init__(message)
        self.structured_content = structured_content


class McpTransportError(McpClientError):
    """No answer was obtained: spawn or connect failure, handshake or call timeout, or a
    dropped connection. The call may or may not have reached the server."""


def _server_environment(spec: McpServerSpec) -> dict[str, str]:
    return {name: os.environ[name] for name in spec.env_names if name in os.environ}


def _http_headers(spec: McpServerSpec) -> dict[str, str]:
    headers: dict[str, str] = {}
    for header, env_name in spec.header_env.items():
        value = os.environ.get(env_name)
        if value is None:
            raise McpTransportError(
                f"MCP server {spec.name!r}: environment variable {env_name} "
                f"(for header {header}) is not set"
            )
        headers[header] = value
    return headers


def _stdio_parameters(spec: McpServerSpec) -> StdioServerParameters:
    if not spec.command:
        raise McpTransportError(f"MCP server {spec.name!r}: no command configured")
    if sys.platform == "win32":  # the guard relies on POSIX process groups
        return StdioServerParameters(
            command=spec.command, args=list(spec.args), env=_server_environment(spec), cwd=spec.cwd
        )
    return StdioServerParameters(
        command=sys.executable,
        args=["-I", "-c", _GUARD_SOURCE, str(os.getpid()), spec.command, *spec.args],
        env=_server_environment(spec),
        cwd=spec.cwd,
    )


def _server_errlog() -> TextIO:
    """Where a stdio server's stderr goes: this process's stderr when it is a real file.

    Celery (and other hosts) replace ``sys.stderr`` with a logging proxy that has no file
    descriptor, which a child process cannot inherit; the original stderr is used then.
    """
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return _devnull()


@functools.cache
def _devnull() -> TextIO:
    return open(os.devnull, "w")  # kept open for the life of the process


@asynccontextmanager
async def _open_client(
    spec: McpServerSpec,
    *,
    logging_callback: LoggingFnT | None = None,
    message_handler: MessageHandlerFnT | None = None,
) -> AsyncIterator[Client]:
    """Connect to ``spec`` and complete the MCP handshake; close everything on exit.

    Raises McpTransportError for configuration problems; the SDK's own exceptions otherwise.
    """
    callbacks: dict[str, Any] = {
        "read_timeout_seconds": spec.call_timeout,
        "logging_callback": logging_callback,
        "message_handler": message_handler,
        "log_level": _LOG_LEVEL,
    }
    async with AsyncExitStack() as stack:
        if spec.transport == "stdio":
            client = Client(
                stdio_client(_stdio_parameters(spec), errlog=_server_errlog()), **callbacks
            )
        elif spec.transport == "streamable_http":
            if not spec.url:
                raise McpTransportError(f"MCP server {spec.name!r}: no URL configured")
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=_http_headers(spec),
                    timeout=httpx2.Timeout(_HTTP_CONNECT_TIMEOUT, read=_HTTP_READ_TIMEOUT),
                )
            )
            client = Client(
                streamable_http_client(spec.url, http_client=http_client), **callbacks
            )
        else:
            raise McpTransportError(
                f"MCP server {spec.name!r}: unknown transport {spec.transport!r}"
            )
        yield await stack.enter_async_context(client)


def _root_cause(error: BaseException) -> BaseException:
    """The first leaf of (possibly nested) exception groups raised by anyio task groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _startup_failure(spec: McpServerSpec, error: BaseException) -> McpTransportError:
    error = _root_cause(error)
    if isinstance(error, McpTransportError):
        return error
    if isinstance(error, TimeoutError):
        return McpTransportError(
            f"MCP server {spec.name!r} did not finish starting within {spec.startup_timeout:g} s"
        )
    reason = error.message if isinstance(error, MCPError) else type(error).__name__
    return McpTransportError(f"MCP server {spec.name!r} could not be started: {reason}")


def render_block(block: ContentBlock) -> str:
    """Render one MCP content block as a line (or lines) of model-readable text.

    Text and embedded text resources appear verbatim; a resource link becomes
    ``[resource link] <name> <uri> (<mime type>): <description>`` so the model can read it with
    ``mcp_read_resource``; images, audio and binary resources become short bracketed
    placeholders (their bytes are not shown to the model).
    """
    if isinstance(block, TextContent):
        return block.text
    if isinstance(block, EmbeddedResource):
        if isinstance(block.resource, TextResourceContents):
            return block.resource.text
        mime = f" ({block.resource.mime_type})" if block.resource.mime_type else ""
        return f"[binary resource {block.resource.uri}{mime}]"
    if isinstance(block, ResourceLink):
        line = f"[resource link] {block.name} <{block.uri}>"
        if block.mime_type:
            line += f" ({block.mime_type})"
        if block.description:
            line += f": {block.description}"
        return line
    if isinstance(block, ImageContent | AudioContent):
        return f"[{block.type} {block.mime_type}]"
    return f"[{block.type} content]"


def render_content(result: CallToolResult) -> str:
    """Render a result's content blocks with :func:`render_block`, one block per line."""
    return "\n".join(render_block(block) for block in result.content)


def _resource_links(result: CallToolResult) -> tuple[McpResourceLink, ...]:
    return tuple(
        McpResourceLink(
            uri=str(block.uri),
            name=block.name,
            description=block.description,
            mime_type=block.mime_type,
        )
        for block in result.content
        if isinstance(block, ResourceLink)
    )


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
    )


async def _list_all_tools(client: Client, spec: McpServerSpec) -> list[DiscoveredTool]:
    tools: list[DiscoveredTool] = []
    cursor: str | None = None
    for _ in range(_MAX_TOOL_PAGES):
        page = await client.list_tools(cursor=cursor, cache_mode="bypass")
        tools.extend(_discovered(tool) for tool in page.tools)
        cursor = page.next_cursor
        if cursor is None:
            return tools
    raise McpTransportError(
        f"MCP server {spec.name!r} listed more than {_MAX_TOOL_PAGES} pages of tools"
    )


async def list_tools(spec: McpServerSpec) -> list[DiscoveredTool]:
    """Discover every tool ``spec`` offers, following ``nextCursor`` through all pages.

    Opens a short-lived session (``startup_timeout`` for the handshake, ``call_timeout`` per
    page) and closes it, stopping a stdio server's process group.

    Raises:
        McpTransportError: The server could not be reached, timed out, or dropped the connection.
        McpToolError: The server answered ``tools/list`` with an error or an invalid result.
    """
    connection = _Connection(spec)
    try:
        client = await connection.wait_ready()
        try:
            return await _list_all_tools(client, spec)
        except MCPError as error:
            raise _call_failure(spec, "tools/list", error) from error
        except ValidationError as error:
            raise McpToolError(f"MCP server {spec.name!r} returned an invalid tool list") from error
        except McpClientError:
            raise
        except Exception as error:
            raise McpTransportError(
                f"MCP server {spec.name!r} connection failed during tools/list: "
                f"{type(_root_cause(error)).__name__}"
            ) from error
    finally:
        await connection.close()


def _call_failure(spec: McpServerSpec, what: str, error: MCPError) -> McpClientError:
    if error.code == CONNECTION_CLOSED:
        return McpTransportError(f"MCP server {spec.name!r} closed the connection during {what}")
    if error.code == REQUEST_TIMEOUT:
        return McpTransportError(f"MCP server {spec.name!r} did not answer {what} in time")
    return McpToolError(
        f"MCP server {spec.name!r} rejected {what}: {error.message} (error code {error.code})"
    )


async def _invoke(callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
    """Run a plain or async callback; its failure is logged, never raised into the session."""
    try:
        result = callback(*args)
        if result is not None:
            await result
    except Exception:
        logger.exception("MCP notification callback %r failed", callback)


class _Connection:
    """One long-lived session, owned by a dedicated task.

    The SDK's client holds anyio task groups and cancel scopes that must be entered and left by
    the same task, so a task of its own enters the client, reports readiness, and leaves it
    when ``close`` is called or the transport fails; calls from other tasks share the session.

    ``log_listeners`` holds the ``on_log`` callbacks of the calls in flight; ``on_idle_log``
    gets log messages that arrive while none is, ``on_tools_list_changed`` the server's name
    when it announces a changed tool list.
    """

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        on_idle_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
        on_tools_list_changed: Callable[[str], Awaitable[None] | None] | None = None,
    ) -> None:
        self.spec = spec
        self.client: Client | None = None
        self.broken = False
        self.log_listeners: list[LogCallback] = []
        self._on_idle_log = on_idle_log
        self._on_tools_list_changed = on_tools_list_changed
        self._notification_tasks: set[asyncio.Task[None]] = set()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._own(), name=f"mcp-connection-{spec.name}")

    def _spawn(self, callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
        # Callbacks may write events or touch a database: never run them in the session's
        # reader, which would stall every response behind them.
        task = asyncio.get_running_loop().create_task(_invoke(callback, *args))
        self._notification_tasks.add(task)
        task.add_done_callback(self._notification_tasks.discard)

    async def _log_received(self, params: LoggingMessageNotificationParams) -> None:
        if self.log_listeners:
            for listener in list(self.log_listeners):
                self._spawn(listener, params.level, params.data)
        elif self._on_idle_log is not None:
            self._spawn(self._on_idle_log, self.spec.name, params.level, params.data)

    async def _message_received(self, message: IncomingMessage) -> None:
        if (
            isinstance(message, ToolListChangedNotification)
            and self._on_tools_list_changed is not None
        ):
            self._spawn(self._on_tools_list_changed, self.spec.name)

    async def _own(self) -> None:
        try:
            async with _open_client(
                self.spec,
                logging_callback=self._log_received,
                message_handler=self._message_received,
            ) as client:
                self.client = client
                self._ready.set_result(None)
                await self._stop.wait()
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.set_exception(TimeoutError())
            raise
        except Exception as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            else:
                logger.warning(
                    "MCP server %r session ended: %s", self.spec.name, type(error).__name__
                )
        finally:
            self.broken = True
            self.client = None

    async def wait_ready(self) -> Client:
        """Wait for the handshake (at most ``startup_timeout`` s) and return the client.

        Raises McpTransportError when the server cannot be started in time.
        """
        try:
            async with asyncio.timeout(self.spec.startup_timeout):
                await asyncio.shield(self._ready)
        except TimeoutError as error:
            await self.close()
            raise _startup_failure(self.spec, error) from error
        except McpClientError:
            raise
        except Exception as error:
            raise _startup_failure(self.spec, error) from error
        if self.client is None:
            raise McpTransportError(f"MCP server {self.spec.name!r} session is closed")
        return self.client

    async def close(self) -> None:
        """Leave the session and stop the server; waits for the owner task to finish."""
        self.broken = True
        self._stop.set()
        if not self._ready.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task


async def _log_idle_message(server: str, level: str, data: Any) -> None:
    logger.info("MCP server %r log (%s): %s", server, level, data)


class McpClientPool:
    """Long-lived MCP sessions, one per server, shared by every call in one event loop.

    Create one per worker process and ``await pool.aclose()`` on shutdown, or use it as an
    async context manager. The pool binds to the event loop of its first call; using it from
    another loop raises ``RuntimeError``. Concurrent calls to one server share its
    session; the first call connects, a failed or dropped session is reopened by the next call,
    and a changed spec for the same server name replaces the old session.

    Args:
        on_tools_list_changed: Called with the server's name for every
            ``notifications/tools/list_changed`` (MCP specification, "Tools/List Changed
            Notification"); the worker passes ``mcp_registry.tasks.tools_list_changed_enqueue``
            so discovery refreshes the stored catalogue. The name is also added to
            :attr:`stale_catalogues` either way.
        on_log: Called as ``on_log(server_name, level, data)`` for log messages that arrive
            while no call with its own ``on_log`` is in flight; default: this module's logger at
            INFO.
    """

    def __init__(
        self,
        *,
        on_tools_list_changed: ToolsChangedCallback | None = None,
        on_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
    ) -> None:
        self._connections: dict[str, _Connection] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._on_tools_list_changed = on_tools_list_changed
        self._on_log = on_log or _log_idle_message
        self.stale_catalogues: set[str] = set()
        """Names of servers that announced a changed tool list since this pool connected."""

    async def __aenter__(self) -> McpClientPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _tools_list_changed(self, server_name: str) -> None:
        self.stale_catalogues.add(server_name)
        if self._on_tools_list_changed is not None:
            await _invoke(self._on_tools_list_changed, server_name)

    async def _connection(self, spec: McpServerSpec) -> _Connection:
        if self._closed:
            raise McpTransportError("the MCP client pool is closed")
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            # Sessions are owned by tasks of the first loop; they cannot serve another one.
            raise RuntimeError("an McpClientPool serves the event loop it was first used in")
        key = spec.fingerprint()
        connection = self._connections.get(spec.name)
        if connection is not None and (connection.broken or connection.spec.fingerprint() != key):
            del self._connections[spec.name]
            await connection.close()
            connection = self._connections.get(spec.name)
        if connection is None:
            connection = _Connection(
                spec, on_idle_log=self._on_log, on_tools_list_changed=self._tools_list_changed
            )
            self._connections[spec.name] = connection
        return connection

    async def _drop(self, connection: _Connection) -> None:
        if self._connections.get(connection.spec.name) is connection:
            del self._connections[connection.spec.name]
        await connection.close()

    async def _ready_client(self, spec: McpServerSpec) -> tuple[_Connection, Client]:
        connection = await self._connection(spec)
        try:
            return connection, await connection.wait_ready()
        except McpTransportError:
            await self._drop(connection)
            raise

    async def _request(
        self,
        spec: McpServerSpec,
        what: str,
        send: Callable[[Client], Awaitable[_T]],
        *,
        on_log: LogCallback | None = None,
    ) -> _T:
        """Send one request over ``spec``'s session and map failures to this module's errors."""
        connection, client = await self._ready_client(spec)
        if on_log is not None:
            connection.log_listeners.append(on_log)
        try:
            return await send(client)
        except MCPError as error:
            failure = _call_failure(spec, what, error)
            if error.code == CONNECTION_CLOSED:
                await self._drop(connection)
            raise failure from error
        except ValidationError as error:
            raise McpToolError(
                f"MCP server {spec.name!r} returned an invalid result for {what}"
            ) from error
        except Exception as error:
            await self._drop(connection)
            raise McpTransportError(
                f"MCP server {spec.name!r} connection failed during {what}: "
                f"{type(_root_cause(error)).__name__}"
            ) from error
        finally:
            if on_log is not None:
                with contextlib.suppress(ValueError):
                    connection.log_listeners.remove(on_log)

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
    ) -> McpToolOutput:
        """Call ``tool_name`` on ``spec``'s server with ``arguments`` (a JSON object).

        ``idempotency_key`` is sent in the request ``_meta`` under ``dexagents/idempotency_key``.
        ``timeout`` is in seconds (``None``: ``spec.call_timeout``); opening the session is
        bounded separately by ``spec.startup_timeout``.

        ``on_progress(progress, total, message)`` receives the call's progress notifications (a
        progress token is sent only when it is given); ``on_log(level, data)`` receives the
        server's log messages while the call is in flight (see the module docstring). Both may
        be plain or async functions; they run in their own tasks, so a slow callback never
        delays the call, and an exception in one is logged and otherwise ignored.

        Returns:
            ``McpToolOutput(text, structured_content, resource_links)``; give the model
            ``output.for_model()``.

        Raises:
            McpToolError: The result has ``isError`` set (``message`` is its text), or the server
                answered with a JSON-RPC error or an invalid result.
            McpTransportError: The server could not be started or reached, the call timed out,
                or the connection dropped (the session is then reopened by the next call).
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
                task = asyncio.create_task(_invoke(on_progress, progress, total, message))
                progress_tasks.add(task)
                task.add_done_callback(progress_tasks.discard)

        result = await self._request(
            spec,
            f"the call to tool {tool_name!r}",
            lambda client: client.call_tool(
                tool_name,
                dict(arguments),
                read_timeout_seconds=call_timeout,
                progress_callback=progress_callback,
                meta=meta,
            ),
            on_log=on_log,
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
        return McpToolOutput(
            text=text,
            structured_content=result.structured_content,
            resource_links=_resource_links(result),
        )

    async def list_resources(
        self, spec: McpServerSpec, *, cursor: str | None = None
    ) -> ListResourcesResult:
        """One page of ``resources/list`` (MCP specification, "Resources/Listing Resources").

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            "resources/list",
            lambda client: client.list_resources(cursor=cursor, cache_mode="bypass"),
        )

    async def list_resource_templates(
        self, spec: McpServerSpec, *, cursor: str | None = None
    ) -> ListResourceTemplatesResult:
        """One page of ``resources/templates/list`` ("Resources/Resource Templates").

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            "resources/templates/list",
            lambda client: client.list_resource_templates(cursor=cursor, cache_mode="bypass"),
        )

    async def read_resource(self, spec: McpServerSpec, uri: str) -> ReadResourceResult:
        """``resources/read`` of ``uri`` ("Resources/Reading Resources").

        Raises McpToolError (unknown resource, invalid result) or McpTransportError.
        """
        return await self._request(
            spec,
            f"resources/read of {uri!r}",
            lambda client: client.read_resource(uri, cache_mode="bypass"),
        )

    async def list_prompts(
        self, spec: McpServerSpec, *, cursor: str | None = None
    ) -> ListPromptsResult:
        """One page of ``prompts/list`` (MCP specification, "Prompts/Listing Prompts").

        Raises McpToolError or McpTransportError as :meth:`call_tool` does.
        """
        return await self._request(
            spec,
            "prompts/list",
            lambda client: client.list_prompts(cursor=cursor, cache_mode="bypass"),
        )

    async def get_prompt(
        self, spec: McpServerSpec, name: str, arguments: Mapping[str, str] | None = None
    ) -> GetPromptResult:
        """``prompts/get`` of ``name`` with string ``arguments`` ("Prompts/Getting a Prompt").

        Raises McpToolError (unknown prompt, missing argument) or McpTransportError.
        """
        return await self._request(
            spec,
            f"prompts/get of {name!r}",
            lambda client: client.get_prompt(name, dict(arguments or {})),
        )

    async def aclose(self) -> None:
        """Close every session and stop stdio servers. Later calls raise McpTransportError."""
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close() for connection in connections))
