# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers
# only; the async RPCs of the test Flows are valid at run time.)
"""Blob collection (``_blobs``): a blob goes in the transaction that removes the last
reference to it, and the engine's start deletes any blob nothing references. A blob stays
while anything references it: another Attribute, another Flow, a history event."""

from __future__ import annotations

import sqlite3
from datetime import timedelta
from pathlib import Path

import grpc
import pytest
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_dev_server._blobs import blob_id_of, blob_reference
from dex_dev_server._model import Run
from dex_dev_server._state import EngineState
from dex_dev_server._store import Store

from . import flows
from .blob_audit import audit
from .conftest import DexEnv, EngineProcess
from .test_blobs import attributes, load, text


@pytest.fixture
def engine_args() -> list[str]:
    return ["--blob-threshold", "1024"]


def blob_id(value: pb.Value) -> str:
    found = blob_id_of(value)
    assert found is not None, value
    return found[1]


def assert_clean(db: Path) -> None:
    """No stored reference without its blob, and no blob without a reference."""
    check = audit(db)
    assert not check.dangling, check.dangling
    assert not check.unreferenced, check.unreferenced


async def test_an_overwritten_attribute_loses_its_blob_unless_another_flow_holds_it(
    dex: DexEnv,
) -> None:
    flow, db = flows.COUNTER, dex.engine.db
    for flow_id in ("gc-a", "gc-b"):
        await dex.client.start_flow(flow, flow_id, None)
        await dex.client.invoke_rpc(flow.set_label, flow_id, text("shared"))
    shared = blob_id((await attributes(dex.engine.address, "gc-a"))["label"])
    assert blob_id((await attributes(dex.engine.address, "gc-b"))["label"]) == shared

    await dex.client.invoke_rpc(flow.set_label, "gc-a", text("second"))
    assert shared in audit(db).stored  # gc-b still references it
    assert_clean(db)

    await dex.client.invoke_rpc(flow.set_label, "gc-b", text("third"))
    assert shared not in audit(db).stored
    assert_clean(db)

    # After a restart the engine answers the current values and not the collected one.
    dex.engine.kill()
    dex.engine.start()
    current = (await attributes(dex.engine.address, "gc-a"))["label"]
    answered = await load(dex.engine.address, "gc-a", current,
                          pb.Value(internal_blob_id_for_string_value=shared))
    assert list(answered.values) == [blob_id(current)]
    assert answered.values[blob_id(current)].string_value == text("second")


async def test_a_deleted_map_instance_loses_its_blob(dex: DexEnv) -> None:
    flow, db = flows.COUNTER, dex.engine.db
    await dex.client.start_flow(flow, "gc-map", None)
    await dex.client.invoke_rpc(flow.note, "gc-map", f"a={text('note-a')}")
    await dex.client.invoke_rpc(flow.note, "gc-map", f"b={text('note-b')}")
    stored = await attributes(dex.engine.address, "gc-map")
    kept, dropped = blob_id(stored["notes/b"]), blob_id(stored["notes/a"])

    await dex.client.invoke_rpc(flow.note, "gc-map", "a")  # deletes the instance
    blobs = audit(db).stored
    assert dropped not in blobs and kept in blobs
    assert_clean(db)
    assert await dex.client.invoke_rpc(flow.list_notes, "gc-map") == f"b={text('note-b')}"


async def test_consumed_messages_keep_their_blobs_in_history(dex: DexEnv) -> None:
    """A consumed channel message leaves its channel, but the history event that published
    it still references the blob: nothing is collected, and every reference in the history
    loads."""
    await dex.client.start_flow(flows.SIGNAL, "gc-inbox", None)
    messages = [text(f"message-{index}") for index in range(2)]
    for message in messages:
        await dex.client.invoke_rpc(flows.SIGNAL.send, "gc-inbox", message)
    result = await dex.client.wait_for_flow("gc-inbox", timedelta(seconds=30))
    assert result.single_output(str) == "+".join(messages)

    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        history = await stub.GetHistoryEvents(
            pb.GetHistoryEventsRequest(flow_id="gc-inbox", estimate_page_size=1000))
    published = [
        message.value
        for event in history.events
        if event.WhichOneof("payload") == "rpc_execution_completed"
        for message in event.rpc_execution_completed.publish_to_channel
    ]
    assert len(published) == 2
    answered = await load(dex.engine.address, "gc-inbox", *published)
    assert [answered.values[blob_id(value)].string_value for value in published] == messages
    assert_clean(dex.engine.db)


async def test_continue_as_new_moves_references_without_losing_a_blob(dex: DexEnv) -> None:
    from dex import FlowConfig, StartFlowOptions

    await dex.client.start_flow(
        flows.LEDGER, "gc-ledger", flows.ledger_input(1, 8),
        StartFlowOptions(config_override=FlowConfig(continue_as_new_threshold=4)),
    )
    result = await dex.client.wait_for_flow("gc-ledger", timedelta(seconds=30))
    assert result.single_output(str) == "8 pages"
    stored = await attributes(dex.engine.address, "gc-ledger")
    assert sorted(stored) == ["ledger", "ledger_pages/7", "ledger_pages/8"]
    # The ledger and the last page are one blob, referenced twice.
    assert blob_id(stored["ledger"]) == blob_id(stored["ledger_pages/8"])
    assert_clean(dex.engine.db)


async def test_the_engine_start_deletes_blobs_nothing_references(
    engine: EngineProcess,
) -> None:
    """The start marks references from the stored rows, not from ``blob_refs`` alone: an
    orphaned blob (as an engine that leaked would leave it) goes; references that commits
    did not index (as an engine without collection would write them: no holders, a newer
    history event) keep their blobs; a database never marked has all of it read."""
    address = engine.address
    async with grpc.aio.insecure_channel(address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        await stub.StartFlow(pb.StartFlowRequest(
            flow_id="gc-start", flow_type="T", request_id="r",
            flow_start_options=pb.FlowStartOptions(attributes=[
                pb.AttributeWrite(key="kept", value=pb.Value(string_value=text("kept")))
            ])))
    kept = (await attributes(address, "gc-start"))["kept"]
    found = blob_reference(pb.Value(string_value=text("history-only")), 1024)
    assert found is not None
    in_history, in_history_id, in_history_data = found

    for number, case in enumerate(("orphan", "unindexed", "never marked")):
        engine.kill()
        orphan_id = f"{number:040d}"
        with sqlite3.connect(engine.db) as db:
            orphan = pb.Value(string_value=text(f"orphan-{number}")).SerializeToString()
            db.execute("INSERT INTO blobs (blob_id, value) VALUES (?, ?)", (orphan_id, orphan))
            if case == "unindexed":
                db.execute("DELETE FROM blob_refs WHERE holder<>'h'")
                (run_id,) = db.execute(
                    "SELECT run_id FROM runs WHERE flow_id='gc-start'").fetchone()
                event = pb.FlowHistoryEvent(
                    event_id=1000, channel_external_publish=pb.ChannelExternalPublishEvent(
                        messages=[pb.ChannelMessage(channel_name="c", value=in_history)]))
                db.execute("INSERT INTO history (run_id, event_id, event) VALUES (?, ?, ?)",
                           (run_id, 1000, event.SerializeToString()))
                db.execute("INSERT INTO blobs (blob_id, value) VALUES (?, ?)",
                           (in_history_id, in_history_data))
            elif case == "never marked":
                db.execute("DELETE FROM blob_refs")
                db.execute("DELETE FROM meta WHERE key='blob_refs_history_rowid'")
        db.close()
        assert audit(engine.db).unreferenced == {orphan_id}, case
        engine.start()
        assert_clean(engine.db)
        answered = await load(address, "gc-start", kept, in_history)
        assert answered.values[blob_id(kept)].string_value == text("kept")
        if case != "orphan":
            assert answered.values[in_history_id].string_value == text("history-only")


def test_a_value_replaced_before_its_commit_stores_no_blob() -> None:
    """Two writes of one Attribute in one commit store only the second value's blob; a
    delete in the next commit removes it."""
    store = Store(":memory:")
    engine = EngineState(store)
    engine.blob_threshold = 1024
    run = Run("run", "run", 1, "T", pb.FLOW_STATUS_RUNNING, "r", 0.0, "run",
              pb.FlowConfig(), pb.StartFlowRequest())

    def blobs() -> set[str]:
        return {row[0] for row in store.db.execute("SELECT blob_id FROM blobs")}

    engine.set_attribute(run, "k", pb.Value(string_value=text("first")))
    engine.set_attribute(run, "k", pb.Value(string_value=text("second")))
    engine.flush(run)
    assert blobs() == {blob_id(run.attributes["k"])}
    engine.set_attribute(run, "k", pb.Value(null_value="NULL_VALUE"))
    engine.flush(run)
    assert blobs() == set()
    assert store.blobs_collected == 2
    store.close()
