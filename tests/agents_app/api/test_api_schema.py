"""The OpenAPI schema and its pages: valid without warnings, every error documented, the docs
served offline to logged-in browsers.

What the served responses look like against this schema is checked by schemathesis against
the real stack (tests/e2e/test_api_contract.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.test import Client
from rest_framework.test import APIClient

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.django_db

ERROR_COMPONENTS = {
    "401": "NotAuthenticatedError",
    "403": "PermissionDeniedError",
    "404": "NotFoundError",
    "413": "RequestTooLargeError",
    "415": "UnsupportedMediaTypeError",
    "503": "ServiceUnavailableError",
}


@pytest.fixture
def schema(owner_client: APIClient) -> dict[str, Any]:
    response = owner_client.get("/api/schema/?format=json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def operations(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in schema["paths"].items()
        for method, operation in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    ]


def ref_name(response: dict[str, Any]) -> str:
    ref: str = response["content"]["application/json"]["schema"]["$ref"]
    return ref.rsplit("/", 1)[1]


def test_schema_generation_has_no_warnings_or_errors(tmp_path: Path) -> None:
    """``manage.py spectacular --validate --fail-on-warn``: also fails on two components with
    one name, an unresolvable serializer or an invalid OpenAPI document."""
    out = tmp_path / "schema.yaml"
    done = subprocess.run(
        [sys.executable, "manage.py", "spectacular", "--validate", "--fail-on-warn",
         "--file", str(out)],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stderr and "Error" not in done.stderr, done.stderr
    assert yaml.safe_load(out.read_text())["openapi"].startswith("3.")


def test_every_operation_documents_its_errors(schema: dict[str, Any]) -> None:
    """401 everywhere, 404 with a path parameter, 400/413/415 with a body, 403 for writes and
    staff-only reads, each with its shared component."""
    for method, path, operation in operations(schema):
        responses = operation["responses"]
        label = f"{method} {path}"
        expected = {"401"}
        if "{" in path:
            expected.add("404")
        if "requestBody" in operation:
            expected |= {"400", "413", "415"}
        if method != "GET" or path.startswith("/api/v1/approvals/"):
            expected.add("403")
        assert expected <= set(responses), f"{label}: {sorted(responses)}"
        for code in expected - {"400"}:
            assert ref_name(responses[code]) == ERROR_COMPONENTS[code], label
        if "400" in responses:
            body = set(schema["components"]["schemas"][ref_name(responses["400"])]["properties"])
            if "requestBody" in operation:
                assert {"non_field_errors", "detail"} <= body, label
            if "limit" in {parameter["name"] for parameter in operation.get("parameters", [])}:
                assert {"limit"} <= body, label
        assert any(code.startswith("2") for code in responses), label


def test_engine_calls_document_503_and_index_reads_do_not(schema: dict[str, Any]) -> None:
    paths = schema["paths"]
    assert "503" in paths["/api/v1/sessions/"]["post"]["responses"]
    assert "503" in paths["/api/v1/sessions/{session_id}/"]["get"]["responses"]
    assert "503" in paths["/api/v1/sessions/{session_id}/stop/"]["post"]["responses"]
    assert "503" not in paths["/api/v1/sessions/"]["get"]["responses"]
    assert "503" not in paths["/api/v1/agents/"]["get"]["responses"]


def test_stop_documents_the_status_it_serves(schema: dict[str, Any]) -> None:
    responses = schema["paths"]["/api/v1/sessions/{session_id}/stop/"]["post"]["responses"]
    body = schema["components"]["schemas"][ref_name(responses["202"])]
    assert set(body["properties"]) == {"status"}
    assert body["required"] == ["status"]


def test_field_errors_name_the_input_fields(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    create = components["SessionCreateInputError"]["properties"]
    # wait is the query's (send and wait); its messages come in the same body.
    assert set(create) == {
        "agent", "message", "plan_mode", "tools", "wait", "non_field_errors", "detail"
    }
    assert create["agent"] == {
        "type": "array", "items": {"type": "string"}, "description": "Messages for this field.",
    }
    # A list field's child errors are keyed by index.
    assert [kind["type"] for kind in create["tools"]["oneOf"]] == ["array", "object"]
    page = schema["paths"]["/api/v1/sessions/{session_id}/messages/"]["get"]["responses"]
    assert set(components[ref_name(page["400"])]["properties"]) >= {"before", "limit"}


def test_the_bearer_scheme_is_documented(schema: dict[str, Any]) -> None:
    schemes = schema["components"]["securitySchemes"]
    assert {"type": "http", "scheme": "bearer"}.items() <= schemes["bearerAuth"].items()
    assert schemes["cookieAuth"]["in"] == "cookie"


@pytest.mark.parametrize("query", ["", "?format=json"])
def test_anonymous_schema_is_401_json(anonymous_client: APIClient, query: str) -> None:
    response = anonymous_client.get(f"/api/schema/{query}")
    assert response.status_code == 401
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"detail": "Authentication credentials were not provided."}


def test_logged_in_browser_reads_the_schema(owner: Any) -> None:
    browser = Client()
    browser.force_login(owner)
    response = browser.get("/api/schema/?format=json")
    assert response.status_code == 200
    assert "/api/v1/sessions/" in response.json()["paths"]


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_redirect_anonymous_to_login(page: str) -> None:
    response = Client().get(page)
    assert response.status_code == 302
    assert response["Location"] == f"/accounts/login/?next={page}"


@pytest.mark.parametrize("page", ["/api/docs/", "/api/redoc/"])
def test_docs_pages_load_only_local_assets(owner: Any, page: str) -> None:
    browser = Client()
    browser.force_login(owner)
    response = browser.get(page)
    assert response.status_code == 200
    html = response.content.decode()
    sources = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html)
    assert sources, html
    for source in sources:
        assert source.startswith("/"), f"{page} loads {source}"
    if page == "/api/docs/":
        assert "/static/drf_spectacular_sidecar/" in html
    else:
        assert '<script src="/api/redoc/redoc.standalone.js">' in html
    policy = response["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "img-src 'self' data: blob:" in policy
    assert "https:" not in policy
    assert "<script>" not in html


def test_redoc_bundle_links_nothing_from_another_host(owner: Any) -> None:
    """Redoc's sidebar logo came from cdn.redoc.ly, which the docs policy refused (a console
    violation on every visit); the bundle served to the page links an empty image instead."""
    browser = Client()
    assert browser.get("/api/redoc/redoc.standalone.js")["Location"].startswith(
        "/accounts/login/"
    )
    browser.force_login(owner)
    response = browser.get("/api/redoc/redoc.standalone.js")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/javascript; charset=utf-8"
    body = response.content.decode()
    assert "Redoc" in body and len(body) > 500_000
    assert "cdn.redoc.ly" not in body
    assert 'src:"data:,"' in body
    assert re.findall(r"https?://[a-z0-9.-]+/[^\s\"']*\.(?:svg|png|js|css)\b", body) == []
    assert body.endswith(
        "//# sourceMappingURL=/static/drf_spectacular_sidecar/redoc/bundles/"
        "redoc.standalone.js.map"
    )


def test_swagger_settings_script_is_served_to_the_browser(owner: Any) -> None:
    browser = Client()
    browser.force_login(owner)
    html = browser.get("/api/docs/").content.decode()
    script = re.search(r'<script src="(/api/docs/\?script=[^"]*)"', html)
    assert script is not None, html
    response = browser.get(script.group(1).replace("&amp;", "&"))
    assert response.status_code == 200
    body = response.content.decode()
    assert '"validatorUrl": null' in body
    assert "/api/schema/" in body


def test_every_request_body_is_a_closed_object(schema: dict[str, Any]) -> None:
    """Bodies refuse names they do not declare (``BodySerializer``), and the schema says so."""
    bodies = set()
    for operations in schema["paths"].values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            reference = content.get("application/json", {}).get("schema", {}).get("$ref")
            if reference:
                bodies.add(reference.rsplit("/", 1)[-1])
    assert {"SessionCreateInput", "MessageInput", "ApiTokenCreateInput"} <= bodies
    components = schema["components"]["schemas"]
    assert {
        name: components[name].get("additionalProperties") for name in sorted(bodies)
    } == {name: False for name in sorted(bodies)}
