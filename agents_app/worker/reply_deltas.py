"""The pieces of a streamed model reply: live deltas buffered into events, and tool-call and
thinking-block deltas merged into whole ones (issue 6, "Streaming").

Text and reasoning deltas go to the session's AgentEvents through :class:`DeltaBuffer`
(1 second or 16 KiB, flushed before the Step returns; seed "Live events");
:class:`ReasoningDeltaBuffer` also keeps the readable reasoning for the assistant message.
Streamed tool calls merge through :class:`ToolCallAccumulator` (the provider shapes it handles
are listed in docs/providers.md), Anthropic thinking blocks through
:class:`ThinkingBlockAccumulator`. ``agents_app.worker.model_replies`` reads whole replies with
them.

May import: the standard library only.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "DELTA_FLUSH_BYTES",
    "DELTA_FLUSH_SECONDS",
    "REASONING_KEPT_CHARS",
    "DeltaBuffer",
    "ReasoningDeltaBuffer",
    "ThinkingBlockAccumulator",
    "ToolCallAccumulator",
    "as_plain",
    "clean_thinking_blocks",
    "field_of",
    "tool_call_delta",
]

DELTA_FLUSH_SECONDS = 1.0
DELTA_FLUSH_BYTES = 16 * 1024


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



def field_of(value: Any, key: str) -> Any:
    """``value[key]`` of a mapping, else the attribute ``key`` of an object (LiteLLM and OpenAI
    answers come as either); ``None`` when absent."""
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
    function = field_of(raw, "function")
    extra: dict[str, Any] = {}
    for source in (function, raw):
        fields = field_of(source, "provider_specific_fields") if source is not None else None
        if isinstance(fields, Mapping):
            extra.update(as_plain(fields))
    return {
        "index": field_of(raw, "index"),
        "id": field_of(raw, "id"),
        "name": field_of(function, "name") if function is not None else None,
        "arguments": field_of(function, "arguments") if function is not None else None,
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

