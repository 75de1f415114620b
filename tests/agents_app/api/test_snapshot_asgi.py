"""The snapshot short path's settings-derived caches follow setting changes.

``agents_app.api.snapshot_asgi`` remembers whether the settings let it answer, which paths resolve
to the snapshot view and the answer's fixed headers; a changed setting (``override_settings``,
which sends ``setting_changed``) must be seen on the next request, not after a restart.
"""

from __future__ import annotations

import uuid
from typing import Any

from django.test import override_settings

from agents_app.api import snapshot_asgi


def _scope(path: str) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "root_path": "",
        "query_string": b"",
        "scheme": "http",
        "headers": [
            (b"host", b"localhost"),
            (b"authorization", b"Bearer some-key"),
            (b"accept", b"application/json"),
        ],
    }


def test_an_eligible_read_follows_the_short_path_setting() -> None:
    session_id = str(uuid.uuid4())
    scope = _scope(f"/api/v1/sessions/{session_id}/")
    request = snapshot_asgi._eligible(scope)
    assert request is not None
    assert request.session_id == session_id
    assert request.key == "some-key"
    with override_settings(DEXAGENTS={"SNAPSHOT_SHORT_PATH": False}):
        assert snapshot_asgi._eligible(scope) is None
    assert snapshot_asgi._eligible(scope) is not None


def test_accept_parameters_and_cookies_are_left_to_django() -> None:
    scope = _scope(f"/api/v1/sessions/{uuid.uuid4()}/")
    assert snapshot_asgi._eligible(scope) is not None
    indented = {**scope, "headers": [
        (name, b"application/json; indent=4" if name == b"accept" else value)
        for name, value in scope["headers"]
    ]}
    assert snapshot_asgi._eligible(indented) is None
    with_cookie = {**scope, "headers": [*scope["headers"], (b"cookie", b"sessionid=abc")]}
    assert snapshot_asgi._eligible(with_cookie) is None


def test_other_paths_are_left_to_django() -> None:
    assert snapshot_asgi._eligible(_scope("/api/v1/sessions/")) is None
    assert snapshot_asgi._eligible(_scope(f"/api/v1/sessions/{uuid.uuid4()}/history/")) is None
    assert snapshot_asgi._eligible(_scope("/healthz")) is None


def test_the_fixed_headers_follow_the_settings() -> None:
    def headers() -> dict[bytes, bytes]:
        return dict(snapshot_asgi.response_headers(secure=False, request_id="r-1", length=12))

    assert headers()[b"X-Frame-Options"] == b"DENY"
    assert headers()[b"Content-Length"] == b"12"
    assert headers()[b"X-Request-ID"] == b"r-1"
    with override_settings(X_FRAME_OPTIONS="SAMEORIGIN"):
        assert headers()[b"X-Frame-Options"] == b"SAMEORIGIN"
    assert headers()[b"X-Frame-Options"] == b"DENY"
