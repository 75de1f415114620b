"""Plans (platform addition): plan mode, write_todos, execute_plan and Continue, against the real
engine and Worker children."""

from __future__ import annotations

import json
from pathlib import Path

from dex_agents import (
    AgentSessionClient,
    AgentSnapshot,
    PlanStatus,
    PlanTaskStatus,
)
from dex_agents.testing import FileGate, wait_for_agent_snapshot
from tests.dex_agents.scripted_agent import STEERING_FLOW_TYPE, invocation_log
from tests.dex_agents.scripted_sessions import (
    last_text,
    running_session,
    user_texts,
    wait_for_idle,
)


def plan_of(snapshot: AgentSnapshot) -> tuple[int, PlanStatus, list[tuple[str, PlanTaskStatus]]]:
    plan = snapshot.plan
    assert plan is not None
    return plan.revision, plan.status, [(task.content, task.status) for task in plan.tasks]


async def planned(sessions: AgentSessionClient, text: str, message_count: int) -> AgentSnapshot:
    assert await sessions.send_user_message("session-1", text, plan_mode=True)
    return await wait_for_idle(sessions, "session-1", message_count=message_count)


async def test_a_plan_is_written_in_plan_mode_then_executed_without_a_user_message(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _):
        snapshot = await planned(sessions, "plan: gather, write", 4)
        assert plan_of(snapshot) == (
            1,
            PlanStatus.DRAFT,
            [("gather", PlanTaskStatus.PENDING), ("write", PlanTaskStatus.PENDING)],
        )
        assert json.loads(snapshot.messages[2].text) == {
            "status": "updated",
            "revision": 1,
            "task_count": 2,
        }

        assert (await sessions.execute_plan("session-1", 2)).reason == "stale_revision"
        accepted = await sessions.execute_plan("session-1", 1)
        assert accepted.accepted, accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=9)
        assert plan_of(snapshot) == (
            3,
            PlanStatus.COMPLETED,
            [("gather", PlanTaskStatus.COMPLETED), ("write", PlanTaskStatus.COMPLETED)],
        )
        assert last_text(snapshot) == "plan complete"
        assert user_texts(snapshot) == ["plan: gather, write"]
        assert not snapshot.plan_execution_requested
        assert (await sessions.execute_plan("session-1", 3)).reason == "not_executable"


async def test_an_unfinished_plan_stays_active_and_continues(tmp_path: Path) -> None:
    async with running_session(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _):
        await planned(sessions, "plan: first, stop here, last", 4)
        assert (await sessions.execute_plan("session-1", 1)).accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=7)
        assert last_text(snapshot) == "stopped at stop here"
        revision, status, tasks = plan_of(snapshot)
        assert (revision, status) == (2, PlanStatus.ACTIVE)
        assert [task_status for _, task_status in tasks] == [
            PlanTaskStatus.COMPLETED,
            PlanTaskStatus.PENDING,
            PlanTaskStatus.PENDING,
        ]

        assert (await sessions.execute_plan("session-1", 1)).reason == "stale_revision"
        assert (await sessions.execute_plan("session-1", 2)).accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=12)
        assert plan_of(snapshot)[:2] == (4, PlanStatus.COMPLETED)
        assert last_text(snapshot) == "plan complete"


async def test_plan_mode_runs_only_write_todos_and_a_revision_retires_the_draft(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _):
        snapshot = await planned(sessions, "plan+lookup: only", 5)
        assert "lookup=failed: Tool call failed: only write_todos can run in plan mode" in (
            last_text(snapshot)
        )
        assert invocation_log(tmp_path).count("tool", "lookup") == 0
        assert plan_of(snapshot)[:2] == (1, PlanStatus.DRAFT)

        snapshot = await planned(sessions, "plan: revised", 9)
        assert plan_of(snapshot) == (2, PlanStatus.DRAFT, [("revised", PlanTaskStatus.PENDING)])
        assert (await sessions.execute_plan("session-1", 1)).reason == "stale_revision"

        # Outside plan mode and plan execution, write_todos fails and the plan stays.
        assert await sessions.send_user_message("session-1", "todo: sneaky")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=13)
        assert "write_todos is available only in plan mode" in last_text(snapshot)
        assert plan_of(snapshot)[0] == 2


async def test_execute_plan_is_refused_while_busy_or_queued(tmp_path: Path) -> None:
    async with running_session(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _):
        await planned(sessions, "plan: one", 4)
        gate = FileGate(tmp_path, "gated_read")
        assert await sessions.send_user_message("session-1", "tools: gated_read")
        await gate.wait_until_reached()
        assert (await sessions.execute_plan("session-1", 1)).reason == "busy"
        assert await sessions.send_user_message("session-1", "queued meanwhile")
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=10)
        assert last_text(snapshot) == "echo: queued meanwhile"
        accepted = await sessions.execute_plan("session-1", 1)
        assert accepted.accepted, accepted
        snapshot = await wait_for_idle(sessions, "session-1", message_count=13)
        assert plan_of(snapshot)[1] is PlanStatus.COMPLETED


async def test_a_plan_update_in_the_same_response_as_a_question_still_applies(
    tmp_path: Path,
) -> None:
    async with running_session(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _):
        await planned(sessions, "plan: ask first, then finish", 4)
        assert (await sessions.execute_plan("session-1", 1)).accepted
        question = await wait_for_agent_snapshot(
            sessions, "session-1", lambda snapshot: snapshot.pending_input, description="question"
        )
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert plan_of(snapshot)[2][0] == ("ask first", PlanTaskStatus.COMPLETED)
        assert await sessions.answer_user_input("session-1", question.tool_call_id, "yes")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=11)
        assert plan_of(snapshot)[1] is PlanStatus.COMPLETED
        assert last_text(snapshot) == "plan complete"
