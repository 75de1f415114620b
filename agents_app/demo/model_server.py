"""The local demo model: a deterministic OpenAI-compatible server (Chat Completions and Responses).

Run it with ``python -m agents_app.demo.model_server --host 127.0.0.1 --port 8811``
(``--port 0`` picks a free port). Once it accepts connections it prints exactly one line,
``demo model ready on http://<host>:<port>``, and flushes stdout. The ``demo`` agent reaches it
through LiteLLM as ``openai/dexagents-demo`` with ``api_base=http://<host>:<port>/v1``
(ARCHITECTURE.md, "The demo model"). It needs no key and ignores any ``Authorization`` header.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses`` (both streaming and not, with
usage) and ``GET /v1/models``.

What each request gets is the demo script's (``agents_app.demo.script``, whose docstring lists
the directives: ``/tool``, ``/wait``, ``/ask``, ``/fail``, ``/slow``, ``/think``, ``/big``,
``/context``, and the title, summary and plan replies), in the OpenAI wire shapes of
``agents_app.demo.openai_wire``. This module is the HTTP side: the routes, the ``/fail`` count,
the context-length refusal and the command line.

This module must stay importable without Django settings. May import: ``agents_app.demo.script``
and ``agents_app.demo.openai_wire``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import socket
import sys
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agents_app.demo.openai_wire import (
    build_chunks,
    build_completion,
    build_response,
    build_response_events,
    count_tokens,
    responses_messages,
)
from agents_app.demo.script import FAIL_STATUSES, DemoReply, plan_reply

__all__ = ["DEMO_MODEL_NAME", "READY_LINE_PREFIX", "FailureLedger", "create_app", "main", "serve"]

DEMO_MODEL_NAME = "dexagents-demo"
"""The model ID the server lists; requests may name any model and get it echoed back."""

READY_LINE_PREFIX = "demo model ready on "


class FailureLedger:
    """Counts the failures answered per exact request, for ``/fail <n> [<status>]``."""

    def __init__(self) -> None:
        self._served: dict[str, int] = {}

    def should_fail(self, route: str, payload: Any, fail_count: int) -> bool:
        """Whether this request fails now; counts the answer when it does."""
        if fail_count <= 0:
            return False
        key = hashlib.sha256(
            json.dumps([route, payload], sort_keys=True, default=str).encode()
        ).hexdigest()
        served = self._served.get(key, 0)
        if served >= fail_count:
            return False
        self._served[key] = served + 1
        return True


async def _sse(
    chunks: Iterable[dict[str, Any]], *, pause: float, named: bool, done: bool
) -> AsyncIterator[str]:
    for number, item in enumerate(chunks):
        if pause and number:
            await asyncio.sleep(pause)
        prefix = f"event: {item['type']}\n" if named else ""
        yield f"{prefix}data: {json.dumps(item)}\n\n"
        # Hand control back so each chunk leaves as its own write, as a real provider's would.
        await asyncio.sleep(0)
    if done:
        yield "data: [DONE]\n\n"


def _error(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": None}}, status_code=status
    )


async def _json_body(request: Request) -> dict[str, Any] | JSONResponse:
    try:
        body = await request.json()
    except ValueError:
        return _error(400, "The request body is not valid JSON.")
    if not isinstance(body, dict):
        return _error(400, "The request body must be a JSON object.")
    return body


def _scripted_failure(status: int) -> JSONResponse:
    """The answer ``/fail`` scripted: an OpenAI-shaped error with ``status`` (429 with
    ``Retry-After: 1``)."""
    kind, message = FAIL_STATUSES[status]
    answer = _error(status, message, kind)
    if status == 429:
        answer.headers["Retry-After"] = "1"
    return answer


def _too_long(reply: DemoReply, prompt_tokens: int) -> JSONResponse | None:
    """OpenAI's context-length error when the input exceeds ``/context``, else ``None``."""
    limit = reply.context_limit
    if limit is None or prompt_tokens <= limit:
        return None
    message = (
        f"This model's maximum context length is {limit} tokens. However, your messages "
        f"resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
    )
    return JSONResponse(
        {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        status_code=400,
    )


def _max_tokens(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def create_app() -> Starlette:
    """Return the demo model's ASGI application (routes under ``/v1``)."""
    ledger = FailureLedger()

    async def chat_completions(request: Request) -> Response:
        """``POST /v1/chat/completions``: answer per the demo script, streaming or not.

        Returns 400 with an OpenAI-shaped error body when the JSON body or ``messages`` is
        invalid, and the scripted status when the script says ``/fail``.
        """
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(item, dict) for item in messages):
            return _error(400, "'messages' must be a list of message objects.")
        reply = plan_reply(messages, max_tokens=_max_tokens(body.get("max_tokens")))
        if ledger.should_fail("chat", messages, reply.fail_count):
            return _scripted_failure(reply.fail_status)
        model = str(body.get("model") or DEMO_MODEL_NAME)
        prompt_tokens = count_tokens(messages)
        if refusal := _too_long(reply, prompt_tokens):
            return refusal
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
            return StreamingResponse(
                _sse(chunks, pause=reply.slow_seconds, named=False, done=True),
                media_type="text/event-stream",
            )
        if reply.slow_seconds:
            await asyncio.sleep(reply.slow_seconds)
        return JSONResponse(
            build_completion(
                reply,
                completion_id=completion_id,
                model=model,
                created=created,
                prompt_tokens=prompt_tokens,
            )
        )

    async def responses(request: Request) -> Response:
        """``POST /v1/responses``: answer per the demo script, streaming or not.

        Returns 400 when the body or ``input`` is invalid, and the scripted status when the
        script says ``/fail``. ``store`` is ignored: nothing is stored.
        """
        body = await _json_body(request)
        if isinstance(body, JSONResponse):
            return body
        try:
            messages = responses_messages(body)
        except ValueError as error:
            return _error(400, str(error))
        reply = plan_reply(messages, max_tokens=_max_tokens(body.get("max_output_tokens")))
        if ledger.should_fail("responses", messages, reply.fail_count):
            return _scripted_failure(reply.fail_status)
        if refusal := _too_long(reply, count_tokens(messages)):
            return refusal
        arguments: dict[str, Any] = {
            "response_id": f"resp_demo_{time.monotonic_ns()}",
            "model": str(body.get("model") or DEMO_MODEL_NAME),
            "created": int(time.time()),
            "prompt_tokens": count_tokens(messages),
        }
        if body.get("stream"):
            events = build_response_events(reply, **arguments)
            return StreamingResponse(
                _sse(events, pause=reply.slow_seconds, named=True, done=False),
                media_type="text/event-stream",
            )
        if reply.slow_seconds:
            await asyncio.sleep(reply.slow_seconds)
        return JSONResponse(build_response(reply, **arguments))

    async def list_models(request: Request) -> Response:
        """``GET /v1/models``: the one demo model, OpenAI list shape."""
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {
                        "id": DEMO_MODEL_NAME,
                        "object": "model",
                        "created": 0,
                        "owned_by": "dexagents",
                    }
                ],
            }
        )

    return Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/responses", responses, methods=["POST"]),
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
