"""One ``tools/call`` from sending to outcome, apart from the connection it travels on.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). Owns the call's
clock (:class:`CallClock`: the call's timeout, standing still while the user answers a server's
question) and the wait for an answer within it (:func:`await_request`); the relays that hand a
call's progress notifications and a server's questions to the caller's callbacks
(:class:`ProgressRelay`, :func:`elicitation_relay`); the request itself (:func:`tool_call_sender`,
which keeps the SDK from sending ``tools/list`` in the middle of a call); and the outcome
(:func:`tool_output`: an ``isError`` result or structured content that breaks the output schema
stored at discovery becomes :class:`McpToolError`, anything else :class:`McpToolOutput`). Which
connection a call uses, and what a failed connection means, is the pool's
(``_mcp_pool``). Imports ``mcp_registry._mcp_spec``, ``mcp_registry._mcp_connection`` (the
callback types) and ``mcp_registry.content``.
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

from mcp import Client
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult
from mcp_types import RequestParamsMeta

from mcp_registry._mcp_connection import ElicitCallback, ProgressCallback, invoke
from mcp_registry._mcp_spec import IDEMPOTENCY_KEY_META, McpServerSpec, McpToolError
from mcp_registry.content import McpToolOutput, render_content, resource_links

logger = logging.getLogger("mcp_registry.client")

_T = TypeVar("_T")
# A tools/call is bounded by the pool's own call clock, not by the SDK's request timeout.
_NO_SDK_TIMEOUT = 30 * 24 * 3600.0


class CallTimedOut(Exception):
    """The call clock ran out; the request was cancelled."""


class CallClock:
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


async def await_request(request: asyncio.Future[_T], clock: CallClock | None) -> _T:
    """Wait for ``request`` within ``clock``; at its end cancel the request (the SDK then
    sends ``notifications/cancelled``) and raise :class:`CallTimedOut`. A cancelled caller
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
                raise CallTimedOut
            done, _ = await asyncio.wait({request}, timeout=wait)
            if done:
                return request.result()
    except asyncio.CancelledError:
        if not request.cancelled() or current_task_cancelling():
            request.cancel()
        raise


def current_task_cancelling() -> bool:
    """Whether the running task was asked to cancel, so a ``CancelledError`` it sees is its
    caller's and not only that of a request it waits for."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


class ProgressRelay:
    """Hands a call's progress notifications to ``on_progress``, each in a task of its own, so
    a slow callback never delays the call's reader; :meth:`delivered` waits for every one.

    An instance is the SDK's ``progress_callback`` (``await relay(progress, total, message)``,
    MCP specification, "Utilities/Progress").
    """

    def __init__(self, on_progress: ProgressCallback) -> None:
        self._on_progress = on_progress
        self._tasks: set[asyncio.Task[None]] = set()

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        task = asyncio.create_task(invoke(self._on_progress, progress, total, message))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def delivered(self) -> None:
        """Wait until every notification received so far has reached ``on_progress`` (so they
        all come before the result, in arrival order); a failed callback was logged."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


def elicitation_relay(on_elicit: ElicitCallback, clock: CallClock) -> ElicitCallback:
    """``on_elicit`` with ``clock`` paused while it runs: the time a user takes to answer a
    server's question (``elicitation/create``) is not the call's time."""

    async def elicit(params: ElicitRequestParams) -> ElicitResult:
        clock.pause()
        try:
            return await on_elicit(params)
        finally:
            clock.resume()

    return elicit


def tool_call_sender(
    tool_name: str,
    arguments: Mapping[str, Any],
    *,
    idempotency_key: str | None,
    progress: ProgressRelay | None,
) -> Callable[[Client], Awaitable[CallToolResult]]:
    """The request the pool sends for one call: ``tools/call`` of ``tool_name`` with
    ``arguments``, ``idempotency_key`` in its ``_meta`` under :data:`IDEMPOTENCY_KEY_META`, a
    progress token only when ``progress`` is given, and no SDK timeout (the call clock bounds
    the wait)."""
    meta: RequestParamsMeta | None = None
    if idempotency_key is not None:
        meta = cast(RequestParamsMeta, {IDEMPOTENCY_KEY_META: idempotency_key})

    async def send(client: Client) -> CallToolResult:
        skip_sdk_result_check(client, tool_name)
        return await client.call_tool(
            tool_name,
            dict(arguments),
            # The call clock bounds the wait (it stands still while the user answers a
            # question); the SDK's own timeout would not.
            read_timeout_seconds=_NO_SDK_TIMEOUT,
            progress_callback=progress,
            meta=meta,
        )

    return send


def tool_output(
    spec: McpServerSpec, tool_name: str, what: str, result: CallToolResult
) -> McpToolOutput:
    """The outcome of ``result``, the answer to ``what`` (the call of ``tool_name``).

    Returns:
        ``McpToolOutput(text, structured_content, resource_links, content)``.

    Raises:
        McpToolError: ``result`` has ``isError`` set (``message`` is its text), or its
            structured content breaks ``spec.tool_output_schemas[tool_name]`` (the message
            says where, and quotes the text content).
    """
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
        resource_links=resource_links(result),
        content=tuple(result.content),
    )


def skip_sdk_result_check(client: Client, tool_name: str) -> None:
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
