"""One model reply, read from a LiteLLM stream or a whole response, in a provider-neutral shape.

The runner makes one LiteLLM call per ``RunModel`` Step (seed "run_model_step(turn)") and turns
what comes back into a :class:`ModelReply`. Streamed and whole answers of the same content give
equal replies (issue 6, "Golden streams"), so the history never depends on whether a call
streamed.

Two wire families arrive here:

* Chat Completions chunks and responses, as LiteLLM normalises every provider (OpenAI, Anthropic
  Messages, Gemini, Groq, OpenAI-compatible servers). Anthropic thinking blocks arrive as
  ``thinking_blocks`` (with their ``signature``) and are kept verbatim; Gemini thought
  signatures arrive as tool calls' ``provider_specific_fields`` and are kept too.
* OpenAI Responses events and responses (``litellm.aresponses``). Reasoning output items
  (``encrypted_content`` included) are kept for replay; summary deltas are live reasoning.

Text and reasoning deltas go to the session's AgentEvents through the buffers of
``agents_app.worker.reply_deltas`` (1 second or 16 KiB, flushed before the Step returns; seed
"Live events"), which also merges streamed tool calls and thinking blocks. What the provider is
sent is built in ``agents_app.worker.model_requests``.

May import: ``agents_app.worker.reply_deltas`` and ``dex_agents``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agents_app.worker.reply_deltas import (
    DeltaBuffer,
    ThinkingBlockAccumulator,
    ToolCallAccumulator,
    as_plain,
    clean_thinking_blocks,
    field_of,
    tool_call_delta,
)
from dex_agents import AgentUsage

__all__ = [
    "REASONING_ITEM_KEYS",
    "ModelReply",
    "ModelResponseError",
    "chat_response_reasoning",
    "openai_chunk_stream",
    "read_chat_response",
    "read_chat_stream",
    "read_responses_response",
    "read_responses_stream",
    "reasoning_item",
    "reply_from_output",
    "usage_from",
]

REASONING_ITEM_KEYS = ("id", "type", "summary", "content", "encrypted_content", "status")
"""The keys of a Responses reasoning item that are kept and replayed."""


class ModelResponseError(RuntimeError):
    """The model's response cannot continue the turn (empty, failed, or unreadable).

    Raised from ``run_model_step``, so it fails the ``RunModel`` attempt and the Step is retried.
    """



def usage_from(raw: Any) -> AgentUsage:
    """This call's ``AgentUsage`` (``requests=1``) from a usage object or dict.

    Reads Chat Completions names (``prompt_tokens``, ``completion_tokens``,
    ``prompt_tokens_details.cached_tokens``, ``completion_tokens_details.reasoning_tokens``) and
    Responses names (``input_tokens``, ``output_tokens``, ``input_tokens_details``,
    ``output_tokens_details``). Input tokens include cached ones, as every provider reports
    them through LiteLLM. ``None`` gives zero tokens.
    """
    data = as_plain(raw)
    if not isinstance(data, Mapping):
        return AgentUsage(requests=1)

    def number(*keys: str) -> int:
        for key in keys:
            value = data.get(key)
            if isinstance(value, int | float) and value:
                return int(value)
        return 0

    def detail(containers: Sequence[str], key: str) -> int:
        for container in containers:
            details = data.get(container)
            if isinstance(details, Mapping) and details.get(key):
                return int(details[key])
        return 0

    return AgentUsage(
        input_tokens=number("prompt_tokens", "input_tokens"),
        output_tokens=number("completion_tokens", "output_tokens"),
        reasoning_tokens=detail(
            ("completion_tokens_details", "output_tokens_details"), "reasoning_tokens"
        ),
        cached_input_tokens=detail(
            ("prompt_tokens_details", "input_tokens_details"), "cached_tokens"
        ),
        requests=1,
    )


@dataclass
class ModelReply:
    """What one model call produced, provider-neutral.

    Attributes:
        text: The visible answer text ("" when none).
        tool_calls: ``{"id", "name", "arguments", "provider_specific_fields"?}`` per call, in
            model order; ``id`` is the provider's (may be empty), ``arguments`` the raw text.
        thinking_blocks: Anthropic thinking blocks, verbatim (signatures included).
        reasoning_items: OpenAI Responses reasoning items (keys in ``REASONING_ITEM_KEYS``).
        usage: This call's usage.
    """

    text: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    thinking_blocks: list[dict[str, Any]] = field(default_factory=list)
    reasoning_items: list[dict[str, Any]] = field(default_factory=list)
    usage: AgentUsage = field(default_factory=lambda: AgentUsage(requests=1))


# --- Chat Completions -------------------------------------------------------------------------


def openai_chunk_stream(stream: Any) -> Any | None:
    """The provider's own stream inside a LiteLLM ``acompletion(stream=True)`` answer when that
    stream yields OpenAI Chat Completions chunks (the ``openai`` provider: OpenAI itself and
    every OpenAI-compatible server reached with an ``api_base``), else ``None``.

    Its chunks have the shape LiteLLM's wrapper gives (``choices[].delta.content``,
    ``.reasoning_content``, ``.tool_calls``, a last chunk with ``usage``), so
    :func:`read_chat_stream` reads them the same way. Reading them directly skips the
    wrapper's per-chunk conversion, which rebuilds each chunk as LiteLLM objects, and its
    end-of-stream work (the whole response rebuilt from the chunks, its cost worked out, the
    success logging no platform code reads): about three fifths of a streamed call's CPU in
    the worker. Other providers' streams (Anthropic, Gemini, ...) keep LiteLLM's wrapper,
    which translates them.
    """
    if getattr(stream, "custom_llm_provider", None) != "openai":
        return None
    inner = getattr(stream, "completion_stream", None)
    try:
        from openai import AsyncStream
    except ImportError:  # pragma: no cover - LiteLLM requires openai
        return None
    return inner if isinstance(inner, AsyncStream) else None


async def read_chat_stream(
    stream: Any,
    text: DeltaBuffer,
    reasoning: DeltaBuffer,
    usage_seen: list[Any] | None = None,
) -> ModelReply:
    """Read a LiteLLM ``acompletion(stream=True)`` stream into a :class:`ModelReply`.

    ``delta.content`` goes to ``text`` and ``delta.reasoning_content`` to ``reasoning`` as they
    arrive; tool calls merge through :class:`ToolCallAccumulator`, thinking blocks through
    :class:`ThinkingBlockAccumulator`; the last chunk with ``usage`` gives the usage, and each
    usage object is appended to ``usage_seen`` as it arrives (so a reader whose task is
    cancelled mid-stream can still tell what the provider reported). The buffers are not
    flushed here.
    """
    parts: list[str] = []
    calls = ToolCallAccumulator()
    thinking = ThinkingBlockAccumulator()
    raw_usage: Any = None
    async for chunk in stream:
        usage = field_of(chunk, "usage")
        if usage is not None:
            raw_usage = usage
            if usage_seen is not None:
                usage_seen.append(usage)
        for choice in field_of(chunk, "choices") or ():
            delta = field_of(choice, "delta")
            if delta is None:
                continue
            reasoning_piece = field_of(delta, "reasoning_content")
            if isinstance(reasoning_piece, str):
                reasoning.add(reasoning_piece)
            content = field_of(delta, "content")
            if isinstance(content, str) and content:
                parts.append(content)
                text.add(content)
            for block in field_of(delta, "thinking_blocks") or ():
                thinking.add(block)
            for raw_call in field_of(delta, "tool_calls") or ():
                calls.add(tool_call_delta(raw_call))
    return ModelReply(
        text="".join(parts),
        tool_calls=calls.calls,
        thinking_blocks=thinking.blocks,
        usage=usage_from(raw_usage),
    )


def read_chat_response(response: Any) -> ModelReply:
    """A whole ``acompletion`` response (first choice) as a :class:`ModelReply`."""
    choices = field_of(response, "choices") or ()
    message = field_of(choices[0], "message") if choices else None
    calls: list[dict[str, Any]] = []
    if message is not None:
        for raw_call in field_of(message, "tool_calls") or ():
            delta = tool_call_delta(raw_call)
            call: dict[str, Any] = {
                "id": delta["id"] or "",
                "name": delta["name"] or "",
                "arguments": delta["arguments"] or "",
            }
            if delta["provider_specific_fields"]:
                call["provider_specific_fields"] = delta["provider_specific_fields"]
            calls.append(call)
    content = field_of(message, "content") if message is not None else None
    return ModelReply(
        text=content if isinstance(content, str) else "",
        tool_calls=calls,
        thinking_blocks=clean_thinking_blocks(
            field_of(message, "thinking_blocks") if message is not None else None
        ),
        usage=usage_from(field_of(response, "usage")),
    )


def chat_response_reasoning(response: Any) -> str:
    """The readable reasoning of a whole ``acompletion`` response (first choice):
    ``reasoning_content`` (LiteLLM puts Anthropic thinking text there too), or ``""``.
    A stream gives the same text as ``reasoning_content`` deltas."""
    choices = field_of(response, "choices") or ()
    message = field_of(choices[0], "message") if choices else None
    text = field_of(message, "reasoning_content") if message is not None else None
    return text if isinstance(text, str) else ""


# --- OpenAI Responses -------------------------------------------------------------------------


def reasoning_item(raw: Any) -> dict[str, Any]:
    """A Responses reasoning output item, reduced to ``REASONING_ITEM_KEYS`` without ``None``.

    Raises:
        ModelResponseError: If it has no ``id`` or ``type``.
    """
    data = as_plain(raw)
    item = {key: data[key] for key in REASONING_ITEM_KEYS if data.get(key) is not None}
    if not item.get("id") or item.get("type") != "reasoning":
        raise ModelResponseError("the model returned a reasoning item without an id")
    item.setdefault("summary", [])
    return item


def reply_from_output(output: Sequence[Any], usage: Any) -> ModelReply:
    """A :class:`ModelReply` from Responses ``output`` items, in output order.

    ``message`` items give text (``output_text`` and ``refusal`` parts), ``function_call``
    items give tool calls (``call_id``, ``name``, ``arguments``), ``reasoning`` items are kept.
    Other item types are ignored.
    """
    reply = ModelReply(usage=usage_from(usage))
    parts: list[str] = []
    for raw in output:
        item = as_plain(raw)
        if not isinstance(item, Mapping):
            continue
        kind = item.get("type")
        if kind == "reasoning":
            reply.reasoning_items.append(reasoning_item(item))
        elif kind == "message":
            for part in item.get("content") or ():
                if not isinstance(part, Mapping):
                    continue
                if part.get("type") == "output_text":
                    parts.append(str(part.get("text") or ""))
                elif part.get("type") == "refusal":
                    parts.append(str(part.get("refusal") or ""))
        elif kind == "function_call":
            reply.tool_calls.append(
                {
                    "id": str(item.get("call_id") or ""),
                    "name": str(item.get("name") or ""),
                    "arguments": str(item.get("arguments") or ""),
                }
            )
    reply.text = "".join(parts)
    return reply


async def read_responses_stream(
    stream: Any, text: DeltaBuffer, reasoning: DeltaBuffer
) -> ModelReply:
    """Read a LiteLLM ``aresponses(stream=True)`` event stream into a :class:`ModelReply`.

    ``response.output_text.delta`` and ``response.refusal.delta`` go to ``text``,
    ``response.reasoning_summary_text.delta`` to ``reasoning``. The reply is built from the
    ``response.output_item.done`` items by ``output_index`` (or from ``response.completed``'s
    output when no item arrived), with usage from ``response.completed``.

    Raises:
        ModelResponseError: On ``response.failed`` or ``error``, or when the stream ends
            without ``response.completed`` or ``response.incomplete``.
    """
    done_items: dict[int, Any] = {}
    final: Any = None
    async for event in stream:
        raw_kind = field_of(event, "type")
        kind = str(getattr(raw_kind, "value", raw_kind) or "")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            text.add(str(field_of(event, "delta") or ""))
        elif kind == "response.reasoning_summary_text.delta":
            reasoning.add(str(field_of(event, "delta") or ""))
        elif kind == "response.output_item.done":
            index = field_of(event, "output_index")
            position = int(index) if index is not None else len(done_items)
            done_items[position] = field_of(event, "item")
        elif kind in ("response.completed", "response.incomplete"):
            final = field_of(event, "response")
        elif kind in ("response.failed", "error"):
            detail = (
                field_of(field_of(event, "response"), "error")
                or field_of(event, "message")
                or kind
            )
            raise ModelResponseError(f"the model call failed: {as_plain(detail)}")
    if final is None:
        raise ModelResponseError("the model's stream ended before the response completed")
    output = [done_items[index] for index in sorted(done_items)] or list(
        field_of(final, "output") or ()
    )
    return reply_from_output(output, field_of(final, "usage"))


def read_responses_response(response: Any) -> ModelReply:
    """A whole ``aresponses`` response as a :class:`ModelReply`."""
    return reply_from_output(list(field_of(response, "output") or ()), field_of(response, "usage"))
