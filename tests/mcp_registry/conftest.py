"""Real MCP servers for the registry tests: the demo servers, ``mcp-server-time`` (PyPI),
``@modelcontextprotocol/server-everything`` (npm, installed by ``make peers``) and the stub
servers that misbehave on request (``stub_server.py``, ``stub_http_server.py``); and the admin
form and logged-in client the admin tests share."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from dex_agents.testing import free_port
from mcp_registry.client import McpClientPool, McpServerSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 20.0
EVERYTHING_JS = (
    REPO_ROOT
    / "tests/peers/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
)


def everything_command() -> tuple[str, str]:
    """``(node, index.js)`` of server-everything; fails with the fix when it is missing."""
    node = shutil.which("node")
    if node is None or not EVERYTHING_JS.exists():
        pytest.fail("server-everything is not installed: run `make peers` (needs Node 20+)")
    return node, str(EVERYTHING_JS)


def demo_spec(name: str, **overrides: object) -> McpServerSpec:
    """The spec of the demo server ``name`` run by this interpreter, with its state dir."""
    values: dict[str, object] = {
        "name": name,
        "transport": "stdio",
        "command": sys.executable,
        "args": ("-m", f"mcp_registry.demo_servers.{name}"),
        "cwd": str(REPO_ROOT),
        "env_names": ("DEXAGENTS_VAR_DIR",),
        "startup_timeout": 30.0,
        "call_timeout": 30.0,
    }
    values.update(overrides)
    return McpServerSpec(**values)  # type: ignore[arg-type]


async def wait_until(description: str, probe: Callable[[], bool]) -> None:
    """Poll ``probe`` every 50 ms until it is true; fail after DEADLINE_SECONDS."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {description}")
        await asyncio.sleep(0.05)


def process_gone(pid: int) -> bool:
    """True once ``pid`` no longer runs (reaped, or a zombie waiting for its reaper)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except (FileNotFoundError, ProcessLookupError):  # ESRCH while the process goes
        return True
    return any(
        line.split()[1:2] == ["Z"] for line in status.splitlines() if line.startswith("State:")
    )


@pytest.fixture
def var_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh ``DEXAGENTS_VAR_DIR`` for the demo servers' state files."""
    directory = tmp_path / "var"
    directory.mkdir()
    monkeypatch.setenv("DEXAGENTS_VAR_DIR", str(directory))
    return directory


@pytest.fixture
async def pool() -> AsyncIterator[McpClientPool]:
    async with McpClientPool() as pool:
        yield pool


@pytest.fixture
def time_spec() -> McpServerSpec:
    """``mcp-server-time`` from PyPI, as a stdio child."""
    return McpServerSpec(
        name="time",
        transport="stdio",
        command=sys.executable,
        args=("-m", "mcp_server_time", "--local-timezone", "UTC"),
        startup_timeout=30.0,
        call_timeout=30.0,
    )


@pytest.fixture
def everything_spec() -> McpServerSpec:
    """``@modelcontextprotocol/server-everything`` from npm, as a stdio child."""
    node, script = everything_command()
    return McpServerSpec(
        name="everything",
        transport="stdio",
        command=node,
        args=(script, "stdio"),
        startup_timeout=30.0,
        call_timeout=30.0,
    )


@pytest.fixture
def everything_http_spec() -> Iterator[McpServerSpec]:
    """server-everything serving Streamable HTTP on a free local port."""
    node, script = everything_command()
    port = free_port()
    process = subprocess.Popen(
        [node, script, "streamableHttp"],
        env={**os.environ, "PORT": str(port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + DEADLINE_SECONDS
        while True:
            assert process.poll() is None, "server-everything exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "server-everything never listened"
                time.sleep(0.05)
        yield McpServerSpec(
            name="everything_http",
            transport="streamable_http",
            url=f"http://127.0.0.1:{port}/mcp",
            startup_timeout=30.0,
            call_timeout=30.0,
        )
    finally:
        process.terminate()
        try:
            process.wait(timeout=DEADLINE_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


PEERS = REPO_ROOT / "tests/peers/node_modules/@modelcontextprotocol"


def npm_server_command(package: str) -> tuple[str, str]:
    """``(node, index.js)`` of an npm MCP server of tests/peers (``server-memory``, ...)."""
    node = shutil.which("node")
    script = PEERS / package / "dist/index.js"
    if node is None or not script.exists():
        pytest.fail(f"{package} is not installed: run `make peers` (needs Node 20+)")
    return node, str(script)


@pytest.fixture
def files_root(tmp_path: Path) -> Path:
    """The one folder the filesystem server may touch, with ``notes.txt`` in it."""
    root = tmp_path / "files"
    root.mkdir()
    (root / "notes.txt").write_text("first line\nsecond line\n", encoding="utf-8")
    return root


@pytest.fixture
def filesystem_spec(files_root: Path) -> McpServerSpec:
    """``@modelcontextprotocol/server-filesystem`` (npm) serving ``files_root``."""
    node, script = npm_server_command("server-filesystem")
    return McpServerSpec(
        name="files", transport="stdio", command=node, args=(script, str(files_root)),
        startup_timeout=30.0, call_timeout=30.0,
    )


@pytest.fixture
def memory_spec(tmp_path: Path) -> McpServerSpec:
    """``@modelcontextprotocol/server-memory`` (npm), its graph in a file of ``tmp_path``."""
    node, script = npm_server_command("server-memory")
    return McpServerSpec(
        name="memory", transport="stdio", command=node, args=(script,),
        env={"MEMORY_FILE_PATH": str(tmp_path / "memory.jsonl")},
        startup_timeout=30.0, call_timeout=30.0,
    )


@pytest.fixture
def git_repository(tmp_path: Path) -> Path:
    """An empty git repository for ``mcp-server-git``."""
    repository = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repository)], check=True)
    return repository


@pytest.fixture
def git_spec(git_repository: Path) -> McpServerSpec:
    """``mcp-server-git`` (PyPI) on ``git_repository``."""
    return McpServerSpec(
        name="git", transport="stdio", command=sys.executable,
        args=("-m", "mcp_server_git", "--repository", str(git_repository)),
        startup_timeout=30.0, call_timeout=30.0,
    )


# --- the stub servers ------------------------------------------------------------------------

STUB = Path(__file__).with_name("stub_server.py")
HTTP_STUB = Path(__file__).with_name("stub_http_server.py")
#: The output schema of the stub's ``echo`` tool (``--output-schema``).
ECHO_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}


def stub_spec(journal: Path, *flags: str, **overrides: Any) -> McpServerSpec:
    """The spec of ``stub_server.py`` (a stdio child) journalling to ``journal``, with its
    ``flags`` (its docstring lists them) and spec fields ``overrides``."""
    values: dict[str, Any] = {
        "name": "stub",
        "transport": "stdio",
        "command": sys.executable,
        "args": (str(STUB), "--journal", str(journal), *flags),
        "startup_timeout": 20.0,
        "call_timeout": 20.0,
    }
    values.update(overrides)
    return McpServerSpec(**values)


@contextlib.asynccontextmanager
async def http_stub(journal: Path, *flags: str, **overrides: Any) -> AsyncIterator[McpServerSpec]:
    """``stub_http_server.py`` as a real process, and the spec that reaches it."""
    server = await asyncio.create_subprocess_exec(
        sys.executable, str(HTTP_STUB), "--journal", str(journal), *flags,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert server.stdout is not None
        port = int(await asyncio.wait_for(server.stdout.readline(), timeout=DEADLINE_SECONDS))
        values: dict[str, Any] = {
            "name": "stub", "transport": "streamable_http", "url": f"http://127.0.0.1:{port}/mcp",
            "startup_timeout": 20.0, "call_timeout": 20.0,
        }
        values.update(overrides)
        yield McpServerSpec(**values)
    finally:
        server.kill()
        await server.wait()


def received(journal: Path) -> list[dict[str, Any]]:
    """Every request a stub received, in order (across its restarts)."""
    if not journal.exists():
        return []
    return [json.loads(line) for line in journal.read_text().splitlines() if line]


def methods(journal: Path) -> list[str]:
    """The methods of :func:`received`, in order."""
    return [message["method"] for message in received(journal)]


async def echo(pool: McpClientPool, spec: McpServerSpec, **kwargs: Any) -> Any:
    """The stub's ``echo`` of ``hi`` through ``pool``; ``kwargs`` go to ``call_tool``."""
    return await pool.call_tool(
        spec, "echo", {"text": "hi"}, idempotency_key=None, timeout=kwargs.pop("timeout", None),
        **kwargs,
    )


# --- the admin ---------------------------------------------------------------------------------


def logged_in(user: Any) -> Client:
    """A Django test client with ``user`` logged in."""
    client = Client()
    client.force_login(user)
    return client


def server_form(**overrides: Any) -> dict[str, Any]:
    """The admin's add form of a stdio server (no tool rows), with ``overrides``."""
    data = {
        "name": "files",
        "transport": "stdio",
        "enabled": "on",
        "command": "/usr/bin/mcp-files",
        "args": '["--root", "/srv"]',
        "cwd": "",
        "env_names": '["FILES_TOKEN"]',
        "env_values": "{}",
        "url": "",
        "header_env": "{}",
        "startup_timeout": "30",
        "call_timeout": "60",
        "retries": "2",
        "isolation": "session",
        "idle_timeout": "300",
        "tools-TOTAL_FORMS": "0",
        "tools-INITIAL_FORMS": "0",
        "tools-MIN_NUM_FORMS": "0",
        "tools-MAX_NUM_FORMS": "1000",
    }
    data.update(overrides)
    return data


@pytest.fixture
def queued_discoveries(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The server IDs whose discovery was queued (``discover_server_tools.apply_async``),
    in order; nothing is queued."""
    from mcp_registry import tasks

    queued: list[int] = []
    monkeypatch.setattr(
        tasks.discover_server_tools, "apply_async", lambda args, *_, **__: queued.append(*args)
    )
    return queued
