"""The runner contract's pure parts: rendering, policies, usage, keys, codecs."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from dex import CodecRegistry

from dex_agents import (
    AgentInterrupt,
    AgentSessionStartInput,
    AgentSnapshot,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
    ToolPolicyResolver,
    build_turn_failure_note,
    describe_tool_call_outcome,
    idempotency_key,
    is_approval_required,
    message_sequence_key,
)


def record(
    tool_call_id: str,
    status: ToolCallStatus,
    order: int,
    *,
    output: str | None = None,
    error: str | None = None,
    rejection_message: str | None = None,
) -> AgentToolCall:
    return AgentToolCall(
        tool_call_id=tool_call_id,
        tool_name=f"tool_{tool_call_id}",
        arguments='{"q": 1}',
        effect=ToolEffect.READ,
        requires_approval=False,
        status=status,
        deferral_order=order,
        turn_id="turn-3",
        output=output,
        error=error,
        rejection_message=rejection_message,
    )


def test_turn_failure_note_has_the_documented_format_in_deferral_order() -> None:
    records = [
        record("b", ToolCallStatus.FAILED, 1, error="boom"),
        record("a", ToolCallStatus.SUCCEEDED, 0, output="42"),
        record("c", ToolCallStatus.OUTCOME_UNKNOWN, 2, error="worker lost"),
    ]
    assert build_turn_failure_note(records) == (
        "[Dex] The previous turn failed after these tool calls ran:\n"
        '- tool_a {"q": 1} -> succeeded: 42\n'
        '- tool_b {"q": 1} -> failed: Tool call failed: boom\n'
        '- tool_c {"q": 1} -> outcome_unknown: Tool call outcome is unknown (worker lost); '
        "it may or may not have taken effect.\n"
        "Do not repeat these tool calls unless the user asks again."
    )


def test_turn_failure_note_keeps_the_start_of_long_outputs_and_arguments() -> None:
    # Issue 25: four 300 KB outputs made a 1.2 MB note (a user message every later call
    # carries). The note names each call and how it ended, with the start of its output.
    long_output = "first line\nsecond line\nthird line\n" + "x" * 300_000
    records = [
        dataclasses.replace(
            record(name, ToolCallStatus.SUCCEEDED, order, output=long_output),
            arguments='{"q": "' + "y" * 5_000 + '"}',
        )
        for order, name in enumerate("abcd")
    ]
    note = build_turn_failure_note(records)
    assert len(note) < 4_000
    lines = note.split("\n")
    assert lines[0] == "[Dex] The previous turn failed after these tool calls ran:"
    assert lines[-1] == "Do not repeat these tool calls unless the user asks again."
    assert note.count("- tool_") == 4
    assert note.count("-> succeeded: first line") == 4
    arguments = records[0].arguments
    assert f"- tool_a {arguments[:200]} [... {len(arguments) - 200} more characters] ->" in note
    kept = "first line\nsecond line\nthird line"
    assert f"-> succeeded: {kept} [... {len(long_output) - len(kept)} more characters]" in note


def test_outcome_of_an_open_record_is_refused() -> None:
    with pytest.raises(ValueError, match="not final"):
        describe_tool_call_outcome(record("a", ToolCallStatus.AWAITING_APPROVAL, 0))
    with pytest.raises(ValueError):
        build_turn_failure_note([])


def test_rejection_shows_the_reviewer_message() -> None:
    rejected = record("a", ToolCallStatus.REJECTED, 0, rejection_message="not now")
    assert describe_tool_call_outcome(rejected) == (
        "Tool call was rejected and did not run: not now"
    )


@pytest.mark.parametrize(
    ("effect", "expected"),
    [
        (ToolEffect.READ, False),
        (ToolEffect.IDEMPOTENT_WRITE, False),
        (ToolEffect.NON_IDEMPOTENT_WRITE, True),
        (ToolEffect.UNCLASSIFIED, True),
    ],
)
def test_default_approval_follows_the_effect_table(effect: ToolEffect, expected: bool) -> None:
    assert is_approval_required(ToolPolicy(effect)) is expected
    assert is_approval_required(ToolPolicy(effect, requires_approval=not expected)) is not expected


def test_policy_resolution_order() -> None:
    resolver = ToolPolicyResolver(
        session_policies={"both": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE)},
        flow_policies={
            "both": ToolPolicy(ToolEffect.READ),
            "flow_only": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE),
        },
        default_tool_effect=ToolEffect.UNCLASSIFIED,
    )
    assert resolver.resolve("both", ToolEffect.READ).effect is ToolEffect.NON_IDEMPOTENT_WRITE
    assert resolver.resolve("flow_only", ToolEffect.READ).effect is ToolEffect.IDEMPOTENT_WRITE
    assert resolver.resolve("meta", ToolEffect.READ).effect is ToolEffect.READ
    assert resolver.resolve("unknown").effect is ToolEffect.UNCLASSIFIED


def test_usage_adds_field_by_field() -> None:
    total = AgentUsage(1, 2, 3, 4, 5) + AgentUsage(10, 20, 30, 40, 50)
    assert total == AgentUsage(11, 22, 33, 44, 55)


def test_keys() -> None:
    assert message_sequence_key(1) == "000000000001"
    with pytest.raises(ValueError):
        message_sequence_key(0)
    assert idempotency_key("s-1", record("x", ToolCallStatus.PENDING, 0)) == "s-1/turn-3/x"


def test_wire_types_round_trip_through_the_sdk_codec() -> None:
    codecs = CodecRegistry()
    deadline = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    snapshot = AgentSnapshot(
        state=AgentState(AgentStatus.RUNNING_TOOLS, 2, "turn-2", 3, "oops"),
        messages=[],
        pending_interrupts=[AgentInterrupt("turn-2.c", "c", "refund", "{}", deadline, "turn-2")],
        tool_calls=[record("c", ToolCallStatus.AWAITING_APPROVAL, 0)],
        usage=AgentUsage(requests=1),
        queued_message_count=1,
        last_turn_error="oops",
    )
    codec = codecs.resolve(AgentSnapshot)
    decoded = codec.decode(codec.encode(snapshot))
    assert decoded == snapshot
    assert decoded.pending_interrupts[0].deadline == deadline
    assert '"status":"running_tools"' in str(codec.encode(snapshot).data)

    start = AgentSessionStartInput("hi", {"model": "m"}, {"t": ToolPolicy(ToolEffect.READ)})
    start_codec = codecs.resolve(AgentSessionStartInput)
    assert start_codec.decode(start_codec.encode(start)) == start


def test_package_never_imports_django() -> None:
    probe = "import sys, dex_agents, dex_agents.testing; print('django' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "False"
