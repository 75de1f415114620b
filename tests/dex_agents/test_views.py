"""Byte-bounded views of stored messages and records in RPC answers (dex_agents/_views.py)."""

from __future__ import annotations

import json

from agents_app.api.session_schema import SessionMessageSerializer
from agents_app.gateway import session_data
from dex_agents import AgentMessage, AgentToolCall, MessageRole, ToolCallStatus, ToolEffect
from dex_agents._views import (
    QUEUED_MESSAGES_BYTES,
    RECORD_OUTPUT_VIEW_BYTES,
    RECORDS_VIEW_BYTES,
    cut_message,
    cut_text,
    encoded_size,
    fit_messages,
    record_view,
    record_view_limit,
    records_size,
    snapshot_messages_budget,
)


def message(sequence: int, text: str, role: MessageRole = MessageRole.ASSISTANT,
            item: dict | None = None) -> AgentMessage:
    return AgentMessage(sequence, role, text,
                        item if item is not None else {"role": str(role), "content": text},
                        "turn-1")


def test_the_newest_or_the_oldest_that_fit_the_budget_are_kept() -> None:
    messages = [message(sequence, "x" * 1000) for sequence in range(1, 11)]
    one = encoded_size(messages[0])
    newest = fit_messages(messages, 3 * one + 10)
    assert [item.sequence for item in newest] == [8, 9, 10]
    oldest = fit_messages(messages, 3 * one + 10, keep_newest=False)
    assert [item.sequence for item in oldest] == [1, 2, 3]
    assert fit_messages(messages, 100 * one) == messages


def test_a_message_larger_than_the_budget_is_shown_cut() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "files__write", "arguments": json.dumps({"body": "b" * 9000})}}
    big = message(5, "é" * 300_000, item={"role": "assistant", "content": "é" * 300_000,
                                          "tool_calls": [call], "reasoning": "secret"})
    [shown] = fit_messages([message(4, "small"), big], 64 * 1024)
    assert shown.sequence == 5 and encoded_size(shown) <= 64 * 1024 + 1024
    assert shown.text.startswith("é" * 100)
    assert shown.text.endswith("more characters not shown here]")
    assert shown.framework_item["cut"] == {"text_length": 300_000}
    assert shown.framework_item["tool_calls"][0]["id"] == "call_1"
    assert len(shown.framework_item["tool_calls"][0]["function"]["arguments"]) == 4096
    assert "reasoning" not in shown.framework_item and "content" not in shown.framework_item
    # The stored message is unchanged.
    assert len(big.text) == 300_000

    data = session_data.message_to_data(shown)
    assert data["text_length"] == 300_000 and data["tool_calls"][0]["name"] == "files__write"
    serializer = SessionMessageSerializer(data=data)
    assert serializer.is_valid(), serializer.errors
    assert "text_length" not in session_data.message_to_data(message(4, "small"))


def test_cut_text_keeps_within_its_budget_for_any_characters() -> None:
    for text in ("a" * 50_000, "€" * 50_000, "\U0001f600" * 50_000):
        cut = cut_text(text, 10_000)
        assert cut != text and cut.endswith("more characters not shown here]")
        assert len(json.dumps(cut)) <= 10_000
    assert cut_text("short", 100) == "short"
    assert cut_message(message(1, "short"), 10_000) == message(1, "short")


def test_a_message_whose_text_fits_once_its_item_is_slimmed_keeps_its_text() -> None:
    text = "t" * 60_000  # 120,000 bytes with its item's copy of the text
    [shown] = fit_messages([message(1, text)], 64 * 1024)
    assert shown.text == text and shown.framework_item == {"role": "assistant"}
    assert "text_length" not in session_data.message_to_data(shown)


def test_record_views_cut_long_outputs_and_arguments() -> None:
    record = AgentToolCall(
        tool_call_id="call_1", tool_name="files__read", arguments="{" + "a" * 100_000 + "}",
        effect=ToolEffect.READ, requires_approval=False, status=ToolCallStatus.SUCCEEDED,
        deferral_order=0, turn_id="turn-1", output="\u4e2d" * 200_000,
    )
    view = record_view(record)
    assert view.output is not None and view.output.startswith("\u4e2d" * 1000)
    assert view.output.endswith("more characters not shown here]")
    # Bytes, not characters: each of these characters is six bytes of the SDK's JSON.
    assert len(json.dumps(view.output)) <= RECORD_OUTPUT_VIEW_BYTES
    assert len(json.dumps(view.arguments)) <= RECORD_OUTPUT_VIEW_BYTES
    assert view.arguments.startswith("{aaa")
    small = AgentToolCall(
        tool_call_id="call_2", tool_name="files__read", arguments="{}",
        effect=ToolEffect.READ, requires_approval=False, status=ToolCallStatus.PENDING,
        deferral_order=1, turn_id="turn-1",
    )
    assert record_view(small) is small


def test_a_snapshot_of_a_full_queue_and_many_records_stays_under_4_mib() -> None:
    """The records share ``RECORDS_VIEW_BYTES``, the messages get what the queue and the
    records leave of ``SNAPSHOT_BYTES`` (at least 256 KiB), so the three stay under 4 MiB
    however many parallel calls a turn has and however full its queue is."""
    assert record_view_limit(1) == RECORD_OUTPUT_VIEW_BYTES
    assert record_view_limit(4) == RECORD_OUTPUT_VIEW_BYTES  # 4 x 2 x 64 KiB = 512 KiB
    assert record_view_limit(8) == 32 * 1024
    assert record_view_limit(1000) == 4 * 1024
    records = [
        AgentToolCall(
            tool_call_id=f"call-{n}", tool_name="read", arguments="a" * 200_000,
            effect=ToolEffect.READ, requires_approval=False, status=ToolCallStatus.SUCCEEDED,
            deferral_order=n, turn_id="turn-1", output="😀" * 200_000,
        )
        for n in range(16)
    ]
    views = [record_view(record, record_view_limit(len(records))) for record in records]
    shown = records_size(views)
    assert shown <= RECORDS_VIEW_BYTES + 16 * 400
    queue = 20 * len(json.dumps("q" * 90_000))  # 20 messages of 90,000 ASCII characters
    assert queue <= QUEUED_MESSAGES_BYTES
    budget = snapshot_messages_budget(queue, shown)
    assert 256 * 1024 <= budget <= 1024 * 1024
    assert budget + queue + shown <= 4 * 1024 * 1024 - 256 * 1024
    assert snapshot_messages_budget(0, 0) == 1024 * 1024
    assert snapshot_messages_budget(10**9, 10**9) == 256 * 1024
