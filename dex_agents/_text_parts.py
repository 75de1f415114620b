"""Texts larger than one Dex value, stored whole in parts (platform addition, issue 26).

A Dex value reaches a Worker whole in one gRPC message (``LoadBlobs`` answers at most 4 MiB),
so one tool result of 20 MB cannot be one Attribute. A tool Step whose runner returns
``ToolExecutionResult(output, full_text)`` with ``full_text`` longer than ``output`` stores
``full_text`` in ``TEXT_PARTS`` instances ``<turn_id>:<tool_call_id>:<nnnnn>`` of at most
``TEXT_PART_BYTES`` of UTF-8 each, in the same commit as the tool call's record; the record
says where (``AgentToolCall.output_parts``). The model sees ``output`` only (the runner cuts
it to the agent's limit); when the turn completes, the tool message that answers the call
takes the reference over (``AgentMessage.text_parts``) and ``TEXT_PARTS_INDEX`` lists it, so
that context compaction deletes the parts with the message. A turn that fails, or a record no
message took over, deletes its parts when its records are deleted.

People read the whole text with ``read_message_text`` one part at a time: each part, even as
the SDK's ASCII-escaped JSON (a UTF-8 byte may take six), fits one gRPC answer.
"""

from __future__ import annotations

from dex import Context

from dex_agents._persistence import TEXT_PARTS, TEXT_PARTS_INDEX
from dex_agents._records import AgentToolCall, TextParts

#: The most UTF-8 bytes of one stored part (``TEXT_PARTS`` instance, ``read_message_text``
#: answer): 512 KiB, so a part of control characters, each escaped as six bytes of JSON, still
#: fits a 4 MiB gRPC message.
TEXT_PART_BYTES = 512 * 1024
#: The most UTF-8 bytes of one text a session stores in parts (a tool result): a longer text
#: is cut here with a note. The parts travel to the engine in the tool Step's one commit.
MAX_STORED_TEXT_BYTES = 32 * 1024 * 1024
#: The last line of a text cut at ``MAX_STORED_TEXT_BYTES``; ``{kept}`` and ``{length}`` are
#: characters.
STORED_TEXT_CUT_NOTE = (
    "\n\n[dexagents] The session stored the first {kept:,} of {length:,} characters of this "
    "result ({limit:,} bytes)."
)


def split_text(text: str, part_bytes: int = TEXT_PART_BYTES) -> list[str]:
    """``text`` as consecutive parts of at most ``part_bytes`` UTF-8 bytes each, cut between
    characters; ``[""]`` for the empty text. Joined, the parts are ``text``.

    Raises:
        ValueError: If ``part_bytes`` is under 4 (one character may take four bytes).
    """
    if part_bytes < 4:
        raise ValueError("part_bytes must be at least 4")
    data = text.encode("utf-8")
    if len(data) <= part_bytes:
        return [text]
    parts: list[str] = []
    start = 0
    while start < len(data):
        end = min(start + part_bytes, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # inside a character
            end -= 1
        parts.append(data[start:end].decode("utf-8"))
        start = end
    return parts


def text_part_key(key: str, index: int) -> str:
    """The ``TEXT_PARTS`` instance of part ``index`` of the text stored under ``key``."""
    return f"{key}:{index:05d}"


def tool_output_key(record: AgentToolCall) -> str:
    """The ``TextParts.key`` of a tool call's whole result: ``<turn_id>:<tool_call_id>``."""
    return f"{record.turn_id}:{record.tool_call_id}"


def cut_stored_text(text: str, limit: int = MAX_STORED_TEXT_BYTES) -> str:
    """``text`` whole when its UTF-8 form fits ``limit`` bytes, else its first part (cut
    between characters, room left for the note) followed by ``STORED_TEXT_CUT_NOTE``."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    kept = data[: limit - 512].decode("utf-8", errors="ignore")
    note = STORED_TEXT_CUT_NOTE.format(kept=len(kept), length=len(text), limit=limit)
    return kept + note


def store_text_parts(context: Context, key: str, text: str) -> TextParts:
    """Stage ``text`` (cut to ``MAX_STORED_TEXT_BYTES``) as ``TEXT_PARTS`` instances under
    ``key``; where they are."""
    stored = cut_stored_text(text)
    parts = split_text(stored)
    for index, part in enumerate(parts):
        TEXT_PARTS.set(context, text_part_key(key, index), part)
    return TextParts(key=key, count=len(parts), length=len(stored))


def delete_text_parts(context: Context, parts: TextParts) -> None:
    """Stage the deletion of every instance of ``parts`` (instances need not be loaded)."""
    for index in range(parts.count):
        TEXT_PARTS.delete(context, text_part_key(parts.key, index))


def index_message_parts(context: Context, sequence_key: str, parts: TextParts) -> None:
    """Record in ``TEXT_PARTS_INDEX`` that the message ``sequence_key`` owns ``parts``."""
    index = dict(TEXT_PARTS_INDEX.get(context) or {})
    index[sequence_key] = parts
    TEXT_PARTS_INDEX.set(context, index)


def delete_message_parts_before(context: Context, sequence_key: str) -> int:
    """Stage the deletion of the parts of every indexed message keyed before
    ``sequence_key`` (the messages compaction deletes); how many texts."""
    index = TEXT_PARTS_INDEX.get(context)
    if not index:
        return 0
    gone = [key for key in index if key < sequence_key]
    if not gone:
        return 0
    for key in gone:
        delete_text_parts(context, index[key])
    kept = {key: parts for key, parts in index.items() if key >= sequence_key}
    TEXT_PARTS_INDEX.set(context, kept)
    return len(gone)


def read_part(text: str, part: int) -> tuple[str | None, int]:
    """Part ``part`` of ``text`` split as ``split_text`` splits it (``None`` when out of
    range), and the count of parts."""
    parts = split_text(text)
    return (parts[part] if 0 <= part < len(parts) else None), len(parts)
