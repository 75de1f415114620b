"""A stdio MCP server whose read-only tools never answer: the transport failures of issue 23.

Run it with ``python tests/agents_app/failing_mcp_server.py``. Each call first appends the
tool's name as one line to the file named by ``FAILING_MCP_LOG``, so a test counts the calls
that really reached a server (one per Step attempt), then:

- ``crash`` ends the server process at once (the client sees the connection close);
- ``hang`` sleeps for an hour (only a timeout ends the call).

Both carry ``readOnlyHint``, so a server trusted to annotate makes them ``read`` tools, which
retry.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

LOG_ENV = "FAILING_MCP_LOG"
HANG_SECONDS = 3600
#: This file, to run as the server's command (``python SCRIPT``).
SCRIPT = Path(__file__).resolve()

server = MCPServer("dexagents-test-failing")
READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


def calls_count(log: Path, tool: str) -> int:
    """How many calls of ``tool`` the servers logging to ``log`` received."""
    if not log.exists():
        return 0
    return log.read_text().splitlines().count(tool)


def _record(tool: str) -> None:
    with Path(os.environ[LOG_ENV]).open("a") as log:
        log.write(f"{tool}\n")


@server.tool(name="crash", description="Ends the server process.", annotations=READ_ONLY)
def crash() -> str:
    """Log the call, then end the process without answering."""
    _record("crash")
    os._exit(1)


@server.tool(name="hang", description="Never answers.", annotations=READ_ONLY)
async def hang() -> str:
    """Log the call, then sleep for ``HANG_SECONDS``."""
    _record("hang")
    await asyncio.sleep(HANG_SECONDS)
    return "woke up"


if __name__ == "__main__":
    server.run("stdio")
