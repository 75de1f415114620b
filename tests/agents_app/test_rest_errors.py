"""Every ``/api/`` answer is JSON: malformed and deep bodies, unknown paths and odd IDs, 405,
413 and 500 (``agents_app.rest_errors``).

The write endpoints are read from the URL conf, so a new one cannot be left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from agents_app.models import AgentSession
from tests.factories import AgentDefinitionFactory, AgentSessionFactory, UserFactory

pytestmark = pytest.mark.django_db

SESSION_ID = "ses_fffffffffffffffffffffffffffffff2"
#: What the issue saw: ~2,000 levels, past Python's recursion limit.
DEEP_BODY = "[" * 2000 + "]" * 2000
PATH_ARGUMENTS = {
    "session_id": SESSION_ID,
    "message_id": "01920000-0000-7000-8000-000000000001",
    "interrupt_id": "turn-1.call_1",
    "elicitation_id": "turn-1.call_1.0123456789abcdef",
    "token_id": "1",
    "sequence": "1",
    "slug": "demo",
    "name": "no-such-trigger",
    "schedule_id": "1",
}


def _routes(
    patterns: list[URLPattern | URLResolver], prefix: str = "/"
) -> Iterator[tuple[str, Any]]:
    """``(path, view class)`` for every DRF route, path arguments filled in."""
    for pattern in patterns:
        text = prefix + str(pattern.pattern)
        if isinstance(pattern, URLResolver):
            yield from _routes(pattern.url_patterns, text)
            continue
        view_class = getattr(pattern.callback, "cls", None)
        if view_class is not None:
            yield re.sub(r"<(?:\w+:)?(\w+)>", lambda m: PATH_ARGUMENTS[m.group(1)], text), (
                view_class
            )


def _write_routes() -> list[tuple[str, str]]:
    found = [
        (method, path)
        for path, view_class in _routes(get_resolver().url_patterns)
        if path.startswith("/api/")
        for method in ("post", "put", "patch")
        if hasattr(view_class, method)
    ]
    assert len(found) >= 8, found  # the URL conf was read, not an empty list
    return found


@pytest.fixture
def staff_owner_client(settings: Any, engine_down: str) -> APIClient:
    """A staff member who owns the session, so both owner-only and staff-only writes run."""
    settings.DEXAGENTS = {**settings.DEXAGENTS, "ENGINE_TIMEOUT": 1}
    user = UserFactory.create(username="staff-owner", is_staff=True)
    AgentSessionFactory.create(
        id=SESSION_ID, owner=user, agent=AgentDefinitionFactory.create(slug="demo")
    )
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_deeply_nested_body_is_a_400_on_every_write_endpoint(
    staff_owner_client: APIClient,
) -> None:
    refused = []
    for method, path in _write_routes():
        answer = getattr(staff_owner_client, method)(
            path, DEEP_BODY, content_type="application/json"
        )
        assert answer["Content-Type"] == "application/json", (method, path, answer.content[:200])
        assert answer.status_code < 500 or answer.status_code == 503, (method, path)
        if answer.status_code == 400:
            assert "nest deeper than" in answer.json()["detail"], (method, path, answer.json())
            refused.append(path)
        else:
            # The endpoint takes no body: the deep one changed nothing.
            empty = getattr(staff_owner_client, method)(path, "{}", content_type="application/json")
            assert empty.status_code == answer.status_code, (method, path)
    # Every endpoint with a request body refused it.
    assert len(refused) >= 6, refused


def test_nesting_up_to_the_bound_parses_and_one_more_level_does_not(
    staff_owner_client: APIClient,
) -> None:
    from agents_app.rest_errors import JSON_MAX_NESTING_DEPTH

    path = "/api/v1/sessions/"

    def nested(levels: int) -> str:
        return json.dumps({"agent": "demo", "tools": "x"})[:-1] + ', "extra": ' + (
            "[" * (levels - 1) + "]" * (levels - 1)
        ) + "}"

    within = staff_owner_client.post(path, nested(JSON_MAX_NESTING_DEPTH),
                                     content_type="application/json")
    # Parsed: the serializer answers, naming the field it does not take.
    assert within.status_code == 400 and "extra" in within.json(), within.json()
    beyond = staff_owner_client.post(path, nested(JSON_MAX_NESTING_DEPTH + 1),
                                     content_type="application/json")
    assert beyond.status_code == 400
    assert "nest deeper than" in beyond.json()["detail"]


def test_malformed_json_is_a_400_json_error(staff_owner_client: APIClient) -> None:
    answer = staff_owner_client.post("/api/v1/sessions/", "{", content_type="application/json")
    assert answer.status_code == 400
    assert answer.json()["detail"].startswith("JSON parse error")


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/nothing-here/",
        "/api/v1/sessions/a%2Fb/",
        "/api/v1/sessions/a%2Fb/stop/",
        "/api/v1/sessions/../",
        "/api/v1/sessions/%2E%2E/history/x/",
        "/api/",
        "/api/v2/sessions/",
    ],
)
def test_unknown_api_paths_answer_json_404(owner: Any, settings: Any, path: str) -> None:
    client = APIClient()
    client.force_authenticate(owner)
    for debug in (False, True):
        settings.DEBUG = debug
        answer = client.get(path)
        assert answer.status_code == 404, (debug, path)
        assert answer["Content-Type"] == "application/json", (debug, path)
        assert set(answer.json()) == {"detail"}
        assert int(answer.get("Content-Length", str(len(answer.content)))) == len(answer.content)


def test_a_path_without_its_trailing_slash_answers_json(owner: Any) -> None:
    """A fresh-clone trial got 301 with an empty HTML body, and a POST that follows it is
    resent as a GET without its body: writes answer 404 naming the right path instead."""
    client = APIClient()
    client.force_authenticate(owner)
    moved = client.get("/api/v1/sessions")
    assert moved.status_code == 301
    assert moved["Location"].endswith("/api/v1/sessions/")
    assert moved.json() == {"detail": "Moved to /api/v1/sessions/"}
    for path in ("/api/v1/sessions", "/api/v1/tokens"):
        answer = client.post(path, {"agent": "demo"}, format="json")
        assert answer.status_code == 404, path
        assert answer.json() == {
            "detail": f"No endpoint at {path}; did you mean {path}/ (API paths end with a "
            "slash)?"
        }
    assert AgentSession.objects.count() == 0


def test_a_dot_dot_session_id_is_a_json_404(owner: Any) -> None:
    client = APIClient()
    client.force_authenticate(owner)
    for path in ("/api/v1/sessions/../", "/api/v1/sessions/../history/",
                 "/api/v1/sessions/../stop/"):
        method = client.post if path.endswith("stop/") else client.get
        answer = method(path)
        assert answer.status_code == 404, path
        assert answer.json() == {"detail": "No such session."}, path


def test_a_browser_asking_for_html_gets_the_json_error_body(owner: Any) -> None:
    client = Client()
    client.force_login(owner)
    answer = client.get("/api/v1/sessions/ses_nobody/", HTTP_ACCEPT="text/html")
    assert answer.status_code == 404
    assert answer["Content-Type"] == "application/json"
    assert answer.json() == {"detail": "No such session."}
    assert int(answer["Content-Length"]) == len(answer.content)


def test_pages_keep_their_html_404(owner: Any, settings: Any) -> None:
    settings.DEBUG = False
    client = Client()
    client.force_login(owner)
    answer = client.get("/no-such-page/")
    assert answer.status_code == 404
    assert answer["Content-Type"].startswith("text/html")


def test_method_not_allowed_and_oversized_bodies_answer_json(owner_client: APIClient) -> None:
    refused = owner_client.put("/api/v1/sessions/", {}, format="json")
    assert refused.status_code == 405
    assert refused["Content-Type"] == "application/json"
    assert "detail" in refused.json()
    huge = owner_client.post("/api/v1/sessions/", b"x" * (3 * 1024 * 1024),
                             content_type="application/json")
    assert huge.status_code == 413
    assert "larger than the limit" in huge.json()["detail"]


def test_a_server_error_under_api_answers_json(
    owner: Any, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agents_app.selectors import session_reads

    def broken(**kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(session_reads, "session_list_visible", broken)
    client = Client(raise_request_exception=False)
    client.force_login(owner)
    for debug in (False, True):
        settings.DEBUG = debug
        answer = client.get("/api/v1/sessions/")
        assert answer.status_code == 500, debug
        assert answer["Content-Type"] == "application/json", debug
        assert answer.json() == {"detail": "Internal server error; it was logged."}
        assert "boom" not in answer.content.decode()


def test_session_row_is_untouched_by_refused_bodies(staff_owner_client: APIClient) -> None:
    before = AgentSession.objects.get(pk=SESSION_ID)
    staff_owner_client.post(f"/api/v1/sessions/{SESSION_ID}/messages/", DEEP_BODY,
                            content_type="application/json")
    after = AgentSession.objects.get(pk=SESSION_ID)
    assert (after.status, after.updated_at) == (before.status, before.updated_at)
