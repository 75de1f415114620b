"""The local demo model: a deterministic OpenAI-compatible Chat Completions server.

Run it with ``python -m agents_app.demo_model --host 127.0.0.1 --port 8811`` (``--port 0`` picks a
free port). Once it accepts connections it prints exactly one line,
``demo model ready on http://<host>:<port>``, and flushes stdout. The ``demo`` agent reaches it
through LiteLLM as ``openai/dexagents-demo`` with ``api_base=http://<host>:<port>/v1``
(ARCHITECTURE.md, "The demo model"). It needs no key and ignores any ``Authorization`` header.

The script is applied to the conversation a request carries, so the server keeps no state:

* When the request ends with ``role="tool"`` messages (tool results after the assistant message
  that asked for them), the answer is a final text that quotes each result's text, in order.
* Otherwise the latest user message is read line by line. Every line
  ``/tool <name> <json-arguments>`` becomes one tool call of a single response, in line order
  (parallel tool calls). The arguments are passed on verbatim (``{}`` when omitted), so a test can
  also script invalid JSON. Call IDs are ``call_<n>``, numbered after the tool calls already in
  the conversation, so they never repeat within one conversation.
* Any other message gets ``You said: <text>``.

Streaming follows the OpenAI wire shape: ``data: <chunk JSON>`` server-sent events, text split
over several chunks, tool-call arguments split over id-less continuation chunks, then a usage
chunk (empty ``choices``) when ``stream_options.include_usage`` is true, then ``data: [DONE]``.
Token counts are whitespace-separated words, which is deterministic and good enough for a demo.

This module must stay importable without Django settings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

DEMO_MODEL_NAME = "dexagents-demo"
"""The model ID the server lists; requests may name any model and get it echoed back."""

READY_LINE_PREFIX = "demo model ready on "

_TOOL_LINE = re.compile(r"^\s*/tool\s+(?P<name>\S+)(?:\s+(?P<arguments>.*\S))?\s*$")
_TEXT_CHUNK_WORDS = 3
_ARGUMENT_CHUNK_CHARS = 8


@dataclass(frozen=True)
class DemoToolCall:
    """One scripted tool call: ``id`` like ``call_3``, the tool ``name``, raw ``arguments``."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class DemoReply:
    """The scripted answer to one request: either ``text`` or a non-empty ``tool_calls`` list."""

    text: str | None = None
    tool_calls: list[DemoToolCall] = field(default_factory=list)

    @property
    def finish_reason(self) -> str:
        """``"tool_calls"`` when the reply asks for tools, else ``"stop"``."""
        return "tool_calls" if self.tool_calls else "stop"


def message_text(content: Any) -> str:
    """Return the text of a Chat Completions ``content`` value.

    Accepts a string, ``None``, or a list of content parts (``{"type": "text", "text": ...}``);
    non-text parts are skipped and text parts are joined with newlines.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") == "text"
        )
    return str(content)


def plan_reply(messages: Sequence[Mapping[str, Any]]) -> DemoReply:
    """Apply the demo script (see the module docstring) to a request's ``messages``.

    ``messages`` are Chat Completions message dicts, oldest first. Pure and deterministic.
    """
    trailing_results: list[str] = []
    for message in reversed(messages):
        if message.get("role") != "tool":
            break
        trailing_results.append(message_text(message.get("content")))
    if trailing_results:
        trailing_results.reverse()
        quoted = "\n".join(f"- {result}" for result in trailing_results)
        return DemoReply(text=f"Here is what the tools returned:\n{quoted}")

    user_text = next(
        (
            message_text(message.get("content"))
            for message in reversed(messages)
            if message.get("role") == "user"
        ),
        "",
    )
    earlier_calls = sum(
        len(message.get("tool_calls") or [])
        for message in messages
        if message.get("role") == "assistant"
    )
    tool_calls: list[DemoToolCall] = []
    for line in user_text.splitlines():
        match = _TOOL_LINE.match(line)
        if match is None:
            continue
        tool_calls.append(
            DemoToolCall(
                id=f"call_{earlier_calls + len(tool_calls) + 1}",
                name=match.group("name"),
                arguments=match.group("arguments") or "{}",
            )
        )
    if tool_calls:
        return DemoReply(tool_calls=tool_calls)
    return DemoReply(text=f"You said: {user_text}")


def count_tokens(messages: Sequence[Mapping[str, Any]]) -> int:
    """Count prompt "tokens" as whitespace-separated words over contents and tool arguments."""
    total = 0
    for message in messages:
        total += len(message_text(message.get("content")).split())
        for call in message.get("tool_calls") or []:
            function = call.get("function") or {}
            total += len(str(function.get("name", "")).split())
            total += len(str(function.get("arguments", "")).split())
    return total


def _completion_tokens(reply: DemoReply) -> int:
    if reply.text is not None:
        return len(reply.text.split())
    return sum(len(call.name.split()) + len(call.arguments.split()) for call in reply.tool_calls)


def _usage(prompt_tokens: int, reply: DemoReply) -> dict[str, int]:
    completion_tokens = _completion_tokens(reply)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def split_text(text: str, words_per_chunk: int = _TEXT_CHUNK_WORDS) -> list[str]:
    """Split ``text`` into chunks of a few words each, keeping every character (joins back)."""
    pieces = re.findall(r"\S+\s*|\s+", text)
    return [
        "".join(pieces[start : start + words_per_chunk])
        for start in range(0, len(pieces), words_per_chunk)
    ] or [""]


def _split_arguments(arguments: str) -> list[str]:
    return [
        arguments[start : start + _ARGUMENT_CHUNK_CHARS]
        for start in range(0, len(arguments), _ARGUMENT_CHUNK_CHARS)
    ]


def build_completion(
    reply: DemoReply, *, completion_id: str, model: str, created: int, prompt_tokens: int
) -> dict[str, Any]:
    """Build a non-streaming ``chat.completion`` object for ``reply``, usage included."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.text}
    if reply.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in reply.tool_calls
        ]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": reply.finish_reason}],
        "usage": _usage(prompt_tokens, reply),
    }


def build_chunks(
    reply: DemoReply,
    *,
    completion_id: str,
    model: str,
    created: int,
    prompt_tokens: int,
    include_usage: bool,
) -> list[dict[str, Any]]:
    """Build the ``chat.completion.chunk`` objects that stream ``reply``, in order.

    The first chunk carries the role; each tool call opens with a chunk holding its index, id
    and name, and its arguments follow in id-less chunks that carry only the index. The last
    choice chunk has the finish reason; a usage chunk with empty ``choices`` follows when
    ``include_usage`` is true.
    """

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    chunks = [chunk({"role": "assistant", "content": ""})]
    if reply.text is not None:
        chunks.extend(chunk({"content": piece}) for piece in split_text(reply.text))
    for index, call in enumerate(reply.tool_calls):
        opening = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [opening]}))
        chunks.extend(
            chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
            for piece in _split_arguments(call.arguments)
        )
    chunks.append(chunk({}, reply.finish_reason))
    if include_usage:
        chunks.append(
            {
                "id": completion_id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": [],
                "usage": _usage(prompt_tokens, reply),
            }
        )
    return chunks


async def _sse(chunks: Iterable[dict[str, Any]]) -> AsyncIterator[str]:
    for item in chunks:
        yield f"data: {json.dumps(item)}\n\n"
        # Hand control back so each chunk leaves as its own write, as a real provider's would.
        await asyncio.sleep(0)
    yield "data: [DONE]\n\n"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": None}},
        status_code=status,
    )


async def chat_completions(request: Request) -> Response:
    """``POST /v1/chat/completions``: answer per the demo script, streaming or not.

    Returns 400 with an OpenAI-shaped error body when the JSON body or ``messages`` is invalid.
    """
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object.")
    messages = body.get("messages")
    if not isinstance(messages, list) or not all(isinstance(item, dict) for item in messages):
        return _error(400, "'messages' must be a list of message objects.")
    model = str(body.get("model") or DEMO_MODEL_NAME)
    reply = plan_reply(messages)
    prompt_tokens = count_tokens(messages)
    created = int(time.time())
    completion_id = f"chatcmpl-demo-{time.monotonic_ns()}"
    if body.get("stream"):
        stream_options = body.get("stream_options") or {}
        chunks = build_chunks(
            reply,
            completion_id=completion_id,
            model=model,
            created=created,
            prompt_tokens=prompt_tokens,
            include_usage=bool(stream_options.get("include_usage")),
        )
        return StreamingResponse(_sse(chunks), media_type="text/event-stream")
    return JSONResponse(
        build_completion(
            reply,
            completion_id=completion_id,
            model=model,
            created=created,
            prompt_tokens=prompt_tokens,
        )
    )


async def list_models(request: Request) -> Response:
    """``GET /v1/models``: the one demo model, OpenAI list shape."""
    return JSONResponse(
        {
            "object": "list",
            "data": [
                {"id": DEMO_MODEL_NAME, "object": "model", "created": 0, "owned_by": "dexagents"}
            ],
        }
    )


def create_app() -> Starlette:
    """Return the demo model's ASGI application (routes under ``/v1``)."""
    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
        ]
    )


async def serve(host: str, port: int) -> None:
    """Serve the demo model on ``host:port`` until SIGINT or SIGTERM.

    Binds the socket first so ``port=0`` resolves to a real free port, then prints the ready
    line once uvicorn has started. Raises ``OSError`` when the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    config = uvicorn.Config(create_app(), log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if serving.done():
            await serving  # startup failed: surface its exception
            return
        await asyncio.sleep(0.01)
    shown_host = f"[{host}]" if family == socket.AF_INET6 else host
    print(f"{READY_LINE_PREFIX}http://{shown_host}:{bound_port}", flush=True)
    await serving


def main(argv: Sequence[str] | None = None) -> None:
    """Command-line entry point: ``--host`` (default 127.0.0.1), ``--port`` (default
    ``DEMO_MODEL_PORT`` or 8811)."""
    parser = argparse.ArgumentParser(description="Deterministic OpenAI-compatible demo model.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_MODEL_PORT", "8811")))
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.host, args.port))
    sys.exit(0)


if __name__ == "__main__":
    main()
