"""The Content-Security-Policy header (agents_app.pages.content_security, the settings' policy).

Personas: anonymous (the login page), owner (the portal and the API docs pages). The browser
test tests/e2e/test_content_security_browser.py loads every page under it in Chromium.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from agents_app.api.schema import DOCS_CONTENT_SECURITY_POLICY


def directives(policy: str) -> dict[str, list[str]]:
    parsed: dict[str, list[str]] = {}
    for part in policy.split(";"):
        name, *values = part.split()
        parsed[name] = values
    return parsed


def test_the_login_page_gets_the_strict_policy_with_its_websocket_origin() -> None:
    response = Client().get("/accounts/login/", HTTP_HOST="localhost:8000")
    assert response.status_code == 200
    policy = directives(response["Content-Security-Policy"])
    assert policy["default-src"] == ["'self'"]
    assert policy["script-src"] == ["'self'"]
    assert policy["style-src"] == ["'self'"]
    assert policy["frame-ancestors"] == ["'none'"]
    assert policy["object-src"] == ["'none'"]
    assert policy["connect-src"] == ["'self'", "ws://localhost:8000", "wss://localhost:8000"]
    assert "'unsafe-inline'" not in response["Content-Security-Policy"]
    assert "'unsafe-eval'" not in response["Content-Security-Policy"]


def test_a_host_outside_allowed_hosts_adds_no_websocket_origin() -> None:
    response = Client().get("/accounts/login/", HTTP_HOST="evil.example")
    assert response.status_code == 400
    policy = directives(response["Content-Security-Policy"])
    assert policy["connect-src"] == ["'self'"]


def test_the_portal_gets_it_too(owner: Any) -> None:
    browser = Client()
    browser.force_login(owner)
    response = browser.get("/")
    assert response.status_code == 200
    assert "frame-ancestors 'none'" in response["Content-Security-Policy"]


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_the_api_docs_pages_keep_their_own_policy(owner: Any, page: str) -> None:
    browser = Client()
    browser.force_login(owner)
    response = browser.get(page)
    assert response.status_code == 200
    assert response["Content-Security-Policy"] == DOCS_CONTENT_SECURITY_POLICY


def test_the_json_api_sends_no_policy_so_the_snapshot_short_path_stays_on(
    owner_client: Any,
) -> None:
    from agents_app.api import snapshot_asgi

    answer = owner_client.get("/api/v1/agents/")
    assert answer.status_code == 200
    assert "Content-Security-Policy" not in answer.headers
    # Every middleware is one the short path knows how to answer for (module docstring).
    assert snapshot_asgi._path_enabled()
