"""AwaitToolApproval's deadline Timer against resolve_interrupt, driven deterministically.

``skip_timer`` fires a deadline Timer at an exact moment. In the first test the Worker has two
task slots: the SDK keeps one for RPCs, so a gated tool holding the only Step slot stops every
other Step while RPCs are still answered, and a Step queued for a slot holds no locks yet (its
locks are taken when its task goes to the Worker). In the second, ``resolve_interrupt`` of
``GatedResolveFlow`` holds PendingInterrupts at a FileGate while the Timer fires, which is the
seed's race ("Design decisions": "When it resolves an interrupt just as its deadline Timer fires,
AwaitToolApproval waits again and applies the answer").
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
from dex import StepExecutionId, TimerId
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_agents import ToolCallStatus
from dex_agents._approval_steps import DEADLINE_TIMER_ID
from dex_agents.testing import (
    EXECUTE_COMPLETED_EVENT,
    AgentTestStack,
    FileGate,
)
from tests.dex_agents.scripted_agent import (
    DEADLINE_FLOW_TYPE,
    GATED_RESOLVE_FLOW_TYPE,
    LONG_DEADLINE_FLOW_TYPE,
    RESOLVE_GATE,
    WORKER_SLOTS_ENV,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    flow_of,
    last_text,
    running_session,
    scripted_stack,
    wait_for_idle,
    wait_for_interrupt,
    wait_for_step_waiting,
)


async def approval_steps(stack: AgentTestStack, session_id: str) -> dict[str, int]:
    """``step_execution_id -> phase`` of the session's active AwaitToolApproval executions."""
    async with grpc.aio.insecure_channel(stack.server_address) as channel:
        state = await dex_pb2_grpc.FlowServiceStub(channel).GetFlowState(
            pb.GetFlowStateRequest(flow_id=session_id), timeout=10
        )
    return {
        step.step_execution_id: step.phase
        for step in state.active_step_executions
        if step.step_type == "AwaitToolApproval"
    }


async def wait_for_approval_wait(stack: AgentTestStack, session_id: str, number: int) -> None:
    """Until ``AwaitToolApproval-<number>`` waits on its answer and deadline Timer."""
    await wait_for_step_waiting(stack, session_id, f"AwaitToolApproval-{number}")


async def skip_deadline_timer(stack: AgentTestStack, session_id: str, number: int) -> None:
    await stack.client.skip_timer(
        session_id,
        StepExecutionId("AwaitToolApproval", number),
        TimerId(condition_id=DEADLINE_TIMER_ID),
    )


async def executed(stack: AgentTestStack, session_id: str, step_type: str) -> list[str]:
    return [
        entry.step_execution_id
        for entry in await stack.read_step_history(session_id)
        if entry.event_type == EXECUTE_COMPLETED_EVENT and entry.step_type == step_type
    ]


async def test_deadline_timer_and_locks_with_the_only_step_slot_taken(tmp_path: Path) -> None:
    async with scripted_stack(tmp_path, worker_env={WORKER_SLOTS_ENV: "2"}) as stack:
        plain = stack.sessions(flow_of(stack))
        waiting = stack.sessions(flow_of(stack, LONG_DEADLINE_FLOW_TYPE))
        expiring = stack.sessions(flow_of(stack, DEADLINE_FLOW_TYPE))
        await stack.start_worker()

        # A Timer that fires before the deadline waits again; nothing is decided.
        await waiting.start_session("waiting", "tools: refund")
        await wait_for_approval_wait(stack, "waiting", 1)
        await skip_deadline_timer(stack, "waiting", 1)
        await wait_for_approval_wait(stack, "waiting", 2)
        assert await executed(stack, "waiting", "AwaitToolApproval") == ["AwaitToolApproval-1"]
        snapshot = await waiting.get_agent_snapshot("waiting")
        assert [item.tool_name for item in snapshot.pending_interrupts] == ["refund"]
        assert snapshot.tool_calls[0].status is ToolCallStatus.AWAITING_APPROVAL
        interrupt = snapshot.pending_interrupts[0]

        # The gated read takes the only Step slot: from here on no other Step runs, while RPCs
        # are still answered.
        gate = FileGate(tmp_path, "gated_read")
        await expiring.start_session("expiring", "tools: gated_read, refund")
        await gate.wait_until_reached()
        expiring_interrupt = await wait_for_interrupt(expiring, "expiring")
        assert expiring_interrupt.deadline is not None

        # AgentSnapshot.state is None until StartAgentSession commits.
        await plain.start_session("not-started", "hello")
        unstarted = await plain.get_agent_snapshot("not-started")
        assert unstarted.state is None
        assert unstarted.messages == []

        # Once the Timer fires (committed before skip_timer returns), AwaitToolApproval's execute
        # is queued behind the gated read. It takes PendingInterrupts only when a Worker slot
        # runs it, so the RPC that locks PendingInterrupts is answered now instead of meeting
        # RpcLockConflictError (which AgentSessionClient would retry for 5 seconds, then raise).
        await skip_deadline_timer(stack, "waiting", 2)
        assert (await approval_steps(stack, "waiting")).get(
            "AwaitToolApproval-2"
        ) == pb.ACTIVE_STEP_PHASE_ACTIVE
        assert await waiting.resolve_interrupt("waiting", interrupt.interrupt_id, approved=True)
        assert await executed(stack, "waiting", "AwaitToolApproval") == ["AwaitToolApproval-1"]

        gate.release()
        snapshot = await wait_for_idle(expiring, "expiring", message_count=4)
        assert last_text(snapshot).startswith(
            "gated_read=succeeded: gated_read ok; refund=rejected: "
            "Tool call was rejected and did not run: No approval before the deadline"
        )
        snapshot = await wait_for_idle(plain, "not-started", message_count=2)
        assert last_text(snapshot) == "echo: hello"

        # The early Timer's execute finds the interrupt answered and the answer is applied.
        snapshot = await wait_for_idle(waiting, "waiting", message_count=4)
        assert last_text(snapshot) == "refund=succeeded: refund ok"
        assert invocation_log(tmp_path).count("tool", "refund") == 1


async def test_resolve_racing_the_deadline_timer_waits_again_and_applies_the_answer(
    tmp_path: Path,
) -> None:
    async with running_session(
        tmp_path, "tools: refund", flow_type=GATED_RESOLVE_FLOW_TYPE, session_id="racing"
    ) as (stack, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "racing")
        await wait_for_approval_wait(stack, "racing", 1)

        # The RPC holds PendingInterrupts at the gate; the Timer fires meanwhile, so the wait
        # ends by the Timer and AwaitToolApproval's execute queues behind the RPC's lock.
        gate = FileGate(tmp_path, RESOLVE_GATE)
        resolving = asyncio.create_task(
            sessions.resolve_interrupt("racing", interrupt.interrupt_id, approved=True)
        )
        await gate.wait_until_reached()
        await skip_deadline_timer(stack, "racing", 1)
        gate.release()
        assert await resolving

        snapshot = await wait_for_idle(sessions, "racing", message_count=4)
        assert last_text(snapshot) == "refund=succeeded: refund ok"
        assert await executed(stack, "racing", "AwaitToolApproval") == [
            "AwaitToolApproval-1",
            "AwaitToolApproval-2",
        ], "the Timer's execute found the interrupt answered, waited again, then applied it"
        assert invocation_log(tmp_path).count("tool", "refund") == 1
