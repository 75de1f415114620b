"""The OpenAPI components of a session's conversation (agents_app/api/session_schema.py) match
what ``session_data`` really builds: every key it writes is a declared field, every required
field is there, and each value passes its field (role, effect and status enumerations,
nullable fields, date-times). The served schema as a whole is checked by schemathesis and a
generated client in tests/e2e/test_api_contract.py."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from rest_framework import serializers

from agents_app.api.session_schema import (
    PendingInterruptSerializer,
    SessionMessageSerializer,
    SessionUsageSerializer,
    ToolCallRecordSerializer,
)
from agents_app.gateway import session_data
from dex_agents import (
    AgentInterrupt,
    AgentMessage,
    AgentSnapshot,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    MessageRole,
    ToolCallStatus,
    ToolEffect,
)


def check(serializer_class: type[serializers.Serializer], data: dict[str, Any]) -> None:
    fields = serializer_class().fields
    assert set(data) <= set(fields), f"undeclared: {set(data) - set(fields)}"
    required = {name for name, field in fields.items() if field.required}
    assert required <= set(data), f"missing: {required - set(data)}"
    serializer = serializer_class(data=data)
    assert serializer.is_valid(), (data, serializer.errors)


def record(status: ToolCallStatus, order: int, **extra: Any) -> AgentToolCall:
    return AgentToolCall(
        tool_call_id=f"call-{order}",
        tool_name="files__write",
        arguments="" if order == 0 else '{"path": "a"}',
        effect=list(ToolEffect)[order % len(ToolEffect)],
        requires_approval=order % 2 == 0,
        status=status,
        deferral_order=order,
        turn_id="turn-2",
        **extra,
    )


def test_the_snapshot_data_matches_its_components() -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "search__web_search", "arguments": '{"q": "cats"}'}}
    messages = [
        AgentMessage(1, MessageRole.SYSTEM, "be brief", None, "turn-1"),
        AgentMessage(2, MessageRole.USER, "find cats", {"role": "user"}, "turn-1"),
        AgentMessage(3, MessageRole.ASSISTANT, "", {"role": "assistant", "content": None,
                                                    "tool_calls": [call]}, "turn-1"),
        # A provider that gave a call no ID and no arguments.
        AgentMessage(4, MessageRole.ASSISTANT, "", {"tool_calls": [{"function": {}}]},
                     "turn-1"),
        AgentMessage(5, MessageRole.TOOL, "3 results",
                     {"role": "tool", "tool_call_id": "call_1"}, "turn-1"),
    ]
    records = [record(status, order) for order, status in enumerate(ToolCallStatus)]
    records.append(record(ToolCallStatus.SUCCEEDED, len(records), output="[image: chart]",
                          timeout_seconds=2.5, retries=0))
    records.append(record(ToolCallStatus.FAILED, len(records), error="boom"))
    records.append(record(ToolCallStatus.REJECTED, len(records), rejection_message=""))
    interrupts = [
        AgentInterrupt("turn-2.call-0", "call-0", "files__write", "{}",
                       datetime(2026, 1, 1, tzinfo=UTC), "turn-2"),
        AgentInterrupt("turn-2.call-2", "call-2", "files__write", "", None, "turn-2"),
    ]
    snapshot = AgentSnapshot(
        state=AgentState(status=AgentStatus.RUNNING_TOOLS, turn_number=2, turn_id="turn-2"),
        messages=messages,
        pending_interrupts=interrupts,
        tool_calls=records,
        usage=AgentUsage(input_tokens=3, output_tokens=4, requests=1),
        queued_message_count=0,
        last_turn_error=None,
    )
    data = session_data.snapshot_to_data(snapshot)
    assert len(data["messages"]) == 5 and len(data["tool_calls"]) == len(records)
    for message in data["messages"]:
        check(SessionMessageSerializer, message)
    assert "tool_calls" in data["messages"][2] and "tool_call_id" in data["messages"][4]
    for item in data["tool_calls"]:
        check(ToolCallRecordSerializer, item)
    for item in data["pending_interrupts"]:
        check(PendingInterruptSerializer, item)
    check(SessionUsageSerializer, data["usage"])


def test_a_snapshot_without_usage_reads_zeros() -> None:
    snapshot = AgentSnapshot(
        state=None, messages=[], pending_interrupts=[], tool_calls=[],
        usage=None,  # type: ignore[arg-type]
        queued_message_count=0, last_turn_error=None,
    )
    data = session_data.snapshot_to_data(snapshot)
    assert data["usage"] == AgentUsage().as_dict()
    check(SessionUsageSerializer, data["usage"])


@pytest.mark.parametrize(
    "serializer_class, data",
    [
        (SessionMessageSerializer, {"sequence": 1, "role": "robot", "text": "", "turn_id": "t"}),
        (ToolCallRecordSerializer, {**session_data.tool_call_to_data(
            record(ToolCallStatus.PENDING, 1)), "status": "paused"}),
        (PendingInterruptSerializer, {"interrupt_id": "a", "tool_call_id": "b",
                                      "tool_name": "c", "arguments": "{}",
                                      "deadline": "tomorrow", "turn_id": "t"}),
    ],
)
def test_the_check_catches_a_value_outside_the_component(
    serializer_class: type[serializers.Serializer], data: dict[str, Any]
) -> None:
    with pytest.raises(AssertionError):
        check(serializer_class, data)
