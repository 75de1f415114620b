"""One approved tool call, run once on its MCP server (or as a built-in), and what its record keeps.

``tool_call_execute`` is the runner's ``execute_deferred_tool_call`` (seed "Tool execution"):
it runs the call through the MCP client pool with the call's idempotency key and the tool's
timeout, relays the server's progress notifications and log messages as ``tool_progress`` and
``tool_log`` AgentEvents, and turns a question the server asks during the call
(``elicitation/create``) into a question of the session (``dex_agents.ToolCallElicitations``):
the user answers it in the browser or the API while the call waits, and the server gets
``accept`` with the form's values, ``decline`` or ``cancel``. The result is cut to what a tool
call record may keep (:func:`stored_text`).

May import: ``agents_app.worker.agent_config``, ``agents_app.worker.tool_calls``,
``agents_app.worker.model_replies``, ``dex_agents`` and ``mcp_registry``.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import timedelta
from typing import Any, Literal, cast

from mcp.types import ElicitRequestParams, ElicitRequestURLParams, ElicitResult

from agents_app.worker.agent_config import AgentModelConfig
from agents_app.worker.model_replies import ModelResponseError
from agents_app.worker.tool_calls import parse_tool_arguments
from dex_agents import (
    AgentEventType,
    AgentSessionClient,
    DeferredToolExecution,
    ToolCallElicitations,
    ToolExecutionError,
    ToolExecutionResult,
)
from mcp_registry.builtin_tools import BuiltinToolError, builtin_tool_content
from mcp_registry.client import ElicitCallback, McpClientPool, McpServerSpec, McpToolError
from mcp_registry.content import MediaLimits, ToolResultContent

__all__ = [
    "TOOL_RESULT_MAX_STORED_BYTES",
    "ServerResolver",
    "SessionClientFactory",
    "elicitation_handler",
    "stored_text",
    "tool_call_execute",
    "tool_execution_result",
]

ServerResolver = Callable[[str], Awaitable[McpServerSpec]]
"""``async (server_name) -> McpServerSpec``; supplied by the Django side (reads the registry)."""

SessionClientFactory = Callable[[], AgentSessionClient]
"""``() -> AgentSessionClient`` of the session Flow on the same engine, usable on the running
event loop (the Worker's); tool calls put MCP servers' questions to the user through it."""


TOOL_RESULT_MAX_STORED_BYTES = 1024 * 1024
"""The most bytes of one tool result's text (or error) its tool call record keeps, counted in
the JSON the Dex SDK stores (ASCII-escaped: a non-ASCII character takes 6 or 12 bytes). Records
live in Dex state, one value must stay under the 4 MiB a worker loads at once, and the turn's
tool message keeps the record's text twice (its text and its framework item); a longer text
is cut here with a note for the model (the model sees at most ``tool_result_max_chars`` of it
anyway), and a longer result's whole text is stored apart, in parts, for people
(``ToolExecutionResult.full_text``; errors are not)."""


async def tool_call_execute(
    call: DeferredToolExecution,
    config: AgentModelConfig,
    *,
    pool: McpClientPool,
    server_resolver: ServerResolver,
    media_limits: MediaLimits,
    session_client: SessionClientFactory | None,
) -> ToolExecutionResult:
    """Run one approved tool call on its MCP server, once, with the call's idempotency key.

    MCP progress notifications and server log messages received during the call become
    ``tool_progress`` and ``tool_log`` events. Built-in tools (resources and prompts) run
    through the same pool. The server's questions (``elicitation/create``) wait for the
    user's answer as questions of the session (:func:`elicitation_handler`).

    Returns:
        The model-visible result: the tool's text, its resource links and its structured
        content in one form, with the images ``media_limits`` allow when the
        model accepts images (``McpToolOutput.for_model_content``,
        ``ToolResultContent.encode``), followed by a note on each of the server's questions
        the user did not answer (expired, withdrawn, declined unasked).

    Raises:
        ToolExecutionError: Unknown tool, arguments that are not a JSON object (both
            checked before any server is contacted), or an MCP tool error (``isError`` or
            a server error response): recorded ``failed`` for the model to see.
        McpTransportError: The server could not be reached, or the request took longer than
            the tool's ``timeout_seconds`` (else the server's ``call_timeout``): a Step
            failure, so read and idempotent-write calls are retried as their policy says.

    Args:
        call: The approved call, its record and the session's event writer.
        config: The session's agent config (``AgentModelConfig.parse(call.agent_config)``).
        pool: The MCP client pool the call runs through.
        server_resolver: ``async (server_name) -> McpServerSpec``.
        media_limits: The bounds of the images a result attaches (``accept_images`` is set
            here from ``config``).
        session_client: A client of the session Flow for the user's answers to the server's
            questions; ``None`` declines every question.
    """
    record = call.tool_call
    entry = config.tool(record.tool_name)
    if entry is None:
        raise ToolExecutionError(f"Tool {record.tool_name!r} is not enabled for this session.")
    try:
        arguments = parse_tool_arguments(record.tool_name, record.arguments)
    except ModelResponseError as error:
        raise ToolExecutionError(
            f"{error}. Call the tool again with a JSON object as its arguments."
        ) from error
    if entry.subagent:
        # The session runs subagent calls as child sessions (CallSubagent); one reaches the
        # runner only on a Flow without AgentSessionOptions.subagents.
        raise ToolExecutionError(f"{record.tool_name!r}: subagents are not enabled here.")
    limits = replace(media_limits, accept_images=config.accepts_images())
    if entry.builtin:
        try:
            content = await builtin_tool_content(
                name=entry.name,
                arguments=arguments,
                pool=pool,
                server_names=sorted({tool.server for tool in config.tools if tool.server}),
                resolve_server=server_resolver,
                scope=config.scope(call.flow_id),
                media=limits,
            )
        except BuiltinToolError as error:
            raise ToolExecutionError(stored_text(error.message)) from error
        return tool_execution_result(content)

    def on_progress(progress: float, total: float | None, message: str | None) -> None:
        call.events.write_event(AgentEventType.TOOL_PROGRESS, {
            "tool_call_id": record.tool_call_id, "tool_name": record.tool_name,
            "progress": progress, "total": total, "message": message,
        })

    def on_log(level: str, data: Any) -> None:
        call.events.write_event(AgentEventType.TOOL_LOG, {
            "tool_call_id": record.tool_call_id, "tool_name": record.tool_name,
            "level": str(level), "data": data,
        })

    spec = await server_resolver(entry.server)
    asker, on_elicit = elicitation_handler(call, config, entry.server, session_client)
    try:
        output = await pool.call_tool(
            spec, entry.tool, arguments, idempotency_key=call.idempotency_key,
            timeout=entry.timeout_seconds, on_progress=on_progress, on_log=on_log,
            on_elicit=on_elicit, scope=config.scope(call.flow_id),
        )
    except McpToolError as error:
        raise ToolExecutionError(stored_text(_with_notes(error.message, asker))) from error
    content = output.for_model_content(limits)
    return tool_execution_result(replace(content, text=_with_notes(content.text, asker)))


def elicitation_handler(
    call: DeferredToolExecution,
    config: AgentModelConfig,
    server: str,
    session_client: SessionClientFactory | None,
) -> tuple[ToolCallElicitations | None, ElicitCallback | None]:
    """The MCP client's ``on_elicit`` for one attempt of ``call``, and the asker that keeps
    its notes; ``(None, None)`` without a session client (questions are then declined).

    Form mode shows the server's form, URL mode its message and URL (never opened for
    the user); the answer, or ``cancel`` once ``config.elicitation_timeout`` seconds pass
    or the session withdraws the question, goes back to the server.
    """
    if session_client is None:
        return None, None
    asker = ToolCallElicitations(
        session_client(),
        call,
        server_name=server,
        timeout=timedelta(seconds=config.elicitation_timeout),
    )

    async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
        if isinstance(params, ElicitRequestURLParams):
            outcome = await asker.ask(
                mode="url",
                message=params.message,
                url=params.url,
                server_elicitation_id=params.elicitation_id or "",
            )
        else:
            outcome = await asker.ask(
                mode="form",
                message=params.message,
                requested_schema=dict(params.requested_schema),
            )
        action = cast(Literal["accept", "decline", "cancel"], outcome.action)
        return ElicitResult(action=action, content=outcome.content)

    return asker, on_elicit


def tool_execution_result(content: ToolResultContent) -> ToolExecutionResult:
    """The result a tool Step records for ``content``: its text cut by :func:`stored_text`
    (with its images, encoded), and the whole text as ``full_text`` when the cut left some
    out, which the session stores in parts for people (``dex_agents._text_parts``)."""
    shown = stored_text(content.text)
    output = replace(content, text=shown).encode()
    return ToolExecutionResult(output, full_text=content.text if shown != content.text else None)


def stored_text(text: str, limit: int = TOOL_RESULT_MAX_STORED_BYTES) -> str:
    """``text`` as a tool call record keeps it: whole when its JSON form, ASCII-escaped as the
    Dex SDK stores it (a non-ASCII character takes 6 or 12 bytes), fits ``limit`` bytes; else
    its longest start that leaves room for a note, followed by the note saying how much was
    left out.
    """
    if _json_bytes_len(text) <= limit:
        return text
    low, high = 0, min(len(text), limit)
    while low < high:  # the longest start of at most limit - 512 bytes of JSON
        middle = (low + high + 1) // 2
        if _json_bytes_len(text[:middle]) <= limit - 512:
            low = middle
        else:
            high = middle - 1
    return (
        f"{text[:low]}\n\n[dexagents] The result was cut to its first {low:,} of "
        f"{len(text):,} characters ({limit:,} bytes of JSON) to fit the session's storage; ask "
        "the tool for a smaller part if you need the rest."
    )


_json_encode = json.JSONEncoder().encode


def _json_bytes_len(text: str) -> int:
    return len(_json_encode(text))


def _with_notes(text: str, asker: ToolCallElicitations | None) -> str:
    """``text`` followed by the notes on the server's questions the user did not answer (one
    line each, marked ``[dexagents]``), so the model knows why the server got ``cancel``."""
    if asker is None or not asker.notes:
        return text
    notes = "\n".join(f"[dexagents] {note}" for note in asker.notes)
    return f"{text}\n\n{notes}" if text else notes
