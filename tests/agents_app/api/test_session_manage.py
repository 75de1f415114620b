"""Rename, archive, delete and full-text search of sessions (issue 27, "Sessions").

Personas: the owner, another user, staff, anonymous. Deletion runs against the real embedded
engine (``engine`` fixture) and reads the engine afterwards; search writes the index through
the worker's own entry point (``session_changes_apply``) on the test database (SQLite here;
PostgreSQL in ``test_session_search_postgres``).
"""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path
from typing import Any

import grpc
import pytest
from dex.dexpb import dex_pb2 as pb
from rest_framework.test import APIClient

from agents_app.gateway import dex_gateway, engine_connection
from agents_app.models import (
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    SessionMessageText,
    TitleSource,
    UsageRecord,
)
from agents_app.services import session_lifecycle
from agents_app.sessions.session_index import session_changes_apply
from dex_agents import AgentSessionChange, AgentStatus, ObservedMessage
from tests.factories import AgentDefinitionFactory

pytestmark = pytest.mark.django_db

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def make_session(owner: Any, number: int = 1, title: str = "First chat") -> AgentSession:
    agent = AgentDefinitionFactory.create(slug=f"demo-{owner.pk}-{number}")
    return AgentSession.objects.create(
        id=f"ses_{owner.pk:04d}{number:028d}", owner=owner, agent=agent, title=title,
        status="waiting_for_user_message",
    )


def said(session: AgentSession, *messages: tuple[int, str, str]) -> None:
    """Index ``(sequence, role, text)`` as the worker's observer does."""
    session_changes_apply(changes=[AgentSessionChange(
        flow_id=session.pk, observed_at=T0, status=None, turn_id="turn-1",
        messages=tuple(ObservedMessage(*message) for message in messages),
    )])


# --- rename ----------------------------------------------------------------------------------


def test_the_owner_renames_and_no_generated_title_replaces_it(
    owner: Any, owner_client: APIClient, settings: Any
) -> None:
    session = make_session(owner)
    response = owner_client.patch(
        f"/api/v1/sessions/{session.pk}/", {"title": "  Trip   to Lisbon "}, format="json"
    )
    assert response.status_code == 200, response.content
    assert response.json()["title"] == "Trip to Lisbon"
    session.refresh_from_db()
    assert (session.title, session.title_source) == ("Trip to Lisbon", TitleSource.USER)
    # The end of a turn schedules generated titles only for first-message titles.
    settings.DEXAGENTS = {**settings.DEXAGENTS, "GENERATE_TITLES": True}
    session_changes_apply(changes=[AgentSessionChange(
        flow_id=session.pk, observed_at=T0, status=AgentStatus.WAITING_FOR_USER_MESSAGE,
        turn_id="turn-1",
    )])
    session.refresh_from_db()
    assert session.title_source == TitleSource.USER
    assert session_lifecycle.session_title_generate(session_id=session.pk) is None
    assert AgentSession.objects.get(pk=session.pk).title == "Trip to Lisbon"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"title": ""}, "title"),
        ({"title": "   "}, "title"),
        ({"title": "x" * 201}, "title"),
        ({"title": "\u202e\u2066\x07"}, "title"),  # only control characters
        ({"title": 7}, "title"),
        ({"archived": "yes"}, "archived"),
        ({"name": "x"}, "name"),
        ({}, "non_field_errors"),
    ],
)
def test_a_bad_update_is_a_400_naming_the_field(
    owner: Any, owner_client: APIClient, body: dict[str, Any], field: str
) -> None:
    session = make_session(owner)
    response = owner_client.patch(f"/api/v1/sessions/{session.pk}/", body, format="json")
    assert response.status_code == 400
    assert list(response.json()) == [field]
    assert AgentSession.objects.get(pk=session.pk).title == "First chat"


def test_a_renamed_title_loses_bidi_and_other_control_characters(
    owner: Any, owner_client: APIClient
) -> None:
    session = make_session(owner)
    response = owner_client.patch(
        f"/api/v1/sessions/{session.pk}/",
        {"title": "\u2067Invoice\u2069 \u202egpj.exe\u202c\x1b\x07 final\u200f"}, format="json",
    )
    assert response.status_code == 200, response.content
    assert response.json()["title"] == "Invoice gpj.exe final"
    assert AgentSession.objects.get(pk=session.pk).title == "Invoice gpj.exe final"


def test_a_200_character_title_is_kept(owner: Any, owner_client: APIClient) -> None:
    session = make_session(owner)
    response = owner_client.patch(
        f"/api/v1/sessions/{session.pk}/", {"title": "t" * 200}, format="json"
    )
    assert response.status_code == 200
    assert AgentSession.objects.get(pk=session.pk).title == "t" * 200


def test_only_the_owner_renames_or_archives(
    owner: Any, other_client: APIClient, staff_client: APIClient, anonymous_client: APIClient
) -> None:
    session = make_session(owner)
    url = f"/api/v1/sessions/{session.pk}/"
    assert other_client.patch(url, {"title": "mine"}, format="json").status_code == 404
    assert other_client.post(f"{url}archive/").status_code == 404
    assert other_client.delete(url).status_code == 404
    assert staff_client.patch(url, {"title": "staff"}, format="json").status_code == 403
    assert staff_client.post(f"{url}archive/").status_code == 403
    assert anonymous_client.patch(url, {"title": "x"}, format="json").status_code == 401
    assert anonymous_client.delete(url).status_code == 401
    session.refresh_from_db()
    assert (session.title, session.archived_at) == ("First chat", None)


# --- archive ---------------------------------------------------------------------------------


def test_archived_sessions_leave_the_list_unless_asked_for(
    owner: Any, owner_client: APIClient, staff_client: APIClient, client: Any
) -> None:
    kept, archived = make_session(owner, 1, "Kept"), make_session(owner, 2, "Bygone chat")
    response = owner_client.post(f"/api/v1/sessions/{archived.pk}/archive/")
    assert response.status_code == 200 and response.json()["archived"] is True

    def listed(api: APIClient, query: str = "") -> list[str]:
        return [row["id"] for row in api.get(f"/api/v1/sessions/{query}").json()["results"]]

    assert listed(owner_client) == [kept.pk]
    assert listed(owner_client, "?archived=true") == [archived.pk]
    assert listed(staff_client, "?archived=true") == [archived.pk]
    assert owner_client.get("/api/v1/sessions/?archived=maybe").status_code == 400
    # Still readable: its chat page opens.
    client.force_login(owner)
    assert client.get(f"/sessions/{archived.pk}/").status_code == 200
    page = client.get("/sessions/").content.decode()
    assert "Kept" in page and "Bygone chat" not in page
    assert "Bygone chat" in client.get("/sessions/?archived=1").content.decode()
    # PATCH does the same, both ways.
    response = owner_client.patch(
        f"/api/v1/sessions/{archived.pk}/", {"archived": False}, format="json"
    )
    assert response.json()["archived"] is False
    assert set(listed(owner_client)) == {kept.pk, archived.pk}
    assert owner_client.post(f"/api/v1/sessions/{kept.pk}/unarchive/").status_code == 200


# --- search ----------------------------------------------------------------------------------


def test_search_finds_words_of_messages_with_a_snippet(
    owner: Any, other_user: Any, owner_client: APIClient
) -> None:
    lisbon = make_session(owner, 1, "Holidays")
    other = make_session(owner, 2, "Groceries")
    foreign = make_session(other_user, 1, "Theirs")
    said(lisbon, (1, "user", "Where should I stay in Lisbon?"),
         (2, "assistant", "Alfama is a lovely old quarter of Lisbon with steep streets."))
    said(other, (1, "user", "Buy milk and bread"))
    said(foreign, (1, "user", "Lisbon trams"))

    results = owner_client.get("/api/v1/sessions/?search=lisb%20quarter").json()["results"]
    assert [row["id"] for row in results] == [lisbon.pk]
    match = results[0]["match"]
    assert (match["sequence"], match["role"]) == (2, "assistant")
    marked = [match["snippet"][start:end] for start, end in match["highlights"]]
    assert marked == ["quarter", "Lisbon"]
    # A title match has no message match; a word no message has matches nothing.
    results = owner_client.get("/api/v1/sessions/?search=Groceries").json()["results"]
    assert [(row["id"], row["match"]) for row in results] == [(other.pk, None)]
    assert owner_client.get("/api/v1/sessions/?search=tram").json()["results"] == []
    # Query syntax is only words.
    for query in ('"', "AND OR NOT", "lisbon*)", "NEAR(a b)"):
        assert owner_client.get("/api/v1/sessions/", {"search": query}).status_code == 200


def test_the_index_is_idempotent_and_follows_rewrites(owner: Any) -> None:
    from agents_app.sessions.session_search import message_matches_get

    session = make_session(owner)
    said(session, (1, "user", "apples"))
    said(session, (1, "user", "apples"))
    assert SessionMessageText.objects.filter(session=session).count() == 1
    said(session, (1, "user", "pears"))  # a repeated Step attempt stored other text
    assert message_matches_get(words=["apples"], session_ids=[session.pk]) == {}
    assert message_matches_get(words=["pears"], session_ids=[session.pk])[session.pk].snippet \
        == "pears"
    # Tool messages and blank texts are not indexed.
    said(session, (2, "tool", "oranges"), (3, "assistant", "  "))
    assert SessionMessageText.objects.filter(session=session).count() == 1


def test_the_sessions_page_shows_the_matching_message(owner: Any, client: Any) -> None:
    session = make_session(owner, 1, "Holidays")
    said(session, (1, "user", "<b>Where</b> should I stay in Lisbon?"))
    client.force_login(owner)
    page = client.get("/sessions/?search=lisbon").content.decode()
    assert "<mark>Lisbon</mark>" in page
    assert "&lt;b&gt;Where&lt;/b&gt;" in page


# --- delete ----------------------------------------------------------------------------------


def _engine_rows(db: Path, flow_id: str) -> int:
    with sqlite3.connect(db) as connection:
        runs = connection.execute("SELECT COUNT(*) FROM runs WHERE flow_id=?", (flow_id,))
        streams = connection.execute(
            "SELECT COUNT(*) FROM stream_messages WHERE flow_id=?", (flow_id,)
        )
        return int(runs.fetchone()[0]) + int(streams.fetchone()[0])


@pytest.mark.parametrize("deleter", ["owner", "staff"])
def test_delete_stops_the_flow_and_removes_index_and_history(
    owner: Any, staff: Any, token_client: Any, engine: str, tmp_path: Path, deleter: str,
) -> None:
    agent = AgentDefinitionFactory.create(slug="demo")
    session = session_lifecycle.session_create(owner=owner, agent=agent)
    said(session, (1, "user", "secret plans"))
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.c1", tool_call_id="c1", tool_name="t",
        requested_at=T0,
    )
    decision = ApprovalDecision.objects.create(
        session=session, interrupt_id="turn-1.c0", tool_call_id="c0", tool_name="t",
        approved=True, decided_by=staff,
    )
    UsageRecord.objects.create(
        session=session, owner=owner, agent=agent, model_call_id="m1", recorded_at=T0,
        day=T0.date(), requests=1,
    )
    assert _engine_rows(tmp_path / "dex.db", session.pk) > 0
    api = token_client(owner if deleter == "owner" else staff)
    url = f"/api/v1/sessions/{session.pk}/"

    response = api.delete(url)
    assert response.status_code == 204, response.content

    owner_api = token_client(owner)
    for path in ("", "history/", "queue/", "messages/"):
        assert owner_api.get(url + path).status_code == 404, path
    assert owner_api.patch(url, {"title": "x"}, format="json").status_code == 404
    assert owner_api.delete(url).status_code == 404
    assert owner_api.get("/api/v1/sessions/").json()["results"] == []
    assert owner_api.get("/api/v1/sessions/?search=secret").json()["results"] == []
    assert not AgentSession.objects.filter(pk=session.pk).exists()
    assert not SessionMessageText.objects.filter(session_id=session.pk).exists()
    assert not ApprovalRequest.objects.filter(session_id=session.pk).exists()
    # The audit and the money spent stay, on a tombstone without its title.
    tombstone = AgentSession.with_deleted.get(pk=session.pk)
    assert tombstone.deleted_at is not None and tombstone.title == ""
    assert ApprovalDecision.objects.filter(pk=decision.pk).exists()
    assert UsageRecord.objects.filter(session_id=session.pk).count() == 1
    # The engine has nothing of it any more.
    assert _engine_rows(tmp_path / "dex.db", session.pk) == 0

    async def history() -> Any:
        return await engine_connection.connection().flow_service.GetHistoryEvents(
            pb.GetHistoryEventsRequest(flow_id=session.pk)
        )

    with pytest.raises(grpc.RpcError) as gone:
        dex_gateway.run(history())
    assert gone.value.code() == grpc.StatusCode.NOT_FOUND


def test_delete_while_the_engine_is_down_is_a_503_that_changes_nothing(
    owner: Any, owner_client: APIClient, engine_down: str
) -> None:
    session = make_session(owner)
    response = owner_client.delete(f"/api/v1/sessions/{session.pk}/")
    assert response.status_code == 503
    assert AgentSession.objects.filter(pk=session.pk).exists()


@pytest.mark.django_db(transaction=True)
async def test_an_open_websocket_closes_when_its_session_is_deleted(
    owner: Any, engine: str
) -> None:
    from asgiref.sync import sync_to_async
    from channels.testing import WebsocketCommunicator

    from dexagents_site.asgi import application
    from tests.conftest import api_token_key

    agent = await sync_to_async(AgentDefinitionFactory.create)(slug="demo")
    session = await sync_to_async(session_lifecycle.session_create)(owner=owner, agent=agent)
    key = await sync_to_async(api_token_key)(owner)
    communicator = WebsocketCommunicator(
        application, f"/ws/sessions/{session.pk}/events/",
        headers=[(b"authorization", f"Bearer {key}".encode())],
    )
    connected, _ = await communicator.connect()
    assert connected
    await sync_to_async(session_lifecycle.session_delete)(session=session)
    while True:
        output = await communicator.receive_output(timeout=10)
        if output["type"] == "websocket.close":
            break
    assert output["code"] == 4404
    await communicator.disconnect(code=4404)
