"""How a stopped session's snapshot reads (``session_reads.snapshot_as_stopped``)."""

from typing import Any

from agents_app.selectors.session_reads import snapshot_as_stopped


def test_open_tool_calls_of_a_stopped_session_end_as_they_will() -> None:
    """A fresh-clone trial saw a stopped session still list its call as awaiting approval."""
    snapshot: dict[str, Any] = {
        "status": "running_tools",
        "pending_interrupts": [{"interrupt_id": "turn-1.call_1"}],
        "pending_elicitations": [{"kind": "elicitation", "call_id": "call_2"}],
        "tool_calls": [
            {"id": "call_1", "status": "awaiting_approval"},
            {"id": "call_2", "status": "pending"},
            {"id": "call_3", "status": "approved"},
            {"id": "call_4", "status": "succeeded"},
            {"id": "call_5", "status": "rejected"},
        ],
    }
    stopped = snapshot_as_stopped(snapshot=snapshot)
    assert stopped["status"] == "stopped"
    assert stopped["pending_interrupts"] == []
    # Nobody waits for the answer of an MCP server's question any more.
    assert stopped["pending_elicitations"] == []
    assert [call["status"] for call in stopped["tool_calls"]] == [
        "cancelled", "outcome_unknown", "outcome_unknown", "succeeded", "rejected",
    ]
    assert snapshot["tool_calls"][0]["status"] == "awaiting_approval"  # the input is untouched
