"""API tokens (``/api/v1/tokens/``, ``agents_app.api.tokens``): hashed storage, names,
expiry, create with a password or a browser session, list and revoke, and the move of plain
DRF tokens into the hashed store (migration 0007)."""

import base64
import datetime
import importlib
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.utils import timezone
from knox.crypto import hash_token
from rest_framework.test import APIClient

from agents_app.auth import user_for_token_key
from agents_app.models import ApiToken
from tests.conftest import api_token_key
from tests.factories import UserFactory

PASSWORD = "correct horse battery staple"  # tests.factories.UserFactory's

pytestmark = pytest.mark.django_db


def basic(client: APIClient, username: str, password: str = PASSWORD) -> APIClient:
    raw = base64.b64encode(f"{username}:{password}".encode()).decode()
    client.credentials(HTTP_AUTHORIZATION=f"Basic {raw}")
    return client


def bearer(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def test_create_with_a_password_shows_the_key_once_and_stores_only_its_digest(
    owner: Any,
) -> None:
    response = basic(APIClient(), "owner").post(
        "/api/v1/tokens/", {"name": "CI deploy"}, format="json"
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "created_at", "expires_at", "expired", "key"}
    assert body["name"] == "CI deploy"
    assert body["expires_at"] is None and body["expired"] is False
    key = body["key"]
    assert key.startswith("dxa_") and len(key) == 68

    token = ApiToken.objects.get(pk=body["id"])
    assert token.digest == hash_token(key)
    stored = [str(value) for value in ApiToken.objects.values_list(flat=False).get(pk=token.pk)]
    assert key not in stored

    # The key works with either keyword; the list never shows it again.
    assert bearer(key).get("/api/v1/sessions/").status_code == 200
    listed = bearer(key).get("/api/v1/tokens/")
    assert listed.status_code == 200
    assert listed.json()["results"] == [
        {key_: value for key_, value in body.items() if key_ != "key"}
    ]
    assert key not in listed.content.decode()


def test_create_with_a_browser_session_and_an_expiry(owner: Any) -> None:
    client = APIClient()
    client.force_login(owner)
    expires_at = timezone.now() + datetime.timedelta(days=30)
    response = client.post(
        "/api/v1/tokens/",
        {"name": "laptop", "expires_at": expires_at.isoformat()},
        format="json",
    )
    assert response.status_code == 201, response.content
    token = ApiToken.objects.get(pk=response.json()["id"])
    assert token.expiry == expires_at
    assert user_for_token_key(response.json()["key"]) == owner


def test_a_session_create_needs_the_csrf_token(owner: Any) -> None:
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(owner)
    response = client.post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == 403
    assert "CSRF" in response.json()["detail"]
    assert not ApiToken.objects.exists()


def test_a_token_cannot_create_tokens(owner: Any) -> None:
    response = bearer(api_token_key(owner)).post(
        "/api/v1/tokens/", {"name": "more"}, format="json"
    )
    assert response.status_code == 403
    assert response.json() == {
        "detail": "An API token cannot create tokens: authenticate with your password (HTTP "
        "Basic) or a logged-in browser session."
    }
    assert ApiToken.objects.count() == 1


@pytest.mark.parametrize(
    ("client_for", "status"),
    [
        (lambda: APIClient(), 401),
        (lambda: basic(APIClient(), "owner", "wrong password"), 401),
        (lambda: basic(APIClient(), "nobody"), 401),
    ],
)
def test_create_refuses_anonymous_and_wrong_passwords(
    owner: Any, client_for: Any, status: int
) -> None:
    response = client_for().post("/api/v1/tokens/", {"name": "x"}, format="json")
    assert response.status_code == status
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({}, "name", "required"),
        ({"name": "   "}, "name", "may not be blank"),
        ({"name": "x" * 101}, "name", "no more than 100"),
        ({"name": "x", "expires_at": "tomorrow"}, "expires_at", "wrong format"),
        ({"name": "x", "expires_at": "2000-01-01T00:00:00Z"}, "expires_at", "in the future"),
    ],
)
def test_create_validates_with_field_messages(
    owner: Any, body: dict[str, Any], field: str, fragment: str
) -> None:
    response = basic(APIClient(), "owner").post("/api/v1/tokens/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert fragment in response.json()[field][0]
    assert not ApiToken.objects.exists()


def test_expired_tokens_answer_401_with_a_clear_message(owner: Any) -> None:
    key = api_token_key(owner, "short-lived")
    expired_at = timezone.now() - datetime.timedelta(minutes=1)
    ApiToken.objects.filter(user=owner).update(expiry=expired_at)
    response = bearer(key).get("/api/v1/sessions/")
    assert response.status_code == 401
    detail = response.json()["detail"]
    assert detail.startswith(f"This API token expired at {expired_at.isoformat()}")
    assert "create a new one" in detail
    # Kept (not silently deleted), so its owner sees why clients fail.
    client = APIClient()
    client.force_login(owner)
    [listed] = client.get("/api/v1/tokens/").json()["results"]
    assert listed["name"] == "short-lived" and listed["expired"] is True


def test_revoke_own_token_and_not_someone_elses(owner: Any, other_user: Any) -> None:
    owner_key = api_token_key(owner, "a")
    other_key = api_token_key(other_user, "b")
    other_id = ApiToken.objects.get(user=other_user).pk
    owner_id = ApiToken.objects.get(user=owner).pk

    refused = bearer(owner_key).delete(f"/api/v1/tokens/{other_id}/")
    assert refused.status_code == 404
    assert refused.json() == {"detail": "You have no API token with this ID."}
    assert user_for_token_key(other_key) == other_user

    # A token may revoke itself (a client logging out); its next request is refused.
    assert bearer(owner_key).delete(f"/api/v1/tokens/{owner_id}/").status_code == 204
    after = bearer(owner_key).get("/api/v1/tokens/")
    assert after.status_code == 401
    assert "Invalid token" in after.json()["detail"]
    assert not ApiToken.objects.filter(user=owner).exists()


def test_one_user_holds_a_bounded_number_of_tokens(owner: Any, settings: Any) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "MAX_API_TOKENS_PER_USER": 2}
    client = basic(APIClient(), "owner")
    for name in ("one", "two"):
        assert client.post("/api/v1/tokens/", {"name": name}, format="json").status_code == 201
    refused = client.post("/api/v1/tokens/", {"name": "three"}, format="json")
    assert refused.status_code == 409
    assert "revoke one" in refused.json()["detail"]
    assert ApiToken.objects.filter(user=owner).count() == 2


def test_the_list_shows_only_the_callers_tokens_newest_first(
    owner: Any, other_user: Any
) -> None:
    api_token_key(other_user, "theirs")
    key = api_token_key(owner, "first")
    api_token_key(owner, "second")
    names = [item["name"] for item in bearer(key).get("/api/v1/tokens/").json()["results"]]
    assert names == ["second", "first"]


@pytest.mark.django_db(transaction=True)
async def test_websockets_refuse_an_expired_token_with_4401(owner: Any) -> None:
    from asgiref.sync import sync_to_async

    from dexagents_site.asgi import application

    def expired_key() -> str:
        key = api_token_key(owner)
        ApiToken.objects.update(expiry=timezone.now() - datetime.timedelta(seconds=1))
        return key

    key = await sync_to_async(expired_key)()
    communicator = WebsocketCommunicator(
        application, "/ws/approvals/", headers=[(b"authorization", f"Bearer {key}".encode())]
    )
    connected, _ = await communicator.connect()
    assert connected
    closing = await communicator.receive_output(timeout=5)
    assert closing["type"] == "websocket.close" and closing["code"] == 4401
    # Answer the close as a browser does; ``wait()`` alone would sit out its 1 s timeout.
    await communicator.disconnect(code=4401)


MOVE_MIGRATION = "agents_app.migrations.0007_api_token_from_drf_tokens"


def test_the_migration_moves_plain_drf_tokens_into_the_hashed_store() -> None:
    """A database from before hashed tokens: its DRF ``authtoken_token`` rows become
    ``ApiToken`` rows that the same keys authenticate, and the plain keys are deleted."""
    from django.apps import apps

    migration = importlib.import_module(MOVE_MIGRATION)
    alice = UserFactory.create(username="alice")
    old_key = "9944b09199c62bcf9418ad846dd0e4bbdfc6ee4b"  # DRF's format: 40 hex characters
    with connection.cursor() as cursor:
        cursor.execute(
            "CREATE TABLE authtoken_token (key varchar(40) PRIMARY KEY, "
            "created datetime NOT NULL, user_id integer NOT NULL UNIQUE)"
        )
        cursor.execute(
            "INSERT INTO authtoken_token (key, created, user_id) VALUES (%s, %s, %s)",
            [old_key, "2025-03-04 05:06:07.000000", alice.pk],
        )
    try:
        assert user_for_token_key(old_key) is None  # not readable before the move
        # Not entered: SQLite's editor refuses to open inside the test's transaction, and the
        # migration uses only its connection and quoting.
        migration.move_drf_tokens(apps, connection.schema_editor())
        with connection.cursor() as cursor:
            cursor.execute("SELECT COUNT(*) FROM authtoken_token")
            assert cursor.fetchone() == (0,)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TABLE authtoken_token")

    token = ApiToken.objects.get(user=alice)
    assert token.digest == hash_token(old_key)  # the frozen format is knox's
    assert token.name == "API token (from before hashed tokens)"
    assert token.expiry is None
    assert token.created == datetime.datetime(2025, 3, 4, 5, 6, 7, tzinfo=datetime.UTC)
    assert bearer(old_key).get("/api/v1/sessions/").status_code == 200
    token_keyword = APIClient()
    token_keyword.credentials(HTTP_AUTHORIZATION=f"Token {old_key}")
    assert token_keyword.get("/api/v1/sessions/").status_code == 200


def test_the_migration_does_nothing_without_the_drf_table() -> None:
    from django.apps import apps

    migration = importlib.import_module(MOVE_MIGRATION)
    migration.move_drf_tokens(apps, connection.schema_editor())
    assert not ApiToken.objects.exists()


def test_admin_lists_tokens_without_keys_and_may_only_revoke(superuser: Any) -> None:
    from django.contrib import admin
    from django.test import Client

    from agents_app.admin import ApiTokenAdmin

    key = api_token_key(superuser, "ops")
    assert isinstance(admin.site._registry[ApiToken], ApiTokenAdmin)
    browser = Client()
    browser.force_login(superuser)
    page = browser.get("/admin/agents_app/apitoken/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "ops" in html and key not in html and key[:15] not in html
    assert browser.get("/admin/agents_app/apitoken/add/").status_code == 403
