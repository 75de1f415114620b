"""The demo model's script: the directives it reads and the reply every request gets.

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

The HTTP server (``agents_app.demo.model_server``) answers with :func:`plan_reply`'s
:class:`DemoReply` in the OpenAI wire shapes (``agents_app.demo.openai_wire``). Everything here is
pure and deterministic; the only state the server keeps is the ``/fail`` count.

This module must stay importable without Django settings. May import: the worker's title and
plan prompts (``agents_app.worker.titles``, ``agents_app.worker.plan_prompts``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_app.worker.plan_prompts import plan_from_prompt
from agents_app.worker.titles import TITLE_REQUEST_PREFIX, title_from_message

__all__ = [
    "FAIL_STATUSES",
    "MEDIA_PART_TYPES",
    "SUMMARY_REQUEST_PREFIX",
    "DemoReply",
    "DemoToolCall",
    "big_text",
    "describe_media",
    "is_summary_request",
    "is_title_request",
    "is_tool_media_message",
    "media_parts",
    "message_text",
    "plan_reply",
    "summary_reply",
    "title_reply",
]

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
"""How the LiteLLM runner's summarizer instructions start (``runner.SUMMARY_INSTRUCTIONS``)."""
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


MEDIA_PART_TYPES = ("image_url", "input_image", "file", "input_file", "input_audio")
"""The ``type`` of the content parts that carry media rather than text."""


def media_parts(content: Any) -> list[Mapping[str, Any]]:
    """The non-text parts (images, files, audio) of a ``content`` list; ``[]`` for text."""
    if not isinstance(content, list):
        return []
    return [
        part
        for part in content
        if isinstance(part, Mapping) and part.get("type") in MEDIA_PART_TYPES
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
