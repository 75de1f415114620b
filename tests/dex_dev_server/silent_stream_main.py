"""One pull stream in its own process that takes a task and never answers it (killed by tests).

It registers on a Flow type's queue, prints ``task <attempt>`` for the first task it receives
(a worker whose Step is running and has written nothing yet), then waits to be killed.
``python -m tests.dex_dev_server.silent_stream_main ADDRESS FLOW_TYPE``.
"""

from __future__ import annotations

import asyncio
import sys

import grpc
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc


def attempt_of(task: pb.PollWorkerTask) -> int:
    """The attempt of a Step task (``wait_for`` or ``execute``); 0 for an RPC."""
    request = task.WhichOneof("request")
    if request == "wait_for":
        return task.wait_for.context.attempt
    if request == "execute":
        return task.execute.context.attempt
    return 0


async def main(address: str, flow_type: str) -> None:
    async with grpc.aio.insecure_channel(address) as channel:
        call = dex_pb2_grpc.WorkerTaskServiceStub(channel).PollWorkerTask()
        await call.write(pb.PollWorkerTaskRequest(register=pb.PollWorkerTaskRegister(
            queue=flow_type, app_worker_id="silent", flow_types=[flow_type])))
        while True:
            frame = await call.read()
            if frame is grpc.aio.EOF:
                return
            if frame.WhichOneof("frame") == "task":
                print(f"task {attempt_of(frame.task)}", flush=True)
                break
        await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
