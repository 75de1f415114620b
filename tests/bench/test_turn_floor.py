"""The floor of ``bench/turn.py`` (``bench/turn_floor.py``) on the real engine and a real pull
worker: one floor turn goes through the agent turn's Steps and answers its RPC."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dex import FlowStatus, StepExecutionId, WaitForStepCompletionOptions

from bench.turn_floor import TOOLS, FloorFlow, floor_turn
from dex_agents.testing import AgentTestStack

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


async def test_a_floor_turn_runs_the_turns_steps_and_waits_for_the_next_message(
    tmp_path: Path,
) -> None:
    flow = FloorFlow()
    async with AgentTestStack(
        tmp_path, [flow], "bench.turn_floor", worker_cwd=REPOSITORY_ROOT
    ) as stack:
        await stack.start_worker()
        await floor_turn(stack.client, flow, "floor-1")
        options = WaitForStepCompletionOptions(request_timeout=timedelta(seconds=5))
        # Every tool Step ran, each once, and the Flow went on to wait for a message.
        for number in range(1, TOOLS + 1):
            await stack.client.wait_for_step_completion(
                "floor-1", StepExecutionId("FloorTool", number), options
            )
        info = await stack.client.describe_flow("floor-1")
        assert info.status == FlowStatus.RUNNING
