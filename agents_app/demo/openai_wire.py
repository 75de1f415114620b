"""The OpenAI wire shapes of the demo model's replies, and the Responses input it reads.

A :class:`~agents_app.demo.script.DemoReply` becomes a whole ``chat.completion`` object
(:func:`build_completion`) or its ``chat.completion.chunk`` stream (:func:`build_chunks`), a
whole Responses ``response`` (:func:`build_response`) or its streaming events
(:func:`build_response_events`). A Responses request's ``instructions`` and ``input`` become
Chat Completions messages (:func:`responses_messages`), so one script serves both APIs.

Chat Completions streaming follows the OpenAI wire shape: ``data: <chunk JSON>`` server-sent
events, text split over several chunks, tool-call arguments split over id-less continuation
chunks, then a usage chunk (empty ``choices``) when ``stream_options.include_usage`` is true,
then ``data: [DONE]``. Responses streaming sends typed ``event:`` / ``data:`` pairs ending with
``response.completed`` (which carries usage). Token counts are whitespace-separated words,
which is deterministic and good enough for a demo.

This module must stay importable without Django settings. May import:
``agents_app.demo.script``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agents_app.demo.script import MEDIA_PART_TYPES, DemoReply, media_parts, message_text

__all__ = [
    "build_chunks",
    "build_completion",
    "build_response",
    "build_response_events",
    "build_response_output",
    "count_tokens",
    "encrypted_reasoning",
    "responses_messages",
    "split_text",
]

_TEXT_CHUNK_WORDS = 3
_ARGUMENT_CHUNK_CHARS = 8


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
        elif part.get("type") in MEDIA_PART_TYPES:
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
