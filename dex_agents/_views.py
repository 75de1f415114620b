"""Platform addition (issue 26): RPC answers that show stored messages stay under a byte
budget, so a session of any size can be read.

Dex answers an RPC in one gRPC message, and the SDK's clients accept at most 4 MiB (gRPC's
default). Large stored values travel as blobs, but an RPC's output is one value, sent inline
(``dex_dev_server._blobs``), so a snapshot holding the newest 200 messages could pass that
limit once messages are large. The answers that show messages therefore hold as many of them
as fit in a budget of their JSON size (``encoded_size``): the newest for a snapshot or a page
read backwards, the oldest for a page read forwards; the caller pages through the rest. A
single message larger than the whole budget is shown cut (``cut_message``): its
``framework_item`` is replaced by the fields that link tool calls and results, and when its text
still does not fit, the text ends with a line saying how many characters were left out and the
item says ``{"cut": {"text_length": <characters>}}``; the stored message is unchanged. Tool
call records in a snapshot show at most ``RECORD_OUTPUT_VIEW_BYTES`` of their output the same
way.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dex_agents._records import AgentMessage, AgentToolCall

#: JSON bytes of messages in a snapshot, at most (``snapshot_messages_budget``).
SNAPSHOT_MESSAGES_BYTES = 1024 * 1024
#: JSON bytes of messages in a snapshot, at least, however large its queue and records.
SNAPSHOT_MESSAGES_MIN_BYTES = 256 * 1024
#: JSON bytes a snapshot's messages, queue and tool call records may take together: with its
#: other fields it stays under the 4 MiB an answer may carry.
SNAPSHOT_BYTES = 3 * 1024 * 1024 + 512 * 1024
#: JSON bytes the texts of a session's queued and steered messages may take together
#: (``AgentSessionOptions.max_queued_bytes`` as the platform sets it): 20 messages of 90,000
#: ASCII characters fit; with the snapshot's messages and records, a snapshot stays under
#: ``SNAPSHOT_BYTES``.
QUEUED_MESSAGES_BYTES = 2 * 1024 * 1024
#: JSON bytes the tool call records of a snapshot show together, at most: each record's
#: ``output`` and ``arguments`` are cut to an equal share (``record_view_limit``).
RECORDS_VIEW_BYTES = 512 * 1024
#: The smallest share of one record's ``output`` (and of its ``arguments``) a snapshot shows.
RECORD_VIEW_MIN_BYTES = 4 * 1024
#: JSON bytes of messages in one page read with ``read_agent_messages`` or
#: ``list_agent_messages``.
PAGE_MESSAGES_BYTES = 3 * 1024 * 1024
#: JSON bytes of a tool call record's ``output``, and of its ``arguments``, a snapshot shows.
RECORD_OUTPUT_VIEW_BYTES = 64 * 1024
#: Bytes counted for a message besides its text and framework item (field names, numbers).
_MESSAGE_OVERHEAD = 160
#: The framework item fields a cut message keeps: what links tool calls to their results.
_LINK_FIELDS = ("role", "tool_call_id", "tool_calls")
#: Characters of each tool call's ``arguments`` a cut message keeps.
_CUT_ARGUMENTS_CHARS = 4096


#: One encoder for every size: ``json.dumps(value, default=...)`` builds a new encoder per
#: call, which was half the cost of sizing a snapshot's messages. Its output is the same.
_encode = json.JSONEncoder(default=str).encode


def _json_size(value: Any) -> int:
    return len(_encode(value))


def queued_bytes(texts: Sequence[str]) -> int:
    """The JSON bytes of queued message texts, as the SDK encodes them (ASCII-escaped: an
    emoji takes 12 bytes)."""
    return sum(_json_size(text) for text in texts)


def encoded_size(message: AgentMessage) -> int:
    """About the bytes ``message`` takes in an RPC answer's JSON (exact for its text and
    framework item, ASCII-escaped as the SDK's JSON is)."""
    return _json_size(message.text) + _json_size(message.framework_item) + _MESSAGE_OVERHEAD


def cut_text(text: str, budget: int) -> str:
    """``text`` whose JSON form fits ``budget`` bytes: its start and a last line saying how
    many characters were left out (``text`` itself when it fits)."""
    if _json_size(text) <= budget:
        return text
    keep = max(0, budget // 2)
    while True:
        shown = text[:keep]
        result = f"{shown}\n\n[... {len(text) - keep:,} more characters not shown here]"
        if _json_size(result) <= budget or keep == 0:
            return result
        keep //= 2


def _link_fields(item: Any) -> dict[str, Any]:
    if not isinstance(item, Mapping):
        return {}
    linked = {name: item[name] for name in _LINK_FIELDS if name in item}
    calls = linked.get("tool_calls")
    if isinstance(calls, list):
        linked["tool_calls"] = [_cut_call(call) for call in calls]
    return linked


def _cut_call(call: Any) -> Any:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    arguments = function.get("arguments")
    if isinstance(arguments, str) and len(arguments) > _CUT_ARGUMENTS_CHARS:
        function["arguments"] = arguments[:_CUT_ARGUMENTS_CHARS]
    return {**call, "function": function}


def cut_message(message: AgentMessage, budget: int) -> AgentMessage:
    """A view of ``message`` that fits about ``budget`` JSON bytes (see the module
    docstring); ``message`` itself when it already fits."""
    if encoded_size(message) <= budget:
        return message
    item = _link_fields(message.framework_item)
    marker = {"cut": {"text_length": len(message.text)}}
    room = max(1024, budget - _json_size({**item, **marker}) - _MESSAGE_OVERHEAD)
    text = cut_text(message.text, room)
    if text != message.text:
        item.update(marker)
    return replace(message, text=text, framework_item=item)


def fit_messages(
    messages: Sequence[AgentMessage], budget: int, *, keep_newest: bool = True
) -> list[AgentMessage]:
    """The messages (oldest first) that fit ``budget`` JSON bytes together: the newest ones
    when ``keep_newest``, else the oldest. At least one is kept, cut when it alone passes the
    budget."""
    ordered = list(reversed(messages)) if keep_newest else list(messages)
    kept: list[AgentMessage] = []
    left = budget
    for message in ordered:
        size = encoded_size(message)
        if size > left:
            if not kept:
                kept.append(cut_message(message, budget))
            break
        kept.append(message)
        left -= size
    if keep_newest:
        kept.reverse()
    return kept


def record_view_limit(count: int) -> int:
    """The JSON bytes a snapshot shows of each of ``count`` records' ``output`` (and of its
    ``arguments``): an equal share of ``RECORDS_VIEW_BYTES``, between
    ``RECORD_VIEW_MIN_BYTES`` and ``RECORD_OUTPUT_VIEW_BYTES``."""
    share = RECORDS_VIEW_BYTES // max(1, 2 * count)
    return max(RECORD_VIEW_MIN_BYTES, min(RECORD_OUTPUT_VIEW_BYTES, share))


def records_size(records: Sequence[AgentToolCall]) -> int:
    """About the JSON bytes ``records`` take in an answer."""
    return sum(
        _json_size(record.output or "") + _json_size(record.arguments) + _MESSAGE_OVERHEAD * 2
        for record in records
    )


def snapshot_messages_budget(queued: int, records: int) -> int:
    """The JSON bytes a snapshot's messages may take beside ``queued`` bytes of queued and
    steered texts and ``records`` bytes of tool call records: what ``SNAPSHOT_BYTES`` leaves,
    between ``SNAPSHOT_MESSAGES_MIN_BYTES`` and ``SNAPSHOT_MESSAGES_BYTES``."""
    left = SNAPSHOT_BYTES - queued - records
    return max(SNAPSHOT_MESSAGES_MIN_BYTES, min(SNAPSHOT_MESSAGES_BYTES, left))


def record_view(record: AgentToolCall, limit: int = RECORD_OUTPUT_VIEW_BYTES) -> AgentToolCall:
    """``record`` with its ``output`` and ``arguments`` each cut to ``limit`` bytes of JSON
    (``cut_text``: the start, then a line saying how many characters were left out; cut
    arguments are no longer a JSON object)."""
    output, arguments = record.output, record.arguments
    if output is not None:
        output = cut_text(output, limit)
    arguments = cut_text(arguments, limit)
    if output is record.output and arguments is record.arguments:
        return record
    return replace(record, output=output, arguments=arguments)
