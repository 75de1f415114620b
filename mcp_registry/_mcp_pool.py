"""The worker's MCP connections, one per server and scope key, and the requests sent on them.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). Owns
:class:`McpClientPool`: which connection a request travels on (the server's isolation and the
request's :class:`McpScope`), opening and reopening connections, the bound on live stdio
processes, closing idle ones and those of ended agent sessions, cancelling an ended session's
requests, and what a failed request means (an answer, a crash with its exit status, a dropped
connection). What a ``tools/call`` itself does (its clock, relays and outcome) is
``_mcp_call``'s; one connection's own life is ``_mcp_connection``'s. Imports
``mcp_registry._mcp_spec``, ``mcp_registry._mcp_stdio`` (a type), ``mcp_registry._mcp_transport``,
``mcp_registry._mcp_connection``, ``mcp_registry._mcp_call`` and ``mcp_registry.content``.

Isolation (which requests share a connection, and when one closes) and where a server's
notifications and questions go are described in ``mcp_registry.client``'s docstring.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from mcp import Client, MCPError
from mcp.types import (
    GetPromptResult,
    ListPromptsResult,
    ListResourcesResult,
    ListResourceTemplatesResult,
    ReadResourceResult,
)
from pydantic import ValidationError

from mcp_registry._mcp_call import (
    CallClock,
    CallTimedOut,
    ProgressRelay,
    await_request,
    current_task_cancelling,
    elicitation_relay,
    tool_call_sender,
    tool_output,
)
from mcp_registry._mcp_connection import (
    Connection,
    ElicitCallback,
    HttpSessionCallback,
    LogCallback,
    ProgressCallback,
    ToolsChangedCallback,
    invoke,
    log_idle_message,
)
from mcp_registry._mcp_spec import (
    McpPoolFullError,
    McpScope,
    McpServerSpec,
    McpToolError,
    McpTransportError,
    scope_key,
)
from mcp_registry._mcp_stdio import ProcessStatusCallback
from mcp_registry._mcp_transport import call_failure, connection_failure_text, raised_here
from mcp_registry.content import McpToolOutput

logger = logging.getLogger("mcp_registry.client")

_T = TypeVar("_T")


class _CancelledBySessionEnd(Exception):
    """A request this pool cancelled because its agent session ended."""


class McpClientPool:
    """Long-lived MCP connections, one per server and scope key, in one event loop.

    Create one per worker process and ``await pool.aclose()`` on shutdown, or use it as an
    async context manager. The pool binds to the event loop of its first call; using it from
    another loop raises ``RuntimeError``. A request names its :class:`McpScope`; the server's
    ``isolation`` decides which connection it travels on (``mcp_registry.client``). The first
    request of a scope connects; a failed or dropped connection is reopened by the next one,
    and a changed spec for the same server replaces it.

    Args:
        on_tools_list_changed: Called with the server's name for every
            ``notifications/tools/list_changed`` (MCP specification, "Tools/List Changed
            Notification"); the worker passes ``mcp_registry.tasks.tools_list_changed_enqueue``
            so discovery refreshes the stored catalogue. The name is also added to
            :attr:`stale_catalogues` either way.
        on_log: Called as ``on_log(server_name, level, data)`` for log messages no call
            owns (``mcp_registry.client``); default: that module's logger at INFO.
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
        clock: CallClock | None = None,
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
                return await await_request(request, clock)
            except CallTimedOut:
                raise McpTransportError(
                    f"MCP server {spec.name!r} did not answer {what} within "
                    f"{clock.limit if clock else 0:g} s; the request was cancelled"
                ) from None
            except asyncio.CancelledError:
                if request.cancelled() and not current_task_cancelling():
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
                        failure = McpTransportError(connection.crash_message(what))
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
                    raise McpTransportError(connection.crash_message(what)) from error
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
        connection (``mcp_registry.client``); ``None`` uses the server's shared one.
        ``idempotency_key`` is sent in the request ``_meta`` under ``dexagents/idempotency_key``.
        ``timeout`` is in seconds (``None``: ``spec.call_timeout``); at the timeout the request
        is cancelled (``notifications/cancelled``). Opening the connection is bounded
        separately by ``spec.startup_timeout``.

        ``on_progress(progress, total, message)`` receives the call's progress notifications (a
        progress token is sent only when it is given); ``on_log(level, data)`` receives the
        server's log messages ``mcp_registry.client`` attributes to this call. Both may be plain
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
        clock = CallClock(spec.call_timeout if timeout is None else timeout)
        progress = ProgressRelay(on_progress) if on_progress is not None else None
        elicit = elicitation_relay(on_elicit, clock) if on_elicit is not None else None
        send = tool_call_sender(
            tool_name, arguments, idempotency_key=idempotency_key, progress=progress
        )
        what = f"the call to tool {tool_name!r}"
        result = await self._request(
            spec, scope, what, send, on_log=on_log, on_elicit=elicit, timeout=clock.limit,
            clock=clock,
        )
        if progress is not None:
            # Deliver every progress event before the result, in arrival order.
            await progress.delivered()
        return tool_output(spec, tool_name, what, result)

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
