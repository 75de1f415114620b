"""Durable waits and questions survive a SIGKILLed dexworker, end to end: the real engine, web,
demo model and ``manage.py dexworker`` as processes (``tests/e2e/relay_stack.py``).

The demo model's ``/wait`` and ``/ask`` directives call the session's built-in ``durable_wait``
and ``request_user_input`` tools. Each test kills the worker while the session waits, starts a
new one, and checks that the wait ends once and the question is answered once.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from dex_agents import EXECUTE_COMPLETED_EVENT
from tests.e2e.conftest import PYTHON, wait_until
from tests.e2e.relay_stack import Stack, dex_client, running_stack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("durable-kill")) as platform:
        yield platform


def start(stack: Stack, message: str) -> str:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
        assert created.status_code == 201, created.text
        return str(created.json()["id"])


def snapshot(stack: Stack, session_id: str) -> Any:
    async def read() -> Any:
        from dex_agents import AgentSessionClient

        async with dex_client(stack.engine_address) as (client, flow):
            return await AgentSessionClient(client, flow).get_agent_snapshot(session_id)

    return asyncio.run(read())


def wait_for_step_waiting(stack: Stack, session_id: str, execution_id: str) -> None:
    """Until the engine shows ``execution_id`` (``"DurableWait-1"``) waiting: its wait_for
    committed, so its Timer or Channel wait is in place.

    The snapshot lists the wait or the question as soon as the Step that raised it commits,
    before the waiting Step's wait_for has run on the worker; a kill in between would land on
    that wait_for, not on the wait these tests are about.
    """
    import grpc
    from dex.dexpb import dex_pb2 as pb
    from dex.dexpb import dex_pb2_grpc

    async def phase() -> int | None:
        async with grpc.aio.insecure_channel(stack.engine_address) as channel:
            state = await dex_pb2_grpc.FlowServiceStub(channel).GetFlowState(
                pb.GetFlowStateRequest(flow_id=session_id), timeout=10
            )
        return next(
            (step.phase for step in state.active_step_executions
             if step.step_execution_id == execution_id),
            None,
        )

    wait_until(
        f"{execution_id} of {session_id} to wait",
        lambda: asyncio.run(phase()) == pb.ACTIVE_STEP_PHASE_WAITING,
        timeout=30,
    )


def replace_worker(stack: Stack) -> None:
    """SIGKILL the running dexworker (its whole process group) and start a new one."""
    worker = next(proc for proc in reversed(stack.processes.started) if proc.name == "worker")
    worker.signal_group(9)
    worker.popen.wait(timeout=30)
    fresh = stack.processes.start(
        "worker", [PYTHON, "manage.py", "dexworker", "--max-concurrent-tasks", "32"]
    )
    fresh.wait_for_line("dexworker ready")


def finished_text(stack: Stack, session_id: str) -> str:
    """The last message once the session waits for a user message again."""

    def done() -> str | None:
        with stack.api("owner") as owner:
            body = owner.get(f"/api/v1/sessions/{session_id}/").json()
        if body.get("status") != "waiting_for_user_message" or not body.get("messages"):
            return None
        return str(body["messages"][-1]["text"])

    return str(wait_until(f"{session_id} to finish its turn", done, timeout=60))


def completed_steps(stack: Stack, session_id: str, step_type: str) -> int:
    with stack.api("owner") as owner:
        history = owner.get(f"/api/v1/sessions/{session_id}/history/").json()
    return sum(
        1
        for entry in history
        if entry["step_type"] == step_type and entry["event_type"] == EXECUTE_COMPLETED_EVENT
    )


def test_a_durable_wait_ends_once_after_the_worker_is_killed(stack: Stack) -> None:
    session_id = start(stack, "/wait 3600 cooling off")
    timer = wait_until(
        "the durable wait", lambda: snapshot(stack, session_id).pending_timer, timeout=30
    )
    assert (timer.duration_seconds, timer.reason) == (3600, "cooling off")
    wait_for_step_waiting(stack, session_id, "DurableWait-1")
    replace_worker(stack)
    assert snapshot(stack, session_id).pending_timer == timer

    async def fire() -> None:
        from dex import StepExecutionId, TimerId

        from dex_agents._builtin_steps import DURABLE_WAIT_TIMER_ID

        async with dex_client(stack.engine_address) as (client, _flow):
            await client.skip_timer(
                session_id,
                StepExecutionId("DurableWait", 1),
                TimerId(condition_id=DURABLE_WAIT_TIMER_ID),
            )

    asyncio.run(fire())
    text = finished_text(stack, session_id)
    assert text.startswith("Here is what the tools returned:\n- ")
    result = json.loads(text.split("- ", 1)[1])
    assert result == {"status": "completed", "duration_seconds": 3600, "reason": "cooling off"}
    assert completed_steps(stack, session_id, "DurableWait") == 1


def test_a_question_is_answered_once_after_the_worker_is_killed(stack: Stack) -> None:
    session_id = start(stack, "/ask Which colour? | red | blue")
    question = wait_until(
        "the question", lambda: snapshot(stack, session_id).pending_input, timeout=30
    )
    assert (question.prompt, question.choices) == ("Which colour?", ["red", "blue"])
    wait_for_step_waiting(stack, session_id, "AwaitUserInput-1")
    replace_worker(stack)

    async def answer(text: str) -> bool:
        from dex_agents import AgentSessionClient

        async with dex_client(stack.engine_address) as (client, flow):
            sessions = AgentSessionClient(client, flow)
            return await sessions.answer_user_input(session_id, question.tool_call_id, text)

    assert asyncio.run(answer("red"))
    assert not asyncio.run(answer("blue"))
    assert finished_text(stack, session_id) == "You said: red"
    assert completed_steps(stack, session_id, "AwaitUserInput") == 1
    with stack.api("owner") as owner:
        messages = owner.get(f"/api/v1/sessions/{session_id}/").json()["messages"]
    assert [message["text"] for message in messages if message["role"] == "user"] == [
        "/ask Which colour? | red | blue",
        "red",
    ]
