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
``on_progress``; a log message names no request, so it goes to a call's ``on_log`` only while
that call is the one request in flight on the server's session and no earlier request was
abandoned there (timed out or cancelled on this side while the server may still run it), and
otherwise to the pool's ``on_log`` (the worker's log), never to another call: the calls of a
session belong to different agent sessions and users, so a message written during one user's
call must not reach another's events. Concurrent calls on one server therefore show no log
messages of their own, nor does any call on a session after an abandoned request until the
session is reopened; a
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
import threading
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
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
sys.stderr.write("\\0dexagents-mcp-pids %d %d\\n" % (os.getpid(), server.pid))
sys.stderr.flush()
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
        env_names: stdio: secret references: names of variables copied from ``os.environ``
            into the server's environment at connect time (on top of a minimal safe set:
            ``HOME``, ``PATH``, ...). A name that is not set fails the connection
            (:class:`McpTransportError` naming the variable).
        env: stdio: plain, non-secret values set in the server's environment
            (``{"MEMORY_FILE_PATH": "/srv/memory.jsonl"}``); they may be shown and logged.
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
    env: Mapping[str, str] = field(default_factory=dict)
    url: str = ""
    header_env: Mapping[str, str] = field(default_factory=dict)
    startup_timeout: float = 30.0
    call_timeout: float = 60.0

    def fingerprint(self) -> str:
        """A stable string identifying this configuration (names only, no secret values)."""
        fields = asdict(self)
        fields["args"] = list(self.args)
        fields["env_names"] = list(self.env_names)
        fields["env"] = dict(self.env)
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
        task_support: ``execution.taskSupport`` (``"forbidden"``, ``"optional"`` or
            ``"required"``), ``None`` when the tool does not say.
    """

    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    task_support: str | None = None


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
        """The result as one string for the model's tool message, in ONE form.

        MCP asks servers to mirror ``structuredContent`` in a text block ("Tools/Structured
        Content"), so sending both would make the model read the result twice. The rendered
        content is sent when there is no structured content or when the structured content
        adds nothing to it (:func:`structured_adds_information`); otherwise the structured
        content alone is sent as JSON, followed by the result's resource links, one per line
        (they are not part of the JSON). An empty result reads ``(no content)``.
        """
        if self.structured_content is None or not structured_adds_information(
            self.text, self.structured_content
        ):
            return self.text or "(no content)"
        rendered = json.dumps(self.structured_content, ensure_ascii=False, sort_keys=True)
        links = [_resource_link_line(link) for link in self.resource_links]
        return "\n".join([rendered, *links])


def _resource_link_line(link: McpResourceLink) -> str:
    line = f"[resource link] {link.name} <{link.uri}>"
    if link.mime_type:
        line += f" ({link.mime_type})"
    if link.description:
        line += f": {link.description}"
    return line


def _scalars(value: Any) -> Iterator[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)
    else:
        yield value


def structured_adds_information(text: str, structured: Any) -> bool:
    """Whether ``structured`` (a ``structuredContent`` JSON value) says more than ``text``.

    It adds nothing when ``text`` parses as the same JSON value, or when every string of it
    (at any depth) occurs in ``text`` and every number and boolean occurs there as JSON
    (``3.5``, ``true``); object keys and ``null`` are layout, not information. So
    ``{"content": "<file text>"}`` next to the file text adds nothing, while
    ``{"temperature": 21}`` next to "It is mild" does.
    """
    if not text:
        return True
    try:
        if json.loads(text) == structured:
            return False
    except ValueError:
        pass
    lowered = text.lower()
    for scalar in _scalars(structured):
        if scalar is None or scalar == "":
            continue
        if isinstance(scalar, str):
            if scalar not in text:
                return True
        elif json.dumps(scalar).lower() not in lowered:
            return True
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
    environment = dict(spec.env)
    missing = [name for name in spec.env_names if name not in os.environ]
    if missing:
        raise McpTransportError(
            f"MCP server {spec.name!r}: environment variable{'s' if len(missing) > 1 else ''} "
            f"{', '.join(missing)} (listed in its secret references) "
            f"{'are' if len(missing) > 1 else 'is'} not set in the worker's environment"
        )
    environment.update({name: os.environ[name] for name in spec.env_names})
    return environment


def _secret_values(spec: McpServerSpec) -> dict[str, str]:
    """Values of the spec's secret references that are set, by name (for redaction)."""
    names = [*spec.env_names, *spec.header_env.values()]
    return {name: os.environ[name] for name in names if os.environ.get(name)}


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
    """Where a stdio server's stderr lines are echoed: this process's stderr when it is a real
    file, else the original one (Celery replaces ``sys.stderr`` with a logging proxy)."""
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


STDERR_TAIL_LINES = 20
"""How many of a stdio server's last stderr lines are kept (errors, process status)."""
_STDERR_LINE_MAX_CHARS = 500
_STDERR_BUFFER_MAX_BYTES = 64 * 1024
_PID_MARKER = "\0dexagents-mcp-pids "
_STDERR_EOF_WAIT_SECONDS = 2.0


class _StderrCapture:
    """The stderr of a stdio server, read through a pipe by a daemon thread.

    Each line is echoed to the worker's stderr prefixed with ``[mcp <server>]`` and the last
    :data:`STDERR_TAIL_LINES` are kept (at most 500 characters each), with the values of the
    server's secret references replaced by ``[NAME]``. The guard's PID line is consumed, not
    kept. ``on_line`` and ``on_eof`` are called from the reading thread.
    """

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        on_line: Callable[[], None] | None = None,
        on_eof: Callable[[], None] | None = None,
    ) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self.guard_pid: int | None = None
        self.server_pid: int | None = None
        self._read_fd = read_fd
        self._name = spec.name
        self._secrets = sorted(
            _secret_values(spec).items(), key=lambda item: len(item[1]), reverse=True
        )
        self._lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._lock = threading.Lock()
        self._on_line = on_line
        self._on_eof = on_eof
        self._echo = _server_errlog()
        self._thread = threading.Thread(
            target=self._read, name=f"mcp-stderr-{spec.name}", daemon=True
        )
        self._thread.start()

    def tail(self) -> tuple[str, ...]:
        """The last lines read so far, oldest first."""
        with self._lock:
            return tuple(self._lines)

    def close_writer(self) -> None:
        """Close this process's copy of the pipe's write end (the child keeps its own)."""
        if not self.writer.closed:
            self.writer.close()

    def wait_eof(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds until every writer has closed the pipe."""
        self._thread.join(timeout)

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := os.read(self._read_fd, 65536):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                if len(buffer) > _STDERR_BUFFER_MAX_BYTES:
                    complete.append(buffer)
                    buffer = b""
                for raw in complete:
                    self._line(raw)
            if buffer:
                self._line(buffer)
        except OSError:
            pass
        finally:
            os.close(self._read_fd)
            if self._on_eof is not None:
                self._on_eof()

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if text.startswith(_PID_MARKER):
            with contextlib.suppress(ValueError):
                guard, server = text[len(_PID_MARKER):].split()
                self.guard_pid, self.server_pid = int(guard), int(server)
        else:
            for name, value in self._secrets:
                text = text.replace(value, f"[{name}]")
            text = text[:_STDERR_LINE_MAX_CHARS]
            with self._lock:
                self._lines.append(text)
            with contextlib.suppress(Exception):
                self._echo.write(f"[mcp {self._name}] {text}\n")
                self._echo.flush()
        if self._on_line is not None:
            self._on_line()


ProcessState = Literal["starting", "running", "stopped", "exited", "failed"]


@dataclass(frozen=True)
class McpProcessStatus:
    """The state of one stdio server process a pool runs (for the admin's process view).

    Attributes:
        server: The server's registry name.
        state: ``starting`` (spawned, handshake not finished), ``running``, ``stopped`` (closed
            by the pool), ``exited`` (ended on its own while connected), ``failed`` (could not
            be started).
        guard_pid: PID of the guard process (the direct child, leader of the process group).
        server_pid: PID of the server command itself.
        restarts: How many times this pool reopened the server since its first start.
        started_at: When this process was spawned (UTC).
        ended_at: When it stopped, exited or failed (UTC); ``None`` while alive.
        stderr_tail: Its last stderr lines, secret values replaced by ``[NAME]``.
        error: Why it failed or exited; ``""`` otherwise.
    """

    server: str
    state: ProcessState
    guard_pid: int | None
    server_pid: int | None
    restarts: int
    started_at: datetime
    ended_at: datetime | None
    stderr_tail: tuple[str, ...]
    error: str = ""


ProcessStatusCallback = Callable[[McpProcessStatus], Awaitable[None] | None]
"""``on_process_status(status)``: a stdio server process of the pool changed state, or wrote
to its stderr (at most twice a second). Calls are made one at a time, in order."""


@asynccontextmanager
async def _open_client(
    spec: McpServerSpec,
    *,
    logging_callback: LoggingFnT | None = None,
    message_handler: MessageHandlerFnT | None = None,
    errlog: TextIO | None = None,
) -> AsyncIterator[Client]:
    """Connect to ``spec`` and complete the MCP handshake; close everything on exit.

    ``errlog`` receives a stdio server's stderr (default: this process's stderr).

    Raises McpTransportError for configuration problems (an unset secret reference
    included); the SDK's own exceptions otherwise (OSError when the process cannot be spawned).
    """
    callbacks: dict[str, Any] = {
        "read_timeout_seconds": spec.call_timeout,
        "logging_callback": logging_callback,
        "message_handler": message_handler,
        "log_level": _LOG_LEVEL,
    }
    async with AsyncExitStack() as stack:
        if spec.transport == "stdio":
            transport = stdio_client(_stdio_parameters(spec), errlog=errlog or _server_errlog())
            client = Client(transport, **callbacks)
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


def _with_stderr(message: str, tail: Sequence[str]) -> str:
    if not tail:
        return message
    return f"{message}. Last lines of its stderr:\n" + "\n".join(tail[-10:])


def _startup_failure(
    spec: McpServerSpec, error: BaseException, stderr_tail: Sequence[str] = ()
) -> McpTransportError:
    error = _root_cause(error)
    if isinstance(error, McpTransportError):
        return error
    if isinstance(error, TimeoutError):
        message = (
            f"MCP server {spec.name!r} did not finish starting within {spec.startup_timeout:g} s"
        )
    else:
        if isinstance(error, MCPError) and error.code == CONNECTION_CLOSED:
            reason = "the process closed the connection before the MCP handshake finished"
        elif isinstance(error, MCPError):
            reason = error.message
        elif isinstance(error, OSError):
            reason = str(error)  # "[Errno 2] No such file or directory: '/srv/x'"
        else:
            reason = type(error).__name__
        message = f"MCP server {spec.name!r} could not be started: {reason}"
    return McpTransportError(_with_stderr(message, stderr_tail))


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
        task_support=tool.execution.task_support if tool.execution else None,
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
        McpTransportError: The server could not be started (a stdio server's message ends with
            the last lines of its stderr, e.g. ``No such file or directory``), a secret
            reference is not set, the server timed out, or it dropped the connection.
        McpToolError: The server answered ``tools/list`` with an error or an invalid result.
    """
    connection = _Connection(spec)
    try:
        client = await connection.wait_ready()
        try:
            return await _list_all_tools(client, spec)
        except MCPError as error:
            failure = _call_failure(spec, "tools/list", error)
            if isinstance(failure, McpTransportError):
                await connection.close()
                failure = McpTransportError(
                    _with_stderr(failure.message, await connection._stderr_tail_after_exit())
                )
            raise failure from error
        except ValidationError as error:
            raise McpToolError(f"MCP server {spec.name!r} returned an invalid tool list") from error
        except McpClientError:
            raise
        except Exception as error:
            await connection.close()
            raise McpTransportError(
                _with_stderr(
                    f"MCP server {spec.name!r} connection failed during tools/list: "
                    f"{type(_root_cause(error)).__name__}",
                    await connection._stderr_tail_after_exit(),
                )
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

    ``requests_in_flight`` counts the pool's requests on the session and ``log_listeners``
    holds the ``on_log`` callbacks of the calls in flight; a log message goes to the one
    listener when exactly one request is in flight and none was abandoned on this session,
    else to ``on_idle_log`` (see the module docstring); ``on_tools_list_changed`` gets the
    server's name
    when it announces a changed tool list. A stdio server's stderr is captured
    (:class:`_StderrCapture`): its tail explains a failed start, and its end (every process of
    the group gone) marks the session broken. ``on_status`` gets :class:`McpProcessStatus`
    reports, one at a time under ``status_lock``.
    """

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        on_idle_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
        on_tools_list_changed: Callable[[str], Awaitable[None] | None] | None = None,
        on_status: ProcessStatusCallback | None = None,
        status_lock: asyncio.Lock | None = None,
        restarts: int = 0,
    ) -> None:
        self.spec = spec
        self.client: Client | None = None
        self.broken = False
        self.log_listeners: list[LogCallback] = []
        self.requests_in_flight = 0
        #: Requests this side stopped waiting for without an answer (a timeout, a cancelled
        #: call); the server may still run them, so no log message is a single call's after one.
        self.abandoned_requests = 0
        self._on_idle_log = on_idle_log
        self._on_tools_list_changed = on_tools_list_changed
        self._on_status = on_status if spec.transport == "stdio" else None
        self._status_lock = status_lock or asyncio.Lock()
        self._restarts = restarts
        self._state: ProcessState = "starting"
        self._started_at = datetime.now(UTC)
        self._ended_at: datetime | None = None
        self._error = ""
        self._report_pending = False
        self._closing = False
        self._notification_tasks: set[asyncio.Task[None]] = set()
        self._loop = asyncio.get_running_loop()
        self._ready: asyncio.Future[None] = self._loop.create_future()
        self._stop = asyncio.Event()
        self.stderr: _StderrCapture | None = None
        if spec.transport == "stdio":
            self.stderr = _StderrCapture(
                spec,
                on_line=lambda: self._from_thread(self._stderr_changed),
                on_eof=lambda: self._from_thread(self._stderr_ended),
            )
        self._task = asyncio.create_task(self._own(), name=f"mcp-connection-{spec.name}")

    def _from_thread(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(callback)

    def _spawn(self, callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
        # Callbacks may write events or touch a database: never run them in the session's
        # reader, which would stall every response behind them.
        task = asyncio.get_running_loop().create_task(_invoke(callback, *args))
        self._notification_tasks.add(task)
        task.add_done_callback(self._notification_tasks.discard)

    def status(self) -> McpProcessStatus:
        """A snapshot of this connection's process (stdio only)."""
        capture = self.stderr
        return McpProcessStatus(
            server=self.spec.name,
            state=self._state,
            guard_pid=capture.guard_pid if capture else None,
            server_pid=capture.server_pid if capture else None,
            restarts=self._restarts,
            started_at=self._started_at,
            ended_at=self._ended_at,
            stderr_tail=capture.tail() if capture else (),
            error=self._error,
        )

    async def _deliver(self, status: McpProcessStatus) -> None:
        assert self._on_status is not None
        async with self._status_lock:
            await _invoke(self._on_status, status)

    def _report(self) -> None:
        self._report_pending = False
        if self._on_status is not None:
            task = self._loop.create_task(self._deliver(self.status()))
            self._notification_tasks.add(task)
            task.add_done_callback(self._notification_tasks.discard)

    def _stderr_changed(self) -> None:
        if self._on_status is not None and not self._report_pending:
            self._report_pending = True
            self._loop.call_later(0.5, self._report)

    def _stderr_ended(self) -> None:
        # Every process of the group closed its stderr: the server is gone.
        if self._state == "running" and not self._closing:
            self._end("exited", "the server process exited")
            self.broken = True
            self._stop.set()

    def _end(self, state: ProcessState, error: str) -> None:
        if self._state in ("starting", "running"):
            self._state = state
            self._ended_at = datetime.now(UTC)
            self._error = error
            self._report()

    async def _log_received(self, params: LoggingMessageNotificationParams) -> None:
        # Only an unambiguous owner gets it: with two requests in flight either may have
        # caused it, and handing it to both leaked one user's tool log into another's session.
        if (
            self.requests_in_flight == 1
            and len(self.log_listeners) == 1
            and not self.abandoned_requests
        ):
            self._spawn(self.log_listeners[0], params.level, params.data)
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
                errlog=self.stderr.writer if self.stderr else None,
            ) as client:
                if self.stderr is not None:
                    # The child holds its own copy; once every process of its group exits,
                    # the pipe reaches its end and the session is marked broken.
                    self.stderr.close_writer()
                self.client = client
                self._state = "running"
                self._report()
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
                self._end("exited", f"the session ended: {type(error).__name__}")
        finally:
            self.broken = True
            self.client = None
            if self.stderr is not None:
                self.stderr.close_writer()

    async def _stderr_tail_after_exit(self) -> tuple[str, ...]:
        """The stderr tail once the owner task is done and the pipe reached its end
        (bounded wait: a grandchild that kept the pipe open must not hold up the error)."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        if self.stderr is None:
            return ()
        await asyncio.to_thread(self.stderr.wait_eof, _STDERR_EOF_WAIT_SECONDS)
        return self.stderr.tail()

    async def wait_ready(self) -> Client:
        """Wait for the handshake (at most ``startup_timeout`` s) and return the client.

        Raises McpTransportError when the server cannot be started in time; its message ends
        with the last lines the server wrote to stderr, when there are any.
        """
        try:
            async with asyncio.timeout(self.spec.startup_timeout):
                await asyncio.shield(self._ready)
        except TimeoutError as error:
            failure = _startup_failure(self.spec, error, self.stderr.tail() if self.stderr else ())
            self._end("failed", failure.message)
            await self.close()
            raise failure from error
        except McpClientError as error:
            self._end("failed", error.message)
            raise
        except Exception as error:
            failure = _startup_failure(self.spec, error, await self._stderr_tail_after_exit())
            self._end("failed", failure.message)
            raise failure from error
        if self.client is None:
            raise McpTransportError(f"MCP server {self.spec.name!r} session is closed")
        return self.client

    async def close(self) -> None:
        """Leave the session and stop the server; waits for the owner task to finish."""
        self._closing = True
        self.broken = True
        self._stop.set()
        if not self._ready.done():
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        if self._ready.done() and not self._ready.cancelled():
            # A start abandoned at its timeout left its failure here with nobody to await it:
            # retrieve it, or asyncio logs "Future exception was never retrieved" once the
            # future is collected.
            self._ready.exception()
        self._end("stopped", "")
        if self._notification_tasks:
            # Status reports (the last one included) are delivered before close returns.
            await asyncio.wait(set(self._notification_tasks), timeout=5.0)


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
        on_log: Called as ``on_log(server_name, level, data)`` for log messages no single call
            owns: those that arrive while no request, or more than one, is in flight on the
            server's session, or while the one in flight has no ``on_log``; default: this
            module's logger at INFO.
        on_process_status: Called with an :class:`McpProcessStatus` whenever a stdio server
            process of the pool starts, becomes ready, stops, exits or fails, and (at most
            twice a second) when it writes to stderr; calls are serialized, in order. The
            worker passes ``mcp_registry.tasks.process_status_record``, which keeps the rows
            the admin shows.
    """

    def __init__(
        self,
        *,
        on_tools_list_changed: ToolsChangedCallback | None = None,
        on_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
        on_process_status: ProcessStatusCallback | None = None,
    ) -> None:
        self._connections: dict[str, _Connection] = {}
        self._on_process_status = on_process_status
        self._status_lock: asyncio.Lock | None = None
        self._starts: dict[str, int] = {}
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
            if self._status_lock is None:
                self._status_lock = asyncio.Lock()
            starts = self._starts.get(spec.name, 0)
            self._starts[spec.name] = starts + 1
            connection = _Connection(
                spec,
                on_idle_log=self._on_log,
                on_tools_list_changed=self._tools_list_changed,
                on_status=self._on_process_status,
                status_lock=self._status_lock,
                restarts=starts,
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
        connection.requests_in_flight += 1
        if on_log is not None:
            connection.log_listeners.append(on_log)
        answered = False
        try:
            result = await send(client)
            answered = True
            return result
        except MCPError as error:
            # A JSON-RPC error is the server's answer; a timeout is the client giving up.
            answered = error.code not in (REQUEST_TIMEOUT, CONNECTION_CLOSED)
            failure = _call_failure(spec, what, error)
            if error.code == CONNECTION_CLOSED:
                await self._drop(connection)
            raise failure from error
        except ValidationError as error:
            answered = True
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
            connection.requests_in_flight -= 1
            if not answered:
                # Timed out or cancelled here: the server may still be running it, and its
                # log messages may still come (see ``_Connection.abandoned_requests``).
                connection.abandoned_requests += 1
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
        server's log messages while this call is the only request in flight on the server's
        session (see the module docstring). Both may
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
