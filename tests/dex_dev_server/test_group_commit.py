"""Group commit at ``--sync full``: nothing leaves the engine before the WAL fsync covering it.

The engine runs in this process (``EngineServer``) so that the test can hold the WAL fsync of
its syncer thread, as a slow disk would: while it is held, neither the ``StartFlow`` answer nor
the first Step's task may leave, because a power loss then would take back the commit they
show. Kills of the engine process at ``--sync full`` are in ``test_durability`` and
``test_repeated_kills``.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import grpc
import pytest
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_dev_server._server import EngineServer

from .conftest import eventually

#: How long a wrongly ungated answer gets to show up while the fsync is held. The test passes
#: with any value when the engine is right; it only gives a wrong engine its chance to fail.
MISBEHAVE_WINDOW = 0.3


async def test_full_answers_and_dispatches_nothing_before_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    released = threading.Event()
    held = threading.Event()
    real_fsync = os.fsync

    def slow_disk_fsync(fd: int) -> None:
        held.set()
        released.wait(60)
        real_fsync(fd)

    server = EngineServer(tmp_path / "engine.sqlite3", port=0, synchronous="full")
    await server.start()
    try:
        store = server.store
        assert store is not None and store.group_commit
        async with grpc.aio.insecure_channel(server.address) as channel:
            workers = dex_pb2_grpc.WorkerTaskServiceStub(channel)
            stream = workers.PollWorkerTask()
            await stream.write(
                pb.PollWorkerTaskRequest(
                    register=pb.PollWorkerTaskRegister(
                        queue="Idle", app_worker_id="worker-1", flow_types=["Idle"]
                    )
                )
            )
            registered = await stream.read()
            assert registered.WhichOneof("frame") == "registered"

            monkeypatch.setattr(os, "fsync", slow_disk_fsync)
            flows = dex_pb2_grpc.FlowServiceStub(channel)
            started = asyncio.ensure_future(
                flows.StartFlow(
                    pb.StartFlowRequest(
                        flow_id="gc-1", flow_type="Idle", request_id="r1", start_step_type="S"
                    )
                )
            )
            task_frame = asyncio.ensure_future(stream.read())
            await eventually(lambda: server.engine is not None and server.engine.inflight,
                             within=30)
            await asyncio.get_running_loop().run_in_executor(None, held.wait, 30)
            await asyncio.sleep(MISBEHAVE_WINDOW)
            assert store.synced < store.committed
            assert not started.done()
            assert not task_frame.done()

            released.set()
            response = await started
            assert response.run_id
            frame = await task_frame
            assert frame.task.wait_for.context.flow_id == "gc-1"
            assert store.synced == store.committed
            assert store.stats.fsyncs >= 1
            stream.cancel()
    finally:
        released.set()
        await server.stop()
