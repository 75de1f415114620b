"""One MCP connection (a stdio process or a Streamable-HTTP session), owned by one task.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). Owns
:class:`Connection`: the task that holds the SDK's client open, its readiness and close, the
routing of a server's messages that name no request (log messages, questions) to the call that
owns them, the reports of process state (:class:`McpProcessStatus`) and of HTTP sessions
(:class:`McpHttpSession`); and the callback types a call may pass (progress, log,
elicitation). Opening the transport and the prose of failures are ``_mcp_transport``'s.
Imports ``mcp_registry._mcp_spec``, ``mcp_registry._mcp_stdio`` and
``mcp_registry._mcp_transport``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from mcp import Client
from mcp.client.session import ClientRequestContext, IncomingMessage
from mcp.types import (
    ElicitRequestParams,
    ElicitResult,
    LoggingMessageNotificationParams,
    ToolListChangedNotification,
)

from mcp_registry._mcp_spec import McpClientError, McpScope, McpServerSpec, McpTransportError
from mcp_registry._mcp_stdio import (
    STDERR_EOF_WAIT_SECONDS,
    McpProcessStatus,
    ProcessState,
    ProcessStatusCallback,
    StderrCapture,
    exit_status_text,
    with_stderr,
)
from mcp_registry._mcp_transport import connection_failure_text, open_client, startup_failure

logger = logging.getLogger("mcp_registry.client")

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


async def invoke(callback: Callable[..., Awaitable[None] | None], *args: Any) -> None:
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


class Connection:
    """One long-lived MCP session (a stdio process or an HTTP session), owned by a task.

    The SDK's client holds anyio task groups and cancel scopes that must be entered and left by
    the same task, so a task of its own enters the client, reports readiness, and leaves it
    when ``close`` is called or the transport fails; requests from other tasks share it.

    ``key`` is its scope key (``session <id>``, ``user <id>``, ``shared``). ``requests`` maps
    each request task in flight to its scope, in the order they started, and
    ``log_listeners`` holds the ``on_log`` callbacks of the calls in flight; see the module
    docstring for where a log message goes. ``on_tools_list_changed`` gets the server's name
    when it announces a changed tool list. A stdio server's stderr is captured
    (:class:`StderrCapture`): its tail explains a failed start or a crash, and its end (every
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
        self.stderr: StderrCapture | None = None
        if spec.transport == "stdio":
            self.stderr = StderrCapture(
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
        task = self._loop.create_task(invoke(callback, *args))
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
            await invoke(self._on_status, status)

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
        # Every process of the group closed its stderr: the server is gone. No new request
        # may use the connection; one in flight may still get the answer the server wrote
        # before it exited (its stdout is read to the end, in order), so the connection is
        # left to the transport's own end of file, and closed once nothing is in flight.
        if self._state == "running" and not self._closing:
            code = self.stderr.exit_code if self.stderr else None
            self._exit_code = code
            self._end("exited", f"the server process {exit_status_text(code)}")
            self.broken = True
            if self.requests_in_flight == 0:
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
        await asyncio.to_thread(self.stderr.wait_eof, STDERR_EOF_WAIT_SECONDS)
        if self.stderr.exit_code is None:
            return False
        self._stderr_ended()
        return True

    def crash_message(self, what: str) -> str:
        """The error text for a request ``what`` this connection's server crashed during: its
        exit status and the last lines of its stderr (an HTTP server has neither)."""
        capture = self.stderr
        code = capture.exit_code if capture else None
        return with_stderr(
            f"MCP server {self.spec.name!r} {exit_status_text(code)} during {what}",
            capture.tail() if capture else (),
        )

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
        flight. On a ``user`` connection the one request in flight, if there is one: every
        request there is the same user's (a request of theirs that was abandoned earlier may
        still be running, so the message may belong to another of their sessions, which the
        level allows). On a ``shared`` connection nobody: the message may come from any
        user's request.
        """
        if self.single_session:
            return handlers[0] if handlers else None
        if self.key.startswith("user ") and self.requests_in_flight == 1 and len(handlers) == 1:
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
            async with open_client(
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

    async def stderr_tail_after_exit(self) -> tuple[str, ...]:
        """The stderr tail once the owner task is done and the pipe reached its end
        (bounded wait: a grandchild that kept the pipe open must not hold up the error)."""
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        if self.stderr is None:
            return ()
        await asyncio.to_thread(self.stderr.wait_eof, STDERR_EOF_WAIT_SECONDS)
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
            failure = startup_failure(self.spec, error, self.stderr.tail() if self.stderr else ())
            self._end("failed", failure.message)
            await self.close()
            raise failure from error
        except McpClientError as error:
            self._end("failed", error.message)
            raise
        except Exception as error:
            failure = startup_failure(self.spec, error, await self.stderr_tail_after_exit())
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


async def log_idle_message(server: str, level: str, data: Any) -> None:
    logger.info("MCP server %r log (%s): %s", server, level, data)
