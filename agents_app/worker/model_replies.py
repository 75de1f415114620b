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

Text and reasoning deltas go to the session's AgentEvents through :class:`DeltaBuffer`
(1 second or 16 KiB, flushed before the Step returns; seed "Live events").
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dex_agents import AgentUsage

DELTA_FLUSH_SECONDS = 1.0
DELTA_FLUSH_BYTES = 16 * 1024
REASONING_ITEM_KEYS = ("id", "type", "summary", "content", "encrypted_content", "status")
"""The keys of a Responses reasoning item that are kept and replayed."""


class ModelResponseError(RuntimeError):
    """The model's response cannot continue the turn (empty, failed, or unreadable).

    Raised from ``run_model_step``, so it fails the ``RunModel`` attempt and the Step is retried.
    """


def as_plain(value: Any) -> Any:
    """A LiteLLM/OpenAI object (pydantic model or plain value) as plain JSON data."""
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, Mapping):
        return {str(key): as_plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_plain(item) for item in value]
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        return as_plain(dump(exclude_none=False))
    return value


def _get(value: Any, key: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(key)
    return getattr(value, key, None)


class DeltaBuffer:
    """Combines small text pieces into fewer AgentEvents (seed "Live events", "Limits").

    Buffered text is written once it reaches ``max_bytes`` UTF-8 bytes, or ``max_seconds`` after
    its first piece arrived (a timer on the running loop, so a stalled stream still shows what
    it has), or when :meth:`flush` is called; the runner flushes before the Step returns or
    raises. Use it from the event loop's thread.

    Args:
        write: Called with each combined piece, e.g. ``turn.events.write_text_delta``.
        max_seconds: Age of the oldest buffered piece that triggers a write; default 1 s.
        max_bytes: Buffered size that triggers a write; default 16 KiB.
    """

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        max_seconds: float = DELTA_FLUSH_SECONDS,
        max_bytes: int = DELTA_FLUSH_BYTES,
    ) -> None:
        self._write = write
        self._max_seconds = max_seconds
        self._max_bytes = max_bytes
        self._pieces: list[str] = []
        self._size = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self, text: str) -> None:
        """Buffer ``text`` (ignored when empty) and write the buffer when it is due."""
        if not text:
            return
        if not self._pieces:
            self._timer = asyncio.get_running_loop().call_later(self._max_seconds, self.flush)
        self._pieces.append(text)
        self._size += len(text.encode("utf-8"))
        if self._size >= self._max_bytes:
            self.flush()

    def flush(self) -> None:
        """Write whatever is buffered as one piece (nothing when empty) and stop the timer."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._pieces:
            text = "".join(self._pieces)
            self._pieces.clear()
            self._size = 0
            self._write(text)


#: How much of a model call's reasoning its assistant message keeps (characters); the live
#: Thinking panel shows all of it while the call runs.
REASONING_KEPT_CHARS = 16_000


class ReasoningDeltaBuffer(DeltaBuffer):
    """A :class:`DeltaBuffer` for reasoning deltas that also keeps what it was given, so the
    call's reasoning summary can be stored with its assistant message (issue 27, "Reasoning
    kept").

    Only the readable text that went to the live Thinking panel is kept (Chat Completions
    ``reasoning_content``, Anthropic thinking text, Responses summary text), never a
    provider's encrypted reasoning items.

    Args:
        write: As for :class:`DeltaBuffer`.
        started: ``clock()`` when the model call began.
        clock: Seconds, monotonic; ``time.monotonic`` by default.
    """

    def __init__(
        self,
        write: Callable[[str], None],
        *,
        started: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(write)
        self._started = started
        self._clock = clock
        self._kept: list[str] = []
        self._kept_chars = 0
        self._total_chars = 0
        self._last: float | None = None

    def add(self, text: str) -> None:
        if text:
            self._last = self._clock()
            self._total_chars += len(text)
            room = REASONING_KEPT_CHARS - self._kept_chars
            if room > 0:
                self._kept.append(text[:room])
                self._kept_chars += min(len(text), room)
        super().add(text)

    def summary(self) -> dict[str, Any] | None:
        """``{"text", "seconds", "cut"?}`` or ``None`` when the call gave no reasoning text.

        ``seconds`` (one decimal) runs from the call's start to its last reasoning delta;
        ``cut`` (``true``, else absent) says the text is the first ``REASONING_KEPT_CHARS``.
        """
        text = "".join(self._kept).strip()
        if not text or self._last is None:
            return None
        summary: dict[str, Any] = {
            "text": text,
            "seconds": round(max(0.0, self._last - self._started), 1),
        }
        if self._total_chars > REASONING_KEPT_CHARS:
            summary["cut"] = True
        return summary


@dataclass
class ToolCallAccumulator:
    """Merges streamed tool-call deltas into whole calls, in the order they first appear.

    Matching rules (issue 6, "Streaming"):

    * A delta with an ``id`` already seen continues that call.
    * A delta with an ``index`` and a new ``id`` continues the latest call at that index only if
      that call has no id yet; otherwise it opens a new call, so two calls that share an index
      but not an id stay two calls.
    * A delta with an ``index`` and no ``id`` continues the latest call at that index, so
      id-less continuation chunks are never lost; an unseen index opens a call.
    * A delta with neither continues the most recent call.
    * Unless it was matched by its ``id``, a delta with a name that continues a call by the
      rules above opens a new one instead when it cannot belong to it (issue 25): a different
      name after the call's arguments began, or the same name with arguments that begin after
      the call's arguments already form a whole JSON value. The same name with no arguments
      after whole arguments opens the new call only if arguments follow it (OpenAI's shape:
      a name chunk, then argument chunks); otherwise it was a trailing chunk of that call.
      LiteLLM's ``ollama_chat`` and some OpenAI-compatible servers stream every call at
      ``index`` 0 without an ``id``, each delta with its name (LiteLLM's Ollama stream gives
      an ``id`` only to calls with arguments), so two calls with ``"{}"`` used to become one
      named ``a__xb__y`` or one with ``"{}{}"``.
      Nameless arguments after a whole value stay with the call: a call without a name could
      not run, while arguments that are not JSON reach the model as a tool error it can read.

    Names are set once (a repeated identical name is ignored, a different piece before any
    argument is appended: a name streamed in pieces); argument pieces are concatenated;
    ``provider_specific_fields`` dicts are merged.
    """

    calls: list[dict[str, Any]] = field(default_factory=list)
    _by_index: dict[int, int] = field(default_factory=dict)
    _by_id: dict[str, int] = field(default_factory=dict)
    #: Calls whose name came again after their whole arguments: that name, by position.
    _pending: dict[int, str] = field(default_factory=dict)

    def _open(self) -> int:
        self.calls.append({"id": "", "name": "", "arguments": ""})
        return len(self.calls) - 1

    def add(self, delta: Mapping[str, Any]) -> None:
        """Add one delta: ``{"index"?: int, "id"?: str, "name"?: str, "arguments"?: str,
        "provider_specific_fields"?: dict}``."""
        raw_index = delta.get("index")
        index = int(raw_index) if raw_index is not None else None
        call_id = delta.get("id") or None
        name = delta.get("name") or ""
        arguments = delta.get("arguments") or ""
        position: int | None = None
        if call_id is not None and call_id in self._by_id:
            position = self._by_id[call_id]
        else:
            if index is not None and index in self._by_index:
                latest = self._by_index[index]
                if call_id is None or not self.calls[latest]["id"]:
                    position = latest
            elif index is None and call_id is None and self.calls:
                position = len(self.calls) - 1
            if position is not None:
                current = self.calls[position]
                pending = self._pending.pop(position, "")
                if _starts_another_call(current, name, arguments):
                    position = None
                elif pending and not name and arguments.strip() and _whole_json(
                    current["arguments"]
                ):
                    # The same tool named again, with its arguments in the pieces that follow.
                    name, position = pending, None
                elif name == current["name"] and not arguments.strip() and _whole_json(
                    current["arguments"]
                ):
                    # Its name again after whole arguments: a trailing chunk of this call, or
                    # the next call of the same tool; the next arguments tell.
                    self._pending[position] = name
        if position is None:
            position = self._open()
        if index is not None:
            self._by_index[index] = position
        call = self.calls[position]
        if call_id is not None and not call["id"]:
            call["id"] = call_id
            self._by_id[call_id] = position
        if name and name != call["name"]:
            call["name"] += name
        call["arguments"] += arguments
        extra = delta.get("provider_specific_fields")
        if isinstance(extra, Mapping) and extra:
            merged = dict(call.get("provider_specific_fields") or {})
            merged.update(as_plain(extra))
            call["provider_specific_fields"] = merged


def _starts_another_call(call: Mapping[str, Any], name: str, arguments: str) -> bool:
    """Whether a delta with ``name`` and ``arguments`` that matched ``call`` by index (or as
    the latest call) is really the next call (``ToolCallAccumulator``)."""
    if not name or not call["arguments"].strip():
        return False
    if name != call["name"]:
        return True
    return bool(arguments.strip()) and _whole_json(call["arguments"])


def _whole_json(text: str) -> bool:
    """Whether ``text`` is one complete JSON object or array (arguments are objects; a cheap
    look at the last character first, since this runs for every streamed argument piece)."""
    stripped = text.rstrip()
    if not stripped or stripped[-1] not in "}]":
        return False
    try:
        json.loads(stripped)
    except ValueError:
        return False
    return True


def tool_call_delta(raw: Any) -> dict[str, Any]:
    """A plain delta dict from a LiteLLM/OpenAI streamed tool call (object or dict).

    Returns ``{"index", "id", "name", "arguments", "provider_specific_fields"}``; the last merges
    the call's own and its function's ``provider_specific_fields`` (Gemini thought signatures).
    """
    function = _get(raw, "function")
    extra: dict[str, Any] = {}
    for source in (function, raw):
        fields = _get(source, "provider_specific_fields") if source is not None else None
        if isinstance(fields, Mapping):
            extra.update(as_plain(fields))
    return {
        "index": _get(raw, "index"),
        "id": _get(raw, "id"),
        "name": _get(function, "name") if function is not None else None,
        "arguments": _get(function, "arguments") if function is not None else None,
        "provider_specific_fields": extra or None,
    }


@dataclass
class ThinkingBlockAccumulator:
    """Merges Anthropic thinking-block deltas (``delta.thinking_blocks``) into whole blocks.

    Deltas carry the content block ``index``; ``thinking`` text, ``signature`` and redacted
    ``data`` pieces are concatenated per index, in first-seen order. The ``index`` key is
    dropped from the result, so blocks equal those of a whole response.
    """

    _blocks: list[dict[str, Any]] = field(default_factory=list)
    _by_index: dict[int, int] = field(default_factory=dict)

    def add(self, raw: Any) -> None:
        """Add one streamed block piece (object or dict)."""
        piece = as_plain(raw)
        if not isinstance(piece, dict):
            return
        raw_index = piece.pop("index", None)
        block_type = piece.get("type") or "thinking"
        position: int | None = None
        if raw_index is not None:
            position = self._by_index.get(int(raw_index))
        elif self._blocks and self._blocks[-1].get("type") == block_type:
            position = len(self._blocks) - 1
        if position is None:
            self._blocks.append({"type": block_type})
            position = len(self._blocks) - 1
            if raw_index is not None:
                self._by_index[int(raw_index)] = position
        block = self._blocks[position]
        for key, value in piece.items():
            if key == "type" or value is None:
                continue
            if isinstance(value, str) and key in ("thinking", "signature", "data"):
                block[key] = block.get(key, "") + value
            else:
                block[key] = value

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The merged blocks; empty ones (no text, signature or data) are left out."""
        return [
            block
            for block in self._blocks
            if block.get("thinking") or block.get("signature") or block.get("data")
        ]


def clean_thinking_blocks(raw: Any) -> list[dict[str, Any]]:
    """Whole-response thinking blocks as plain dicts, without ``index`` and ``None`` values."""
    accumulator = ThinkingBlockAccumulator()
    for block in raw or ():
        piece = as_plain(block)
        if isinstance(piece, dict):
            piece.pop("index", None)
            accumulator.add(piece)
    return accumulator.blocks


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
        usage = _get(chunk, "usage")
        if usage is not None:
            raw_usage = usage
            if usage_seen is not None:
                usage_seen.append(usage)
        for choice in _get(chunk, "choices") or ():
            delta = _get(choice, "delta")
            if delta is None:
                continue
            reasoning_piece = _get(delta, "reasoning_content")
            if isinstance(reasoning_piece, str):
                reasoning.add(reasoning_piece)
            content = _get(delta, "content")
            if isinstance(content, str) and content:
                parts.append(content)
                text.add(content)
            for block in _get(delta, "thinking_blocks") or ():
                thinking.add(block)
            for raw_call in _get(delta, "tool_calls") or ():
                calls.add(tool_call_delta(raw_call))
    return ModelReply(
        text="".join(parts),
        tool_calls=calls.calls,
        thinking_blocks=thinking.blocks,
        usage=usage_from(raw_usage),
    )


def read_chat_response(response: Any) -> ModelReply:
    """A whole ``acompletion`` response (first choice) as a :class:`ModelReply`."""
    choices = _get(response, "choices") or ()
    message = _get(choices[0], "message") if choices else None
    calls: list[dict[str, Any]] = []
    if message is not None:
        for raw_call in _get(message, "tool_calls") or ():
            delta = tool_call_delta(raw_call)
            call: dict[str, Any] = {
                "id": delta["id"] or "",
                "name": delta["name"] or "",
                "arguments": delta["arguments"] or "",
            }
            if delta["provider_specific_fields"]:
                call["provider_specific_fields"] = delta["provider_specific_fields"]
            calls.append(call)
    content = _get(message, "content") if message is not None else None
    return ModelReply(
        text=content if isinstance(content, str) else "",
        tool_calls=calls,
        thinking_blocks=clean_thinking_blocks(
            _get(message, "thinking_blocks") if message is not None else None
        ),
        usage=usage_from(_get(response, "usage")),
    )


def chat_response_reasoning(response: Any) -> str:
    """The readable reasoning of a whole ``acompletion`` response (first choice):
    ``reasoning_content`` (LiteLLM puts Anthropic thinking text there too), or ``""``.
    A stream gives the same text as ``reasoning_content`` deltas."""
    choices = _get(response, "choices") or ()
    message = _get(choices[0], "message") if choices else None
    text = _get(message, "reasoning_content") if message is not None else None
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
        raw_kind = _get(event, "type")
        kind = str(getattr(raw_kind, "value", raw_kind) or "")
        if kind in ("response.output_text.delta", "response.refusal.delta"):
            text.add(str(_get(event, "delta") or ""))
        elif kind == "response.reasoning_summary_text.delta":
            reasoning.add(str(_get(event, "delta") or ""))
        elif kind == "response.output_item.done":
            index = _get(event, "output_index")
            done_items[int(index) if index is not None else len(done_items)] = _get(event, "item")
        elif kind in ("response.completed", "response.incomplete"):
            final = _get(event, "response")
        elif kind in ("response.failed", "error"):
            detail = _get(_get(event, "response"), "error") or _get(event, "message") or kind
            raise ModelResponseError(f"the model call failed: {as_plain(detail)}")
    if final is None:
        raise ModelResponseError("the model's stream ended before the response completed")
    output = [done_items[index] for index in sorted(done_items)] or list(
        _get(final, "output") or ()
    )
    return reply_from_output(output, _get(final, "usage"))


def read_responses_response(response: Any) -> ModelReply:
    """A whole ``aresponses`` response as a :class:`ModelReply`."""
    return reply_from_output(list(_get(response, "output") or ()), _get(response, "usage"))


def responses_input(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Convert Chat Completions messages to Responses ``(instructions, input)``.

    System messages become ``instructions`` (joined by blank lines). Per message: a tool result
    becomes ``function_call_output`` (its ``output`` the text, or for content parts with images
    a list of ``input_text`` and ``input_image`` items); an assistant message gives its stored
    ``reasoning_items`` first (replayed verbatim, stateless), then its text as a ``message``,
    then one ``function_call`` per tool call; a user message becomes a ``message``.

    Raises:
        ValueError: A tool message without ``tool_call_id``.
    """
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else _content_text(content)
        if role == "system":
            if text:
                instructions.append(text)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                raise ValueError("a tool message has no tool_call_id")
            output: str | list[dict[str, Any]] = text
            if isinstance(content, list) and any(
                isinstance(part, Mapping) and part.get("type") == "image_url" for part in content
            ):
                output = responses_content_parts(content)
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        elif role == "assistant":
            items.extend(dict(item) for item in message.get("reasoning_items") or ())
            if text:
                items.append({"type": "message", "role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments") or "{}",
                    }
                )
        else:
            items.append({"type": "message", "role": "user", "content": text})
    return "\n\n".join(instructions), items


def responses_content_parts(parts: Sequence[Any]) -> list[dict[str, Any]]:
    """Chat Completions content parts as Responses input items: ``text`` becomes
    ``input_text``, ``image_url`` becomes ``input_image`` with the URL as ``image_url`` and
    ``detail`` ``auto`` (OpenAI Responses API, "Function calling / function_call_output");
    other parts are dropped."""
    items: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            items.append({"type": "input_text", "text": str(part.get("text") or "")})
        elif part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if isinstance(url, str) and url:
                items.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return items


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text")
        )
    return "" if content is None else json.dumps(content)
