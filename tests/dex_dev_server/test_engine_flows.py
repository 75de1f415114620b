# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""End-to-end behaviour of the engine with the real SDK Client and pull AsyncWorker."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import grpc
import pytest
from dex import (
    FlowErrorType,
    FlowStatus,
    RPCInvokeOptions,
    RpcLockConflictError,
    StartFlowOptions,
    WorkerInvocationError,
)
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from . import flows
from .conftest import DexEnv, eventually


def _stub(dex: DexEnv) -> tuple[grpc.aio.Channel, dex_pb2_grpc.FlowServiceStub]:
    channel = grpc.aio.insecure_channel(dex.engine.address)
    return channel, dex_pb2_grpc.FlowServiceStub(channel)


async def _history(dex: DexEnv, flow_id: str) -> list[pb.FlowHistoryEvent]:
    channel, stub = _stub(dex)
    async with channel:
        resp = await stub.GetHistoryEvents(pb.GetHistoryEventsRequest(flow_id=flow_id))
    return list(resp.events)


async def test_multi_step_flow_completes_with_history(dex: DexEnv) -> None:
    flow = flows.CHAIN
    run_id = await dex.client.start_flow(flow, "chain-1", 4)
    result = await dex.client.wait_for_flow("chain-1", timedelta(seconds=20))
    assert result.status is FlowStatus.COMPLETED
    assert result.single_output(int) == 50
    info = await dex.client.describe_flow("chain-1")
    assert info.run_id == run_id and info.status is FlowStatus.COMPLETED

    events = await _history(dex, "chain-1")
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds == [
        "flow_started_or_continued",
        "step_execute_completed",
        "step_execute_completed",
        "step_execute_completed",
        "flow_closed",
    ]
    assert [e.event_id for e in events] == [1, 2, 3, 4, 5]
    contexts = [e.step_execute_completed.context for e in events[1:4]]
    assert [c.step_execution_id for c in contexts] == [
        "ChainStart-1",
        "ChainMiddle-1",
        "ChainEnd-1",
    ]
    assert [c.from_step_execution_id for c in contexts] == [
        "__start__",
        "ChainStart-1",
        "ChainMiddle-1",
    ]
    assert all(c.final_attempt == 1 for c in contexts)
    closed = events[-1].flow_closed
    assert closed.flow_status == pb.FLOW_STATUS_COMPLETED
    assert closed.results[0].completed_step_execution_id == "ChainEnd-1"

    channel, stub = _stub(dex)
    async with channel:
        attrs = await stub.GetAttributes(pb.GetAttributesRequest(flow_id="chain-1", all_keys=True))
        assert {kv.key: kv.value.string_value for kv in attrs.attributes} == {
            "trail": "start>middle>end"
        }


async def test_id_reuse_and_request_id_idempotency(dex: DexEnv) -> None:
    flow = flows.SIGNAL
    options = StartFlowOptions(request_id="req-1")
    run_id = await dex.client.start_flow(flow, "reuse-1", None, options)
    from dex import FlowAlreadyStartedError

    with pytest.raises(FlowAlreadyStartedError):
        await dex.client.start_flow(flow, "reuse-1", None)
    again = await dex.client.start_flow(
        flow, "reuse-1", None, StartFlowOptions(request_id="req-1", ignore_already_started=True)
    )
    assert again == run_id
    await dex.client.stop_flow("reuse-1")
    result = await dex.client.wait_for_flow("reuse-1", timedelta(seconds=5))
    assert result.status is FlowStatus.CANCELED


async def test_channel_wait_consumes_two_messages(dex: DexEnv) -> None:
    flow = flows.SIGNAL
    await dex.client.start_flow(flow, "signal-1", None)
    await dex.client.invoke_rpc(flow.send, "signal-1", "a")
    channel, stub = _stub(dex)
    async with channel:
        # One message is not enough for for_n(2): the Step keeps waiting.
        state = await eventually(
            lambda: _waiting_state(stub, "signal-1"),
        )
        assert state.active_step_executions[0].step_execution_id == "WaitSignal-1"
        await stub.PublishToChannel(
            pb.PublishToChannelRequest(
                flow_id="signal-1",
                messages=[
                    pb.ChannelMessage(channel_name="signals", value=pb.Value(string_value="b")),
                ],
            )
        )
    result = await dex.client.wait_for_flow("signal-1", timedelta(seconds=10))
    assert result.status is FlowStatus.COMPLETED
    assert result.single_output(str) == "a+b"


async def _waiting_state(
    stub: dex_pb2_grpc.FlowServiceStub, flow_id: str
) -> pb.GetFlowStateResponse | None:
    state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id=flow_id))
    steps = state.active_step_executions
    if steps and steps[0].phase == pb.ACTIVE_STEP_PHASE_WAITING:
        pending = state.pending_channel_messages
        if sum(len(v.messages) for v in pending.values()) >= 1:
            return state
    return None


async def test_timer_fires_and_channel_alternative_wins(dex: DexEnv) -> None:
    flow = flows.TIMER
    started = time.monotonic()
    await dex.client.start_flow(flow, "timer-1", 1)
    result = await dex.client.wait_for_flow("timer-1", timedelta(seconds=10))
    assert result.single_output(str) == "timer"
    assert time.monotonic() - started >= 0.9

    await dex.client.start_flow(flow, "timer-2", 600)
    channel, stub = _stub(dex)
    async with channel:
        async def timer_info() -> pb.TimerInfo | None:
            state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="timer-2"))
            steps = state.active_step_executions
            return steps[0].timers[0] if steps and steps[0].timers else None

        timer = await eventually(timer_info)
        assert timer.firing_unix_timestamp_seconds >= int(time.time()) + 590
        await stub.PublishToChannel(
            pb.PublishToChannelRequest(
                flow_id="timer-2",
                messages=[
                    pb.ChannelMessage(channel_name="wake", value=pb.Value(string_value="hi"))
                ],
            )
        )
    result = await dex.client.wait_for_flow("timer-2", timedelta(seconds=10))
    assert result.single_output(str) == "woken:hi"


async def test_go_to_many_fan_out_and_join(dex: DexEnv) -> None:
    flow = flows.FAN_OUT
    started = time.monotonic()
    await dex.client.start_flow(flow, "fan-1", 4)
    result = await dex.client.wait_for_flow("fan-1", timedelta(seconds=20))
    assert result.status is FlowStatus.COMPLETED
    assert result.single_output(str) == "[1, 2, 3, 4]|b1,b2,b3,b4|30"
    # Four 0.3 s branches ran in parallel, not one after another.
    assert time.monotonic() - started < 3
    events = await _history(dex, "fan-1")
    branch_ids = sorted(
        e.step_execute_completed.context.step_execution_id
        for e in events
        if e.WhichOneof("payload") == "step_execute_completed"
        and e.step_execute_completed.context.step_type == "Branch"
    )
    assert branch_ids == ["Branch-1", "Branch-2", "Branch-3", "Branch-4"]


async def test_retries_then_failure_route(dex: DexEnv) -> None:
    flow = flows.RETRY
    await dex.client.start_flow(flow, "retry-1", "job")
    result = await dex.client.wait_for_flow("retry-1", timedelta(seconds=30))
    assert result.status is FlowStatus.COMPLETED
    assert result.single_output(str) == "recovered job from doomed job attempt 2"
    events = await _history(dex, "retry-1")
    by_kind: dict[str | None, list[pb.FlowHistoryEvent]] = {}
    for e in events:
        by_kind.setdefault(e.WhichOneof("payload"), []).append(e)
    flaky = by_kind["step_execute_completed"][0].step_execute_completed.context
    assert (flaky.step_execution_id, flaky.final_attempt) == ("Flaky-1", 3)
    assert "flaky failure 2" in flaky.last_failure_info.details.original_worker_error_detail
    failed = by_kind["step_execute_failed"][0].step_execute_failed
    assert failed.context.step_execution_id == "Doomed-1"
    assert failed.output.failure.attempt == 2
    assert failed.output.failure.details.original_worker_error_type == "builtins.LookupError"
    recover = by_kind["step_execute_completed"][-1].step_execute_completed.context
    assert recover.from_step_execution_id == "Doomed-1"


async def test_exhausted_retries_and_force_fail_fail_the_flow(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.FAILING, "fail-1", None)
    await dex.client.start_flow(flows.QUIT, "quit-1", "homework")
    failed = await dex.client.wait_for_flow("fail-1", timedelta(seconds=20))
    assert failed.status is FlowStatus.FAILED
    assert failed.error_type is FlowErrorType.WORKER_API_FAILED
    assert failed.error_message == "boom from AlwaysFails"
    quit_result = await dex.client.wait_for_flow("quit-1", timedelta(seconds=20))
    assert quit_result.status is FlowStatus.FAILED
    assert quit_result.error_type is FlowErrorType.STEP_DECISION_FAILED
    assert quit_result.error_message == "gave up on homework"


async def test_rpc_locks_conflict_fast_and_serialize_writes(dex: DexEnv) -> None:
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "counter-1", None)

    async def bump() -> bool:
        try:
            await dex.client.invoke_rpc(flow.increment, "counter-1", 300)
            return True
        except RpcLockConflictError:
            return False

    outcomes = await asyncio.gather(*(bump() for _ in range(6)))
    successes = sum(outcomes)
    assert 1 <= successes < 6
    assert await dex.client.invoke_rpc(flow.read, "counter-1") == successes

    with pytest.raises(WorkerInvocationError) as raised:
        await dex.client.invoke_rpc(flow.explode, "counter-1")
    assert raised.value.worker_error_type == "builtins.ValueError"
    assert "rpc exploded" in str(raised.value)

    # An RPC schedules a Step on a flow without a start Step.
    assert await dex.client.invoke_rpc(flow.finish, "counter-1", 100) == "scheduled"
    result = await dex.client.wait_for_flow("counter-1", timedelta(seconds=10))
    assert result.single_output(int) == 100 + successes


async def test_steps_locking_one_attribute_run_one_at_a_time(dex: DexEnv) -> None:
    # Three Steps are ready at once and the Worker has idle slots for all of them; each takes
    # the lock when its task is dispatched, so the others wait and no read-modify-write is lost.
    await dex.client.start_flow(flows.LOCKED, "locked-1", 3)
    result = await dex.client.wait_for_flow("locked-1", timedelta(seconds=20))
    assert result.single_output(int) == 3


async def test_attribute_maps_set_load_delete(dex: DexEnv) -> None:
    flow = flows.COUNTER
    options = StartFlowOptions().with_attribute(flows.notes, "alpha", "1")
    await dex.client.start_flow(flow, "maps-1", None, options)
    await dex.client.invoke_rpc(flow.note, "maps-1", "beta=2")
    await dex.client.invoke_rpc(flow.note, "maps-1", "gamma=3")
    await dex.client.invoke_rpc(flow.note, "maps-1", "beta")
    assert await dex.client.invoke_rpc(flow.list_notes, "maps-1") == "alpha=1;gamma=3"
    channel, stub = _stub(dex)
    async with channel:
        attrs = await stub.GetAttributes(
            pb.GetAttributesRequest(flow_id="maps-1", keys=["notes/alpha", "notes/beta"])
        )
    assert [kv.key for kv in attrs.attributes] == ["notes/alpha"]
    await dex.client.stop_flow("maps-1")


async def test_rpc_loads_the_map_instances_its_caller_adds(dex: DexEnv) -> None:
    """``RPCInvokeOptions.load_attribute_map_instances`` (spec 3.1, InvokeRPC selectors): the
    handler sees exactly the instances added per call, also after the run closed."""
    flow = flows.COUNTER
    options = StartFlowOptions().with_attribute(flows.notes, "alpha", "1")
    await dex.client.start_flow(flow, "loads-1", None, options)
    await dex.client.invoke_rpc(flow.note, "loads-1", "gamma=3")
    loads = RPCInvokeOptions(
        load_attribute_map_instances=(flows.notes.load("alpha"), flows.notes.load("beta"))
    )
    expected = "alpha=1;beta=None;gamma?;*?"
    assert await dex.client.invoke_rpc(
        flow.read_loaded_notes, "loads-1", "alpha,beta,gamma", options=loads
    ) == expected
    assert await dex.client.invoke_rpc(
        flow.read_loaded_notes, "loads-1", "alpha,gamma"
    ) == "alpha?;gamma?;*?"
    await dex.client.stop_flow("loads-1")
    assert await dex.client.invoke_rpc(
        flow.read_loaded_notes, "loads-1", "alpha,beta,gamma", options=loads
    ) == expected


async def test_streams_from_steps_and_clients(dex: DexEnv) -> None:
    flow = flows.STREAM
    await dex.client.start_flow(flow, "stream-1", 3)
    await dex.client.wait_for_flow("stream-1", timedelta(seconds=10))
    first = await dex.client.read_stream("stream-1", flows.tokens)
    assert (first.value, first.source) == ("token-0", "#Speaker-1")
    second = await dex.client.read_stream("stream-1", flows.tokens, first.resume_token)
    assert second.value == "token-1"
    await dex.client.write_stream("stream-1", flows.tokens, "tester", "from-client")
    page = await dex.client.list_stream_messages("stream-1", flows.tokens, 2)
    assert [m.value for m in page.messages] == ["from-client", "token-2"]
    older = await dex.client.list_stream_messages(
        "stream-1", flows.tokens, 10, page.next_page_token
    )
    assert [m.value for m in older.messages] == ["token-1", "token-0"]

    async def late_write() -> None:
        await asyncio.sleep(0.3)
        await dex.client.write_stream("stream-1", flows.tokens, "tester", "late")

    last = page.messages[0]
    writer = asyncio.create_task(late_write())
    waited = await dex.client.read_stream(
        "stream-1", flows.tokens, last.resume_token, timedelta(seconds=5)
    )
    await writer
    assert waited.value == "late"


async def test_method_timeout_retries_with_heartbeat_checkpoint(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.TIMEOUT, "timeout-1", None)
    result = await dex.client.wait_for_flow("timeout-1", timedelta(seconds=20))
    assert result.single_output(str) == "attempt 2 after checkpoint-1"
    events = await _history(dex, "timeout-1")
    ctx = next(
        e.step_execute_completed.context
        for e in events
        if e.WhichOneof("payload") == "step_execute_completed"
    )
    assert ctx.final_attempt == 2
    assert "timeout" in ctx.last_failure_info.backend_error


async def test_a_movements_own_retry_and_method_timeout_win_over_the_steps(
    dex: DexEnv,
) -> None:
    """Spec 2.4 StepMovement.step_options: the engine applies the options a movement carries,
    not the Step's registered ones (5 attempts, no timeout): ``once`` gets 1 attempt, ``slow``
    2 attempts of 1 s each, then each goes to its failure route."""
    await dex.client.start_flow(flows.MOVEMENT_OPTIONS, "movement-1", "go")
    result = await dex.client.wait_for_flow("movement-1", timedelta(seconds=30))
    assert result.status is FlowStatus.COMPLETED
    assert result.single_output(str) == "slow failed: execute method timeout after 1s"
    events = await _history(dex, "movement-1")
    failed = {
        e.step_execute_failed.context.step_execution_id: e.step_execute_failed
        for e in events
        if e.WhichOneof("payload") == "step_execute_failed"
    }
    assert list(failed) == ["Bounded-1", "Bounded-2"]
    assert failed["Bounded-1"].output.failure.attempt == 1
    assert "once failed on attempt 1" in (
        failed["Bounded-1"].output.failure.details.original_worker_error_detail
    )
    assert failed["Bounded-2"].output.failure.attempt == 2
    assert failed["Bounded-2"].output.failure.backend_error == "execute method timeout after 1s"


async def test_canceling_steps_and_wait_for_proceed(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.RACE, "race-1", None)
    await dex.client.start_flow(flows.PROCEED, "proceed-1", None)
    race = await dex.client.wait_for_flow("race-1", timedelta(seconds=10))
    assert race.single_output(str) == "fast"
    proceed = await dex.client.wait_for_flow("proceed-1", timedelta(seconds=10))
    assert proceed.single_output(str) == "proceeded=True (wait_for broke)"
    kinds = [e.WhichOneof("payload") for e in await _history(dex, "proceed-1")]
    assert "step_wait_for_failed" in kinds


async def test_flow_timeout_fails_with_message(dex: DexEnv) -> None:
    await dex.client.start_flow(
        flows.EXPIRING, "expire-1", None, StartFlowOptions(timeout=timedelta(seconds=1))
    )
    result = await dex.client.wait_for_flow("expire-1", timedelta(seconds=10))
    assert result.status is FlowStatus.FAILED
    assert result.error_type is FlowErrorType.FLOW_TIMEOUT
    assert result.error_message == "Flow timed out after 1 seconds"


async def test_sub_flows_run_and_report_results(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.PARENT, "parent-1", 1)
    result = await dex.client.wait_for_flow("parent-1", timedelta(seconds=20))
    assert result.single_output(str) == "[20, 30] via SubFlow:parent-1-Delegate-1-1"
    child = await dex.client.describe_flow("SubFlow:parent-1-Delegate-1-0")
    assert child.status is FlowStatus.COMPLETED and child.flow_type == "ChainFlow"


async def test_timeout_handler_and_flow_retry(dex: DexEnv) -> None:
    from dex import RetryPolicy

    await dex.client.start_flow(
        flows.HANDLED, "handled-1", None, StartFlowOptions(timeout=timedelta(seconds=1))
    )
    await dex.client.start_flow(
        flows.FAILING,
        "flow-retry-1",
        None,
        StartFlowOptions(
            retry_policy=RetryPolicy(initial_interval=timedelta(seconds=1), maximum_attempts=2)
        ),
    )
    handled = await dex.client.wait_for_flow("handled-1", timedelta(seconds=10))
    assert handled.single_output(str) == "expired"
    events = await _history(dex, "handled-1")
    handler = [
        e.step_execute_completed.context.step_execution_id
        for e in events
        if e.WhichOneof("payload") == "step_execute_completed"
    ]
    assert handler == ["sys:timeout_handler-1"]

    failed = await dex.client.wait_for_flow("flow-retry-1", timedelta(seconds=30))
    assert failed.status is FlowStatus.FAILED
    channel, stub = _stub(dex)
    async with channel:
        summary = await stub.GetFlowSummary(pb.GetFlowSummaryRequest(flow_id="flow-retry-1"))
    assert summary.run_attempt == 2
    assert summary.first_run_id != summary.flow_execution_id.run_id


async def _publish(dex: DexEnv, flow_id: str, *messages: tuple[str, str]) -> None:
    channel, stub = _stub(dex)
    async with channel:
        await stub.PublishToChannel(
            pb.PublishToChannelRequest(
                flow_id=flow_id,
                messages=[
                    pb.ChannelMessage(channel_name=name, value=pb.Value(string_value=text))
                    for name, text in messages
                ],
            )
        )


async def test_any_combination_consumes_only_the_chosen_group(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.COMBO, "combo-1", None)
    # Half of group 1 and half of group 2: nothing is ready, nothing is consumed.
    await _publish(dex, "combo-1", ("approvals", "yes"), ("mailbox/bob", "b1"))
    channel, stub = _stub(dex)
    async with channel:
        async def waiting() -> bool:
            state = await stub.GetFlowState(pb.GetFlowStateRequest(flow_id="combo-1"))
            steps = state.active_step_executions
            return bool(steps) and steps[0].phase == pb.ACTIVE_STEP_PHASE_WAITING

        await eventually(waiting)
    # Completing group 2 (bob at least 2) wins; the approval stays pending.
    await _publish(dex, "combo-1", ("mailbox/bob", "b2"), ("mailbox/bob", "b3"))
    result = await dex.client.wait_for_flow("combo-1", timedelta(seconds=10))
    assert result.single_output(str) == "['b1', 'b2', 'b3'] left={}"
    channel, stub = _stub(dex)
    async with channel:
        pending = await stub.GetChannelMessages(
            pb.GetChannelMessagesRequest(flow_id="combo-1", channel_name="approvals")
        )
    assert [m.value.string_value for m in pending.messages] == ["yes"]


async def test_channel_map_group_leaves_other_instances_pending(dex: DexEnv) -> None:
    await dex.client.start_flow(flows.COMBO, "combo-2", None)
    await _publish(
        dex,
        "combo-2",
        ("mailbox/carol", "c1"),
        ("mailbox/alice", "a1"),
        ("mailbox/alice", "a2"),
        ("approvals", "ok"),
    )
    result = await dex.client.wait_for_flow("combo-2", timedelta(seconds=10))
    assert result.single_output(str) == "['ok', 'a1'] left={'alice': 1, 'carol': 1}"


# --- tasks larger than a worker accepts ---------------------------------------------------------

async def test_a_step_whose_state_passes_4_mib_loads_it_in_parts(dex: DexEnv) -> None:
    """The crates are blobs (over the 64 KiB default threshold): the Step's task carries
    blob ids, and its worker loads the values with LoadBlobs, whose answers stop short of
    4 MiB. A worker that could not load every blob at once has cached what it got; the engine
    hands the task out again without counting an attempt (the Step allows two), so the Step
    runs with all five crates, and another flow's Step runs meanwhile."""
    options = StartFlowOptions()
    for index in range(5):
        options = options.with_attribute(flows.cargo, f"crate-{index}", flows.crate(index))
    await dex.client.start_flow(flows.HEAVY, "heavy-1", "go", options)
    await dex.client.start_flow(flows.CHAIN, "light-1", 1)

    light = await dex.client.wait_for_flow("light-1", timedelta(seconds=20))
    assert light.single_output(int) == 20
    heavy = await dex.client.wait_for_flow("heavy-1", timedelta(seconds=30))
    assert heavy.status == FlowStatus.COMPLETED
    assert heavy.single_output(str) == "loaded 5 crates"


async def test_an_rpc_whose_output_passes_4_mib_is_refused_alone(dex: DexEnv) -> None:
    from dex import DexServiceError

    flow = flows.COUNTER
    await dex.client.start_flow(flow, "heavy-rpc", None)
    for index in range(5):
        await dex.client.invoke_rpc(flow.note, "heavy-rpc", f"crate-{index}={flows.crate(index)}")
    # Its state (five blobs) reaches the worker in parts; its output is one 5 MiB value,
    # which no client can receive.
    with pytest.raises(DexServiceError) as refused:
        await dex.client.invoke_rpc(flow.list_notes, "heavy-rpc")
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than a client accepts in one message" in refused.value.detail
    # Nothing else is affected: the next RPCs of this flow answer at once.
    assert await dex.client.invoke_rpc(flow.read, "heavy-rpc") == 0
    # The worker's streams are intact: the next RPCs of this and another flow answer at once.
    assert await dex.client.invoke_rpc(flow.read, "heavy-rpc") == 0
    await dex.client.start_flow(flows.CHAIN, "light-2", 2)
    light = await dex.client.wait_for_flow("light-2", timedelta(seconds=20))
    assert light.single_output(int) == 30
