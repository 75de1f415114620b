# mypy: disable-error-code="arg-type"
# (AsyncClient.invoke_rpc in dex-python-sdk 1.23.0 is typed for synchronous RPC handlers only.)
"""``dexdev.FlowRetention/DeleteFlow`` (``dex_dev_server._retention_service``): a closed Flow's
runs, Attributes, history, Stream messages and blobs are deleted; running Flows are refused;
other Flows keep theirs; the deletion survives a restart."""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import grpc
import pytest
from dex import FlowStatus, StartFlowOptions
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2, wrappers_pb2

from dex_dev_server._retention_service import SERVICE

from . import flows
from .blob_audit import audit
from .conftest import DexEnv, EngineProcess


async def _delete(address: str, flow_id: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = channel.unary_unary(
            f"/{SERVICE}/DeleteFlow",
            request_serializer=wrappers_pb2.StringValue.SerializeToString,
            response_deserializer=empty_pb2.Empty.FromString,
        )
        await call(wrappers_pb2.StringValue(value=flow_id), timeout=10)


def _rows(engine: EngineProcess, flow_id: str) -> dict[str, int]:
    with sqlite3.connect(engine.db) as db:
        run_ids = [row[0] for row in db.execute("SELECT run_id FROM runs WHERE flow_id=?",
                                                (flow_id,))]
        marks = ",".join("?" * len(run_ids)) or "''"
        counts = {
            table: db.execute(
                f"SELECT COUNT(*) FROM {table} WHERE run_id IN ({marks})", run_ids
            ).fetchone()[0]
            for table in ("history", "attributes", "channel_messages", "blob_refs")
        }
        counts["runs"] = len(run_ids)
        counts["stream_messages"] = db.execute(
            "SELECT COUNT(*) FROM stream_messages WHERE flow_id=?", (flow_id,)
        ).fetchone()[0]
    return counts


async def test_a_stopped_flow_is_deleted_with_its_history_streams_and_blobs(
    dex: DexEnv,
) -> None:
    options = StartFlowOptions().with_attribute(flows.cargo, "crate-0", flows.crate(0))
    await dex.client.start_flow(flows.COUNTER, "doomed-1", None, options)
    await dex.client.invoke_rpc(flows.COUNTER.set_label, "doomed-1", "hello")
    await dex.client.write_stream("doomed-1", flows.tokens, "tester", "said")
    await dex.client.start_flow(flows.STREAM, "kept-1", 2)
    await dex.client.wait_for_flow("kept-1", timedelta(seconds=10))
    assert audit(dex.engine.db).stored, "the crate is stored as a blob"

    with pytest.raises(grpc.aio.AioRpcError) as running:
        await _delete(dex.engine.address, "doomed-1")
    assert running.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert _rows(dex.engine, "doomed-1")["history"] > 0

    await dex.client.stop_flow("doomed-1")
    await _delete(dex.engine.address, "doomed-1")

    assert set(_rows(dex.engine, "doomed-1").values()) == {0}
    assert not audit(dex.engine.db).stored, "the crate's blob went with its only holder"
    async with grpc.aio.insecure_channel(dex.engine.address) as channel:
        stub = dex_pb2_grpc.FlowServiceStub(channel)
        for call in (
            stub.GetHistoryEvents(pb.GetHistoryEventsRequest(flow_id="doomed-1")),
            stub.GetFlowSummary(pb.GetFlowSummaryRequest(flow_id="doomed-1")),
        ):
            with pytest.raises(grpc.aio.AioRpcError) as gone:
                await call
            assert gone.value.code() == grpc.StatusCode.NOT_FOUND
    page = await dex.client.list_stream_messages("doomed-1", flows.tokens, 10)
    assert list(page.messages) == []
    # Another Flow keeps everything; a second delete, or an unknown Flow, is NOT_FOUND.
    assert _rows(dex.engine, "kept-1")["history"] > 0
    assert [m.value for m in (await dex.client.list_stream_messages(
        "kept-1", flows.tokens, 10)).messages] == ["token-1", "token-0"]
    with pytest.raises(grpc.aio.AioRpcError) as again:
        await _delete(dex.engine.address, "doomed-1")
    assert again.value.code() == grpc.StatusCode.NOT_FOUND

    # The ID can be used again, and the deletion holds across a restart.
    await dex.client.start_flow(flows.CHAIN, "doomed-1", 1)
    result = await dex.client.wait_for_flow("doomed-1", timedelta(seconds=10))
    assert result.status is FlowStatus.COMPLETED
    dex.engine.stop()
    dex.engine.start()
    info = await dex.client.describe_flow("doomed-1")
    assert info.flow_type == "ChainFlow"
