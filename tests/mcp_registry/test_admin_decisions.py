"""Admin shows, per tool, the effective effect, whether it needs approval, and why."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.contrib.auth.models import Permission
from django.urls import reverse
from django.utils import timezone

from tests.factories import McpServerFactory, McpToolFactory
from tests.mcp_registry.conftest import logged_in

pytestmark = pytest.mark.django_db


def page(user: Any, url: str) -> str:
    response = logged_in(user).get(url)
    assert response.status_code == 200
    return html.unescape(response.content.decode()).lower()


def test_tool_list_and_page_say_why(superuser: Any) -> None:
    server = McpServerFactory.create(name="docs", trust_annotations=True)
    McpToolFactory.create(
        server=server, name="search_documents", annotations={"readOnlyHint": True}
    )
    lifted = McpToolFactory.create(
        server=server,
        name="create_document",
        annotations={"idempotentHint": True, "destructiveHint": False},
        requires_approval_override=False,
    )
    listing = page(superuser, reverse("admin:mcp_registry_mcptool_changelist"))
    assert "trusted annotations: readonlyhint is true" in listing
    assert "platform rule: read tools run without approval" in listing
    assert "trusted annotations: idempotenthint is true and destructivehint is false" in listing
    assert "administrator override" in listing

    detail = page(superuser, reverse("admin:mcp_registry_mcptool_change", args=[lifted.pk]))
    assert "idempotent_write" in detail
    assert "approval decided by" in detail

    inline = page(superuser, reverse("admin:mcp_registry_mcpserver_change", args=[server.pk]))
    assert "docs__create_document" in inline
    assert "effect decided by" in inline


def test_untrusted_server_tools_say_so(superuser: Any) -> None:
    tool = McpToolFactory.create(
        server=McpServerFactory.create(trust_annotations=False), annotations={"readOnlyHint": True}
    )
    detail = page(superuser, reverse("admin:mcp_registry_mcptool_change", args=[tool.pk]))
    assert "server annotations are not trusted" in detail
    assert "platform rule: unclassified tools wait for approval" in detail


def test_staff_viewers_see_errors_and_reasons_but_cannot_add(staff: Any) -> None:
    staff.user_permissions.add(
        *Permission.objects.filter(
            content_type__app_label="mcp_registry", codename__startswith="view_"
        )
    )
    McpServerFactory.create(
        name="broken", last_error="McpTransportError: no answer", last_error_at=timezone.now()
    )
    listing = page(staff, reverse("admin:mcp_registry_mcpserver_changelist"))
    assert "mcptransporterror: no answer" in listing
    assert logged_in(staff).get(reverse("admin:mcp_registry_mcpserver_add")).status_code == 403


def test_tools_show_their_timeout_and_attempts_and_where_they_come_from(superuser: Any) -> None:
    server = McpServerFactory.create(
        name="docs", trust_annotations=True, call_timeout=60, startup_timeout=30, retries=2
    )
    McpToolFactory.create(server=server, name="search", annotations={"readOnlyHint": True})
    fetch = McpToolFactory.create(
        server=server,
        name="fetch",
        annotations={"readOnlyHint": True},
        timeout_override=5,
        retries_override=0,
    )
    McpToolFactory.create(
        server=server, name="post", annotations={"readOnlyHint": False}, retries_override=4
    )
    listing = page(superuser, reverse("admin:mcp_registry_mcptool_changelist"))
    assert "timeout per call" in listing
    assert "60 s (server call timeout)" in listing
    assert "3 attempts (server retries 2)" in listing
    assert "5 s (tool override)" in listing
    assert "1 attempt (retries override 0)" in listing
    # A write that may not be repeated runs once, whatever its retries say.
    assert "1 attempt (non_idempotent_write calls are never retried)" in listing
    assert "5 attempts" not in listing

    detail = page(superuser, reverse("admin:mcp_registry_mcptool_change", args=[fetch.pk]))
    assert "5 s (tool override)" in detail
    assert "1 attempt (retries override 0)" in detail
    assert "dex step limit" in detail
    assert "45 s per attempt: 5 s call + 30 s server startup + 10 s margin" in detail
    assert "empty: the server's call timeout" in detail
    assert "empty: the server's retries" in detail

    server_page = page(superuser, reverse("admin:mcp_registry_mcpserver_change", args=[server.pk]))
    assert "1 attempt (retries override 0)" in server_page
    assert "60 s (server call timeout)" in server_page
    assert "2 means up to 3 attempts" in server_page
    assert "non_idempotent_write and unclassified calls are never retried" in server_page
