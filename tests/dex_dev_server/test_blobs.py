# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""Blob storage (spec section 3.5) with ``--blob-threshold 1024``, as the Dex server does it:
large values reach the real SDK's workers and clients as blob ids, which they load with
``LoadBlobs``; the store keeps them across a SIGKILL of the engine."""

from __future__ import annotations

import asyncio
import random
from datetime import timedelta

import grpc
import pytest
from dex import StartFlowOptions
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_dev_server._blobs import blob_id_of
from dex_dev_server._model import Run, StepExec
from dex_dev_server._state import EngineState
from dex_dev_server._store import Store

from . import flows
from .blob_audit import audit
from .conftest import DexEnv, EngineProcess, eventually


@pytest.fixture
def engine_args() -> list[str]:
    return ["--blob-threshold", "1024"]


def text(tag: str, size: int = 3000) -> str:
    return tag + "." * (size - len(tag))


async def attributes(address: str, flow_id: str) -> dict[str, pb.Value]:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        found = await stub.GetAttributes(pb.GetAttributesRequest(flow_id=flow_id, all_keys=True))
    return {kv.key: kv.value for kv in found.attributes}


async def load(address: str, flow_id: str, *values: pb.Value) -> pb.LoadBlobsResponse:
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        return await stub.LoadBlobs(pb.LoadBlobsRequest(entries=[
            pb.LoadBlobRequestEntry(flow_id=flow_id, blob_value=value) for value in values
        ]))


async def test_large_inputs_messages_and_outputs_travel_as_blobs(dex: DexEnv) -> None:
    """A 5,000-character Step input goes through three Steps, three 3,000-character channel
    messages are consumed, and the flow's 14,000-character output reaches the client."""
    start = text("input", 5000)
    await dex.client.start_flow(flows.DURABLE, "big-1", start)
    messages = [text(f"m{index}") for index in range(3)]
    for message in messages:
        await dex.client.invoke_rpc(flows.DURABLE.post, "big-1", message)
    result = await dex.client.wait_for_flow("big-1", timedelta(seconds=30))
    assert result.single_output(str) == f"{start}:" + ",".join(messages)


async def test_attributes_are_blob_ids_that_load_blobs_answers(dex: DexEnv) -> None:
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "notes-1", None)
    value = text("note")
    await dex.client.invoke_rpc(flow.note, "notes-1", f"a={value}")
    await dex.client.invoke_rpc(flow.note, "notes-1", "b=small")
    # The worker loads the blob-backed instance with LoadBlobs.
    assert await dex.client.invoke_rpc(flow.list_notes, "notes-1") == f"a={value};b=small"

    stored = await attributes(dex.engine.address, "notes-1")
    reference = stored["notes/a"]
    assert reference.WhichOneof("kind") == "internal_blob_id_for_string_value"
    assert stored["notes/b"].WhichOneof("kind") == "string_value"
    blob_id = reference.internal_blob_id_for_string_value
    loaded = await load(dex.engine.address, "notes-1", reference)
    assert loaded.values[blob_id].string_value == value

    # An unknown id, or a known one asked as the other kind, is left out of the answer.
    unknown = pb.Value(internal_blob_id_for_string_value="0" * 40)
    other_kind = pb.Value(internal_blob_id_for_obj_value=blob_id)
    assert not (await load(dex.engine.address, "notes-1", unknown, other_kind)).values
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await load(dex.engine.address, "notes-1", pb.Value(string_value="not a blob"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # The same content is stored once: another flow's equal note names the same blob.
    await dex.client.start_flow(flow, "notes-2", None)
    await dex.client.invoke_rpc(flow.note, "notes-2", f"a={value}")
    assert (await attributes(dex.engine.address, "notes-2"))["notes/a"] == reference


async def test_a_blob_backed_attribute_is_not_matched(dex: DexEnv) -> None:
    """Spec section 4.10: WaitForAttribute on a blob-backed value is FAILED_PRECONDITION."""
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "label-1", None)
    await dex.client.invoke_rpc(flow.set_label, "label-1", text("label"))
    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.WaitForAttribute(pb.WaitForAttributeRequest(
                flow_id="label-1", request_timeout_seconds=2, request_id="w1",
                match=pb.AttributeMatch(
                    key="label", operator=pb.ATTRIBUTE_MATCH_OPERATOR_EQUAL,
                    operand=pb.Value(string_value="x"),
                ),
            ))
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION


async def test_blobs_survive_a_killed_engine(dex: DexEnv) -> None:
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "kill-1", None)
    value = text("kept", 20_000)
    await dex.client.invoke_rpc(flow.note, "kill-1", f"a={value}")
    reference = (await attributes(dex.engine.address, "kill-1"))["notes/a"]

    dex.engine.kill()
    dex.engine.start()
    loaded = await load(dex.engine.address, "kill-1", reference)
    assert next(iter(loaded.values.values())).string_value == value
    assert await dex.client.invoke_rpc(flow.list_notes, "kill-1") == f"a={value}"


async def dangling(address: str, flow_id: str) -> list[str]:
    """Blob ids among the flow's stored Attributes that LoadBlobs does not answer."""
    missing = []
    for reference in (await attributes(address, flow_id)).values():
        found = blob_id_of(reference)
        if found is not None and found[1] not in (await load(address, flow_id, reference)).values:
            missing.append(found[1])
    return missing


async def test_sigkills_while_blobs_are_written_and_loaded(dex: DexEnv) -> None:
    """The engine is SIGKILLed at seeded moments while RPCs write blob-backed notes and a
    Step loads five distinct 1 MiB crates in parts. Every note whose write was acknowledged
    is there after each restart, no stored reference dangles, and the Step finishes."""
    rng = random.Random(20_261_205)
    flow = flows.COUNTER
    await dex.client.start_flow(flow, "chaos-notes", None)
    options = StartFlowOptions()
    for index in range(5):
        options = options.with_attribute(flows.cargo, f"crate-{index}", flows.crate(index))
    await dex.client.start_flow(flows.HEAVY, "chaos-heavy", "go", options)

    acknowledged: dict[str, str] = {}
    stop = asyncio.Event()

    async def write_notes() -> None:
        number = 0
        # At most 100 notes of at most 20,000 characters: list_notes answers them in one
        # RPC output, which must stay under 4 MiB.
        while not stop.is_set() and number < 100:
            key = f"n{number + 1}"
            value = text(f"note-{number + 1}", rng.randint(1500, 20_000))
            try:
                await dex.client.invoke_rpc(flow.note, "chaos-notes", f"{key}={value}")
            except Exception:
                # The engine is down: write this note again (a new value; the last one
                # acknowledged is what must be there), without using up the 100.
                await asyncio.sleep(0.05)
                continue
            number += 1
            acknowledged[key] = value

    writer = asyncio.create_task(write_notes())
    try:
        for _ in range(3):
            # Each kill comes after one more acknowledged write, unless all are written (on a
            # busy machine the seeded pause alone once let only two through), then at a
            # seeded moment.
            written = len(acknowledged)
            await eventually(
                lambda written=written: len(acknowledged) > written or writer.done(), within=60
            )
            await asyncio.sleep(rng.uniform(0.1, 0.6))
            dex.engine.kill()
            dex.engine.start()
            assert await dangling(dex.engine.address, "chaos-notes") == []
            assert await dangling(dex.engine.address, "chaos-heavy") == []
            assert not audit(dex.engine.db).dangling
    finally:
        stop.set()
        await writer
    assert len(acknowledged) >= 3, acknowledged.keys()
    listed: str = await dex.client.invoke_rpc(flow.list_notes, "chaos-notes")
    found = dict(item.split("=", 1) for item in listed.split(";"))
    assert {key: found.get(key) for key in acknowledged} == acknowledged
    heavy = await dex.client.wait_for_flow("chaos-heavy", timedelta(seconds=60))
    assert heavy.single_output(str) == "loaded 5 crates"


async def test_a_load_blobs_answer_stays_under_4_mib_with_many_small_blobs(
    engine: EngineProcess,
) -> None:
    """4,000 values of 1,100 bytes: the answer's map framing counts too, so the answer fits a
    default gRPC channel (4 MiB) and leaves the rest out for the next call."""
    writes = [pb.AttributeWrite(key=f"k{index}", value=pb.Value(string_value=text(
        f"{index:05d}", 1100))) for index in range(4000)]
    async with grpc.aio.insecure_channel(engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        await stub.StartFlow(pb.StartFlowRequest(
            flow_id="many-1", flow_type="T", request_id="r",
            flow_start_options=pb.FlowStartOptions(attributes=writes)))
    references = list((await attributes(engine.address, "many-1")).values())
    assert len(references) == 4000
    assert all(value.WhichOneof("kind") == "internal_blob_id_for_string_value"
               for value in references)
    answered = await load(engine.address, "many-1", *references)
    assert 3000 < len(answered.values) < 4000


async def test_a_value_no_worker_could_load_is_refused_when_written(dex: DexEnv) -> None:
    from dex import DexServiceError

    flow = flows.COUNTER
    await dex.client.start_flow(flow, "huge-1", None)
    with pytest.raises(DexServiceError) as refused:
        # A small input whose result writes one 4.2 MB value.
        await dex.client.invoke_rpc(flow.note_repeated, "huge-1", "a=h*4200000")
    assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "more than the" in refused.value.detail and "nothing of the rpc" in refused.value.detail
    assert await dex.client.invoke_rpc(flow.list_notes, "huge-1") == ""


def test_a_sub_flow_output_blob_is_stored_with_its_parent() -> None:
    """The parent may commit before the child that produced the output: the blob goes with
    both commits, so a crash between them leaves no reference without its blob."""
    store = Store(":memory:")
    engine = EngineState(store)
    engine.blob_threshold = 1024

    def run(run_id: str) -> Run:
        return Run(run_id, run_id, 1, "T", pb.FLOW_STATUS_RUNNING, "r", 0.0, run_id,
                   pb.FlowConfig(), pb.StartFlowRequest())

    child, parent = run("child"), run("parent")
    reference = engine.offload(child, pb.Value(string_value=text("output", 5000)))
    # The parent's waiting Step holds the child's result, as _report_to_parents leaves it.
    parent.steps["Wait-1"] = StepExec(
        "Wait-1", "Wait", pb.StepMovement(step_type="Wait"), "waiting",
        subs={0: pb.FlowResult(results=[pb.StepCompletionOutput(
            completed_step_output=reference)])},
    )
    engine.carry_blob(child, parent, reference)
    engine.flush(parent)  # the child's commit never happens
    stored = store.load_blob(reference.internal_blob_id_for_string_value)
    assert stored is not None and pb.Value.FromString(stored).string_value.startswith("output")
    store.close()
