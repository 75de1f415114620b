"""Reaching an MCP server: the transports, the handshake, and how a failure to reach one reads.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). Owns
:func:`open_client` (a stdio child or a Streamable-HTTP session, ``initialize`` first and the
SDK's negotiation only for a modern-only server), :func:`http_session_end` (the ``DELETE`` that
ends an HTTP session nobody holds a connection for any more), and the class-free prose of
failures a model or an administrator reads (:func:`connection_failure_text`,
:func:`startup_failure`, :func:`call_failure`, and :func:`raised_here`, which tells the SDK's own
errors from a server's answer). Keeps no state between calls. Imports ``mcp_registry._mcp_spec``
and ``mcp_registry._mcp_stdio`` only.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, Literal, TextIO

import httpx2
from mcp import Client, MCPError
from mcp.client.session import ElicitationFnT, LoggingFnT, MessageHandlerFnT
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import (
    CONNECTION_CLOSED,
    REQUEST_TIMEOUT,
    UNSUPPORTED_PROTOCOL_VERSION,
)

from mcp_registry._mcp_spec import (
    McpClientError,
    McpServerSpec,
    McpToolError,
    McpTransportError,
    http_headers,
)
from mcp_registry._mcp_stdio import server_errlog, stdio_parameters, with_stderr

logger = logging.getLogger("mcp_registry.client")

# Log messages at this level and above are requested from servers on the 2026-07-28 protocol,
# where delivery is opted into per request (SEP-2577); older servers send what they like.
_LOG_LEVEL = "info"

_HTTP_CONNECT_TIMEOUT = 30.0
_HTTP_READ_TIMEOUT = 300.0


@asynccontextmanager
async def open_client(
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
                    headers=http_headers(spec),
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
                    stdio_parameters(spec), errlog=errlog or server_errlog()
                )
                return Client(transport, mode=mode, **callbacks)
            return Client(
                streamable_http_client(spec.url, http_client=http_client), mode=mode, **callbacks
            )

        try:
            client = await stack.enter_async_context(client_for("legacy"))
        except Exception as error:
            refused = root_cause(error)
            if not (
                isinstance(refused, MCPError) and refused.code == UNSUPPORTED_PROTOCOL_VERSION
            ):
                raise
            client = await stack.enter_async_context(client_for("auto"))
        yield client


def root_cause(error: BaseException) -> BaseException:
    """The first leaf of (possibly nested) exception groups raised by anyio task groups."""
    while isinstance(error, BaseExceptionGroup) and error.exceptions:
        error = error.exceptions[0]
    return error


def connection_failure_text(error: BaseException) -> str:
    """A short, class-free description of an unexpected connection failure, for messages a
    model or an administrator reads (``could not connect``, ``HTTP status 502``, ...)."""
    error = root_cause(error)
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


def startup_failure(
    spec: McpServerSpec, error: BaseException, stderr_tail: Sequence[str] = ()
) -> McpTransportError:
    error = root_cause(error)
    if isinstance(error, McpTransportError):
        return error
    remote = spec.transport == "streamable_http"
    if isinstance(error, TimeoutError):
        what = "answer the MCP handshake" if remote else "finish starting"
        message = f"MCP server {spec.name!r} did not {what} within {spec.startup_timeout:g} s"
    else:
        if isinstance(error, MCPError) and raised_here(error) == "closed":
            closer = "the server" if remote else "the process"
            reason = f"{closer} closed the connection before the MCP handshake finished"
        elif isinstance(error, OSError) and not remote:
            reason = str(error)  # "[Errno 2] No such file or directory: '/srv/x'"
        else:
            reason = connection_failure_text(error)
        started = "reached" if remote else "started"
        message = f"MCP server {spec.name!r} could not be {started}: {reason}"
    return McpTransportError(with_stderr(message, stderr_tail))


def raised_here(error: MCPError) -> str | None:
    """``"closed"`` or ``"timeout"`` when the SDK raised ``error`` itself (the connection
    closed, or its request timeout passed), ``None`` when the server sent it.

    The SDK reports both with JSON-RPC codes a server may also send (-32000 and -32001, in
    the implementation-defined range), so the code alone would take a server's answer for
    "no answer" and run the call again. The SDK's own errors carry no data and fixed
    messages (``mcp.shared.jsonrpc_dispatcher``).
    """
    if error.data is not None:
        return None
    if error.code == CONNECTION_CLOSED and error.message == "Connection closed":
        return "closed"
    if (
        error.code == REQUEST_TIMEOUT
        and error.message.startswith("Request ")
        and error.message.endswith(" timed out")
    ):
        return "timeout"
    return None


def call_failure(
    spec: McpServerSpec, what: str, error: MCPError, timeout: float | None
) -> McpClientError:
    """The error a caller gets for an ``MCPError`` of ``what`` (see :func:`raised_here`)."""
    cause = raised_here(error)
    if cause == "closed":
        return McpTransportError(f"MCP server {spec.name!r} closed the connection during {what}")
    if cause == "timeout":
        waited = spec.call_timeout if timeout is None else timeout
        return McpTransportError(
            f"MCP server {spec.name!r} did not answer {what} within {waited:g} s; "
            "the request was cancelled"
        )
    return McpToolError(
        f"MCP server {spec.name!r} rejected {what}: {error.message} (error code {error.code})"
    )



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
