"""Admin permissions: only superusers add or change MCP servers and tools."""

import sys
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.contrib.messages import get_messages
from django.test import Client
from django.urls import reverse

from mcp_registry.models import McpServer
from tests.factories import McpServerFactory, McpToolFactory
from tests.mcp_registry.conftest import REPO_ROOT, logged_in, server_form

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_with_all_mcp_permissions(staff: Any) -> Any:
    """Staff holding every model permission of the app: still not enough to write."""
    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="mcp_registry"))
    return staff


def test_superuser_can_add_a_server(superuser: Any) -> None:
    client = logged_in(superuser)
    response = client.post(reverse("admin:mcp_registry_mcpserver_add"), server_form())
    assert response.status_code == 302, response.content
    server = McpServer.objects.get(name="files")
    assert server.args == ["--root", "/srv"]
    assert server.env_names == ["FILES_TOKEN"]


def test_superuser_add_form_rejects_secret_values_in_env_names(superuser: Any) -> None:
    client = logged_in(superuser)
    response = client.post(
        reverse("admin:mcp_registry_mcpserver_add"),
        server_form(env_names='["sk-live-abc"]'),
    )
    assert response.status_code == 200
    assert not McpServer.objects.filter(name="files").exists()


def test_staff_cannot_add_a_server(staff_with_all_mcp_permissions: Any) -> None:
    client = logged_in(staff_with_all_mcp_permissions)
    url = reverse("admin:mcp_registry_mcpserver_add")
    assert client.get(url).status_code == 403
    assert client.post(url, server_form()).status_code == 403
    assert not McpServer.objects.filter(name="files").exists()


def test_staff_cannot_change_a_server(staff_with_all_mcp_permissions: Any) -> None:
    server = McpServerFactory.create(name="files", command="/usr/bin/old")
    client = logged_in(staff_with_all_mcp_permissions)
    url = reverse("admin:mcp_registry_mcpserver_change", args=[server.pk])
    response = client.post(url, server_form(command="/usr/bin/evil"))
    assert response.status_code in (302, 403)
    server.refresh_from_db()
    assert server.command == "/usr/bin/old"
    # The page renders read-only: no save button.
    page = client.get(url)
    assert page.status_code == 200
    assert b'name="_save"' not in page.content


def test_staff_cannot_delete_a_server(staff_with_all_mcp_permissions: Any) -> None:
    server = McpServerFactory.create()
    client = logged_in(staff_with_all_mcp_permissions)
    url = reverse("admin:mcp_registry_mcpserver_delete", args=[server.pk])
    assert client.post(url, {"post": "yes"}).status_code == 403
    assert McpServer.objects.filter(pk=server.pk).exists()


def test_staff_cannot_change_tool_overrides(staff_with_all_mcp_permissions: Any) -> None:
    tool = McpToolFactory.create(annotations={"destructiveHint": True})
    client = logged_in(staff_with_all_mcp_permissions)
    url = reverse("admin:mcp_registry_mcptool_change", args=[tool.pk])
    client.post(url, {"enabled": "on", "requires_approval_override": "false"})
    tool.refresh_from_db()
    assert tool.requires_approval_override is None
    assert tool.effective_requires_approval is True


def test_superuser_can_lift_approval_on_a_tool(superuser: Any) -> None:
    tool = McpToolFactory.create(annotations={"destructiveHint": True})
    client = logged_in(superuser)
    url = reverse("admin:mcp_registry_mcptool_change", args=[tool.pk])
    response = client.post(
        url,
        {
            "enabled": "on",
            "effect_override": "",
            "requires_approval_override": "false",
            "timeout_override": "",
            "retries_override": "",
        },
    )
    assert response.status_code == 302, response.content
    tool.refresh_from_db()
    assert tool.effective_requires_approval is False


def test_nobody_adds_tools_by_hand(superuser: Any) -> None:
    client = logged_in(superuser)
    assert client.get(reverse("admin:mcp_registry_mcptool_add")).status_code == 403


def test_lists_show_discovery_state_and_effects(superuser: Any) -> None:
    server = McpServerFactory.create(name="search", last_error="ConnectionError: refused")
    McpToolFactory.create(server=server, name="web_search", annotations={"readOnlyHint": True})
    client = logged_in(superuser)
    servers = client.get(reverse("admin:mcp_registry_mcpserver_changelist")).content.decode()
    assert "ConnectionError: refused" in servers
    tools = client.get(reverse("admin:mcp_registry_mcptool_changelist")).content.decode()
    assert "search__web_search" in tools
    assert ">read<" in tools


def test_anonymous_is_sent_to_login() -> None:
    response = Client().get(reverse("admin:mcp_registry_mcpserver_changelist"))
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


@pytest.mark.usefixtures("eager_celery")
def test_discover_action_queues_discovery(
    superuser: Any, django_capture_on_commit_callbacks: Any
) -> None:
    import sys
    from pathlib import Path

    server = McpServerFactory.create(
        name="search",
        command=sys.executable,
        args=["-m", "mcp_registry.demo_servers.search"],
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    client = logged_in(superuser)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(
            reverse("admin:mcp_registry_mcpserver_changelist"),
            {"action": "discover_tools", "_selected_action": [server.pk]},
        )
    assert response.status_code == 302
    assert [tool.exposed_name for tool in server.tools.all()] == ["search__web_search"]


@pytest.mark.usefixtures("eager_celery")
def test_saving_an_enabled_server_queues_its_discovery_once_committed(
    superuser: Any, django_capture_on_commit_callbacks: Any
) -> None:
    client = logged_in(superuser)
    form = server_form(
        name="search",
        command=sys.executable,
        args='["-m", "mcp_registry.demo_servers.search"]',
        cwd=str(REPO_ROOT),
        env_names="[]",
    )
    with django_capture_on_commit_callbacks() as callbacks:
        response = client.post(reverse("admin:mcp_registry_mcpserver_add"), form)
    assert response.status_code == 302, response.content
    server = McpServer.objects.get(name="search")
    # Nothing ran inside the admin's transaction: the discovery waits for the commit.
    assert len(callbacks) == 1
    assert (server.last_discovered_at, server.last_error) == (None, "")
    notes = [str(message) for message in get_messages(response.wsgi_request)]
    assert "was added successfully" in notes[-2], notes
    assert notes[-1].startswith("Discovery of the tools of “search” is queued"), notes
    callbacks[0]()
    server.refresh_from_db()
    assert server.last_discovered_at is not None
    assert [tool.exposed_name for tool in server.tools.all()] == ["search__web_search"]

    # A change is discovered again.
    first = server.last_discovered_at
    change = reverse("admin:mcp_registry_mcpserver_change", args=[server.pk])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(change, {**form, "startup_timeout": "20"})
    assert response.status_code == 302, response.content
    assert len(callbacks) == 1
    server.refresh_from_db()
    assert server.startup_timeout == 20
    assert server.last_discovered_at > first
    notes = [str(message) for message in get_messages(response.wsgi_request)]
    assert "was changed successfully" in notes[-2], notes
    assert notes[-1].startswith("Discovery of the tools of “search” is queued"), notes

    # A disabled server is not discovered, and the message says so.
    disabled = {key: value for key, value in form.items() if key != "enabled"}
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        response = client.post(change, disabled)
    assert response.status_code == 302, response.content
    assert callbacks == []
    notes = [str(message) for message in get_messages(response.wsgi_request)]
    assert notes[-1] == "“search” is disabled, so its tools are not discovered.", notes


def test_staff_cannot_run_discovery(staff_with_all_mcp_permissions: Any) -> None:
    server = McpServerFactory.create()
    client = logged_in(staff_with_all_mcp_permissions)
    client.post(
        reverse("admin:mcp_registry_mcpserver_changelist"),
        {"action": "discover_tools", "_selected_action": [server.pk]},
    )
    server.refresh_from_db()
    assert server.last_discovered_at is None and server.last_error == ""
