# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""Crash behaviour: a SIGKILLed worker and a SIGKILLed engine lose nothing."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import grpc
from dex import (
    AsyncClient,
    BlobCacheConfig,
    ClientOptions,
    FlowStatus,
    Registry,
    WorkerTarget,
    open_blob_cache,
)
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from . import flows
from .conftest import REPO, DexEnv, EngineProcess, eventually


def _spawn_worker(address: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.dex_dev_server.worker_main", address],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


async def _progress(address: str, flow_id: str) -> str:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        resp = await stub.GetAttributes(pb.GetAttributesRequest(flow_id=flow_id, keys=["progress"]))
    return resp.attributes[0].value.string_value if resp.attributes else ""


async def _history(address: str, flow_id: str) -> list[pb.FlowHistoryEvent]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        resp = await stub.GetHistoryEvents(pb.GetHistoryEventsRequest(flow_id=flow_id))
    return list(resp.events)


def _slow_attempt(events: list[pb.FlowHistoryEvent]) -> int:
    for e in events:
        if e.WhichOneof("payload") == "step_execute_completed":
            ctx = e.step_execute_completed.context
            if ctx.step_type == "Slow":
                return ctx.final_attempt
    return 0


async def test_worker_sigkill_mid_step_fails_the_attempt_and_retries(
    engine: EngineProcess, tmp_path: Path
) -> None:
    worker = _spawn_worker(engine.address)
    try:
        assert worker.stdout is not None
        assert (await asyncio.to_thread(worker.stdout.readline)).startswith("worker ready")
        registry = Registry(flows.ALL_FLOWS, allow_async_handlers=True)
        cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "c"), 1 << 24))
        client = AsyncClient(
            registry,
            cache,
            ClientOptions(server_address=engine.address, worker_target=WorkerTarget(pull=True)),
        )
        await client.start_flow(flows.DURABLE, "wkill-1", "w")
        await _slow_started(client, "wkill-1")
        await asyncio.to_thread(_kill, worker)
        # A new worker picks the Step up again, as attempt 2.
        worker = _spawn_worker(engine.address)
        await eventually(lambda: _is(_progress(engine.address, "wkill-1"), "waiting"), within=20)
        events = await _history(engine.address, "wkill-1")
        assert _slow_attempt(events) == 2
        for text in ("x", "y", "z"):
            await client.invoke_rpc(flows.DURABLE.post, "wkill-1", text)
        result = await client.wait_for_flow("wkill-1", timedelta(seconds=15))
        assert result.single_output(str) == "w:x,y,z"
        await client.close()
        cache.close()
    finally:
        await asyncio.to_thread(_kill, worker)


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


async def _slow_started(client: object, flow_id: str) -> None:
    """Wait until the Slow Step's first attempt announced itself on the Stream."""
    message = await client.read_stream(  # type: ignore[attr-defined]
        flow_id, flows.slow_log, "", timedelta(seconds=10)
    )
    assert message.value == "slow started attempt 1"


async def _is(value: object, expected: str) -> bool:
    return (await value) == expected  # type: ignore[misc]


async def test_engine_sigkill_and_restart_resumes_everything(dex: DexEnv) -> None:
    engine = dex.engine
    client = dex.client
    # Flow C: a long timer that must still be pending after the restart.
    await client.start_flow(flows.TIMER, "crash-c", 300)
    await client.write_stream("crash-c", flows.tokens, "tester", "before-crash")
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)

        async def timer_registered() -> pb.GetFlowStateResponse | None:
            state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="crash-c"))
            steps = state.active_step_executions
            waiting = bool(steps) and steps[0].phase == pb.ACTIVE_STEP_PHASE_WAITING
            return state if waiting and steps[0].timers else None

        # The timer exists once Sleepy's wait_for committed (the Step waits); a read before
        # that, on a loaded machine, saw no timer at all.
        before = await eventually(timer_registered, within=20)
    # Flow A: parked in a channel + timer wait.
    await client.start_flow(flows.DURABLE, "crash-a", "a")
    await eventually(lambda: _is(_progress(engine.address, "crash-a"), "waiting"), within=20)
    # Flow B: its Slow Step is mid-execution (attempt 1 sleeps 3 s) when the engine dies. It
    # starts last and the kill follows its start at once: a slow poll for another flow between
    # the two could let attempt 1 finish and commit first.
    await client.start_flow(flows.DURABLE, "crash-b", "b")
    await _slow_started(client, "crash-b")
    engine.kill()
    engine.start()

    # Slow attempt 1 was dispatched but never committed: it is retried as attempt 2.
    await eventually(lambda: _is(_progress(engine.address, "crash-b"), "waiting"), within=20)
    await eventually(lambda: _is(_progress(engine.address, "crash-a"), "waiting"), within=20)
    assert _slow_attempt(await _history(engine.address, "crash-b")) == 2

    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        after = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="crash-c"))
        assert after.active_step_executions[0].timers == before.active_step_executions[0].timers
        await stub.PublishToChannel(
            pb.PublishToChannelRequest(
                flow_id="crash-a",
                messages=[
                    pb.ChannelMessage(channel_name="inbox", value=pb.Value(string_value="1"))
                ],
            )
        )
        ids_before = [
            m.message_id
            for m in (
                await stub.GetChannelMessages(
                    pb.GetChannelMessagesRequest(flow_id="crash-a", channel_name="inbox")
                )
            ).messages
        ]

    # Kill again with a message pending; its ID and order survive.
    engine.kill()
    engine.start()
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        ids_after = [
            m.message_id
            for m in (
                await stub.GetChannelMessages(
                    pb.GetChannelMessagesRequest(flow_id="crash-a", channel_name="inbox")
                )
            ).messages
        ]
    assert ids_after == ids_before and len(ids_after) == 1

    for flow_id in ("crash-a", "crash-b"):
        for text in ("2", "3"):
            await client.invoke_rpc(flows.DURABLE.post, flow_id, text)
    await client.invoke_rpc(flows.DURABLE.post, "crash-b", "4")
    a = await client.wait_for_flow("crash-a", timedelta(seconds=20))
    b = await client.wait_for_flow("crash-b", timedelta(seconds=20))
    assert a.single_output(str) == "a:1,2,3"
    assert b.single_output(str) == "b:2,3,4"
    assert (await client.describe_flow("crash-c")).status is FlowStatus.RUNNING
    message = await client.read_stream("crash-c", flows.tokens)
    assert message.value == "before-crash"

    # SIGTERM drains and exits 0.
    assert engine.terminate() == 0


def test_cli_list_and_inspect(engine: EngineProcess) -> None:
    async def start() -> None:
        async with grpc.aio.insecure_channel(engine.address) as channel:
            stub = dex_pb2_grpc.FlowServiceStub(channel)
            await stub.StartFlow(
                pb.StartFlowRequest(flow_id="cli-1", flow_type="Idle", request_id="r1")
            )

    asyncio.run(start())
    out = subprocess.run(
        [sys.executable, "-m", "dex_dev_server", "list", "--db", str(engine.db)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    rows = json.loads(out)
    assert [(r["flow_id"], r["status"]) for r in rows] == [("cli-1", "RUNNING")]
    out = subprocess.run(
        [sys.executable, "-m", "dex_dev_server", "inspect", "cli-1", "--db", str(engine.db)],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    data = json.loads(out)
    assert data["history"][0]["type"] == "flow_started_or_continued"
    table = subprocess.run(
        [sys.executable, "-m", "dex_dev_server", "list", "--db", str(engine.db), "--table"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout
    assert "cli-1" in table and "FLOW_ID" in table
