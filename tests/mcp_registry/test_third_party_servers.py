"""The registry against third-party MCP servers run as real subprocesses:
``@modelcontextprotocol/server-memory`` and ``@modelcontextprotocol/server-filesystem`` (npm,
``make peers``) and ``mcp-server-git`` (PyPI). One test per gap found registering them (issue 11,
"MCP registry, from real third-party servers")."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import OperationalError
from django.urls import reverse

from mcp_registry.client import McpClientPool, McpServerSpec, McpToolOutput
from mcp_registry.models import McpServer, McpServerProcess
from mcp_registry.selectors import server_spec_build
from mcp_registry.services import ToolDiscoveryError, server_discover_tools
from mcp_registry.tasks import process_status_record
from tests.factories import McpServerFactory
from tests.mcp_registry.conftest import DEADLINE_SECONDS, logged_in, server_form


def _row(spec: McpServerSpec, **overrides: Any) -> McpServer:
    values: dict[str, Any] = {
        "name": spec.name,
        "transport": spec.transport,
        "command": spec.command,
        "args": list(spec.args),
        "env_values": dict(spec.env),
        "trust_annotations": True,
        "startup_timeout": 30,
    }
    values.update(overrides)
    return McpServerFactory.create(**values)


async def _call(spec: McpServerSpec, tool: str, arguments: dict[str, Any]) -> McpToolOutput:
    async with McpClientPool() as pool:
        return await pool.call_tool(spec, tool, arguments, idempotency_key=None, timeout=None)


# A server that cannot start: the real reason reaches last_error and the discovery output.


@pytest.mark.django_db
def test_a_folder_that_does_not_exist_stores_the_servers_stderr(
    filesystem_spec: McpServerSpec, tmp_path: Path
) -> None:
    missing = tmp_path / "missing"
    server = _row(filesystem_spec, args=[filesystem_spec.args[0], str(missing)])
    with pytest.raises(ToolDiscoveryError):
        server_discover_tools(server=server)
    server.refresh_from_db()
    assert "Connection closed" not in server.last_error
    assert f"Cannot access directory {missing}" in server.last_error
    assert "None of the specified directories are accessible" in server.last_error


@pytest.mark.django_db
def test_a_command_or_working_directory_that_does_not_exist_says_so(tmp_path: Path) -> None:
    ghost = McpServerFactory.create(name="ghost", command=str(tmp_path / "no-server"), args=[])
    nowhere = McpServerFactory.create(
        name="nowhere", command=sys.executable, args=["-c", "pass"], cwd=str(tmp_path / "gone")
    )
    for server in (ghost, nowhere):
        with pytest.raises(ToolDiscoveryError):
            server_discover_tools(server=server)
        server.refresh_from_db()
        assert "No such file or directory" in server.last_error
    assert str(tmp_path / "no-server") in ghost.last_error
    assert str(tmp_path / "gone") in nowhere.last_error


@pytest.mark.django_db
def test_discover_command_keeps_a_catalogue_only_when_there_was_one(
    filesystem_spec: McpServerSpec, tmp_path: Path
) -> None:
    script = filesystem_spec.args[0]
    server = _row(filesystem_spec, args=[script, str(tmp_path / "missing")])

    def discover() -> str:
        out = StringIO()
        with pytest.raises(CommandError):
            call_command("mcp_discover", server.name, stdout=out)
        return out.getvalue()

    never = discover()
    assert "files: ERROR (no catalogue: discovery never succeeded)" in never
    assert "last good catalogue kept" not in never
    assert "None of the specified directories are accessible" in never
    server.args = list(filesystem_spec.args)
    server.save()
    call_command("mcp_discover", server.name, stdout=StringIO())
    server.refresh_from_db()
    server.args = [script, str(tmp_path / "missing")]
    server.save()
    kept = discover()
    assert "files: ERROR (last good catalogue kept)" in kept
    assert "files__read_text_file" in kept


@pytest.mark.django_db
def test_start_failures_never_show_a_secret_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LEAKY_TOKEN", "tok-0123456789abcdef")
    server = McpServerFactory.create(
        name="leaky",
        command=sys.executable,
        args=[
            "-c",
            "import os, sys; sys.stderr.write('bad token ' + os.environ['LEAKY_TOKEN'] + '\\n');"
            " sys.exit(3)",
        ],
        env_names=["LEAKY_TOKEN"],
    )
    with pytest.raises(ToolDiscoveryError):
        server_discover_tools(server=server)
    server.refresh_from_db()
    assert "bad token [LEAKY_TOKEN]" in server.last_error
    assert "tok-0123456789abcdef" not in server.last_error


# A command that does not exist: import and admin warn at save time.


@pytest.mark.django_db
def test_import_warns_about_a_command_that_does_not_exist(
    memory_spec: McpServerSpec, tmp_path: Path
) -> None:
    config = tmp_path / "mcp.yaml"
    config.write_text(
        f"""
servers:
  - name: ghost
    transport: stdio
    command: no-such-mcp-server-command
  - name: local
    transport: stdio
    command: bin/server
    cwd: {tmp_path}
  - name: memory
    transport: stdio
    command: node
    args: ["{memory_spec.args[0]}"]
""",
        encoding="utf-8",
    )
    out, err = StringIO(), StringIO()
    call_command("mcp_import", str(config), "--no-discover", stdout=out, stderr=err)
    assert "Created: ghost, local, memory" in out.getvalue()
    warnings = err.getvalue().splitlines()
    assert warnings == [
        "Warning: server 'ghost': command 'no-such-mcp-server-command' is not on PATH and is "
        "not an existing file.",
        "Warning: server 'local': command 'bin/server' is not an existing file.",
    ]


@pytest.mark.django_db
def test_admin_warns_at_save_about_a_command_that_does_not_exist(superuser: Any) -> None:
    client = logged_in(superuser)
    add = reverse("admin:mcp_registry_mcpserver_add")
    form = server_form(name="ghost", command="/usr/bin/no-such-mcp", args="[]", env_names="[]")
    response = client.post(add, form, follow=True)
    assert response.status_code == 200
    assert McpServer.objects.filter(name="ghost").exists()
    texts = [(m.level_tag, str(m)) for m in response.context["messages"]]
    assert (
        "warning",
        "Saved, but command '/usr/bin/no-such-mcp' is not an existing file on this machine: "
        "the worker will not be able to start it unless its machine has it.",
    ) in texts
    form = server_form(name="memory", command="node", args="[]", env_names="[]")
    response = client.post(add, form, follow=True)
    assert McpServer.objects.filter(name="memory").exists()
    assert "warning" not in [m.level_tag for m in response.context["messages"]]


# Per-server environment: plain values apart from secret references; unset references fail.


@pytest.mark.django_db
def test_plain_values_reach_the_server_and_an_unset_secret_reference_fails_discovery(
    memory_spec: McpServerSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory_file = tmp_path / "graph.jsonl"
    server = _row(memory_spec, env_values={"MEMORY_FILE_PATH": str(memory_file)})
    assert "create_entities" in {tool.name for tool in server_discover_tools(server=server)}
    async_to_sync(_call)(
        server_spec_build(server=server),
        "create_entities",
        {"entities": [{"name": "Ada", "entityType": "person", "observations": ["math"]}]},
    )
    assert '"name":"Ada"' in memory_file.read_text(encoding="utf-8")

    monkeypatch.delenv("MEMORY_API_TOKEN", raising=False)
    server.env_names = ["MEMORY_API_TOKEN"]
    server.save()
    with pytest.raises(ToolDiscoveryError):
        server_discover_tools(server=server)
    server.refresh_from_db()
    assert server.last_error == (
        "MCP server 'memory': environment variable MEMORY_API_TOKEN "
        "(listed in its secret references) is not set in the worker's environment"
    )
    assert server.tools.filter(available=True).count() == 9  # the last good catalogue


@pytest.mark.django_db
def test_plain_values_and_secret_references_are_kept_apart() -> None:
    server = McpServerFactory.build(
        name="memory", env_names=["MEMORY_TOKEN"], env_values={"MEMORY_TOKEN": "x"}
    )
    with pytest.raises(ValidationError) as raised:
        server.full_clean()
    assert raised.value.message_dict["env_values"] == [
        "MEMORY_TOKEN is also a secret reference; give each variable in one place only."
    ]
    server = McpServerFactory.build(name="memory", env_values={"LEVEL": 3, "bad name": "x"})
    with pytest.raises(ValidationError) as raised:
        server.full_clean()
    assert raised.value.message_dict["env_values"] == ["Not environment variable names: bad name."]


# Idempotent and destructive tools: idempotent_write (retries kept), approval required.


@pytest.mark.django_db
def test_idempotent_destructive_tools_keep_retries_and_wait_for_approval(
    filesystem_spec: McpServerSpec,
    git_spec: McpServerSpec,
    memory_spec: McpServerSpec,
    superuser: Any,
) -> None:
    found = {}
    for spec, name in (
        (filesystem_spec, "write_file"),
        (git_spec, "git_reset"),
        (memory_spec, "delete_entities"),
    ):
        tools = {tool.name: tool for tool in server_discover_tools(server=_row(spec, retries=2))}
        tool = found[name] = tools[name]
        assert tool.annotations["idempotentHint"] is True
        assert tool.annotations["destructiveHint"] is True
        assert tool.effective_effect == "idempotent_write"
        assert tool.effective_retries == 2
        assert tool.effective_requires_approval is True
        assert tool.effect_decision.reason == (
            "trusted annotations: idempotentHint is true, so repeating is harmless and retries "
            "are safe; destructiveHint is true, so every call waits for approval"
        )
        assert tool.approval_decision.reason == (
            "platform rule: idempotent_write tools wait for approval; this one is destructive"
        )
    page = logged_in(superuser).get(
        reverse("admin:mcp_registry_mcptool_change", args=[found["git_reset"].pk])
    )
    assert page.status_code == 200
    assert b"so repeating is harmless and retries are safe" in page.content
    assert b"this one is destructive" in page.content


# Text and structuredContent: the model gets one form.


async def test_a_file_read_reaches_the_model_once(
    pool: McpClientPool, filesystem_spec: McpServerSpec, files_root: Path
) -> None:
    output = await pool.call_tool(
        filesystem_spec, "read_text_file", {"path": str(files_root / "notes.txt")},
        idempotency_key=None, timeout=None,
    )
    assert output.structured_content == {"content": "first line\nsecond line\n"}
    assert output.for_model() == "first line\nsecond line\n"


async def test_a_memory_result_reaches_the_model_once(
    pool: McpClientPool, memory_spec: McpServerSpec
) -> None:
    output = await pool.call_tool(
        memory_spec,
        "create_entities",
        {"entities": [{"name": "Ada", "entityType": "person", "observations": ["math"]}]},
        idempotency_key=None, timeout=None,
    )
    assert isinstance(output.structured_content, dict)  # {"entities": [...]}; the text a list
    assert output.for_model() == output.text
    assert output.for_model().count("Ada") == 1


def test_structured_content_alone_when_it_adds_information() -> None:
    weather = {"city": "Lisbon", "temperature": 21, "sunny": True}
    assert McpToolOutput(text="It is mild in Lisbon.", structured_content=weather).for_model() == (
        '{"city": "Lisbon", "sunny": true, "temperature": 21}'
    )
    said = McpToolOutput(text="Lisbon: 21 degrees, sunny: true", structured_content=weather)
    assert said.for_model() == said.text
    assert McpToolOutput(text="", structured_content=None).for_model() == "(no content)"


# Admin: per server, process state, PIDs, restarts, stderr tail, last discovery.


async def _read_while_the_pool_writes(read: Callable[[], Any]) -> Any:
    """Run the synchronous ``read`` in a thread; ``None`` when SQLite refused it (locked).

    The test database is SQLite in memory with a shared cache, whose table locks refuse a
    read at once while the pool's status writer (another thread) writes; a file database
    (WAL), as the platform runs on, waits instead.
    """
    try:
        return await sync_to_async(read)()
    except OperationalError as error:
        if "locked" not in str(error):
            raise
        return None


async def _read_until_unlocked(read: Callable[[], Any]) -> Any:
    """``read`` again until SQLite lets it through, within ``DEADLINE_SECONDS``."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    while (result := await _read_while_the_pool_writes(read)) is None:
        if time.monotonic() > deadline:
            raise AssertionError("the test database stayed locked")
        await asyncio.sleep(0.05)
    return result


async def _poll_process(
    description: str, accept: Callable[[McpServerProcess], bool]
) -> McpServerProcess:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while True:
        row = await _read_while_the_pool_writes(
            lambda: McpServerProcess.objects.select_related("server").first()
        )
        if row is not None and accept(row):
            return row
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {description}; last row: {row}")
        await asyncio.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_admin_shows_process_state_stderr_and_last_discovery(
    memory_spec: McpServerSpec, superuser: Any
) -> None:
    server = _row(memory_spec)
    server_discover_tools(server=server)
    spec = server_spec_build(server=server)
    client = logged_in(superuser)
    change = reverse("admin:mcp_registry_mcpserver_change", args=[server.pk])

    async def scenario() -> tuple[bytes, bytes]:
        async with McpClientPool(on_process_status=process_status_record) as pool:
            await pool.call_tool(spec, "read_graph", {}, idempotency_key=None, timeout=None)
            first = await _poll_process(
                "a running process with its stderr",
                lambda row: row.state == "running"
                and row.server_pid is not None
                and "Knowledge Graph MCP Server running on stdio" in row.stderr_tail,
            )
            assert first.restarts == 0 and first.guard_pid not in (None, first.server_pid)
            assert first.server_pid is not None
            os.kill(first.server_pid, signal.SIGKILL)
            await _poll_process("the exit", lambda row: row.state == "exited")
            await pool.call_tool(spec, "read_graph", {}, idempotency_key=None, timeout=None)
            again = await _poll_process(
                "the restarted process",
                lambda row: row.state == "running" and row.restarts == 1
                and row.server_pid not in (None, first.server_pid),
            )
            assert again.server_pid is not None
            os.kill(again.server_pid, 0)  # alive
            page = await _read_until_unlocked(lambda: client.get(change))
            listing = await _read_until_unlocked(
                lambda: client.get(reverse("admin:mcp_registry_mcpserver_changelist"))
            )
            return page.content, listing.content

    page, listing = asyncio.run(scenario())
    # One row per process start: the killed one keeps how it ended.
    killed, row = McpServerProcess.objects.order_by("started_at")
    assert (killed.state, killed.exit_code) == ("exited", -signal.SIGKILL)
    assert killed.error == "the server process was killed by signal 9 (SIGKILL)"
    assert row.state == "stopped" and row.ended_at is not None
    for content in (page, listing):
        assert "ok at" in content.decode() and "9 tools available" in content.decode()
    assert "1 running; last crash: was killed by signal 9 (SIGKILL) at" in listing.decode()
    assert (
        f"running, PID {row.server_pid} (guard {row.guard_pid}), 1 restart, shared, "
        f"on worker {socket.gethostname()}:{os.getpid()}"
    ) in page.decode()
    assert "was killed by signal 9 (SIGKILL), PID" in page.decode()
    assert "Knowledge Graph MCP Server running on stdio" in page.decode()
    assert "Last lines of its stderr" in page.decode()
