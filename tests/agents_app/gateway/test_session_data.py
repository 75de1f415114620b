"""The JSON-ready shapes of Dex values (``agents_app.gateway.session_data``; no engine needed)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from agents_app.gateway import session_data
from dex_agents import (
    AgentElicitation,
    AgentInterrupt,
    AgentMessage,
    AgentPlan,
    AgentQueuedMessage,
    AgentSnapshot,
    AgentState,
    AgentStatus,
    AgentToolCall,
    AgentUsage,
    MessageRole,
    PendingTimer,
    PendingUserInput,
    PlanStatus,
    PlanTask,
    PlanTaskStatus,
    ToolCallStatus,
    ToolEffect,
    TurnMode,
)


def test_snapshot_to_data_shapes_the_api_answer() -> None:
    snapshot = AgentSnapshot(
        state=AgentState(status=AgentStatus.RUNNING_TOOLS, turn_number=1, turn_id="turn-1"),
        messages=[
            AgentMessage(
                sequence=1,
                role=MessageRole.USER,
                text="find cats",
                framework_item={"secret": "framework detail"},
                turn_id="turn-1",
            )
        ],
        pending_interrupts=[
            AgentInterrupt(
                interrupt_id="int-1",
                tool_call_id="call-1",
                tool_name="files__write",
                arguments='{"path": "a"}',
                deadline=datetime(2026, 1, 1, tzinfo=UTC),
                turn_id="turn-1",
            )
        ],
        tool_calls=[
            AgentToolCall(
                tool_call_id="call-1",
                tool_name="files__write",
                arguments='{"path": "a"}',
                effect=ToolEffect.NON_IDEMPOTENT_WRITE,
                requires_approval=True,
                status=ToolCallStatus.AWAITING_APPROVAL,
                deferral_order=0,
                turn_id="turn-1",
            )
        ],
        usage=AgentUsage(input_tokens=3, output_tokens=4, requests=1),
        queued_message_count=2,
        last_turn_error=None,
        queued_messages=[
            AgentQueuedMessage(
                message_id="0190-a",
                text="and dogs",
                plan_mode=True,
                created_at=datetime(2026, 1, 1, 12, tzinfo=UTC),
                client_id="c1",
            )
        ],
        steered_messages=[AgentQueuedMessage(message_id="0190-b", text="birds instead")],
    )
    data = session_data.snapshot_to_data(snapshot)
    assert data["status"] == "running_tools"
    assert data["messages"] == [
        {
            "sequence": 1,
            "role": "user",
            "text": "find cats",
            "turn_id": "turn-1",
            "created_at": None,
        }
    ]
    assert data["has_older_messages"] is False
    assert data["pending_interrupts"][0]["deadline"] == "2026-01-01T00:00:00+00:00"
    assert data["tool_calls"][0]["effect"] == "non_idempotent_write"
    assert data["tool_calls"][0]["status"] == str(ToolCallStatus.AWAITING_APPROVAL)
    assert data["usage"]["output_tokens"] == 4
    assert data["queued_message_count"] == 2
    # Listed under the sender's client_id when it has one, else the Channel message ID.
    assert data["queued_messages"] == [
        {
            "id": "c1",
            "text": "and dogs",
            "plan_mode": True,
            "created_at": "2026-01-01T12:00:00+00:00",
        }
    ]
    assert data["steered_messages"] == [
        {"id": "0190-b", "text": "birds instead", "plan_mode": False, "created_at": None}
    ]
    assert data["last_turn_error"] is None
    assert data["awaiting_approval"] is True
    assert "framework detail" not in repr(data)


def test_messages_link_tool_results_to_their_calls() -> None:
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "search__web_search", "arguments": '{"query": "cats"}'},
    }
    assistant = AgentMessage(
        sequence=2,
        role=MessageRole.ASSISTANT,
        text="",
        turn_id="turn-1",
        framework_item={
            "role": "assistant",
            "content": None,
            "tool_calls": [call],
            "thinking_blocks": [{"signature": "opaque"}],
        },
    )
    result = AgentMessage(
        sequence=3,
        role=MessageRole.TOOL,
        text="3 results",
        turn_id="turn-1",
        framework_item={"role": "tool", "tool_call_id": "call_1", "content": "3 results"},
        created_at=datetime(2026, 12, 5, 9, 30, tzinfo=UTC),
    )
    assert session_data.message_to_data(assistant) == {
        "sequence": 2,
        "role": "assistant",
        "text": "",
        "turn_id": "turn-1",
        "created_at": None,
        "tool_calls": [
            {"id": "call_1", "name": "search__web_search", "arguments": '{"query": "cats"}'}
        ],
    }
    assert session_data.message_to_data(result) == {
        "sequence": 3,
        "role": "tool",
        "text": "3 results",
        "turn_id": "turn-1",
        "created_at": "2026-12-05T09:30:00+00:00",
        "tool_call_id": "call_1",
    }


def test_snapshot_to_data_shapes_questions_waits_and_plans() -> None:
    snapshot = AgentSnapshot(
        state=AgentState(
            status=AgentStatus.WAITING_FOR_USER_INPUT,
            turn_number=2,
            turn_id="turn-2",
            turn_mode=TurnMode.EXECUTING,
        ),
        messages=[],
        pending_interrupts=[],
        tool_calls=[],
        usage=AgentUsage(),
        queued_message_count=0,
        pending_input=PendingUserInput("call_3", "Which colour?", ["red", "blue"], "turn-2"),
        pending_timer=PendingTimer(
            "call_2", datetime(2026, 1, 1, 13, tzinfo=UTC), 3600, "cooling off", "turn-2"
        ),
        plan=AgentPlan(
            3,
            PlanStatus.ACTIVE,
            [
                PlanTask("step one", PlanTaskStatus.COMPLETED),
                PlanTask("step two", PlanTaskStatus.IN_PROGRESS),
                PlanTask("step three"),
            ],
        ),
        plan_execution_requested=True,
    )
    data = session_data.snapshot_to_data(snapshot)
    assert data["status"] == "waiting_for_user_input"
    assert data["turn_mode"] == "executing"
    assert data["pending_input"] == {
        "call_id": "call_3",
        "prompt": "Which colour?",
        "choices": ["red", "blue"],
    }
    assert data["pending_timer"] == {
        "call_id": "call_2",
        "fires_at": "2026-01-01T13:00:00+00:00",
        "duration_seconds": 3600,
        "reason": "cooling off",
    }
    assert data["plan"] == {
        "revision": 3,
        "status": "active",
        "tasks": [
            {"content": "step one", "status": "completed"},
            {"content": "step two", "status": "in_progress"},
            {"content": "step three", "status": "pending"},
        ],
    }
    assert data["plan_execution_requested"] is True


def test_snapshot_to_data_shapes_the_questions_of_mcp_servers() -> None:
    asked = datetime(2026, 1, 1, 12, tzinfo=UTC)
    form = AgentElicitation(
        elicitation_id="turn-1.call_1.0123456789abcdef",
        tool_call_id="call_1",
        tool_name="everything__trigger-elicitation-request",
        turn_id="turn-1",
        server_name="everything",
        mode="form",
        message="Who are you?",
        requested_schema={"type": "object", "properties": {"name": {"type": "string"}}},
        url="",
        server_elicitation_id="",
        requested_at=asked,
        deadline=asked + timedelta(minutes=10),
    )
    link = replace(
        form,
        elicitation_id="turn-1.call_2.fedcba9876543210",
        tool_call_id="call_2",
        mode="url",
        message="Sign in",
        requested_schema=None,
        url="https://example.com/sign-in",
        server_elicitation_id="sign-in-1",
    )
    snapshot = AgentSnapshot(
        state=AgentState(status=AgentStatus.RUNNING_TOOLS, turn_number=1, turn_id="turn-1"),
        messages=[],
        pending_interrupts=[],
        tool_calls=[],
        usage=AgentUsage(),
        queued_message_count=0,
        pending_elicitations=[form, link],
    )
    data = session_data.snapshot_to_data(snapshot)
    # Dex keeps JSON keys sorted; the server's order of the properties comes back.
    ordered = replace(
        form,
        requested_schema={"properties": {"a": {"type": "string"}, "b": {"type": "string"}}},
        field_order=["b", "a"],
    )
    shaped = session_data.elicitation_to_data(ordered)
    assert list(shaped["requested_schema"]["properties"]) == shaped["field_order"] == ["b", "a"]
    assert data["pending_elicitations"] == [
        {
            "kind": "elicitation",
            "elicitation_id": "turn-1.call_1.0123456789abcdef",
            "call_id": "call_1",
            "tool_name": "everything__trigger-elicitation-request",
            "server": "everything",
            "mode": "form",
            "message": "Who are you?",
            "requested_schema": {"type": "object", "properties": {"name": {"type": "string"}}},
            "field_order": ["name"],
            "url": None,
            "requested_at": "2026-01-01T12:00:00+00:00",
            "deadline": "2026-01-01T12:10:00+00:00",
        },
        {
            "kind": "elicitation",
            "elicitation_id": "turn-1.call_2.fedcba9876543210",
            "call_id": "call_2",
            "tool_name": "everything__trigger-elicitation-request",
            "server": "everything",
            "mode": "url",
            "message": "Sign in",
            "requested_schema": None,
            "field_order": [],
            "url": "https://example.com/sign-in",
            "requested_at": "2026-01-01T12:00:00+00:00",
            "deadline": "2026-01-01T12:10:00+00:00",
        },
    ]


def test_snapshot_before_start_reports_starting() -> None:
    snapshot = AgentSnapshot(
        state=None,
        messages=[],
        pending_interrupts=[],
        tool_calls=[],
        usage=AgentUsage(),
        queued_message_count=0,
    )
    data = session_data.snapshot_to_data(snapshot)
    assert data["status"] == "starting"
    assert data["turn_mode"] == "chat"
    assert data["pending_input"] is data["pending_timer"] is data["plan"] is None
    assert data["plan_execution_requested"] is False
    assert data["pending_elicitations"] == []
