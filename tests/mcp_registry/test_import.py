"""``manage.py mcp_import`` (YAML declarations), discovery on import, periodic discovery."""

from __future__ import annotations

import importlib
import io
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import CommandError, call_command
from django_celery_beat.models import PeriodicTask

from mcp_registry.models import McpServer, McpTool
from mcp_registry.services import DISCOVERY_TASK_NAME, discovery_schedule_set
from tests.mcp_registry.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db

CONFIG = f"""
servers:
  - name: docs
    transport: stdio
    command: {sys.executable}
    args: ["-m", "mcp_registry.demo_servers.docs"]
    cwd: {REPO_ROOT}
    env: [DEXAGENTS_VAR_DIR]
    trust_annotations: true
    startup_timeout: 20
    call_timeout: 45
    retries: 1
    tools:
      create_document: {{requires_approval: false, timeout: 5, retries: 0}}
  - name: remote
    transport: streamable_http
    url: https://mcp.example.com/mcp
    headers: {{Authorization: REMOTE_MCP_TOKEN}}
    enabled: false
"""


def _import(path: Path | None, *extra: str) -> str:
    out = io.StringIO()
    args = [str(path)] if path is not None else []
    call_command("mcp_import", *args, *extra, stdout=out, stderr=io.StringIO())
    return out.getvalue()


def _snapshot() -> list[tuple[Any, ...]]:
    servers = [
        tuple(row.values()) for row in McpServer.objects.order_by("name").values()
    ]
    tools = [tuple(row.values()) for row in McpTool.objects.order_by("pk").values()]
    return [*servers, *tools]


@pytest.fixture
def config_file(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.yaml"
    path.write_text(CONFIG)
    return path


def test_import_creates_servers_and_importing_twice_changes_nothing(
    config_file: Path, django_capture_on_commit_callbacks: Any
) -> None:
    with django_capture_on_commit_callbacks() as callbacks:
        output = _import(config_file)
    assert "Created: docs, remote" in output
    # Discovery is queued for the created, enabled server only, once the import commits.
    assert len(callbacks) == 1
    assert "Discovery queued for: docs (" in output
    docs = McpServer.objects.get(name="docs")
    assert docs.env_names == ["DEXAGENTS_VAR_DIR"]
    assert docs.trust_annotations is True
    remote = McpServer.objects.get(name="remote")
    assert remote.header_env == {"Authorization": "REMOTE_MCP_TOKEN"}
    assert remote.enabled is False
    assert (docs.startup_timeout, docs.call_timeout, docs.retries) == (20, 45, 1)
    override = McpTool.objects.get(server=docs, name="create_document")
    assert (override.requires_approval_override, override.timeout_override) == (False, 5)
    assert override.retries_override == 0
    assert override.available is False  # waits for discovery

    before = _snapshot()
    with django_capture_on_commit_callbacks() as callbacks:
        output = _import(config_file)
    assert "Unchanged: docs, remote" in output
    assert callbacks == []
    assert "Discovery queued" not in output
    assert _snapshot() == before


def test_import_reads_the_config_variable_and_updates_what_changed(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEXAGENTS_MCP_CONFIG", str(config_file))
    _import(None)
    config_file.write_text(CONFIG.replace("startup_timeout: 20", "startup_timeout: 7"))
    assert "Updated: docs" in _import(None, "--no-discover")
    assert McpServer.objects.get(name="docs").startup_timeout == 7


def test_discovery_runs_on_import(
    config_file: Path, var_dir: Path, django_capture_on_commit_callbacks: Any
) -> None:
    from dexagents_site import celery_app

    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            _import(config_file)
    finally:
        celery_app.conf.task_always_eager = previous
    tool = McpTool.objects.get(server__name="docs", name="create_document")
    # Discovery filled the placeholder row and kept the imported overrides.
    assert tool.available is True
    assert tool.effective_effect == "idempotent_write"
    assert tool.effective_requires_approval is False
    assert tool.approval_decision.reason == "administrator override"
    # ... and its limits, which reach the session snapshot (AgentDefinition.agent_config).
    assert tool.timeout_decision.reason == "tool override"
    assert (tool.effective_timeout, tool.effective_retries) == (5, 0)
    assert tool.attempts_decision.value == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("servers: [", "not valid YAML"),
        ("hosts: []", "one key, 'servers'"),
        ("servers:\n  - {name: a, transport: ftp}", "transport must be"),
        ("servers:\n  - {name: a, transport: stdio, command: x, shell: true}", "unknown keys"),
        ("servers:\n  - {name: a, transport: stdio, command: x, startup_timeout: true}",
         "startup_timeout must be a whole number"),
        ("servers:\n  - {name: a, transport: stdio, command: x, tools: {t: {effect: maybe}}}",
         "effect must be one of"),
        ("servers:\n  - {name: a, transport: stdio, command: x}\n"
         "  - {name: a, transport: stdio, command: y}", "declared twice"),
        # Model validation: a valid first server is not saved when the second is bad.
        ("servers:\n  - {name: ok, transport: stdio, command: x}\n"
         "  - {name: Bad Name, transport: stdio, command: x}", "server 'Bad Name': name"),
        ("servers:\n  - {name: ok, transport: stdio, command: x}\n"
         "  - {name: leak, transport: stdio, command: x, env: [sk-live-123]}",
         "env entry 1 is not an environment variable name"),
        ("servers:\n  - {name: web, transport: streamable_http, url: 'https://x.example/mcp',"
         " headers: {Authorization: 'Bearer sk-live-123'}}",
         "value of header 'Authorization' is not an environment variable name"),
        ("servers:\n  - {name: web, transport: streamable_http}", "needs a URL"),
    ],
)
def test_bad_input_is_a_clear_error_and_imports_nothing(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(CommandError) as raised:
        _import(path)
    assert message in str(raised.value)
    assert "Nothing was imported" in str(raised.value)
    assert "sk-live" not in str(raised.value)
    assert McpServer.objects.count() == 0
    assert McpTool.objects.count() == 0


def test_import_without_a_file_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEXAGENTS_MCP_CONFIG", raising=False)
    with pytest.raises(CommandError, match="DEXAGENTS_MCP_CONFIG"):
        _import(None)
    with pytest.raises(CommandError, match="Cannot read"):
        _import(Path("/nonexistent/mcp.yaml"))


def test_periodic_discovery_is_scheduled_and_configurable() -> None:
    # The schedule is migration 0003's row. A transactional test run earlier on this test
    # database (pytest-xdist orders tests freely) flushes every table, so the migration's
    # function is run again here, as migrate ran it (it creates the row only when absent).
    from django.apps import apps as installed_apps
    from django.db import connection

    schedule_migration = importlib.import_module(
        "mcp_registry.migrations.0003_discovery_schedule"
    )
    schedule_migration.schedule_create(installed_apps, connection.schema_editor())
    task = PeriodicTask.objects.get(name=DISCOVERY_TASK_NAME)
    assert task.task == "mcp_registry.discover_all_servers"
    assert task.enabled is True
    assert (task.interval.every, task.interval.period) == (60, "minutes")
    discovery_schedule_set(every_minutes=15)
    task.refresh_from_db()
    assert task.interval.every == 15
    assert PeriodicTask.objects.filter(name=DISCOVERY_TASK_NAME).count() == 1
    with pytest.raises(ValueError):
        discovery_schedule_set(every_minutes=0)


def test_the_periodic_task_queues_every_enabled_server(
    queued_discoveries: list[int], django_capture_on_commit_callbacks: Any
) -> None:
    from mcp_registry import tasks
    from tests.factories import McpServerFactory

    on = McpServerFactory.create(name="on")
    McpServerFactory.create(name="off", enabled=False)
    with django_capture_on_commit_callbacks(execute=True):
        assert tasks.discover_all_servers.apply().get() == ["on"]
    assert queued_discoveries == [on.pk]


def test_env_values_are_imported_apart_from_secret_references(tmp_path: Path) -> None:
    path = tmp_path / "mcp.yaml"
    path.write_text(
        "servers:\n"
        "  - {name: memory, transport: stdio, command: node, env: [MEMORY_TOKEN],\n"
        "     env_values: {MEMORY_FILE_PATH: /srv/memory.jsonl}}\n"
    )
    _import(path, "--no-discover")
    server = McpServer.objects.get(name="memory")
    assert (server.env_names, server.env_values) == (
        ["MEMORY_TOKEN"], {"MEMORY_FILE_PATH": "/srv/memory.jsonl"}
    )
    path.write_text(
        "servers:\n"
        "  - {name: memory, transport: stdio, command: node, env_values: {PORT: 8080}}\n"
    )
    with pytest.raises(CommandError) as raised:
        _import(path, "--no-discover")
    assert "env_values PORT must be a string (quote numbers and booleans)" in str(raised.value)
    assert McpServer.objects.get(name="memory").env_values == {
        "MEMORY_FILE_PATH": "/srv/memory.jsonl"
    }
