"""The local demo model: a deterministic OpenAI-compatible server (Chat Completions and Responses).

Run it with ``python -m agents_app.demo.model_server --host 127.0.0.1 --port 8811``
(``--port 0`` picks a free port). Once it accepts connections it prints exactly one line,
``demo model ready on http://<host>:<port>``, and flushes stdout. The ``demo`` agent reaches it
through LiteLLM as ``openai/dexagents-demo`` with ``api_base=http://<host>:<port>/v1``
(ARCHITECTURE.md, "The demo model"). It needs no key and ignores any ``Authorization`` header.

Routes: ``POST /v1/chat/completions``, ``POST /v1/responses`` (both streaming and not, with
usage) and ``GET /v1/models``.

The script is applied to the conversation a request carries (issue 6, "The demo model server"):

* When the request ends with tool results (``role="tool"`` messages, or Responses
  ``function_call_output`` items), the answer is a final text that quotes each result's text,
  in order, then one line per image the results carried: ``[received image image/png, 4033
  bytes, sha256 <first 12 hex digits>]``. Images count wherever OpenAI-compatible clients put
  them: as ``image_url`` parts of a tool message, as ``input_image`` items of a
  ``function_call_output``, or in the user message LiteLLM inserts after the tool messages
  (OpenAI allows only text in tool messages); such a user message is part of the results,
  not the latest user message.
* Otherwise the latest user message is read line by line. Directive lines:

  - ``/tool <name> <json-arguments>``: one tool call per line, all in one response, in line
    order (parallel tool calls). The arguments are passed on verbatim (``{}`` when omitted),
    so a test can also script invalid JSON. Call IDs are ``call_<n>``, numbered after the tool
    calls already in the conversation, so they never repeat within one conversation.
  - ``/wait <seconds> <reason>``: a call of the built-in ``durable_wait`` tool (the session
    waits on a durable Timer; a steered message ends it early).
  - ``/ask <prompt> | <choice> | <choice>``: a call of the built-in ``request_user_input``
    tool; without ``|`` the question takes a free-text answer.
  - ``/fail <n> [<status>]``: the first ``n`` times the server receives this exact request
    (same route, same input), it answers HTTP ``status`` (500 when omitted; one of
    ``FAIL_STATUSES``: 400, 401, 403 and 404 as a provider refusing the request, 429 with
    ``Retry-After: 1``, 500, 502, 503); a retry of the same request then succeeds. The count
    is the only state the server keeps.
  - ``/slow <seconds>``: wait ``seconds`` between streamed chunks (or once before a whole
    answer), so a test can kill a worker mid-stream.
  - ``/think``: also emit a reasoning summary (``Thinking about: <text>``): Responses
    ``response.reasoning_summary_text.delta`` events and a reasoning item with
    ``encrypted_content``; Chat Completions ``reasoning_content`` deltas.
  - ``/big <n>``: the answer is ``n`` KB of filler text (``n`` up to 1024, fractions allowed),
    to fill a small context window (the ``demo-small`` agent shows compaction with it).
  - ``/context <tokens>``: the server refuses the request (HTTP 400, OpenAI's
    ``context_length_exceeded``) when its input has more than ``tokens`` tokens, as a provider
    does past its context window.

* A request whose system message starts with ``TITLE_REQUEST_PREFIX`` (a session title,
  ``agents_app.worker.titles``) is answered with the first six words of the quoted user message's
  first line that is not a directive, capitalized, quoted and ending with a period.
* A request whose system message starts with ``SUMMARY_REQUEST_PREFIX`` (the LiteLLM runner's
  summarizer, context compaction) is answered with a deterministic summary: the previous
  summary's lines, then one line per ``[<role> #<sequence>]`` block of the transcript with the
  start of its first line that is not a directive, cut to ``max_tokens`` words. ``/slow``
  lines in the transcript apply.

  Without ``/tool`` lines the answer is ``You said: <the other lines>``. Directives apply to
  every request whose latest user message carries them, including the answer after tool results.

* Plans (the runner's plan system messages, ``agents_app.worker.plan_prompts``): in plan mode the
  reply is one ``write_todos`` call with one pending task per non-blank line of the user's
  message (lines are kept whole, ``/tool`` directives included), then, after its result,
  ``Plan ready for review: ...``. While a plan executes, each reply completes the next unfinished
  task with one ``write_todos`` call, plus a call of the tool named by a ``/tool <name> <json>``
  inside that task's text; with every task completed it answers ``Plan complete: ...``. A task
  whose text holds ``/stop`` is first only marked ``in_progress``, then the reply stops the turn
  with ``Stopped at: <task>`` (the plan stays active); the next execution (Continue) completes
  it and goes on.

Chat Completions streaming follows the OpenAI wire shape: ``data: <chunk JSON>`` server-sent
events, text split over several chunks, tool-call arguments split over id-less continuation
chunks, then a usage chunk (empty ``choices``) when ``stream_options.include_usage`` is true,
then ``data: [DONE]``. Responses streaming sends typed ``event:`` / ``data:`` pairs ending with
``response.completed`` (which carries usage). Token counts are whitespace-separated words,
which is deterministic and good enough for a demo.

This module must stay importable without Django settings.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
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

from agents_app.worker.plan_prompts import plan_from_prompt
from agents_app.worker.titles import TITLE_REQUEST_PREFIX, title_from_message

DEMO_MODEL_NAME = "dexagents-demo"
"""The model ID the server lists; requests may name any model and get it echoed back."""

READY_LINE_PREFIX = "demo model ready on "

_TOOL_LINE = re.compile(r"^\s*/tool\s+(?P<name>\S+)(?:\s+(?P<arguments>.*\S))?\s*$")
_WAIT_LINE = re.compile(r"^\s*/wait\s+(?P<seconds>-?\d+)(?:\s+(?P<reason>.*\S))?\s*$")
_ASK_LINE = re.compile(r"^\s*/ask\s+(?P<question>.*\S)\s*$")
_TASK_TOOL = re.compile(r"/tool\s+(?P<name>\S+)(?:\s+(?P<arguments>.*\S))?\s*$")
_TASK_STOP = re.compile(r"(?:^|\s)/stop(?:\s|$)")
_FAIL_LINE = re.compile(r"^\s*/fail\s+(?P<count>\d+)(?:\s+(?P<status>\d{3}))?\s*$")
#: The statuses ``/fail`` can answer, with the OpenAI error ``type`` and message of each.
FAIL_STATUSES: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Invalid request: the demo model was scripted to refuse it."),
    401: ("invalid_request_error", "Incorrect API key provided (scripted by /fail)."),
    403: ("invalid_request_error", "This key may not use this model (scripted by /fail)."),
    404: ("invalid_request_error", "The model does not exist (scripted by /fail)."),
    429: ("rate_limit_error", "Rate limit reached (scripted by /fail); retry after 1 s."),
    500: ("server_error", "The demo model was scripted to fail this request (/fail)."),
    502: ("server_error", "Bad gateway (scripted by /fail)."),
    503: ("server_error", "The demo model is overloaded (scripted by /fail)."),
}
_SLOW_LINE = re.compile(r"^\s*/slow\s+(?P<seconds>\d+(?:\.\d+)?)\s*$")
_THINK_LINE = re.compile(r"^\s*/think\s*$")
_BIG_LINE = re.compile(r"^\s*/big\s+(?P<kb>\d+(?:\.\d+)?)\s*$")
_CONTEXT_LINE = re.compile(r"^\s*/context\s+(?P<tokens>\d+)\s*$")
_TRANSCRIPT_HEADER = re.compile(r"^\[(?P<role>\w+) #(?P<sequence>\d+)\]$")
_MAX_BIG_KB = 1024.0
_FILLER = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
_SUMMARY_LINE_CHARS = 60
SUMMARY_REQUEST_PREFIX = "Summarize the conversation for context compaction."
"""How the LiteLLM runner's summarizer instructions start
(``agents_app.worker.model_input.SUMMARY_INSTRUCTIONS``)."""
_TEXT_CHUNK_WORDS = 3
_ARGUMENT_CHUNK_CHARS = 8
_MAX_SLOW_SECONDS = 60.0


@dataclass(frozen=True)
class DemoToolCall:
    """One scripted tool call: ``id`` like ``call_3``, the tool ``name``, raw ``arguments``."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class DemoReply:
    """The scripted answer to one request.

    Attributes:
        text: The answer text, or ``None`` when the reply asks for tools.
        tool_calls: The scripted calls (non-empty when ``text`` is ``None``).
        reasoning: The reasoning summary (``/think``), or ``None``.
        fail_count: How many times this exact request answers ``fail_status`` first
            (``/fail``).
        fail_status: The HTTP status of those answers (500 unless ``/fail`` names one).
        slow_seconds: Pause between streamed chunks (``/slow``), 0 for none.
        context_limit: Refuse an input of more tokens than this (``/context``), or ``None``.
    """

    text: str | None = None
    tool_calls: list[DemoToolCall] = field(default_factory=list)
    reasoning: str | None = None
    fail_count: int = 0
    fail_status: int = 500
    slow_seconds: float = 0.0
    context_limit: int | None = None

    @property
    def finish_reason(self) -> str:
        """``"tool_calls"`` when the reply asks for tools, else ``"stop"``."""
        return "tool_calls" if self.tool_calls else "stop"


def message_text(content: Any) -> str:
    """Return the text of a Chat Completions or Responses ``content`` value.

    Accepts a string, ``None``, or a list of content parts (``text``, ``input_text`` or
    ``output_text``); other parts are skipped and text parts are joined with newlines.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping)
            and part.get("type") in ("text", "input_text", "output_text")
        )
    return str(content)


_MEDIA_PART_TYPES = ("image_url", "input_image", "file", "input_file", "input_audio")


def media_parts(content: Any) -> list[Mapping[str, Any]]:
    """The non-text parts (images, files, audio) of a ``content`` list; ``[]`` for text."""
    if not isinstance(content, list):
        return []
    return [
        part
        for part in content
        if isinstance(part, Mapping) and part.get("type") in _MEDIA_PART_TYPES
    ]


def is_tool_media_message(messages: Sequence[Mapping[str, Any]], index: int) -> bool:
    """Whether ``messages[index]`` is the user message a client inserted after tool messages
    to carry their images (LiteLLM does so for OpenAI-compatible providers)."""
    message = messages[index]
    return (
        index > 0
        and message.get("role") == "user"
        and messages[index - 1].get("role") == "tool"
        and bool(media_parts(message.get("content")))
    )


def describe_media(part: Mapping[str, Any]) -> str:
    """One received media part as ``[received image image/png, 4033 bytes, sha256 <12 hex>]``
    (a data URL is decoded; any other URL is named as it is)."""
    kind = str(part.get("type"))
    if kind in ("image_url", "input_image"):
        image = part.get("image_url")
        url = image.get("url") if isinstance(image, Mapping) else image
        url = str(url or "")
        match = re.match(r"data:(?P<mime>[^;,]+)(?:;[^,]*)?;base64,(?P<data>.*)$", url, re.S)
        if match is None:
            return f"[received image {url[:80]}]"
        try:
            raw = base64.b64decode(match.group("data"), validate=True)
        except ValueError:
            return f"[received image {match.group('mime')}, invalid base64]"
        digest = hashlib.sha256(raw).hexdigest()[:12]
        return f"[received image {match.group('mime')}, {len(raw)} bytes, sha256 {digest}]"
    return f"[received {kind} part]"


def big_text(kilobytes: float) -> str:
    """``kilobytes`` KB (1,024 characters each) of filler words, for ``/big``."""
    size = int(min(kilobytes, _MAX_BIG_KB) * 1024)
    return (_FILLER * (size // len(_FILLER) + 1))[:size]


def is_summary_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``messages`` come from the runner's summarizer (context compaction)."""
    return bool(messages) and message_text(messages[0].get("content")).startswith(
        SUMMARY_REQUEST_PREFIX
    ) and messages[0].get("role") == "system"


def is_title_request(messages: Sequence[Mapping[str, Any]]) -> bool:
    """Whether ``messages`` ask for a session title (``agents_app.worker.titles``)."""
    return bool(messages) and messages[0].get("role") == "system" and message_text(
        messages[0].get("content")
    ).startswith(TITLE_REQUEST_PREFIX)


def title_reply(messages: Sequence[Mapping[str, Any]]) -> DemoReply:
    """A title as a model might write it: the first six words of the quoted user message's
    first line that is not a directive, capitalized, in quotes and with a final period (which
    ``agents_app.worker.titles.clean_title`` removes)."""
    quoted = message_text(messages[-1].get("content")) if len(messages) > 1 else ""
    user_text = quoted.removeprefix("User: ").split("\n\nAssistant: ", 1)[0]
    words = title_from_message(user_text).split()[:6] or ["Conversation"]
    title = " ".join(words)
    return DemoReply(text=f'"{title[:1].upper()}{title[1:]}."')


def summary_reply(messages: Sequence[Mapping[str, Any]], max_tokens: int | None) -> DemoReply:
    """The deterministic summary of a summarizer request (see the module docstring)."""
    text = message_text(messages[-1].get("content")) if len(messages) > 1 else ""
    previous, _, transcript = text.partition("\nNew messages:\n")
    previous = previous.removeprefix("Previous summary:\n").strip()
    lines = [] if previous in ("", "(none)") else previous.splitlines()
    slow_seconds = 0.0
    blocks: list[tuple[str, list[str]]] = []
    for line in transcript.splitlines():
        if match := _SLOW_LINE.match(line):
            slow_seconds = min(float(match.group("seconds")), _MAX_SLOW_SECONDS)
        if match := _TRANSCRIPT_HEADER.match(line):
            blocks.append((f"{match.group('role')} #{match.group('sequence')}", []))
        elif blocks and line.strip():
            blocks[-1][1].append(line.strip())
    for name, texts in blocks:
        # The first line that is not a directive, else the first line.
        said = next((text for text in texts if not text.startswith("/")), texts[0] if texts else "")
        lines.append(f"{name}: {said[:_SUMMARY_LINE_CHARS]}")
    summary = "\n".join(lines) or "Nothing to summarize."
    if max_tokens is not None and max_tokens > 0:
        summary = " ".join(summary.split(" ")[:max_tokens])
    return DemoReply(text=summary, slow_seconds=slow_seconds)


def plan_reply(
    messages: Sequence[Mapping[str, Any]], *, max_tokens: int | None = None
) -> DemoReply:
    """Apply the demo script (see the module docstring) to a request's ``messages``.

    ``messages`` are Chat Completions message dicts, oldest first; ``max_tokens`` bounds a
    summary. Pure and deterministic.
    """
    if is_summary_request(messages):
        return summary_reply(messages, max_tokens)
    if is_title_request(messages):
        return title_reply(messages)
    user_text = next(
        (
            message_text(messages[index].get("content"))
            for index in reversed(range(len(messages)))
            if messages[index].get("role") == "user"
            and not is_tool_media_message(messages, index)
        ),
        "",
    )
    earlier_calls = sum(
        len(message.get("tool_calls") or [])
        for message in messages
        if message.get("role") == "assistant"
    )
    tool_calls: list[DemoToolCall] = []
    plain_lines: list[str] = []
    fail_count = 0
    fail_status = 500
    slow_seconds = 0.0
    think = False
    big_kb: float | None = None
    context_limit: int | None = None
    def add_call(name: str, arguments: str) -> None:
        tool_calls.append(
            DemoToolCall(
                id=f"call_{earlier_calls + len(tool_calls) + 1}", name=name, arguments=arguments
            )
        )

    for line in user_text.splitlines():
        if match := _TOOL_LINE.match(line):
            add_call(match.group("name"), match.group("arguments") or "{}")
        elif match := _WAIT_LINE.match(line):
            wait = {
                "duration_seconds": int(match.group("seconds")),
                "reason": match.group("reason") or "Requested wait",
            }
            add_call("durable_wait", json.dumps(wait))
        elif match := _ASK_LINE.match(line):
            prompt, *choices = [part.strip() for part in match.group("question").split("|")]
            question: dict[str, Any] = {"prompt": prompt}
            if choices:
                question["choices"] = choices
            add_call("request_user_input", json.dumps(question))
        elif (match := _FAIL_LINE.match(line)) and int(
            match.group("status") or 500
        ) in FAIL_STATUSES:
            fail_count = int(match.group("count"))
            fail_status = int(match.group("status") or 500)
        elif match := _SLOW_LINE.match(line):
            slow_seconds = min(float(match.group("seconds")), _MAX_SLOW_SECONDS)
        elif _THINK_LINE.match(line):
            think = True
        elif match := _BIG_LINE.match(line):
            big_kb = float(match.group("kb"))
        elif match := _CONTEXT_LINE.match(line):
            context_limit = int(match.group("tokens"))
        else:
            plain_lines.append(line)
    plain_text = "\n".join(plain_lines).strip()
    reasoning = f"Thinking about: {plain_text or 'the request'}" if think else None
    common: dict[str, Any] = {
        "reasoning": reasoning,
        "fail_count": fail_count,
        "fail_status": fail_status,
        "slow_seconds": slow_seconds,
        "context_limit": context_limit,
    }

    trailing_results: list[str] = []
    received: list[str] = []
    for index in reversed(range(len(messages))):
        message = messages[index]
        if message.get("role") != "tool" and not is_tool_media_message(messages, index):
            break
        parts = [describe_media(part) for part in media_parts(message.get("content"))]
        received[:0] = parts
        if message.get("role") == "tool":
            trailing_results.append(message_text(message.get("content")))
    mode, plan = plan_from_prompt(messages)
    if mode == "planning":
        return _planning_reply(user_text, bool(trailing_results), earlier_calls, common)
    if mode == "executing" and plan is not None:
        return _executing_reply(plan, bool(trailing_results), earlier_calls, common)
    if trailing_results:
        trailing_results.reverse()
        quoted = "\n".join(f"- {result}" for result in [*trailing_results, *received])
        return DemoReply(text=f"Here is what the tools returned:\n{quoted}", **common)
    if tool_calls:
        return DemoReply(tool_calls=tool_calls, **common)
    if big_kb is not None:
        return DemoReply(text=big_text(big_kb), **common)
    return DemoReply(text=f"You said: {plain_text}", **common)


def _planning_reply(
    user_text: str, answered: bool, earlier_calls: int, common: dict[str, Any]
) -> DemoReply:
    tasks = [line.strip() for line in user_text.splitlines() if line.strip()]
    if answered:
        return DemoReply(
            text=f"Plan ready for review: {len(tasks)} task(s). Execute it when you are ready.",
            **common,
        )
    todos = [{"content": task, "status": "pending"} for task in tasks]
    call = DemoToolCall(
        id=f"call_{earlier_calls + 1}", name="write_todos", arguments=json.dumps({"todos": todos})
    )
    return DemoReply(tool_calls=[call], **common)


def _executing_reply(
    plan: Mapping[str, Any], answered: bool, earlier_calls: int, common: dict[str, Any]
) -> DemoReply:
    tasks = list(plan.get("tasks") or [])
    unfinished = [task for task in tasks if task.get("status") != "completed"]
    if not unfinished:
        return DemoReply(text=f"Plan complete: all {len(tasks)} task(s) are done.", **common)
    current = unfinished[0]
    status = "completed"
    if _TASK_STOP.search(str(current["content"])):
        if current.get("status") == "pending":
            status = "in_progress"
        elif answered:
            # This turn just marked it in_progress: stop here, leaving the plan unfinished.
            return DemoReply(text=f"Stopped at: {current['content']}", **common)
    todos = [
        {
            "content": task["content"],
            "status": status if task is current else task["status"],
        }
        for task in tasks
    ]
    calls = [
        DemoToolCall(
            id=f"call_{earlier_calls + 1}",
            name="write_todos",
            arguments=json.dumps({"todos": todos}),
        )
    ]
    if status == "completed" and (match := _TASK_TOOL.search(str(current["content"]))):
        calls.append(
            DemoToolCall(
                id=f"call_{earlier_calls + 2}",
                name=match.group("name"),
                arguments=match.group("arguments") or "{}",
            )
        )
    return DemoReply(tool_calls=calls, **common)


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


def _reasoning_tokens(reply: DemoReply) -> int:
    return len(reply.reasoning.split()) if reply.reasoning else 0


def _completion_tokens(reply: DemoReply) -> int:
    if reply.text is not None:
        visible = len(reply.text.split())
    else:
        visible = sum(
            len(call.name.split()) + len(call.arguments.split()) for call in reply.tool_calls
        )
    return visible + _reasoning_tokens(reply)


def _usage(prompt_tokens: int, reply: DemoReply) -> dict[str, Any]:
    completion_tokens = _completion_tokens(reply)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": _reasoning_tokens(reply)},
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
    if reply.reasoning is not None:
        message["reasoning_content"] = reply.reasoning
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

    The first chunk carries the role; a reasoning summary follows as ``reasoning_content``
    deltas; each tool call opens with a chunk holding its index, id and name, and its arguments
    follow in id-less chunks that carry only the index. The last choice chunk has the finish
    reason; a usage chunk with empty ``choices`` follows when ``include_usage`` is true.
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
    if reply.reasoning is not None:
        chunks.extend(chunk({"reasoning_content": piece}) for piece in split_text(reply.reasoning))
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


# --- Responses API ----------------------------------------------------------------------------


def responses_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Convert a Responses request's ``instructions`` and ``input`` to Chat Completions
    messages, so one script serves both APIs.

    ``message`` items (or items with a ``role``) keep their role and text (content parts when
    they hold images); ``function_call`` items join the preceding assistant message's
    ``tool_calls``; ``function_call_output`` items become ``role="tool"`` messages (a list
    output becomes content parts, ``input_image`` as ``image_url``); ``reasoning`` items are
    skipped.

    Raises:
        ValueError: If ``input`` is neither a string nor a list of objects.
    """
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    raw = body.get("input")
    if isinstance(raw, str):
        messages.append({"role": "user", "content": raw})
        return messages
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ValueError("'input' must be a string or a list of input items")
    for item in raw:
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = str(item.get("role") or "user")
            messages.append({"role": role, "content": _chat_content(item.get("content"))})
        elif kind == "function_call":
            if not messages or messages[-1].get("role") != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(
                {
                    "id": item.get("call_id"),
                    "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")},
                }
            )
        elif kind == "function_call_output":
            output = item.get("output")
            content: Any = output if isinstance(output, str) else json.dumps(output)
            if isinstance(output, list):
                content = _chat_content(output)
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": content}
            )
    return messages


def _chat_content(content: Any) -> Any:
    """Responses content as Chat Completions content: its text, or text and ``image_url``
    parts when it holds images."""
    if not media_parts(content):
        return message_text(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") in ("text", "input_text", "output_text"):
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif part.get("type") == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
        elif part.get("type") in _MEDIA_PART_TYPES:
            parts.append(dict(part))
    return parts


def _responses_usage(prompt_tokens: int, reply: DemoReply) -> dict[str, Any]:
    output_tokens = _completion_tokens(reply)
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": _reasoning_tokens(reply)},
        "total_tokens": prompt_tokens + output_tokens,
    }


def encrypted_reasoning(summary: str) -> str:
    """The demo's stand-in for encrypted reasoning: base64 of ``demo-reasoning:<summary>``."""
    return base64.b64encode(f"demo-reasoning:{summary}".encode()).decode("ascii")


def build_response_output(reply: DemoReply, response_id: str) -> list[dict[str, Any]]:
    """The Responses ``output`` items for ``reply``: reasoning, then a message or calls."""
    output: list[dict[str, Any]] = []
    if reply.reasoning is not None:
        output.append(
            {
                "id": f"rs_{response_id}",
                "type": "reasoning",
                "summary": [{"type": "summary_text", "text": reply.reasoning}],
                "encrypted_content": encrypted_reasoning(reply.reasoning),
            }
        )
    if reply.text is not None:
        output.append(
            {
                "id": f"msg_{response_id}",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": reply.text, "annotations": []}],
            }
        )
    output.extend(
        {
            "id": f"fc_{response_id}_{index}",
            "type": "function_call",
            "call_id": call.id,
            "name": call.name,
            "arguments": call.arguments,
            "status": "completed",
        }
        for index, call in enumerate(reply.tool_calls)
    )
    return output


def build_response(
    reply: DemoReply, *, response_id: str, model: str, created: int, prompt_tokens: int
) -> dict[str, Any]:
    """Build a whole ``response`` object (status ``completed``, usage included)."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": build_response_output(reply, response_id),
        "parallel_tool_calls": True,
        "tool_choice": "auto",
        "tools": [],
        "store": False,
        "usage": _responses_usage(prompt_tokens, reply),
    }


def build_response_events(
    reply: DemoReply, *, response_id: str, model: str, created: int, prompt_tokens: int
) -> list[dict[str, Any]]:
    """Build the Responses streaming events for ``reply``, in order, each with its ``type``
    and ``sequence_number``: ``response.created``; per output item ``output_item.added``, its
    deltas (reasoning summary text, output text, function call arguments) and
    ``output_item.done``; then ``response.completed`` with the whole response."""
    final = build_response(
        reply, response_id=response_id, model=model, created=created, prompt_tokens=prompt_tokens
    )
    events: list[dict[str, Any]] = []

    def emit(kind: str, **data: Any) -> None:
        events.append({"type": kind, "sequence_number": len(events) + 1, **data})

    emit("response.created", response={**final, "status": "in_progress", "output": []})
    for output_index, item in enumerate(final["output"]):
        item_id = item["id"]
        if item["type"] == "reasoning":
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "summary": []},
            )
            text = item["summary"][0]["text"]
            part: dict[str, Any] = {"type": "summary_text", "text": ""}
            location = {"item_id": item_id, "output_index": output_index, "summary_index": 0}
            emit("response.reasoning_summary_part.added", **location, part=part)
            for piece in split_text(text):
                emit("response.reasoning_summary_text.delta", **location, delta=piece)
            emit("response.reasoning_summary_text.done", **location, text=text)
            emit("response.reasoning_summary_part.done", **location, part={**part, "text": text})
        elif item["type"] == "message":
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "status": "in_progress", "content": []},
            )
            text = item["content"][0]["text"]
            location = {"item_id": item_id, "output_index": output_index, "content_index": 0}
            part = {"type": "output_text", "text": "", "annotations": []}
            emit("response.content_part.added", **location, part=part)
            for piece in split_text(text):
                emit("response.output_text.delta", **location, delta=piece, logprobs=[])
            emit("response.output_text.done", **location, text=text, logprobs=[])
            emit("response.content_part.done", **location, part={**part, "text": text})
        else:
            emit(
                "response.output_item.added",
                output_index=output_index,
                item={**item, "arguments": "", "status": "in_progress"},
            )
            location = {"item_id": item_id, "output_index": output_index}
            for piece in _split_arguments(item["arguments"]):
                emit("response.function_call_arguments.delta", **location, delta=piece)
            emit("response.function_call_arguments.done", **location, arguments=item["arguments"])
        emit("response.output_item.done", output_index=output_index, item=item)
    emit("response.completed", response=final)
    return events


# --- HTTP -------------------------------------------------------------------------------------


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
