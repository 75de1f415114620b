"""Subagents end to end (issue 29): the real engine, web, demo model and ``manage.py dexworker``
as processes (``tests/e2e/relay_stack.py``).

The seeded ``demo-lead`` agent has the demo agent as its subagent (``agent__demo``). Its demo
model's ``/tool agent__demo {"task": ...}`` line starts a child session of the demo agent whose
task is itself a ``/tool`` line: a write that waits for a staff approval. The worker is
SIGKILLed while the child waits; after the approval the child runs the write once and the
parent's call gets the child's answer once.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_durable_kill import (
    completed_steps,
    finished_text,
    replace_worker,
    wait_for_step_waiting,
)

pytestmark = pytest.mark.e2e

POST_HI = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "hi"})


def child_approval_probe(
    stack: Any, parent_id: str, *, approver: str = "staff"
) -> Callable[[], dict[str, Any] | None]:
    """A probe for ``wait_until``: the pending approval of ``parent_id``'s child, as
    ``approver`` lists it (``GET /api/v1/approvals/``), or None. ``stack`` is a relay or page
    stack (both have ``api(persona)``)."""

    def child_approval() -> dict[str, Any] | None:
        with stack.api(approver) as api:
            items = api.get("/api/v1/approvals/").json()
        return next((item for item in items if item["parent_session"] == parent_id), None)

    return child_approval


def start_parent_with_waiting_child(
    stack: Any, task: str, *, approver: str = "staff", timeout: float = 60
) -> tuple[str, dict[str, Any]]:
    """Start a ``demo-lead`` session whose subagent call gets ``task``, and wait until the
    child's approval is listed: ``(parent session ID, the pending approval)``."""
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={
            "agent": "demo-lead", "message": "/tool agent__demo " + json.dumps({"task": task})})
        assert created.status_code == 201, created.text
        parent_id = str(created.json()["id"])
    probe = child_approval_probe(stack, parent_id, approver=approver)
    return parent_id, wait_until("the child's approval", probe, timeout=timeout)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("subagents")) as platform:
        yield platform


def test_a_child_approval_completes_the_parents_call_once_across_a_worker_kill(
    stack: Stack,
) -> None:
    parent_id, pending = start_parent_with_waiting_child(stack, POST_HI)
    child_id = str(pending["session"])
    assert child_id == f"SubFlow:{parent_id}-CallSubagent-1-0"
    assert pending["parent_session_title"]
    assert pending["tool_name"] == "slack__post_message"
    wait_for_step_waiting(stack, child_id, "AwaitToolApproval-1")

    replace_worker(stack)

    with stack.api("owner") as owner:
        child = owner.get(f"/api/v1/sessions/{child_id}/")
        assert child.status_code == 200, child.text
        parent = owner.get(f"/api/v1/sessions/{parent_id}/").json()
    call = next(item for item in parent["tool_calls"] if item["tool_name"] == "agent__demo")
    assert call["child_session_id"] == child_id and call["subagent"] is True

    with stack.api("staff") as staff:
        decided = staff.post(
            f"/api/v1/sessions/{child_id}/interrupts/{pending['interrupt_id']}/",
            json={"approved": True},
        )
        assert decided.status_code == 200, decided.text

    text = finished_text(stack, parent_id)
    assert text.startswith("Here is what the tools returned:\n- ")
    assert "general" in text and "hi" in text
    assert completed_steps(stack, parent_id, "CallSubagent") == 1
    assert completed_steps(stack, child_id, "StartAgentSession") == 1
    assert completed_steps(stack, child_id, "CallSingleAttemptTool") == 1

    def child_stopped() -> dict[str, Any] | None:
        with stack.api("owner") as owner:
            rows = owner.get("/api/v1/sessions/", params={"status": "stopped"}).json()
        items = rows["results"] if isinstance(rows, dict) else rows
        return next(
            (row for row in items if row["id"] == child_id and row["status"] == "stopped"), None
        )

    wait_until("the child indexed as stopped", child_stopped, timeout=30)


def test_stopping_the_parent_stops_its_running_child(stack: Stack) -> None:
    parent_id, pending = start_parent_with_waiting_child(stack, POST_HI)
    child_approval = child_approval_probe(stack, parent_id)
    child_id = str(pending["session"])
    with stack.api("owner") as owner:
        stopped = owner.post(f"/api/v1/sessions/{parent_id}/stop/")
        assert stopped.status_code in (200, 202, 204), stopped.text
        child = owner.get(f"/api/v1/sessions/{child_id}/").json()
    assert child["status"] == "stopped"
    assert child_approval() is None
