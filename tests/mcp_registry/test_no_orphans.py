"""No MCP child outlives the worker: 100 connect/close cycles leave nothing behind, and a
SIGKILLed worker holding live sessions (Python, mcp-server-time, Node server-everything) takes
every server process with it (issue 5, "The client used by the worker")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import textwrap
import time
import uuid
from pathlib import Path

from tests.mcp_registry.conftest import DEADLINE_SECONDS, REPO_ROOT, everything_command
from tests.processes import marked_pids

CYCLES = 100
BATCH = 10

# A minimal MCP server in plain Python (no SDK import), so 100 starts stay cheap.
TINY_SERVER = textwrap.dedent(
    """
    import json, os, sys
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        method = message["method"]
        if method == "initialize":
            result = {"protocolVersion": message["params"]["protocolVersion"],
                      "capabilities": {"tools": {}},
                      "serverInfo": {"name": "tiny", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": [{"name": "pid", "inputSchema": {"type": "object"}}]}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": str(os.getpid())}]}
        elif method == "ping":
            result = {}
        else:
            error = {"code": -32601, "message": "Method not found"}
            print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "error": error}),
                  flush=True)
            continue
        print(json.dumps({"jsonrpc": "2.0", "id": message["id"], "result": result}), flush=True)
    """
)

# The "worker": 100 connect/close cycles, then long-lived sessions until it is killed.
HOLDER = textwrap.dedent(
    """
    import asyncio, json, sys
    from mcp_registry.client import McpClientPool, McpServerSpec

    TINY, NODE, EVERYTHING = sys.argv[1], sys.argv[2], sys.argv[3]
    MARK = ("ORPHAN_MARK",)

    def tiny(name):
        return McpServerSpec(name=name, transport="stdio", command=sys.executable,
                             args=["-I", TINY], env_names=MARK)

    async def cycle(index):
        async with McpClientPool() as pool:
            output = await pool.call_tool(tiny(f"t{index}"), "pid", {},
                                          idempotency_key=None, timeout=30)
            assert output.text.isdigit()

    async def main():
        for start in range(0, CYCLES, BATCH):
            await asyncio.gather(*(cycle(i) for i in range(start, start + BATCH)))
        print("cycled", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        pool = McpClientPool()
        specs = [
            tiny("a"), tiny("b"),
            McpServerSpec(name="time", transport="stdio", command=sys.executable,
                          args=["-m", "mcp_server_time"], env_names=MARK),
            McpServerSpec(name="everything", transport="stdio", command=NODE,
                          args=[EVERYTHING, "stdio"], env_names=MARK),
        ]
        tools = {"a": "pid", "b": "pid", "time": "get_current_time", "everything": "echo"}
        arguments = {"time": {"timezone": "UTC"}, "everything": {"message": "hi"}}
        for spec in specs:
            await pool.call_tool(spec, tools[spec.name], arguments.get(spec.name, {}),
                                 idempotency_key=None, timeout=30)
        print(json.dumps(len(specs)), flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
).replace("CYCLES", str(CYCLES)).replace("BATCH", str(BATCH))


def marked_processes(mark: str) -> list[int]:
    """PIDs of live processes whose environment holds ``ORPHAN_MARK=<mark>``."""
    return marked_pids("ORPHAN_MARK", mark)


async def wait_for_count(mark: str, description: str, predicate: object) -> list[int]:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        pids = marked_processes(mark)
        if predicate(len(pids)):  # type: ignore[operator]
            return pids
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {description}: {pids}")
        await asyncio.sleep(0.1)


async def test_no_mcp_child_survives_cycles_or_a_killed_worker(tmp_path: Path) -> None:
    node, everything = everything_command()
    tiny = tmp_path / "tiny_server.py"
    tiny.write_text(TINY_SERVER)
    holder_script = tmp_path / "holder.py"
    holder_script.write_text(HOLDER)
    mark = uuid.uuid4().hex
    holder = await asyncio.create_subprocess_exec(
        sys.executable, str(holder_script), str(tiny), node, everything,
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "ORPHAN_MARK": mark},
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=120)
        assert line == b"cycled\n", line
        # The holder itself carries the mark; every closed session's processes are gone.
        await wait_for_count(mark, "the cycled servers to exit", lambda n: n == 1)

        holder.stdin.write(b"go\n")
        await holder.stdin.drain()
        sessions = json.loads(await asyncio.wait_for(holder.stdout.readline(), timeout=60))
        # Each live session: a guard process and its server (Node may add none).
        live = await wait_for_count(
            mark, "the live sessions", lambda n: n >= 1 + 2 * sessions
        )
        assert holder.pid in live

        holder.send_signal(signal.SIGKILL)
        await holder.wait()
        await wait_for_count(mark, "every MCP child to stop", lambda n: n == 0)
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()

