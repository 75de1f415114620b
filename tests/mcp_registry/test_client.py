"""The MCP client against real stdio MCP servers run as subprocesses."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mcp_registry.client import (
    IDEMPOTENCY_KEY_META,
    McpClientPool,
    McpServerSpec,
    McpToolError,
    McpTransportError,
    list_tools,
)
from tests.mcp_registry.conftest import DEADLINE_SECONDS, REPO_ROOT, process_gone, wait_until

SEARCH_SPEC = McpServerSpec(
    name="search",
    transport="stdio",
    command=sys.executable,
    args=("-m", "mcp_registry.demo_servers.search"),
    cwd=str(REPO_ROOT),
    startup_timeout=30.0,
    call_timeout=30.0,
)

# A low-level server that pages its tool list three at a time and exposes what the tests need.
PROBE_SERVER = textwrap.dedent(
    """
    import json, os
    import anyio
    import mcp.types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    NAMES = ["echo_meta", "pid", "sleep", "env", "extra_1", "extra_2", "extra_3"]
    TOOLS = [types.Tool(name=name, input_schema={"type": "object"}) for name in NAMES]

    async def list_tools(ctx, params):
        start = int(params.cursor) if params is not None and params.cursor else 0
        end = start + 3
        following = str(end) if end < len(TOOLS) else None
        return types.ListToolsResult(tools=TOOLS[start:end], next_cursor=following)

    def text(value):
        return types.CallToolResult(content=[types.TextContent(type="text", text=value)])

    async def call_tool(ctx, params):
        arguments = params.arguments or {}
        if params.name == "echo_meta":
            return text(json.dumps(dict(ctx.meta or {})))
        if params.name == "pid":
            return text(str(os.getpid()))
        if params.name == "sleep":
            await anyio.sleep(float(arguments["seconds"]))
            return text("slept")
        if params.name == "env":
            return text(json.dumps({name: os.environ.get(name) for name in arguments["names"]}))
        raise MCPError(code=-32602, message=f"Unknown tool: {params.name}")

    server = Server("probe", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main():
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
    """
)

# A Streamable HTTP server on a free port that reports the header it received.
HTTP_SERVER = textwrap.dedent(
    """
    import asyncio, socket
    import uvicorn
    from mcp.server.mcpserver import Context, MCPServer

    server = MCPServer("http-probe")

    @server.tool()
    def whoami(ctx: Context) -> str:
        return "token=" + (ctx.headers or {}).get("x-probe-token", "<none>")

    async def main():
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        config = uvicorn.Config(server.streamable_http_app(), log_level="warning")
        uvicorn_server = uvicorn.Server(config)
        serving = asyncio.create_task(uvicorn_server.serve(sockets=[sock]))
        while not uvicorn_server.started:
            await asyncio.sleep(0.01)
        print(sock.getsockname()[1], flush=True)
        await serving

    asyncio.run(main())
    """
)

# Opens a pool in its own process, prints the probe server's PID, then waits to be killed.
POOL_HOLDER = textwrap.dedent(
    """
    import asyncio, sys
    from mcp_registry.client import McpClientPool, McpServerSpec

    async def main():
        spec = McpServerSpec(name="probe", transport="stdio", command=sys.executable,
                             args=[sys.argv[1]])
        pool = McpClientPool()
        output = await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=30)
        print(output.text, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    """
)


@pytest.fixture
def probe_spec(tmp_path: Path) -> McpServerSpec:
    script = tmp_path / "probe_server.py"
    script.write_text(PROBE_SERVER)
    return McpServerSpec(
        name="probe",
        transport="stdio",
        command=sys.executable,
        args=(str(script),),
        startup_timeout=30.0,
        call_timeout=30.0,
    )


async def test_list_tools_shows_web_search_as_read_only() -> None:
    tools = await list_tools(SEARCH_SPEC)
    assert [tool.name for tool in tools] == ["web_search"]
    tool = tools[0]
    assert tool.title == "Web search"
    assert tool.annotations["readOnlyHint"] is True
    assert tool.annotations["title"] == "Web search"
    assert tool.input_schema["required"] == ["query"]
    assert set(tool.input_schema["properties"]) == {"query", "limit"}
    assert tool.description


async def test_web_search_quotes_the_query(pool: McpClientPool) -> None:
    output = await pool.call_tool(
        SEARCH_SPEC,
        "web_search",
        {"query": "durable agents on Dex", "limit": 2},
        idempotency_key="session-1/turn-1/call_1",
        timeout=None,
    )
    assert '"durable agents on Dex"' in output.text
    assert output.structured_content["query"] == "durable agents on Dex"
    results = output.structured_content["results"]
    assert len(results) == 2
    assert all("durable agents on Dex" in result["title"] for result in results)


async def test_unknown_tool_raises_a_model_readable_error(pool: McpClientPool) -> None:
    with pytest.raises(McpToolError) as raised:
        await pool.call_tool(SEARCH_SPEC, "no_such_tool", {}, idempotency_key=None, timeout=None)
    assert "no_such_tool" in raised.value.message


async def test_invalid_arguments_raise_a_model_readable_error(pool: McpClientPool) -> None:
    with pytest.raises(McpToolError) as raised:
        await pool.call_tool(
            SEARCH_SPEC, "web_search", {"limit": "many"}, idempotency_key=None, timeout=None
        )
    assert "query" in raised.value.message


async def test_protocol_error_raises_a_model_readable_error(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    with pytest.raises(McpToolError) as raised:
        await pool.call_tool(probe_spec, "missing", {}, idempotency_key=None, timeout=None)
    assert "Unknown tool: missing" in raised.value.message
    assert "'probe'" in raised.value.message


async def test_list_tools_follows_every_page(probe_spec: McpServerSpec) -> None:
    tools = await list_tools(probe_spec)
    assert [tool.name for tool in tools] == [
        "echo_meta",
        "pid",
        "sleep",
        "env",
        "extra_1",
        "extra_2",
        "extra_3",
    ]


async def test_idempotency_key_travels_in_request_meta(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    output = await pool.call_tool(
        probe_spec, "echo_meta", {}, idempotency_key="s-1/turn-2/call_3", timeout=None
    )
    assert json.loads(output.text)[IDEMPOTENCY_KEY_META] == "s-1/turn-2/call_3"


async def test_only_named_environment_variables_reach_the_server(
    pool: McpClientPool, probe_spec: McpServerSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROBE_SHARED", "visible")
    monkeypatch.setenv("PROBE_PRIVATE", "hidden")
    spec = replace(probe_spec, env_names=("PROBE_SHARED",), env={"PROBE_PLAIN": "plain value"})
    output = await pool.call_tool(
        spec,
        "env",
        {"names": ["PROBE_SHARED", "PROBE_PRIVATE", "PROBE_PLAIN"]},
        idempotency_key=None,
        timeout=None,
    )
    assert json.loads(output.text) == {
        "PROBE_SHARED": "visible",
        "PROBE_PRIVATE": None,
        "PROBE_PLAIN": "plain value",
    }


async def test_an_unset_secret_reference_fails_with_its_name(
    pool: McpClientPool, probe_spec: McpServerSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROBE_UNSET", raising=False)
    spec = replace(probe_spec, env_names=("PROBE_UNSET",))
    with pytest.raises(McpTransportError) as raised:
        await list_tools(spec)
    assert raised.value.message == (
        "MCP server 'probe': environment variable PROBE_UNSET (listed in its secret "
        "references) is not set in the worker's environment"
    )
    with pytest.raises(McpTransportError):
        await pool.call_tool(spec, "pid", {}, idempotency_key=None, timeout=None)


async def test_calls_share_one_long_lived_session(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    outputs = await asyncio.gather(
        *(
            pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)
            for _ in range(4)
        )
    )
    later = await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)
    assert len({output.text for output in outputs} | {later.text}) == 1


async def test_call_timeout_raises_a_transport_error(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    with pytest.raises(McpTransportError):
        await pool.call_tool(
            probe_spec, "sleep", {"seconds": 30}, idempotency_key=None, timeout=0.5
        )
    # The session survives a timed-out call.
    output = await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)
    assert output.text.isdigit()


async def test_a_dead_server_is_restarted_by_a_later_call(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    first_pid = int(
        (await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)).text
    )
    os.kill(first_pid, signal.SIGKILL)
    await wait_until("the server to die", lambda: process_gone(first_pid))

    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        try:
            output = await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=5)
        except McpTransportError:
            assert time.monotonic() < deadline, "the pool never reconnected"
            continue
        break
    assert int(output.text) != first_pid


async def test_pool_close_stops_the_server(probe_spec: McpServerSpec) -> None:
    pool = McpClientPool()
    pid = int(
        (await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)).text
    )
    await pool.aclose()
    await wait_until("the server to stop", lambda: process_gone(pid))
    with pytest.raises(McpTransportError):
        await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)


async def test_server_runs_in_its_own_process_group(
    pool: McpClientPool, probe_spec: McpServerSpec
) -> None:
    pid = int(
        (await pool.call_tool(probe_spec, "pid", {}, idempotency_key=None, timeout=None)).text
    )
    assert os.getpgid(pid) != os.getpgid(0)


async def test_server_is_not_orphaned_when_the_worker_is_killed(
    probe_spec: McpServerSpec, tmp_path: Path
) -> None:
    holder_script = tmp_path / "pool_holder.py"
    holder_script.write_text(POOL_HOLDER)
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        str(holder_script),
        probe_spec.args[0],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=DEADLINE_SECONDS)
        server_pid = int(line)
        assert not process_gone(server_pid)
        holder.kill()
        await holder.wait()
        await wait_until("the orphaned server to stop", lambda: process_gone(server_pid))
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def test_a_server_that_never_answers_initialize_is_abandoned(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    silent = McpServerSpec(
        name="silent",
        transport="stdio",
        command=sys.executable,
        args=("-c", f"import os, pathlib, time; pathlib.Path({str(pid_file)!r})"
                    ".write_text(str(os.getpid())); time.sleep(3600)"),
        startup_timeout=1.0,
    )
    with pytest.raises(McpTransportError, match="'silent' did not finish starting within 1 s"):
        await list_tools(silent)
    await wait_until("the silent server to write its pid", pid_file.exists)
    await wait_until("the silent server to be stopped",
                      lambda: process_gone(int(pid_file.read_text())))


def test_an_abandoned_start_leaves_no_unretrieved_failure() -> None:
    # asyncio reports a failed future nobody awaited when it is collected, here at exit.
    code = textwrap.dedent("""
        import asyncio, sys
        from mcp_registry.client import McpServerSpec, McpTransportError, list_tools
        spec = McpServerSpec(name="silent", transport="stdio", command=sys.executable,
                             args=("-c", "import time; time.sleep(3600)"), startup_timeout=0.5)
        async def main():
            try:
                await list_tools(spec)
            except McpTransportError:
                print("abandoned")
        asyncio.run(main())
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=60, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "abandoned"), done.stderr
    assert "never retrieved" not in done.stderr, done.stderr


async def test_a_missing_command_raises_a_transport_error(pool: McpClientPool) -> None:
    spec = McpServerSpec(
        name="broken", transport="stdio", command="/nonexistent/mcp-server", startup_timeout=10
    )
    with pytest.raises(McpTransportError) as raised:
        await pool.call_tool(spec, "anything", {}, idempotency_key=None, timeout=None)
    assert "'broken'" in raised.value.message


async def test_streamable_http_server_gets_headers_from_the_environment(
    pool: McpClientPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    script = tmp_path / "http_server.py"
    script.write_text(HTTP_SERVER)
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(script), stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        port = int(await asyncio.wait_for(server.stdout.readline(), timeout=DEADLINE_SECONDS))
        monkeypatch.setenv("PROBE_TOKEN", "sekret-1")
        spec = McpServerSpec(
            name="remote",
            transport="streamable_http",
            url=f"http://127.0.0.1:{port}/mcp",
            header_env={"X-Probe-Token": "PROBE_TOKEN"},
        )
        tools = await list_tools(spec)
        assert [tool.name for tool in tools] == ["whoami"]
        output = await pool.call_tool(spec, "whoami", {}, idempotency_key="k", timeout=None)
        assert output.text == "token=sekret-1"
    finally:
        server.terminate()
        await asyncio.wait_for(server.wait(), timeout=DEADLINE_SECONDS)


async def test_http_header_variables_must_be_set(
    pool: McpClientPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROBE_TOKEN", raising=False)
    spec = McpServerSpec(
        name="remote",
        transport="streamable_http",
        url="http://127.0.0.1:9/mcp",
        header_env={"Authorization": "PROBE_TOKEN"},
        startup_timeout=10,
    )
    with pytest.raises(McpTransportError) as raised:
        await pool.call_tool(spec, "anything", {}, idempotency_key=None, timeout=None)
    assert "PROBE_TOKEN" in raised.value.message
