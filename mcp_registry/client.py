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
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, TextIO, cast

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)
from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT, RequestParamsMeta
from pydantic import ValidationError

logger = logging.getLogger(__name__)

Transport = Literal["stdio", "streamable_http"]

IDEMPOTENCY_KEY_META = "dexagents/idempotency_key"
"""The request ``_meta`` key that carries a tool call's idempotency key to the server."""

_MAX_TOOL_PAGES = 1000
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
class McpToolOutput:
    """A successful ``tools/call`` result.

    Attributes:
        text: Model-readable text: text blocks verbatim, other blocks as short placeholders,
            joined by newlines.
        structured_content: The result's ``structuredContent`` (any JSON value) or ``None``.
    """

    text: str
    structured_content: Any = None


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
async def _open_client(spec: McpServerSpec) -> AsyncIterator[Client]:
    """Connect to ``spec`` and complete the MCP handshake; close everything on exit.

    Raises McpTransportError for configuration problems; the SDK's own exceptions otherwise.
    """
    async with AsyncExitStack() as stack:
        if spec.transport == "stdio":
            client = Client(
                stdio_client(_stdio_parameters(spec), errlog=_server_errlog()),
                read_timeout_seconds=spec.call_timeout,
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
                streamable_http_client(spec.url, http_client=http_client),
                read_timeout_seconds=spec.call_timeout,
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


def render_content(result: CallToolResult) -> str:
    """Render a result's content blocks as model-readable text, one block per line.

    Text blocks and embedded text resources appear verbatim; images, audio, blobs and resource
    links become short bracketed placeholders.
    """
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)
        elif isinstance(block, EmbeddedResource):
            if isinstance(block.resource, TextResourceContents):
                parts.append(block.resource.text)
            else:
                parts.append(f"[binary resource {block.resource.uri}]")
        elif isinstance(block, ResourceLink):
            parts.append(f"[resource link {block.uri}]")
        elif isinstance(block, ImageContent):
            parts.append(f"[image {block.mime_type}]")
        else:
            parts.append(f"[{block.type} content]")
    return "\n".join(parts)


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


class _Connection:
    """One long-lived session, owned by a dedicated task.

    The SDK's client holds anyio task groups and cancel scopes that must be entered and left by
    the same task, so a task of its own enters the client, reports readiness, and leaves it
    when ``close`` is called or the transport fails; calls from other tasks share the session.
    """

    def __init__(self, spec: McpServerSpec) -> None:
        self.spec = spec
        self.client: Client | None = None
        self.broken = False
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._own(), name=f"mcp-connection-{spec.name}")

    async def _own(self) -> None:
        try:
            async with _open_client(self.spec) as client:
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


class McpClientPool:
    """Long-lived MCP sessions, one per server, shared by every call in one event loop.

    Create one per worker process and ``await pool.aclose()`` on shutdown, or use it as an
    async context manager. The pool binds to the event loop of its first call; using it from
    another loop raises ``RuntimeError``. Concurrent calls to one server share its
    session; the first call connects, a failed or dropped session is reopened by the next call,
    and a changed spec for the same server name replaces the old session.
    """

    def __init__(self) -> None:
        self._connections: dict[str, _Connection] = {}
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __aenter__(self) -> McpClientPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

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
            connection = _Connection(spec)
            self._connections[spec.name] = connection
        return connection

    async def _drop(self, connection: _Connection) -> None:
        if self._connections.get(connection.spec.name) is connection:
            del self._connections[connection.spec.name]
        await connection.close()

    async def call_tool(
        self,
        spec: McpServerSpec,
        tool_name: str,
        arguments: Mapping[str, Any],
        *,
        idempotency_key: str | None,
        # The platform passes per-call limits through; the SDK enforces them per request.
        timeout: float | None,  # noqa: ASYNC109
    ) -> McpToolOutput:
        """Call ``tool_name`` on ``spec``'s server with ``arguments`` (a JSON object).

        ``idempotency_key`` is sent in the request ``_meta`` under ``dexagents/idempotency_key``.
        ``timeout`` is in seconds (``None``: ``spec.call_timeout``); opening the session is
        bounded separately by ``spec.startup_timeout``.

        Raises:
            McpToolError: The result has ``isError`` set (``message`` is its text), or the server
                answered with a JSON-RPC error or an invalid result.
            McpTransportError: The server could not be started or reached, the call timed out,
                or the connection dropped (the session is then reopened by the next call).
        """
        connection = await self._connection(spec)
        try:
            client = await connection.wait_ready()
        except McpTransportError:
            await self._drop(connection)
            raise
        meta: RequestParamsMeta | None = None
        if idempotency_key is not None:
            meta = cast(RequestParamsMeta, {IDEMPOTENCY_KEY_META: idempotency_key})
        call_timeout = spec.call_timeout if timeout is None else timeout
        what = f"the call to tool {tool_name!r}"
        try:
            result = await client.call_tool(
                tool_name, dict(arguments), read_timeout_seconds=call_timeout, meta=meta
            )
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
        text = render_content(result)
        if result.is_error:
            raise McpToolError(
                text or f"Tool {tool_name!r} failed without a message.",
                structured_content=result.structured_content,
            )
        return McpToolOutput(text=text, structured_content=result.structured_content)

    async def aclose(self) -> None:
        """Close every session and stop stdio servers. Later calls raise McpTransportError."""
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(connection.close() for connection in connections))
