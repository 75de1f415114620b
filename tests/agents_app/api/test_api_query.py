"""A misspelt query parameter on a list endpoint answers 400 naming it
(``agents_app.api.query``); pagination, ``format`` and each endpoint's own filters pass.
Personas: owner (their lists), staff (the approvals lists), anonymous (401 before any check)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(
    ("path", "good", "misspelt"),
    [
        ("/api/v1/sessions/", "status=stopped&search=x&limit=5&offset=0&format=json", "stauts"),
        ("/api/v1/agents/", "limit=10&offset=0", "slug"),
        ("/api/v1/tokens/", "limit=10", "page"),
    ],
)
def test_owner_lists_refuse_an_unknown_parameter_and_take_their_own(
    owner_client: APIClient, path: str, good: str, misspelt: str
) -> None:
    assert owner_client.get(f"{path}?{good}").status_code == 200
    refused = owner_client.get(f"{path}?limit=5&{misspelt}=1")
    assert refused.status_code == 400, refused.content
    body = refused.json()
    assert list(body) == [misspelt]
    assert body[misspelt][0].startswith("Unknown query parameter; this endpoint takes: ")
    assert "limit" in body[misspelt][0]


@pytest.mark.parametrize(
    ("path", "good", "misspelt"),
    [
        ("/api/v1/approvals/", "agent=demo&tool=x&owner=o&session=s", "agnet"),
        ("/api/v1/approvals/decisions/", "decision=approved&tool=x&limit=5&offset=0", "decsion"),
    ],
)
def test_staff_approval_lists_refuse_an_unknown_parameter(
    staff_client: APIClient, path: str, good: str, misspelt: str
) -> None:
    assert staff_client.get(f"{path}?{good}").status_code == 200
    refused = staff_client.get(f"{path}?{misspelt}=x")
    assert refused.status_code == 400, refused.content
    assert list(refused.json()) == [misspelt]
    assert "tool" in refused.json()[misspelt][0]


def test_anonymous_gets_401_not_a_parameter_message(anonymous_client: APIClient) -> None:
    assert anonymous_client.get("/api/v1/sessions/?stauts=x").status_code == 401
