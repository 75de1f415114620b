# mypy: disable-error-code="arg-type"
"""Chaos: the engine is SIGKILLed again and again while flows of every kind run.

Chains, timers, channel waits and fan-outs keep running on one pull worker while the engine
process is killed at seeded random moments and restarted on the same database. At the end
every flow must have its exact outcome, a gap-free history, exactly one committed execution
per chain hop, and nothing committed may change across one more kill.
"""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import grpc
from dex import FlowStatus
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from . import flows
from .conftest import DexEnv, eventually

SEED = 20_261_129
KILLS = 4
HOP_FLOWS = {"chaos-hop-1": 50, "chaos-hop-2": 35}
TIMER_FLOWS = {"chaos-timer-short": 2, "chaos-timer-mid": 5}
PARKED_TIMER = "chaos-timer-parked"
SIGNAL_FLOWS = ("chaos-signal-1", "chaos-signal-2")


async def _stub_call(address: str, method: str, request: object) -> object:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        return await getattr(stub, method)(request, timeout=10)


async def _history(address: str, flow_id: str) -> list[pb.FlowHistoryEvent]:
    events: list[pb.FlowHistoryEvent] = []
    token = b""
    while True:
        resp = await _stub_call(
            address,
            "GetHistoryEvents",
            pb.GetHistoryEventsRequest(
                flow_id=flow_id, estimate_page_size=200, next_page_token=token
            ),
        )
        assert isinstance(resp, pb.GetHistoryEventsResponse)
        events.extend(resp.events)
        if not resp.next_page_token:
            return events
        token = resp.next_page_token


async def _pending_ids(address: str, flow_id: str, channel: str) -> list[str]:
    resp = await _stub_call(
        address,
        "GetChannelMessages",
        pb.GetChannelMessagesRequest(flow_id=flow_id, channel_name=channel),
    )
    assert isinstance(resp, pb.GetChannelMessagesResponse)
    return [m.message_id for m in resp.messages]


async def _publish(address: str, flow_id: str, channel: str, text: str) -> None:
    await _stub_call(
        address,
        "PublishToChannel",
        pb.PublishToChannelRequest(
            flow_id=flow_id,
            messages=[pb.ChannelMessage(channel_name=channel, value=pb.Value(string_value=text))],
        ),
    )


async def _timers(address: str, flow_id: str) -> list[pb.TimerInfo]:
    resp = await _stub_call(address, "GetFlowState", pb.GetFlowStateRequest(flow_id=flow_id))
    assert isinstance(resp, pb.GetFlowStateResponse)
    return [t for st in resp.active_step_executions for t in st.timers]


def _check_history_shape(flow_id: str, events: list[pb.FlowHistoryEvent]) -> None:
    ids = [e.event_id for e in events]
    assert ids == list(range(1, len(ids) + 1)), f"{flow_id}: history ids {ids}"
    kinds = [e.WhichOneof("payload") for e in events]
    assert kinds[0] == "flow_started_or_continued", f"{flow_id}: {kinds}"
    assert kinds.count("flow_closed") == 1 and kinds[-1] == "flow_closed", f"{flow_id}: {kinds}"
    times = [e.event_time.ToNanoseconds() for e in events]
    assert times == sorted(times), f"{flow_id}: event times go backwards"


async def test_engine_survives_repeated_sigkills_with_every_flow_kind(dex: DexEnv) -> None:
    rng = random.Random(SEED)
    engine, client = dex.engine, dex.client

    for flow_id, length in HOP_FLOWS.items():
        await client.start_flow(flows.HOP, flow_id, length - 1)
    for flow_id, seconds in TIMER_FLOWS.items():
        await client.start_flow(flows.TIMER, flow_id, seconds)
    await client.start_flow(flows.TIMER, PARKED_TIMER, 3600)
    for flow_id in SIGNAL_FLOWS:
        await client.start_flow(flows.SIGNAL, flow_id, None)
    await client.start_flow(flows.FAN_OUT, "chaos-fan-1", 4)
    parked_timers = await eventually(lambda: _timers(engine.address, PARKED_TIMER), within=10)

    expected_ids: dict[str, list[str]] = {}
    for round_no in range(KILLS):
        # A seeded random moment: the flows keep running on their own meanwhile.
        await asyncio.sleep(rng.uniform(0.2, 1.0))
        engine.kill()
        engine.start()
        # Committed state is back before any worker reconnects.
        for flow_id, ids in expected_ids.items():
            assert await _pending_ids(engine.address, flow_id, flows.signals.name) == ids
        assert await _timers(engine.address, PARKED_TIMER) == parked_timers
        if round_no == 0:
            # One pending message each: not enough for for_n(2), so it stays in the channel.
            for flow_id in SIGNAL_FLOWS:
                await _publish(engine.address, flow_id, flows.signals.name, "first")
                expected_ids[flow_id] = await _pending_ids(
                    engine.address, flow_id, flows.signals.name
                )
                assert len(expected_ids[flow_id]) == 1
            await client.start_flow(flows.FAN_OUT, "chaos-fan-2", 3)
        elif round_no == 2:
            for flow_id in SIGNAL_FLOWS:
                await _publish(engine.address, flow_id, flows.signals.name, "second")
            expected_ids.clear()

    await _publish(engine.address, PARKED_TIMER, flows.wake.name, "late")
    expected: dict[str, object] = {
        **{
            flow_id: "".join(f"{i};" for i in range(length - 1, -1, -1))
            for flow_id, length in HOP_FLOWS.items()
        },
        **{flow_id: "timer" for flow_id in TIMER_FLOWS},
        PARKED_TIMER: "woken:late",
        **{flow_id: "first+second" for flow_id in SIGNAL_FLOWS},
        "chaos-fan-1": "[1, 2, 3, 4]|b1,b2,b3,b4|30",
        "chaos-fan-2": "[1, 2, 3]|b1,b2,b3|14",
    }
    for flow_id, output in expected.items():
        result = await client.wait_for_flow(flow_id, timedelta(seconds=30))
        assert result.status is FlowStatus.COMPLETED, (flow_id, result)
        assert result.single_output(str) == output, flow_id

    histories = {flow_id: await _history(engine.address, flow_id) for flow_id in expected}
    retried = 0
    for flow_id, events in histories.items():
        _check_history_shape(flow_id, events)
    for flow_id, length in HOP_FLOWS.items():
        hops = [
            e.step_execute_completed
            for e in histories[flow_id]
            if e.WhichOneof("payload") == "step_execute_completed"
        ]
        # Exactly one committed execution per hop, in order, whatever was retried.
        assert [h.input.step_input.int_value for h in hops] == list(range(length - 1, -1, -1))
        assert [h.context.step_execution_id for h in hops] == [
            f"Hop-{n}" for n in range(1, length + 1)
        ]
        retried += sum(1 for h in hops if h.context.final_attempt > 1)
    # The kills landed on running hops, whose lost attempts were retried.
    assert retried >= 1
    for flow_id in SIGNAL_FLOWS:
        published = [
            m.value.string_value
            for e in histories[flow_id]
            if e.WhichOneof("payload") == "channel_external_publish"
            for m in e.channel_external_publish.messages
        ]
        assert published == ["first", "second"]

    # One more kill with everything closed: nothing committed changes.
    engine.kill()
    engine.start()
    for flow_id, events in histories.items():
        assert await _history(engine.address, flow_id) == events
        assert (await client.describe_flow(flow_id)).status is FlowStatus.COMPLETED
