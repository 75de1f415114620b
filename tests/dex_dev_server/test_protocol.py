# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""Client calls beyond the happy path, and malformed requests at the gRPC level."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from dex import (
    AsyncClient,
    AsyncWorker,
    AttributeMatch,
    BlobCacheConfig,
    ClientOptions,
    FlowNotActiveOrNotFoundError,
    FlowNotFoundError,
    LongPollTimeoutError,
    PullWorkerOptions,
    Registry,
    StepExecutionId,
    TimerId,
    WaitForAttributeOptions,
    WaitForStepCompletionOptions,
    WorkerOptions,
    WorkerTarget,
    open_blob_cache,
)
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2
from google.rpc import status_pb2

from . import flows
from .conftest import DexEnv, EngineProcess, engine_client, eventually


async def test_skip_timer_and_wait_for_step_completion(dex: DexEnv) -> None:
    flow = flows.TIMER
    await dex.client.start_flow(flow, "skip-1", 600)
    sleepy = StepExecutionId("Sleepy", 1)

    async def skipped() -> bool:
        try:
            await dex.client.skip_timer("skip-1", sleepy, TimerId.by_condition_id("nap"))
            return True
        except Exception:
            return False

    await eventually(skipped)
    await dex.client.wait_for_step_completion(
        "skip-1", sleepy, WaitForStepCompletionOptions(request_timeout=timedelta(seconds=10))
    )
    result = await dex.client.wait_for_flow("skip-1", timedelta(seconds=5))
    assert result.single_output(str) == "timer"
    with pytest.raises(FlowNotActiveOrNotFoundError):
        await dex.client.skip_timer("skip-1", sleepy, TimerId.by_condition_id("nap"))


async def test_wait_for_attribute_match_wakes_on_write(dex: DexEnv) -> None:
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "attr-1", None)

    async def bump_later() -> None:
        await asyncio.sleep(0.3)
        await dex.client.invoke_rpc(flow.increment, "attr-1", 0)

    bumper = asyncio.create_task(bump_later())
    matched = await dex.client.wait_for_attribute_match(
        "attr-1",
        flows.counter,
        AttributeMatch.equal_to(1),
        WaitForAttributeOptions(request_timeout=timedelta(seconds=10)),
    )
    await bumper
    assert matched == 1
    await dex.client.stop_flow("attr-1")


async def test_missing_flow_and_long_poll_errors(dex: DexEnv) -> None:
    with pytest.raises(FlowNotFoundError):
        await dex.client.describe_flow("does-not-exist")
    with pytest.raises(FlowNotFoundError):
        await dex.client.wait_for_flow("does-not-exist", timedelta(seconds=1))
    with pytest.raises(FlowNotActiveOrNotFoundError):
        await dex.client.invoke_rpc(flows.COUNTER.read, "does-not-exist")
    await dex.client.start_flow(flows.EXPIRING, "poll-1", None)
    with pytest.raises(LongPollTimeoutError):
        await dex.client.wait_for_flow("poll-1", timedelta(seconds=1))
    await dex.client.stop_flow("poll-1")


def _details(error: grpc.aio.AioRpcError) -> pb.ServiceErrorResponse:
    raw = dict(error.trailing_metadata() or ()).get("grpc-status-details-bin")
    assert raw is not None
    status = status_pb2.Status.FromString(raw)
    assert status.code == error.code().value[0] and status.message == error.details()
    details = pb.ServiceErrorResponse()
    status.details[0].Unpack(details)
    return details


async def test_malformed_requests_get_status_codes(engine: EngineProcess) -> None:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        bad_calls = [
            stub.StartFlow(pb.StartFlowRequest(flow_id="a/b", flow_type="T", request_id="r")),
            stub.StartFlow(pb.StartFlowRequest(flow_id="ok", flow_type="T")),
            stub.StartFlow(
                pb.StartFlowRequest(
                    flow_id="ok", flow_type="T", request_id="r",
                    flow_timeout_policy=pb.FLOW_TIMEOUT_POLICY_FAIL,
                )
            ),
            stub.ReadStream(
                pb.ReadStreamRequest(
                    flow_id="f", flow_type="T", stream_name="s", resume_token="%%%"
                )
            ),
            stub.ListStreamMessages(
                pb.ListStreamMessagesRequest(flow_id="f", flow_type="T", stream_name="s")
            ),
            stub.WriteStream(pb.WriteStreamRequest(flow_id="f", flow_type="T", stream_name="s")),
            stub.PublishToChannel(
                pb.PublishToChannelRequest(flow_id="f", messages=[pb.ChannelMessage()])
            ),
            stub.InvokeRPC(pb.InvokeRPCRequest(flow_id="f")),
            stub.WaitForStepCompletion(
                pb.WaitForStepCompletionRequest(
                    flow_id="f", step_type="S", step_execution_number="x"
                )
            ),
            stub.LoadBlobs(
                pb.LoadBlobsRequest(
                    entries=[pb.LoadBlobRequestEntry(blob_value=pb.Value(int_value=1))]
                )
            ),
        ]
        for call in bad_calls:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await call
            assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
            assert _details(raised.value).sub_status == pb.ERROR_SUB_STATUS_UNCATEGORIZED

        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.StopFlow(pb.StopFlowRequest(flow_id="missing"))
        assert raised.value.code() is grpc.StatusCode.NOT_FOUND
        assert _details(raised.value).sub_status == pb.ERROR_SUB_STATUS_FLOW_NOT_EXISTS

        await stub.StartFlow(pb.StartFlowRequest(flow_id="idle-1", flow_type="T", request_id="r"))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.StartFlow(
                pb.StartFlowRequest(flow_id="idle-1", flow_type="T", request_id="r2")
            )
        assert raised.value.code() is grpc.StatusCode.ALREADY_EXISTS
        assert _details(raised.value).sub_status == pb.ERROR_SUB_STATUS_FLOW_ALREADY_STARTED
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.DeleteChannelMessage(
                pb.DeleteChannelMessageRequest(
                    flow_id="idle-1", channel_name="c", message_id="nope", request_id="r"
                )
            )
        assert _details(raised.value).sub_status == pb.ERROR_SUB_STATUS_CHANNEL_MESSAGE_NOT_FOUND

        # A pull stream that registers for a queue it does not serve is refused.
        tasks = dex_pb2_grpc.WorkerTaskServiceStub(channel)
        call = tasks.PollWorkerTask()
        await call.write(
            pb.PollWorkerTaskRequest(
                register=pb.PollWorkerTaskRegister(queue="X", app_worker_id="w", flow_types=["T"])
            )
        )
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await call.read()
        assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT

        # The engine is unharmed.
        health = await stub.HealthCheck(empty_pb2.Empty())
        assert health.condition == "OK"
        info = await stub.GetServerInfo(empty_pb2.Empty())
        assert (info.minimum_supported_protocol_version, info.current_protocol_version) == (1, 3)


async def test_search_flows_by_indexed_attribute(dex: DexEnv) -> None:
    flow = flows.COUNTER
    for flow_id, color in (("search-1", "blue"), ("search-2", "red"), ("search-3", "blue")):
        await dex.client.start_flow(flow, flow_id, None)
        await dex.client.invoke_rpc(flow.set_label, flow_id, color)
    page = await dex.client.search_flows("Label = 'blue'", 10)
    assert sorted(e.flow_id for e in page.flows) == ["search-1", "search-3"]
    assert page.flows[0].indexed_attributes["Label"].data == "blue"
    page = await dex.client.search_flows(
        "FlowType = 'CounterFlow' AND (Label = 'red' OR FlowId = 'search-1')", 1
    )
    assert len(page.flows) == 1 and page.next_page_token
    rest = await dex.client.search_flows(
        "FlowType = 'CounterFlow' AND (Label = 'red' OR FlowId = 'search-1')",
        10,
        page.next_page_token,
    )
    assert sorted([page.flows[0].flow_id, rest.flows[0].flow_id]) == ["search-1", "search-2"]
    await dex.client.stop_flow("search-2")
    running = await dex.client.search_flows("ExecutionStatus = 'Running' AND Label = 'red'", 10)
    assert list(running.flows) == []


async def test_time_travel_to_beginning_reapplies_external_writes(dex: DexEnv) -> None:
    from dex import TimeTravelOptions, TimeTravelType

    flow = flows.COUNTER
    first_run = await dex.client.start_flow(flow, "travel-1", None)
    await dex.client.invoke_rpc(flow.increment, "travel-1", 0)
    await dex.client.invoke_rpc(flow.increment, "travel-1", 0)
    new_run = await dex.client.time_travel("travel-1", TimeTravelOptions(TimeTravelType.BEGINNING))
    assert new_run != first_run
    assert (await dex.client.describe_flow("travel-1")).run_id == new_run
    assert await dex.client.invoke_rpc(flow.read, "travel-1") == 2

    bare_run = await dex.client.time_travel(
        "travel-1", TimeTravelOptions(TimeTravelType.BEGINNING, skip_writes_reapply=True)
    )
    assert bare_run not in (first_run, new_run)
    assert await dex.client.invoke_rpc(flow.read, "travel-1") == 0
    await dex.client.stop_flow("travel-1")


async def test_continue_as_new_carries_waiting_steps_and_messages(dex: DexEnv) -> None:
    flow = flows.DURABLE
    first_run = await dex.client.start_flow(flow, "can-1", "c")

    async def waiting() -> bool:
        async with grpc.aio.insecure_channel(dex.engine.address) as channel:
            stub = dex_pb2_grpc.FlowServiceStub(channel)
            state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="can-1"))
        return any(s.step_type == "AwaitInbox" for s in state.active_step_executions)

    await eventually(waiting)
    await dex.client.invoke_rpc(flow.post, "can-1", "one")
    await dex.client.trigger_continue_as_new("can-1")
    second_run = (await dex.client.describe_flow("can-1")).run_id
    assert second_run != first_run
    await dex.client.invoke_rpc(flow.post, "can-1", "two")
    await dex.client.invoke_rpc(flow.post, "can-1", "three")
    result = await dex.client.wait_for_flow("can-1", timedelta(seconds=10))
    assert result.single_output(str) == "c:one,two,three"
    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        old = await stub.GetFlowSummary(pb.GetFlowSummaryRequest(flow_id="can-1", run_id=first_run))
        assert old.flow_status == pb.FLOW_STATUS_CONTINUED_AS_NEW
        history = await stub.GetHistoryEvents(
            pb.GetHistoryEventsRequest(flow_id="can-1", run_id=second_run)
        )
        assert history.events[0].flow_started_or_continued.continued_start.previous_run_id == (
            first_run
        )


async def test_raw_channel_attribute_history_and_stream_calls(engine: EngineProcess) -> None:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        await stub.StartFlow(pb.StartFlowRequest(flow_id="raw-1", flow_type="Raw", request_id="r"))
        waiter = asyncio.ensure_future(
            stub.WaitForHistoryEvent(
                pb.WaitForHistoryEventRequest(flow_id="raw-1", next_internal_event_id=2)
            )
        )
        await stub.PublishToChannel(
            pb.PublishToChannelRequest(
                flow_id="raw-1",
                messages=[
                    pb.ChannelMessage(channel_name="c", value=pb.Value(int_value=i))
                    for i in range(3)
                ],
            )
        )
        woke = await asyncio.wait_for(waiter, 5)
        assert woke.event_available and woke.flow_status == pb.FLOW_STATUS_RUNNING
        pending = await stub.GetChannelMessages(
            pb.GetChannelMessagesRequest(flow_id="raw-1", channel_name="c")
        )
        ids = [m.message_id for m in pending.messages]
        assert [m.value.int_value for m in pending.messages] == [0, 1, 2]
        assert ids == sorted(ids) and len(set(ids)) == 3
        await stub.DeleteChannelMessage(
            pb.DeleteChannelMessageRequest(
                flow_id="raw-1", channel_name="c", message_id=ids[1], request_id="d"
            )
        )
        pending = await stub.GetChannelMessages(
            pb.GetChannelMessagesRequest(flow_id="raw-1", channel_name="c")
        )
        assert [m.message_id for m in pending.messages] == [ids[0], ids[2]]

        await stub.SetAttributes(
            pb.SetAttributesRequest(
                flow_id="raw-1",
                request_id="s",
                attributes=[
                    pb.AttributeWrite(key="a", value=pb.Value(string_value="x")),
                    pb.AttributeWrite(key="m/k", value=pb.Value(bool_value=True)),
                ],
            )
        )
        await stub.SetAttributes(
            pb.SetAttributesRequest(
                flow_id="raw-1",
                request_id="s2",
                attributes=[pb.AttributeWrite(key="a", value=pb.Value(null_value="NULL_VALUE"))],
            )
        )
        attrs = await stub.GetAttributes(pb.GetAttributesRequest(flow_id="raw-1", all_keys=True))
        assert [kv.key for kv in attrs.attributes] == ["m/k"]

        await stub.UpdateFlowConfig(
            pb.UpdateFlowConfigRequest(
                flow_id="raw-1", flow_config=pb.FlowConfig(continue_as_new_threshold=7)
            )
        )
        state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="raw-1"))
        assert state.flow_config.continue_as_new_threshold == 7

        history = await stub.GetHistoryEvents(
            pb.GetHistoryEventsRequest(flow_id="raw-1", estimate_page_size=2)
        )
        assert [e.event_id for e in history.events] == [1, 2] and history.next_page_token
        more = await stub.GetHistoryEvents(
            pb.GetHistoryEventsRequest(
                flow_id="raw-1", next_page_token=history.next_page_token, estimate_page_size=10
            )
        )
        kinds = [e.WhichOneof("payload") for e in more.events]
        assert kinds == [
            "channel_external_delete",
            "rpc_execution_completed",
            "rpc_execution_completed",
        ]
        assert more.events[1].rpc_execution_completed.is_set_attribute_api

        # A small Stream keeps only its newest messages.
        for i in range(10):
            await stub.WriteStream(
                pb.WriteStreamRequest(
                    flow_id="raw-1", flow_type="Raw", stream_name="s", source="t",
                    stream_capacity_bytes=400, value=pb.Value(string_value=f"m{i}" * 10),
                )
            )
        listed = await stub.ListStreamMessages(
            pb.ListStreamMessagesRequest(
                flow_id="raw-1", flow_type="Raw", stream_name="s", page_size=100
            )
        )
        values = [m.value.string_value for m in listed.messages]
        assert values[0] == "m9" * 10 and 1 < len(values) < 10
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.WriteStream(
                pb.WriteStreamRequest(
                    flow_id="raw-1", flow_type="Raw", stream_name="s", source="t",
                    stream_capacity_bytes=400, value=pb.Value(string_value="x" * 1000),
                )
            )
        assert raised.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stub.ReadStream(
                pb.ReadStreamRequest(
                    flow_id="raw-1", flow_type="Raw", stream_name="s",
                    resume_token=listed.messages[0].resume_token, wait_time_seconds=1,
                )
            )
        assert raised.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert _details(raised.value).sub_status == pb.ERROR_SUB_STATUS_LONG_POLL_TIME_OUT


async def test_time_travel_to_a_step_replays_the_prefix(dex: DexEnv) -> None:
    from dex import TimeTravelOptions, TimeTravelStepMethod, TimeTravelType

    await dex.client.start_flow(flows.RETRY, "travel-2", "t")
    first = await dex.client.wait_for_flow("travel-2", timedelta(seconds=30))
    expected = "recovered t from doomed t attempt 2"
    assert first.single_output(str) == expected

    # Travel to the Doomed Step: Flaky's recorded success (attempt 3) is replayed, not re-run.
    new_run = await dex.client.time_travel(
        "travel-2", TimeTravelOptions(TimeTravelType.STEP_TYPE, step_type="Doomed")
    )
    again = await dex.client.wait_for_flow("travel-2", timedelta(seconds=30))
    assert again.single_output(str) == expected
    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        history = await stub.GetHistoryEvents(
            pb.GetHistoryEventsRequest(flow_id="travel-2", run_id=new_run)
        )
        attrs = await stub.GetAttributes(
            pb.GetAttributesRequest(flow_id="travel-2", keys=["attempts_seen"])
        )
    kinds = [e.WhichOneof("payload") for e in history.events]
    assert kinds[:2] == ["flow_started_or_continued", "time_travel_fork"]
    flaky = [
        e.step_execute_completed.context
        for e in history.events
        if e.WhichOneof("payload") == "step_execute_completed"
        and e.step_execute_completed.context.step_type == "Flaky"
    ]
    assert [c.step_execution_id for c in flaky] == ["Flaky-1"]
    assert attrs.attributes[0].value.string_value == "flaky ok at 3"

    # Travel to Recover's execute by execution ID.
    await dex.client.time_travel(
        "travel-2",
        TimeTravelOptions(
            TimeTravelType.STEP_EXECUTION_ID,
            step_execution_id="Recover-1",
            step_method=TimeTravelStepMethod.EXECUTE,
        ),
    )
    last = await dex.client.wait_for_flow("travel-2", timedelta(seconds=10))
    assert last.single_output(str) == expected


async def test_configured_threshold_continues_as_new_automatically(dex: DexEnv) -> None:
    from dex import FlowConfig, StartFlowOptions

    run_id = await dex.client.start_flow(
        flows.CHAIN,
        "auto-can-1",
        4,
        StartFlowOptions(config_override=FlowConfig(continue_as_new_threshold=1)),
    )
    result = await dex.client.wait_for_flow("auto-can-1", timedelta(seconds=10))
    assert result.single_output(int) == 50
    assert (await dex.client.describe_flow("auto-can-1")).run_id != run_id
    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        attrs = await stub.GetAttributes(
            pb.GetAttributesRequest(flow_id="auto-can-1", keys=["trail"])
        )
        first = await stub.GetFlowSummary(
            pb.GetFlowSummaryRequest(flow_id="auto-can-1", run_id=run_id)
        )
    assert attrs.attributes[0].value.string_value == "start>middle>end"
    assert first.flow_status == pb.FLOW_STATUS_CONTINUED_AS_NEW


async def test_hard_delete_attribute_values_stay_out_of_history(engine: EngineProcess) -> None:
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        await stub.StartFlow(pb.StartFlowRequest(flow_id="secret-1", flow_type="S", request_id="r"))
        await stub.SetAttributes(
            pb.SetAttributesRequest(
                flow_id="secret-1",
                request_id="s",
                attributes=[
                    pb.AttributeWrite(
                        key="api_key",
                        value=pb.Value(string_value="sk-secret"),
                        is_hard_delete_on_null=True,
                    )
                ],
            )
        )
        attrs = await stub.GetAttributes(pb.GetAttributesRequest(flow_id="secret-1", all_keys=True))
        assert attrs.attributes[0].value.string_value == "sk-secret"
        history = await stub.GetHistoryEvents(pb.GetHistoryEventsRequest(flow_id="secret-1"))
    assert b"sk-secret" not in b"".join(e.SerializeToString() for e in history.events)


async def test_skip_timer_sent_before_the_timer_exists_waits_for_it(
    engine: EngineProcess, tmp_path: Path
) -> None:
    """A skip for a Step still waiting for a worker is held until its wait_for commits."""
    registry = Registry(flows.ALL_FLOWS, allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "c"), 1 << 24))
    client = AsyncClient(
        registry,
        cache,
        ClientOptions(server_address=engine.address, worker_target=WorkerTarget(pull=True)),
    )
    worker = AsyncWorker(
        registry, cache, WorkerOptions(server_address=engine.address, pull=PullWorkerOptions())
    )
    runner: asyncio.Task[None] | None = None
    try:
        # No worker yet: Sleepy-1 cannot have run wait_for, so its timer does not exist.
        await client.start_flow(flows.TIMER, "early-skip", 3600)
        skip = asyncio.create_task(
            client.skip_timer("early-skip", StepExecutionId("Sleepy", 1),
                              TimerId.by_condition_id("nap"))
        )
        await asyncio.sleep(0.3)
        assert not skip.done()  # held, not rejected
        runner = asyncio.create_task(worker.start())
        await worker.wait_pull_registered(timeout=20)
        await asyncio.wait_for(skip, 10)
        result = await client.wait_for_flow("early-skip", timedelta(seconds=10))
        assert result.single_output(str) == "timer"
    finally:
        await asyncio.wait_for(worker.stop(), 20)
        if runner is not None:
            await asyncio.gather(runner, return_exceptions=True)
        await client.close()
        cache.close()


async def test_skip_timer_sent_before_the_step_is_scheduled_waits_for_it(dex: DexEnv) -> None:
    """A skip for the next execution of a Step type, sent while the Step that will schedule it
    is still running, is held until the new Step's wait_for sets its timer. (A pull run of the
    SDK suite's signal test skipped SignalCombinationStep-1 while SignalFirstStep's execute was
    in flight and got INVALID_ARGUMENT.)"""
    flows.gates["gated-skip"] = gate = asyncio.Event()
    await dex.client.start_flow(flows.GATED_TIMER, "gated-skip", 3600)
    await eventually(lambda: "gated-skip" in flows.gate_reached)
    skip = asyncio.create_task(
        dex.client.skip_timer("gated-skip", StepExecutionId("GatedNap", 1),
                              TimerId.by_condition_id("gated-nap"))
    )
    try:
        # GatedNap-1 does not exist while GateKeeper-1 runs: the skip is held, not answered.
        finished, _ = await asyncio.wait({skip}, timeout=1.0)
        assert not finished, skip.exception()
    finally:
        gate.set()  # else the worker could not stop
    await asyncio.wait_for(skip, 10)
    result = await dex.client.wait_for_flow("gated-skip", timedelta(seconds=10))
    assert result.single_output(str) == "timer"


@pytest.fixture
def slow_decline_engine(tmp_path: Path) -> Iterator[EngineProcess]:
    """An engine that passes over a declining stream for a minute, so a task that waited for
    the back-off instead of going elsewhere at once fails a test's 10 s."""
    proc = EngineProcess(tmp_path / "engine.sqlite3", tmp_path / "engine.log",
                         ["--decline-backoff", "60"])
    proc.start()
    yield proc
    proc.stop()


async def _raw_stream(channel: grpc.aio.Channel, flow_type: str, app_worker_id: str) -> Any:
    """A pull stream on ``flow_type``'s queue, registered, driven frame by frame by the test."""
    stream = dex_pb2_grpc.WorkerTaskServiceStub(channel).PollWorkerTask()
    await stream.write(pb.PollWorkerTaskRequest(register=pb.PollWorkerTaskRegister(
        queue=flow_type, app_worker_id=app_worker_id, flow_types=[flow_type])))
    assert (await stream.read()).WhichOneof("frame") == "registered"
    return stream


async def _decline(stream: Any, task_id: str) -> None:
    await stream.write(pb.PollWorkerTaskRequest(reject=pb.PollWorkerTaskReject(
        task_id=task_id, reason=pb.POLL_WORKER_TASK_REJECT_REASON_NO_CAPACITY)))


async def test_an_rpc_a_stream_declines_goes_to_another_idle_stream_at_once(
    slow_decline_engine: EngineProcess, tmp_path: Path
) -> None:
    """The SDK's pull worker retires whichever idle stream it finds surplus, sometimes one the
    engine just sent an RPC to, which answers ``NO_CAPACITY``. The RPC goes to another idle
    stream at once; it used to wait for the next dispatch, up to the whole decline back-off."""
    address = slow_decline_engine.address
    registry = Registry(flows.ALL_FLOWS, allow_async_handlers=True)
    cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "worker-blobs"), 16 * 1024 * 1024))
    worker = AsyncWorker(registry, cache, WorkerOptions(
        server_address=address, pull=PullWorkerOptions(max_concurrent_tasks=4)))
    runner = asyncio.create_task(worker.start())
    try:
        async with engine_client(address, tmp_path / "blobs") as client, \
                grpc.aio.insecure_channel(address) as channel:
            await worker.wait_pull_registered(timeout=20)
            await client.start_flow(flows.COUNTER, "declined-1", None)
            # A stream registered after the worker's, never used: the engine's first choice.
            decliner = await _raw_stream(channel, "CounterFlow", "decliner")
            answer: asyncio.Future[int] = asyncio.ensure_future(asyncio.wait_for(
                client.invoke_rpc(flows.COUNTER.read, "declined-1"), timeout=10))
            task = await asyncio.wait_for(decliner.read(), timeout=10)
            assert task.WhichOneof("frame") == "task"
            assert task.task.WhichOneof("request") == "rpc"
            await _decline(decliner, task.task.task_id)
            assert await answer == 0
            decliner.cancel()
    finally:
        await asyncio.wait_for(worker.stop(), 20)
        await asyncio.gather(runner, return_exceptions=True)
        cache.close()


async def test_a_stream_that_declined_a_step_still_takes_an_rpc(
    slow_decline_engine: EngineProcess, tmp_path: Path
) -> None:
    """The SDK's pull worker declines Steps (NO_CAPACITY) to keep a slot for RPCs, so the stream
    that declined a Step is passed over for Steps only: an RPC goes to it at once."""
    address = slow_decline_engine.address
    sending: asyncio.Future[None] | None = None
    async with engine_client(address, tmp_path / "blobs") as client, \
            grpc.aio.insecure_channel(address) as channel:
        try:
            stream = await _raw_stream(channel, "SignalFlow", "reserving")
            await client.start_flow(flows.SIGNAL, "reserved-1", None)
            step = await asyncio.wait_for(stream.read(), timeout=10)
            assert step.task.WhichOneof("request") == "wait_for"
            await _decline(stream, step.task.task_id)

            sending = asyncio.ensure_future(
                client.invoke_rpc(flows.SIGNAL.send, "reserved-1", "x"))
            rpc = await asyncio.wait_for(stream.read(), timeout=10)
            assert rpc.task.WhichOneof("request") == "rpc"
            assert rpc.task.rpc.rpc_name == "send"
            stream.cancel()
        finally:
            if sending is not None:
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)


def _ask_profile(engine: EngineProcess, profile: Path) -> None:
    """Have the engine write its ``--profile`` figures (SIGUSR1) to ``profile`` afresh."""
    profile.unlink(missing_ok=True)
    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGUSR1)


def _profile_commits(profile: Path) -> tuple[int] | None:
    """``(commits,)`` once the engine wrote ``profile`` (it renames a whole file into place)."""
    if not profile.exists():
        return None
    return (int(json.loads(profile.read_text())["commits"]),)


async def _engine_commits(engine: EngineProcess, profile: Path) -> int:
    """The engine's SQLite commits so far."""
    _ask_profile(engine, profile)
    (commits,) = await eventually(lambda: _profile_commits(profile))
    return int(commits)


@pytest.mark.parametrize("how", ["half-close", "decline"])
async def test_a_step_put_back_is_committed_with_its_next_dispatch(
    tmp_path: Path, how: str
) -> None:
    """A Step task sent to a stream the worker is retiring comes back unanswered at the
    half-close (or declined ``NO_CAPACITY``) and goes to another idle stream: putting it back
    and sending it again are one commit (they were two, each an fsync at ``--sync full``)."""
    profile = tmp_path / "profile.json"
    engine = EngineProcess(tmp_path / "engine.sqlite3", tmp_path / "engine.log",
                           ["--profile", str(profile)])
    engine.start()
    try:
        async with engine_client(engine.address, tmp_path / "blobs") as client, \
                grpc.aio.insecure_channel(engine.address) as channel:
            first = await _raw_stream(channel, "SignalFlow", "w1")
            await client.start_flow(flows.SIGNAL, "put-back-1", None)
            step = await asyncio.wait_for(first.read(), timeout=10)
            assert step.task.WhichOneof("request") == "wait_for"
            second = await _raw_stream(channel, "SignalFlow", "w1")
            before = await _engine_commits(engine, profile)
            if how == "half-close":
                await first.done_writing()
            else:
                await _decline(first, step.task.task_id)
            again = await asyncio.wait_for(second.read(), timeout=10)
            assert again.task.WhichOneof("request") == "wait_for"
            assert again.task.task_id != step.task.task_id
            assert await _engine_commits(engine, profile) - before == 1
            first.cancel()
            second.cancel()
    finally:
        engine.stop()


@pytest.mark.parametrize("value", ["-1", "0", "nan", "soon", "3601"])
def test_a_bad_decline_backoff_is_refused_at_start(value: str) -> None:
    started = subprocess.run(
        [sys.executable, "-m", "dex_dev_server", "--port", "0", "--decline-backoff", value],
        capture_output=True, text=True, timeout=60,
    )
    assert started.returncode == 2
    assert "--decline-backoff" in started.stderr
