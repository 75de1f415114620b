"""Running scripted sessions in the dex_agents tests: the stack, a started session, a session
held at a gate, and the waits and reads the tests share.

Every test here runs the real engine and Worker child processes (``dex_agents.testing``) with
the scripted runner (``tests.dex_agents.scripted_agent``). The test modules import these
helpers from here rather than from one another.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_agents import (
    AgentInterrupt,
    AgentSessionClient,
    AgentSessionFlow,
    AgentSnapshot,
    AgentStatus,
    MessageRole,
    ToolPolicy,
)
from dex_agents.testing import (
    AgentTestStack,
    FileGate,
    WorkerProcess,
    wait_for_agent_snapshot,
    wait_until,
)
from tests.dex_agents.scripted_agent import FLOW_TYPE, STATE_DIR_ENV, build_flows, changes_path

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
WORKER_MODULE = "tests.dex_agents.scripted_worker"
TURN_TIMEOUT = 40.0
#: The session most tests start.
SESSION_ID = "session-1"


@asynccontextmanager
async def scripted_stack(
    tmp_path: Path, *, worker_env: Mapping[str, str] | None = None
) -> AsyncIterator[AgentTestStack]:
    """An engine and the scripted Flows under ``tmp_path``; Workers run ``WORKER_MODULE`` with
    the state directory and ``worker_env`` in their environment. No Worker is started."""
    async with AgentTestStack(
        tmp_path,
        build_flows(),
        WORKER_MODULE,
        worker_cwd=REPOSITORY_ROOT,
        worker_env={STATE_DIR_ENV: str(tmp_path), **(worker_env or {})},
    ) as stack:
        yield stack


def flow_of(stack: AgentTestStack, flow_type: str = FLOW_TYPE) -> AgentSessionFlow:
    flow = next(flow for flow in stack.flows if flow.get_flow_type() == flow_type)
    assert isinstance(flow, AgentSessionFlow)
    return flow


class RunningSession(NamedTuple):
    """A started session: its stack, its Flow's client, and its Worker."""

    stack: AgentTestStack
    sessions: AgentSessionClient
    worker: WorkerProcess


class SessionAtGate(NamedTuple):
    """A started session whose Worker waits at ``gate`` until the test releases it."""

    stack: AgentTestStack
    sessions: AgentSessionClient
    worker: WorkerProcess
    gate: FileGate


@asynccontextmanager
async def running_session(
    tmp_path: Path,
    message: str = "",
    *,
    flow_type: str = FLOW_TYPE,
    session_id: str = SESSION_ID,
    agent_config: dict[str, Any] | None = None,
    tool_policies: Mapping[str, ToolPolicy] | None = None,
) -> AsyncIterator[RunningSession]:
    """A scripted stack with one Worker, and session ``session_id`` of ``flow_type`` started
    with ``message`` (a blank one starts no turn), ``agent_config`` and ``tool_policies``."""
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, flow_type))
        worker = await stack.start_worker()
        await sessions.start_session(
            session_id, message, agent_config=agent_config, tool_policies=tool_policies
        )
        yield RunningSession(stack, sessions, worker)


@asynccontextmanager
async def session_at_gate(
    tmp_path: Path,
    gate: str = "gated_read",
    message: str | None = None,
    *,
    flow_type: str = FLOW_TYPE,
) -> AsyncIterator[SessionAtGate]:
    """``running_session`` started with ``message`` (by default ``"tools: <gate>"``), once its
    Worker reached the ``FileGate`` named ``gate`` (a gated tool, or the scripted model's
    ``model_stream`` and ``model_hold``). The test releases the gate.

    Raises:
        TimeoutError: The gate is not reached within the kit's default deadline.
    """
    text = f"tools: {gate}" if message is None else message
    async with running_session(tmp_path, text, flow_type=flow_type) as (stack, sessions, worker):
        held = FileGate(tmp_path, gate)
        await held.wait_until_reached()
        yield SessionAtGate(stack, sessions, worker, held)


async def wait_for_idle(
    sessions: AgentSessionClient, session_id: str, *, message_count: int
) -> AgentSnapshot:
    """The snapshot once the session waits for a user message with ``message_count`` messages."""

    def idle(snapshot: AgentSnapshot) -> AgentSnapshot | None:
        state = snapshot.state
        if (
            state is not None
            and state.status is AgentStatus.WAITING_FOR_USER_MESSAGE
            and state.message_count >= message_count
        ):
            return snapshot
        return None

    return await wait_for_agent_snapshot(
        sessions,
        session_id,
        idle,
        description=f"idle with {message_count} messages",
        timeout=TURN_TIMEOUT,
    )


async def wait_for_interrupt(sessions: AgentSessionClient, session_id: str) -> AgentInterrupt:
    return await wait_for_agent_snapshot(
        sessions,
        session_id,
        lambda snapshot: next(iter(snapshot.pending_interrupts), None),
        description="a pending approval",
    )


async def wait_for_step_waiting(
    stack: AgentTestStack, session_id: str, execution_id: str
) -> pb.ActiveStepExecutionState:
    """Until the Step execution ``execution_id`` (``"AwaitToolApproval-1"``) waits: its wait_for
    committed, so its Timers exist in the engine. Returns the engine's view of that execution.

    The snapshot shows a pending approval, question or durable wait as soon as the Step that
    raised it commits, before the waiting Step's wait_for has run on a Worker; a test that acts
    "while the session waits" polls for this first.

    Raises:
        TimeoutError: If the execution does not wait within the kit's default deadline.
    """

    async def waiting() -> pb.ActiveStepExecutionState | None:
        async with grpc.aio.insecure_channel(stack.server_address) as channel:
            state = await dex_pb2_grpc.FlowServiceStub(channel).GetFlowState(
                pb.GetFlowStateRequest(flow_id=session_id), timeout=10
            )
        for step in state.active_step_executions:
            if (
                step.step_execution_id == execution_id
                and step.phase == pb.ACTIVE_STEP_PHASE_WAITING
            ):
                return step
        return None

    description = f"{session_id} {execution_id} waiting"
    step: pb.ActiveStepExecutionState = await wait_until(description, waiting)
    return step


def last_text(snapshot: AgentSnapshot) -> str:
    return snapshot.messages[-1].text


def user_texts(snapshot: AgentSnapshot) -> list[str]:
    """The snapshot's user messages, oldest first."""
    return [message.text for message in snapshot.messages if message.role is MessageRole.USER]


async def events_of(stack: AgentTestStack, session_id: str, flow_type: str) -> list[Any]:
    """The session's AgentEvents, oldest first."""
    page = await stack.client.list_stream_messages(
        session_id, flow_of(stack, flow_type).agent_events, 500
    )
    return [message.value for message in reversed(page.messages)]


def closed_interrupts(tmp_path: Path) -> list[list[str]]:
    """``[interrupt_id, outcome]`` of every interrupt the scripted observer heard closed, in
    order, across the sessions of ``tmp_path``."""
    return [
        item
        for line in changes_path(tmp_path).read_text().splitlines()
        for item in json.loads(line)["closed"]
    ]


def stored_part_keys(stack: AgentTestStack) -> list[str]:
    """The ``TEXT_PARTS`` instances the embedded engine stores, read from its database."""
    with sqlite3.connect(f"file:{stack.tmp_path / 'dex.sqlite3'}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT key FROM attributes WHERE key LIKE '%TEXT_PARTS%'").fetchall()
    return sorted(key for (key,) in rows if "TEXT_PARTS_INDEX" not in key)


async def read_whole(sessions: AgentSessionClient, session_id: str, sequence: int) -> str:
    """Message ``sequence``'s whole text, read part by part."""
    first = await sessions.read_message_text(session_id, sequence)
    assert first.found and first.text is not None
    texts = [first.text]
    for part in range(1, first.parts):
        answer = await sessions.read_message_text(session_id, sequence, part)
        assert answer.text is not None and answer.parts == first.parts
        texts.append(answer.text)
    return "".join(texts)
