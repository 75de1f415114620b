"""The floor of ``bench/turn.py``: the agent turn's Step graph with handlers that do nothing.

``FloorFlow`` moves through the same Steps and tasks as one ``dex_agents`` turn, on the same
engine, SDK and pull worker: a start Step, a model Step that fans out to three tool Steps and a
resume Step whose ``wait_for`` waits for the three tools' Channel messages, the second model
Step, and a Step that waits for the next message (a ``wait_for`` task) — nine Step tasks — then
one RPC that reads the answer. No Attributes are loaded, no Stream is written, no heartbeat is
sent. What this costs is what the Dex protocol, the unchanged ``dex-python-sdk`` worker and the
engine cost for the turn's shape before ``dex_agents`` does any work; ``bench/turn.py`` prints
it beside the real turn.

Run as the floor's Worker child: ``python -m bench.turn_floor`` (``DEX_SERVER_ADDRESS`` set).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from dex import (
    AsyncContext,
    Attribute,
    Channel,
    Context,
    Flow,
    PersistenceSchema,
    RPCResult,
    Step,
    StepDecision,
    StepExecutionId,
    StepList,
    StepMovement,
    Wait,
    WaitForStepCompletionOptions,
    dead_end,
    go_to,
    go_to_many,
    rpc,
)

FLOW_TYPE = "TurnFloor"
#: The tools' results, as ``TOOL_CALL_RESULTS`` of a session.
RESULTS: Channel[int] = Channel("FLOOR_RESULTS", int)
#: The next user message, as ``QUEUED_USER_MESSAGES`` (never sent).
INBOX: Channel[str] = Channel("FLOOR_INBOX", str)
#: The turn's answer, set by the second model Step.
ANSWER: Attribute[str] = Attribute("FLOOR_ANSWER", str)
ANSWER_TEXT = "done"
TOOLS = 3


class FloorStart(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        return go_to(FloorModel, 1)


class FloorModel(Step[int]):
    """Model call ``input``: the first asks for the tools, the second answers."""

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        if input == 1:
            return go_to_many(
                *(StepMovement.of(FloorTool, index) for index in range(TOOLS)),
                StepMovement.of(FloorResume, TOOLS),
            )
        ANSWER.set(context, ANSWER_TEXT)
        return go_to(FloorAwaitMessage, 0)


class FloorTool(Step[int]):
    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        RESULTS.publish(context, input)
        return dead_end()


class FloorResume(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:  # type: ignore[override]
        return Wait.until(RESULTS.for_n(input))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        return go_to(FloorModel, 2)


class FloorAwaitMessage(Step[int]):
    async def wait_for(self, context: AsyncContext, input: int) -> Wait:  # type: ignore[override]
        return Wait.until(INBOX.for_n(1))

    async def execute(self, context: AsyncContext, input: int) -> StepDecision:  # type: ignore[override]
        return dead_end()


class FloorFlow(Flow[int]):
    """The turn's Step graph with empty handlers (module docstring)."""

    def get_flow_type(self) -> str:
        return FLOW_TYPE

    def get_steps(self) -> StepList[int]:
        return StepList.start_step(FloorStart()).other_steps(
            FloorModel(), FloorTool(), FloorResume(), FloorAwaitMessage()
        )

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of(RESULTS, INBOX, ANSWER)

    @rpc()
    def get_answer(self, context: Context) -> RPCResult[str]:
        return RPCResult(ANSWER.get(context) or "")


async def floor_turn(client: Any, flow: FloorFlow, flow_id: str) -> None:
    """One floor turn, observed as ``bench/turn.py`` observes ours: start the Flow, wait for
    the second model Step (one ``WaitForStepCompletion`` long poll), read the answer by RPC.

    Raises:
        AssertionError: If the RPC does not return the answer.
    """
    await client.start_flow(flow, flow_id, 0)
    await client.wait_for_step_completion(
        flow_id,
        StepExecutionId("FloorModel", 2),
        WaitForStepCompletionOptions(request_timeout=timedelta(seconds=30)),
    )
    answer = await client.invoke_rpc(flow.get_answer, flow_id)
    assert answer == ANSWER_TEXT, answer


if __name__ == "__main__":
    from dex_agents.testing import run_agent_worker

    run_agent_worker([FloorFlow()])
