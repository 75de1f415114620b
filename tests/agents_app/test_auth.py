"""API-token authentication (``agents_app.auth``) on the REST API, with named personas."""

from typing import Any

import pytest
from rest_framework.test import APIClient

from agents_app.auth import token_key_from_authorization, user_for_token_key
from tests.conftest import api_token_key

pytestmark = pytest.mark.django_db


def test_token_key_parsing() -> None:
    assert token_key_from_authorization(b"Bearer abc") == "abc"
    assert token_key_from_authorization(b"token abc") == "abc"
    assert token_key_from_authorization(b"BEARER  abc ") == "abc"
    assert token_key_from_authorization(b"Basic abc") is None
    assert token_key_from_authorization(b"Bearer") is None
    assert token_key_from_authorization(b"Bearer a b") is None
    assert token_key_from_authorization(b"Bearer \xff") is None


def test_user_for_token_key(owner: Any) -> None:
    key = api_token_key(owner)
    assert user_for_token_key(key) == owner
    assert user_for_token_key("unknown") is None
    owner.is_active = False
    owner.save()
    assert user_for_token_key(key) is None


@pytest.mark.parametrize("scheme", ["Bearer", "Token", "bearer"])
def test_rest_accepts_bearer_and_token(owner: Any, scheme: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"{scheme} {api_token_key(owner)}")
    assert client.get("/api/v1/sessions/").status_code == 200


@pytest.mark.parametrize("header", ["Bearer not-a-key", "Bearer", "Bearer a b", "Basic Zm9v"])
def test_rest_refuses_bad_credentials_with_a_bearer_challenge(
    anonymous_client: APIClient, header: str
) -> None:
    anonymous_client.credentials(HTTP_AUTHORIZATION=header)
    response = anonymous_client.get("/api/v1/sessions/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="api"'
