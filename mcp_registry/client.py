"""The MCP client the Dex worker uses to discover and call tools on trusted MCP servers.

Django-free: the caller describes a server with an :class:`McpServerSpec` (the Django side builds
one from its ``McpServer`` row) and this module does the protocol work through the ``mcp`` SDK
(2.x ``mcp.Client``), for both transports:

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

Isolation (ARCHITECTURE.md, "MCP state belongs to one agent session"): :class:`McpClientPool`
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
connection to a call's ``on_log`` only while that call is the one request in flight and no
earlier request was abandoned there; on a ``shared`` connection to no call, since any user's
earlier request may have caused it. Otherwise it goes to the pool's ``on_log`` (the worker's
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
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, TextIO, TypeVar, cast

import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.session import (
    ClientRequestContext,
    ElicitationFnT,
    IncomingMessage,
    LoggingFnT,
    MessageHandlerFnT,
)
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import (
    CallToolResult,
    ElicitRequestParams,
    ElicitResult,
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    LoggingMessageNotificationParams,
    ReadResourceResult,
    ToolListChangedNotification,
)
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PROTOCOL_VERSION,
    RequestParamsMeta,
)
from pydantic import ValidationError

# Rendering for the model lives in mcp_registry.content; these names stay importable from here.
from mcp_registry.content import McpResourceLink as McpResourceLink
from mcp_registry.content import McpToolOutput as McpToolOutput
from mcp_registry.content import render_block as render_block
from mcp_registry.content import render_content as render_content
from mcp_registry.content import resource_links as _resource_links
from mcp_registry.content import structured_adds_information as structured_adds_information

logger = logging.getLogger(__name__)

Transport = Literal["stdio", "streamable_http"]
Isolation = Literal["session", "user", "shared"]
ISOLATION_LEVELS: tuple[Isolation, ...] = ("session", "user", "shared")

IDEMPOTENCY_KEY_META = "dexagents/idempotency_key"
"""The request ``_meta`` key that carries a tool call's idempotency key to the server."""

_MAX_TOOL_PAGES = 1000
# Log messages at this level and above are requested from servers on the 2026-07-28 protocol,
# where delivery is opted into per request (SEP-2577); older servers send what they like.
_LOG_LEVEL = "info"

_T = TypeVar("_T")
_H = TypeVar("_H")

ProgressCallback = Callable[[float, float | None, str | None], Awaitable[None] | None]
"""``on_progress(progress, total, message)``: one MCP progress notification of a call.

``progress`` increases with every notification; ``total`` is ``None`` when unknown; units are
the server's (MCP specification, "Utilities/Progress"). May be a plain or an async function."""

LogCallback = Callable[[str, Any], Awaitable[None] | None]
"""``on_log(level, data)``: one MCP log message (``notifications/message``).

``level`` is a syslog level name (``debug`` ... ``emergency``), ``data`` any JSON value
(MCP specification, "Server features/Logging"). May be a plain or an async function."""

ElicitCallback = Callable[[ElicitRequestParams], Awaitable[ElicitResult]]
"""``await on_elicit(params)``: the server asks the user something during a call
(``elicitation/create``, MCP specification "Client features/Elicitation"); ``params`` is a
form request (``message``, ``requested_schema``) or a URL request (``message``, ``url``,
``elicitation_id``); the answer is ``ElicitResult(action="accept" | "decline" | "cancel",
content=...)``. While it runs, the call's timeout stands still."""

ToolsChangedCallback = Callable[[str], Awaitable[None] | None]
"""``on_tools_list_changed(server_name)``: the server sent ``notifications/tools/list_changed``."""
_HTTP_CONNECT_TIMEOUT = 30.0
# A tools/call is bounded by the pool's own call clock, not by the SDK's request timeout.
_NO_SDK_TIMEOUT = 30 * 24 * 3600.0
_HTTP_READ_TIMEOUT = 300.0

# Runs as ``python -I -c _GUARD_SOURCE <worker pid> <command> [args...]`` in the server's new
# process group. It starts the server with the inherited stdin/stdout, drops its own copies of
# those pipes, and stops the group when the worker is gone, when it is asked to stop (SIGTERM),
# or once the server exits, so no member of the group outlives the connection. When the server
# exits it first writes a marker line with the exit status (negative: killed by that signal).
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
code = server.wait()
sys.stderr.write("\\0dexagents-mcp-exit %d\\n" % code)
sys.stderr.flush()
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
        isolation: Which requests share a connection (see the module docstring): ``session``
            (one per agent session, the default), ``user`` (one per owner) or ``shared``.
        idle_timeout: Seconds a connection may stay unused before the pool closes it.
        tool_output_schemas: Tool name -> the output schema stored at discovery (``None``: the
            tool declared none). A result's structured content is checked against it. Not part
            of the connection's identity (:meth:`fingerprint`).
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
    isolation: Isolation = "session"
    idle_timeout: float = 300.0
    tool_output_schemas: Mapping[str, dict[str, Any] | None] = field(
        default_factory=dict, compare=False, hash=False, repr=False
    )

    def fingerprint(self) -> str:
        """A stable string identifying this configuration (names only, no secret values).

        A connection opened for one fingerprint is replaced when its server's configuration
        changes; the stored output schemas and the idle timeout do not count.
        """
        fields = asdict(self)
        del fields["tool_output_schemas"], fields["idle_timeout"]
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
        output_schema: The JSON Schema its structured content follows, or ``None``.
        task_support: ``execution.taskSupport`` (``"forbidden"``, ``"optional"`` or
            ``"required"``), ``None`` when the tool does not say.
    """

    name: str
    title: str | None
    description: str
    input_schema: dict[str, Any]
    annotations: dict[str, Any]
    output_schema: dict[str, Any] | None = None
    task_support: str | None = None


@dataclass(frozen=True)
class McpScope:
    """Whom a request is made for, which decides the connection it travels on.

    Attributes:
        session_id: The agent session (Dex Flow ID) the request belongs to.
        user_id: The session owner's ID, as text; ``None`` when unknown, in which case a
            ``user``-isolated server treats the session as its own user.
    """

    session_id: str
    user_id: str | None = None

    def key(self, isolation: Isolation) -> str:
        """The connection key under ``isolation``: ``session <id>``, ``user <id>`` or
        ``shared``."""
        if isolation == "shared":
            return "shared"
        if isolation == "user" and self.user_id:
            return f"user {self.user_id}"
        return f"session {self.session_id}"


def scope_key(spec: McpServerSpec, scope: McpScope | None) -> str:
    """The key of the connection a request for ``scope`` to ``spec``'s server travels on.

    A request that names no scope (discovery-like work, tests) uses the ``shared`` one.
    """
    return "shared" if scope is None else scope.key(spec.isolation)


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


class McpPoolFullError(McpToolError):
    """The request was not sent: the pool already runs ``max_processes`` stdio servers and none
    became idle within the server's startup timeout. Nothing reached the server, so the
    caller may record it as a plain failure the model can read (it never runs twice)."""


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
_EXIT_MARKER = "\0dexagents-mcp-exit "
_STDERR_EOF_WAIT_SECONDS = 2.0


class _StderrCapture:
    """The stderr of a stdio server, read through a pipe by a daemon thread.

    Each line is echoed to the worker's stderr prefixed with ``[mcp <server>]`` and the last
    :data:`STDERR_TAIL_LINES` are kept (at most 500 characters each), with the values of the
    server's secret references replaced by ``[NAME]``. The guard's PID line is consumed, not
    kept, nor is its exit-status line (:attr:`exit_code`). ``on_line`` and ``on_eof`` are
    called from the reading thread.
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
        #: The server's exit status as the guard reported it (negative: killed by that signal).
        self.exit_code: int | None = None
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
        elif text.startswith(_EXIT_MARKER):
            with contextlib.suppress(ValueError):
                self.exit_code = int(text[len(_EXIT_MARKER):])
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


def exit_status_text(code: int | None) -> str:
    """How a process ended, from its exit status: ``exited with code 3``, ``was killed by
    signal 9 (SIGKILL)``, or ``exited`` when the status is unknown (negative: signal number,
    as ``subprocess`` reports it)."""
    if code is None:
        return "exited"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


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
        scope: The connection's scope key (``session <id>``, ``user <id>``, ``shared``).
        exit_code: The server's exit status once it exited on its own (negative: the
            signal that killed it); ``None`` while it runs, or when it was stopped.
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
    scope: str = "shared"
    exit_code: int | None = None


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
    on_http_session_id: Callable[[str], None] | None = None,
    elicitation_callback: ElicitationFnT | None = None,
) -> AsyncIterator[Client]:
    """Connect to ``spec`` and complete the MCP handshake; close everything on exit.

    The ``initialize`` handshake goes first: a server that ignores the ``server/discover``
    probe (most released servers do, until ``initialize``) would otherwise hold the start for
    the probe's whole timeout. A server that answers ``initialize`` with -32022 (unsupported
    protocol version: a modern-only server) is connected again with the SDK's negotiation.

    ``errlog`` receives a stdio server's stderr (default: this process's stderr);
    ``on_http_session_id`` gets a Streamable-HTTP server's ``Mcp-Session-Id`` once it assigns
    one; ``elicitation_callback``, when given, declares the elicitation capability and answers
    the server's ``elicitation/create`` requests.

    Raises McpTransportError for configuration problems (an unset secret reference
    included); the SDK's own exceptions otherwise (OSError when the process cannot be spawned).
    """
    callbacks: dict[str, Any] = {
        "read_timeout_seconds": spec.call_timeout,
        "logging_callback": logging_callback,
        "message_handler": message_handler,
        "log_level": _LOG_LEVEL,
    }
    if elicitation_callback is not None:
        callbacks["elicitation_callback"] = elicitation_callback
    async with AsyncExitStack() as stack:
        http_client: httpx2.AsyncClient | None = None
        if spec.transport == "streamable_http":
            if not spec.url:
                raise McpTransportError(f"MCP server {spec.name!r}: no URL configured")
            hooks: dict[str, list[Callable[..., Any]]] = {}
            if on_http_session_id is not None:
                report = on_http_session_id

                async def session_id_seen(response: httpx2.Response) -> None:
                    session_id = response.headers.get("mcp-session-id")
                    if session_id:
                        report(session_id)

                hooks["response"] = [session_id_seen]
            http_client = await stack.enter_async_context(
                httpx2.AsyncClient(
                    headers=_http_headers(spec),
                    timeout=httpx2.Timeout(_HTTP_CONNECT_TIMEOUT, read=_HTTP_READ_TIMEOUT),
                    event_hooks=hooks,
                )
            )
        elif spec.transport != "stdio":
            raise McpTransportError(
                f"MCP server {spec.name!r}: unknown transport {spec.transport!r}"
            )

        def client_for(mode: Literal["legacy", "auto"]) -> Client:
            if http_client is None:
                transport = stdio_client(
                    _stdio_parameters(spec), errlog=errlog or _server_errlog()
                )
                return Client(transport, mode=mode, **callbacks)
            return Client(
                streamable_http_client(spec.url, http_client=http_client), mode=mode, **callbacks
            )

        try:
            client = await stack.enter_async_context(client_for("legacy"))
        except Exception as error:
            refused = _root_cause(error)
            if not (
                isinstance(refused, MCPError) and refused.code == UNSUPPORTED_PROTOCOL_VERSION
            ):
                raise
            client = await stack.enter_async_context(client_for("auto"))
        yield client


def _root_cause(error: BaseException) -> BaseException:
    """The first leaf of (possibly nested) exception groups raised by anyio task groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def _with_stderr(message: str, tail: Sequence[str]) -> str:
    if not tail:
        return message
    return f"{message}. Last lines of its stderr:\n" + "\n".join(tail[-10:])


def connection_failure_text(error: BaseException) -> str:
    """A short, class-free description of an unexpected connection failure, for messages a
    model or an administrator reads (``could not connect``, ``HTTP status 502``, ...)."""
    error = _root_cause(error)
    if isinstance(error, httpx2.HTTPStatusError):
        return f"HTTP status {error.response.status_code}"
    if isinstance(error, httpx2.ConnectError):
        return "could not connect"
    if isinstance(error, httpx2.TimeoutException):
        return "the HTTP request timed out"
    if isinstance(error, httpx2.HTTPError):
        return "the HTTP exchange failed"
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    if isinstance(error, MCPError):
        return error.message
    logger.info("MCP connection failure: %r", error)
    return "the connection failed unexpectedly"


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
        elif isinstance(error, OSError):
            reason = str(error)  # "[Errno 2] No such file or directory: '/srv/x'"
        else:
            reason = connection_failure_text(error)
        message = f"MCP server {spec.name!r} could not be started: {reason}"
    return McpTransportError(_with_stderr(message, stderr_tail))


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
            failure = _call_failure(spec, "tools/list", error, None)
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
        headers = _http_headers(spec)
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


def _call_failure(
    spec: McpServerSpec, what: str, error: MCPError, timeout: float | None
) -> McpClientError:
    if error.code == CONNECTION_CLOSED:
        return McpTransportError(f"MCP server {spec.name!r} closed the connection during {what}")
    if error.code == REQUEST_TIMEOUT:
        waited = spec.call_timeout if timeout is None else timeout
        return McpTransportError(
            f"MCP server {spec.name!r} did not answer {what} within {waited:g} s; "
            "the request was cancelled"
        )
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


@dataclass(frozen=True)
class McpHttpSession:
    """A Streamable-HTTP MCP session a pool opened or closed (MCP specification,
    "Transports/Session Management"), for a record that outlives the worker.

    A worker killed by SIGKILL cannot send ``DELETE``; a record of the sessions it held lets
    the next worker end them (``mcp_registry.services.http_sessions_orphaned_close``).

    Attributes:
        server: The server's registry name.
        session_id: The ``Mcp-Session-Id`` the server assigned.
        scope: The connection's scope key (``session <id>``, ``user <id>``, ``shared``).
        protocol_version: The protocol version negotiated on it (sent with a later ``DELETE``).
        open: ``True`` when the session was opened, ``False`` when this side closed it.
    """

    server: str
    session_id: str
    scope: str
    protocol_version: str | None
    open: bool


HttpSessionCallback = Callable[[McpHttpSession], Awaitable[None] | None]
"""``on_http_session(session)``: a Streamable-HTTP session was opened or closed."""


class _Connection:
    """One long-lived MCP session (a stdio process or an HTTP session), owned by a task.

    The SDK's client holds anyio task groups and cancel scopes that must be entered and left by
    the same task, so a task of its own enters the client, reports readiness, and leaves it
    when ``close`` is called or the transport fails; requests from other tasks share it.

    ``key`` is its scope key (``session <id>``, ``user <id>``, ``shared``). ``requests`` maps
    each request task in flight to its scope, in the order they started, and
    ``log_listeners`` holds the ``on_log`` callbacks of the calls in flight; see the module
    docstring for where a log message goes. ``on_tools_list_changed`` gets the server's name
    when it announces a changed tool list. A stdio server's stderr is captured
    (:class:`_StderrCapture`): its tail explains a failed start or a crash, and its end (every
    process of the group gone) marks the connection broken with the exit status. ``on_status``
    gets :class:`McpProcessStatus` reports, one at a time under ``status_lock``;
    ``on_http_session`` gets the :class:`McpHttpSession` opened and closed.
    """

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        key: str = "shared",
        on_idle_log: Callable[[str, str, Any], Awaitable[None] | None] | None = None,
        on_tools_list_changed: Callable[[str], Awaitable[None] | None] | None = None,
        on_status: ProcessStatusCallback | None = None,
        on_http_session: HttpSessionCallback | None = None,
        status_lock: asyncio.Lock | None = None,
        restarts: int = 0,
    ) -> None:
        self.spec = spec
        self.key = key
        self.client: Client | None = None
        self.broken = False
        self.log_listeners: list[LogCallback] = []
        self.elicit_handlers: list[ElicitCallback] = []
        self.requests: dict[asyncio.Future[Any], McpScope | None] = {}
        #: Requests admitted on this connection and not finished (including the wait for its
        #: start); a connection with none is idle and may be closed.
        self.requests_in_flight = 0
        #: Requests this side stopped waiting for without an answer (a timeout, a cancelled
        #: call); the server may still run them, so on a connection that several agent
        #: sessions share, no log message is a single call's after one.
        self.abandoned_requests = 0
        self.last_used = time.monotonic()
        self.http_session_id: str | None = None
        self._on_idle_log = on_idle_log
        self._on_tools_list_changed = on_tools_list_changed
        self._on_status = on_status if spec.transport == "stdio" else None
        self._on_http_session = on_http_session if spec.transport == "streamable_http" else None
        self._status_lock = status_lock or asyncio.Lock()
        self._restarts = restarts
        self._state: ProcessState = "starting"
        self._started_at = datetime.now(UTC)
        self._ended_at: datetime | None = None
        self._error = ""
        self._exit_code: int | None = None
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

    @property
    def single_session(self) -> bool:
        """Whether every request on this connection belongs to one agent session."""
        return self.key.startswith("session ")

    def _from_thread(self, callback: Callable[[], None]) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening
            self._loop.call_soon_threadsafe(callback)

    def _spawn(self, callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
        # Callbacks may write events or touch a database: never run them in the session's
        # reader, which would stall every response behind them.
        task = self._loop.create_task(_invoke(callback, *args))
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
            scope=self.key,
            exit_code=self._exit_code,
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
            code = self.stderr.exit_code if self.stderr else None
            self._exit_code = code
            self._end("exited", f"the server process {exit_status_text(code)}")
            self.broken = True
            self._stop.set()

    def _end(self, state: ProcessState, error: str) -> None:
        if self._state in ("starting", "running"):
            self._state = state
            self._ended_at = datetime.now(UTC)
            self._error = error
            self._report()

    async def ended_on_its_own(self) -> bool:
        """After a dropped connection: whether the stdio server exited (its guard reported an
        exit status within a bounded wait), recording the exit for the admin first. Always
        ``False`` for an HTTP server."""
        if self.stderr is None:
            return False
        await asyncio.to_thread(self.stderr.wait_eof, _STDERR_EOF_WAIT_SECONDS)
        if self.stderr.exit_code is None:
            return False
        self._stderr_ended()
        return True

    def _http_session_seen(self, session_id: str) -> None:
        self.http_session_id = session_id

    def _report_http_session(self, *, open: bool) -> None:
        if self._on_http_session is None or self.http_session_id is None:
            return
        client = self.client
        version: str | None = None
        if client is not None:
            with contextlib.suppress(Exception):
                version = client.protocol_version
        self._spawn(
            self._on_http_session,
            McpHttpSession(
                server=self.spec.name,
                session_id=self.http_session_id,
                scope=self.key,
                protocol_version=version,
                open=open,
            ),
        )

    def _sole_owner(self, handlers: Sequence[_H]) -> _H | None:
        """The in-flight call a server message that names no request belongs to, if any.

        On a ``session`` connection every call is the same agent session's: the oldest in
        flight. On a ``user`` connection only an unambiguous owner: the one request in flight,
        with no request abandoned earlier (the server may still be working, and writing, for
        that one). On a ``shared`` connection nobody: the message may come from any user's
        earlier request.
        """
        if self.single_session:
            return handlers[0] if handlers else None
        if (
            self.key.startswith("user ")
            and self.requests_in_flight == 1
            and len(handlers) == 1
            and not self.abandoned_requests
        ):
            return handlers[0]
        return None

    async def _log_received(self, params: LoggingMessageNotificationParams) -> None:
        owner = self._sole_owner(self.log_listeners)
        if owner is not None:
            self._spawn(owner, params.level, params.data)
        elif self._on_idle_log is not None:
            self._spawn(self._on_idle_log, self.spec.name, params.level, params.data)

    async def _elicitation_received(
        self, context: ClientRequestContext, params: ElicitRequestParams
    ) -> ElicitResult:
        # The same rule as log messages: a request names no call, so the question goes to a
        # call of the one session this connection serves, or to an unambiguous owner.
        handler = self._sole_owner(self.elicit_handlers)
        if handler is None:
            logger.info(
                "MCP server %r asked a question no call can take; declined", self.spec.name
            )
            return ElicitResult(action="decline")
        try:
            return await handler(params)
        except Exception:
            logger.exception("Answering MCP server %r's question failed", self.spec.name)
            return ElicitResult(action="cancel")

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
                on_http_session_id=self._http_session_seen,
                elicitation_callback=self._elicitation_received,
            ) as client:
                if self.stderr is not None:
                    # The child holds its own copy; once every process of its group exits,
                    # the pipe reaches its end and the session is marked broken.
                    self.stderr.close_writer()
                self.client = client
                self._state = "running"
                self._report()
                self._report_http_session(open=True)
                self._ready.set_result(None)
                try:
                    await self._stop.wait()
                finally:
                    # Reported before the transport sends DELETE: a worker killed in between
                    # leaves no record, the session then expires on the server.
                    self._report_http_session(open=False)
        except asyncio.CancelledError:
            if not self._ready.done():
                self._ready.set_exception(TimeoutError())
            raise
        except Exception as error:
            if not self._ready.done():
                self._ready.set_exception(error)
            else:
                reason = connection_failure_text(error)
                logger.warning("MCP server %r session ended: %s", self.spec.name, reason)
                self._end("exited", f"the session ended: {reason}")
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


def _crash_message(spec: McpServerSpec, what: str, connection: _Connection) -> str:
    capture = connection.stderr
    code = capture.exit_code if capture else None
    return _with_stderr(
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
        self._connections: dict[tuple[str, str], _Connection] = {}
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
        self._on_log = on_log or _log_idle_message
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
            await _invoke(self._on_tools_list_changed, server_name)

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

    async def _connection(self, spec: McpServerSpec, scope: McpScope | None) -> _Connection:
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
                connection = _Connection(
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
    def _usable(connection: _Connection | None, spec: McpServerSpec) -> bool:
        return (
            connection is not None
            and not connection.broken
            and connection.spec.fingerprint() == spec.fingerprint()
        )

    @staticmethod
    def _admitted(connection: _Connection, spec: McpServerSpec) -> _Connection:
        # Later requests use the newest stored schemas and idle timeout without reconnecting.
        connection.spec = spec
        connection.requests_in_flight += 1
        connection.last_used = time.monotonic()
        return connection

    def _release(self, connection: _Connection) -> None:
        connection.requests_in_flight -= 1
        connection.last_used = time.monotonic()
        if connection.requests_in_flight == 0 and self._slot_freed is not None:
            self._slot_freed.set()

    def _drop_soon(self, connection: _Connection) -> None:
        key = (connection.spec.name, connection.key)
        if self._connections.get(key) is connection:
            del self._connections[key]
        task = asyncio.get_running_loop().create_task(self._drop(connection))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def _drop(self, connection: _Connection) -> None:
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
                if (
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
            answered = False
            try:
                result = await _await_request(request, clock)
                answered = True
                return result
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
                answered = error.code not in (REQUEST_TIMEOUT, CONNECTION_CLOSED)
                failure = _call_failure(spec, what, error, timeout)
                if error.code == CONNECTION_CLOSED:
                    if await connection.ended_on_its_own():
                        failure = McpTransportError(_crash_message(spec, what, connection))
                    await self._drop(connection)
                raise failure from error
            except ValidationError as error:
                answered = True
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
                if not answered:
                    # Timed out or cancelled here: the server may still be running it, and
                    # its log messages may still come (see ``_Connection.abandoned_requests``).
                    connection.abandoned_requests += 1
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
                task = asyncio.create_task(_invoke(on_progress, progress, total, message))
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
