"""REST API: authentication, validation, owner scoping, and behaviour without an engine.

Tests that need a running engine live with the engine fixture (``engine`` in conftest);
everything here runs without one, against a real refused connection where Dex is involved.
"""

from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from agents_app.models import AgentSession, ApiToken, OutboxMessage
from tests.factories import AgentDefinitionFactory, AgentSessionFactory, McpToolFactory

pytestmark = pytest.mark.django_db

SESSION_ID = "ses_fffffffffffffffffffffffffffffff1"
MESSAGE_ID = "01920000-0000-7000-8000-000000000001"
QUEUE = f"/api/v1/sessions/{SESSION_ID}/queue/"
QUEUE_WRITES = [
    ("delete", f"{QUEUE}{MESSAGE_ID}/", {}),
    ("put", f"{QUEUE}{MESSAGE_ID}/", {"text": "edited"}),
    ("post", f"{QUEUE}{MESSAGE_ID}/steer/", {}),
]

INPUT = f"/api/v1/sessions/{SESSION_ID}/input/"
PLAN_EXECUTE = f"/api/v1/sessions/{SESSION_ID}/plan/execute/"
TURN_WRITES = [
    ("post", INPUT, {"call_id": "call_1", "answer": "blue"}),
    ("post", PLAN_EXECUTE, {"revision": 1}),
]

ENDPOINTS = [
    ("get", "/api/v1/agents/"),
    ("get", "/api/v1/sessions/"),
    ("post", "/api/v1/sessions/"),
    ("get", f"/api/v1/sessions/{SESSION_ID}/"),
    ("post", f"/api/v1/sessions/{SESSION_ID}/messages/"),
    ("get", f"/api/v1/sessions/{SESSION_ID}/history/"),
    ("get", QUEUE),
    *[(method, path) for method, path, _ in QUEUE_WRITES],
    *[(method, path) for method, path, _ in TURN_WRITES],
    ("get", "/api/schema/"),
]


@pytest.fixture
def owned_session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo")
    )


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_anonymous_gets_401(
    anonymous_client: APIClient, owned_session: AgentSession, method: str, path: str
) -> None:
    response = getattr(anonymous_client, method)(path, {}, format="json")
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path"), ENDPOINTS)
def test_wrong_token_gets_401(owned_session: AgentSession, method: str, path: str) -> None:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION="Token not-a-real-token")
    assert getattr(client, method)(path, {}, format="json").status_code == 401


def test_agents_lists_enabled_agents_without_credentials(owner_client: APIClient) -> None:
    agent = AgentDefinitionFactory.create(slug="demo", api_key_env="OPENAI_API_KEY")
    agent.tools.add(McpToolFactory.create(name="web_search"))
    AgentDefinitionFactory.create(slug="hidden", enabled=False)
    response = owner_client.get("/api/v1/agents/")
    assert response.status_code == 200
    results = response.json()["results"]
    assert [item["slug"] for item in results] == ["demo"]
    assert results[0]["tools"][0].endswith("__web_search")
    assert "OPENAI_API_KEY" not in response.content.decode()


def test_sessions_lists_only_the_callers_sessions(
    owner_client: APIClient, owned_session: AgentSession, other_user: Any
) -> None:
    AgentSessionFactory.create(owner=other_user)
    response = owner_client.get("/api/v1/sessions/")
    assert response.status_code == 200
    assert [item["id"] for item in response.json()["results"]] == [owned_session.id]
    assert response.json()["results"][0]["agent"] == "demo"


def test_sessions_list_refuses_an_unknown_status_and_filters_by_a_known_one(
    owner_client: APIClient, owned_session: AgentSession
) -> None:
    refused = owner_client.get("/api/v1/sessions/", {"status": "bogus"})
    assert refused.status_code == 400
    assert "bogus" in " ".join(refused.json()["status"])
    listed = owner_client.get("/api/v1/sessions/", {"status": owned_session.status})
    assert [item["id"] for item in listed.json()["results"]] == [owned_session.id]
    assert owner_client.get("/api/v1/sessions/", {"status": "stopped"}).json()["results"] == []


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"agent": "nope", "message": "hi"}, "agent", "Unknown or disabled agent"),
        ({"agent": "off", "message": "hi"}, "agent", "Unknown or disabled agent"),
        ({"message": "hi"}, "agent", "required"),
        ({"agent": "demo", "message": ""}, "message", "blank"),
        ({"agent": "demo", "message": "   "}, "message", "blank"),
    ],
)
def test_create_validation_errors_name_the_field(
    owner_client: APIClient, body: dict[str, str], field: str, fragment: str
) -> None:
    AgentDefinitionFactory.create(slug="demo")
    AgentDefinitionFactory.create(slug="off", enabled=False)
    response = owner_client.post("/api/v1/sessions/", body, format="json")
    assert response.status_code == 400
    assert fragment in " ".join(response.json()[field])
    assert not AgentSession.objects.exists()


def test_a_body_with_an_unknown_field_is_refused_whole(
    owner: Any, owner_client: APIClient
) -> None:
    AgentDefinitionFactory.create(slug="demo")
    response = owner_client.post(
        "/api/v1/sessions/", {"agent": "demo", "message": "hi", "plan_mod": True}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json() == {
        "plan_mod": ["Unknown field; this body takes agent, message, plan_mode, tools."]
    }
    assert not AgentSession.objects.exists()

    browser = APIClient()
    browser.force_login(owner)
    response = browser.post("/api/v1/tokens/", {"name": "ci", "expires": None}, format="json")
    assert response.status_code == 400, response.content
    assert response.json() == {"expires": ["Unknown field; this body takes expires_at, name."]}
    assert not ApiToken.objects.filter(name="ci").exists()


def test_stop_takes_no_body(owner: Any, owner_client: APIClient) -> None:
    session = AgentSession.objects.create(
        id="ses_" + "1" * 32, owner=owner, agent=AgentDefinitionFactory.create(slug="demo")
    )
    response = owner_client.post(
        f"/api/v1/sessions/{session.id}/stop/", {"reason": "done"}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json() == {"reason": ["Unknown field; this request takes no body."]}
    session.refresh_from_db()
    assert session.status != "stopped"


def test_create_answers_503_and_creates_nothing_when_the_engine_is_down(
    owner_client: APIClient, engine_down: str
) -> None:
    AgentDefinitionFactory.create(slug="demo")
    response = owner_client.post(
        "/api/v1/sessions/", {"agent": "demo", "message": "hi"}, format="json"
    )
    assert response.status_code == 503
    assert engine_down in response.json()["detail"]
    assert response.json()["unavailable"] == "engine"
    assert not AgentSession.objects.exists()


@pytest.mark.parametrize("suffix", ["", "history/"])
def test_reads_answer_503_when_the_engine_is_down(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, suffix: str
) -> None:
    response = owner_client.get(f"/api/v1/sessions/{owned_session.id}/{suffix}")
    assert response.status_code == 503
    assert set(response.json()) == {"detail", "unavailable"}
    assert response.json()["unavailable"] == "engine"


def test_blank_message_is_400_before_dex_is_asked(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    response = owner_client.post(
        f"/api/v1/sessions/{owned_session.id}/messages/", {"text": "  "}, format="json"
    )
    assert response.status_code == 400
    assert "text" in response.json()


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("get", "", {}),
        ("post", "messages/", {"text": "hi"}),
        ("get", "history/", {}),
        ("get", "queue/", {}),
        ("delete", f"queue/{MESSAGE_ID}/", {}),
        ("put", f"queue/{MESSAGE_ID}/", {"text": "edited"}),
        ("post", f"queue/{MESSAGE_ID}/steer/", {}),
    ],
)
def test_another_users_session_is_404(
    other_client: APIClient, owned_session: AgentSession, method: str, suffix: str, body: Any
) -> None:
    response = getattr(other_client, method)(
        f"/api/v1/sessions/{owned_session.id}/{suffix}", body, format="json"
    )
    assert response.status_code == 404


@pytest.mark.parametrize(("method", "path", "body"), QUEUE_WRITES)
def test_staff_may_not_change_another_users_queue(
    staff_client: APIClient,
    owned_session: AgentSession,
    engine_down: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    response = getattr(staff_client, method)(path, body, format="json")
    assert response.status_code == 403
    assert "owner" in response.json()["detail"]


def test_a_message_sent_while_the_engine_is_down_is_kept_and_listed_as_pending(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, settings: Any
) -> None:
    messages = f"/api/v1/sessions/{SESSION_ID}/messages/"
    sent = owner_client.post(messages, {"text": "kept", "plan_mode": True}, format="json")
    assert sent.status_code == 202, sent.content
    body = sent.json()
    assert body["queued"] is True and body["delivery"] == "pending"
    kept = OutboxMessage.objects.get(pk=body["id"])
    assert (kept.session_id, kept.text, kept.plan_mode, kept.delivery) == (
        SESSION_ID,
        "kept",
        True,
        "pending",
    )
    assert kept.attempts == 1 and engine_down in kept.last_error

    queue = owner_client.get(QUEUE)
    assert queue.status_code == 200, queue.content
    listed = queue.json()
    assert listed["partial"] is True and listed["steered"] == []
    assert [(e["id"], e["text"], e["plan_mode"], e["delivery"]) for e in listed["queued"]] == [
        (body["id"], "kept", True, "pending")
    ]

    # An edit before delivery acts on the kept row: the old one is withdrawn, the new text
    # joins the tail under a new ID and keeps plan_mode.
    edited = owner_client.put(f"{QUEUE}{body['id']}/", {"text": "kept, edited"}, format="json")
    assert edited.status_code == 201, edited.content
    new_id = edited.json()["id"]
    assert new_id != body["id"] and edited.json()["delivery"] == "pending"
    assert OutboxMessage.objects.get(pk=body["id"]).delivery == "withdrawn"
    queued = owner_client.get(QUEUE).json()["queued"]
    assert [(e["id"], e["text"], e["plan_mode"]) for e in queued] == [
        (new_id, "kept, edited", True)
    ]
    steered = owner_client.post(f"{QUEUE}{new_id}/steer/")
    assert steered.status_code == 202, steered.content
    assert OutboxMessage.objects.get(pk=new_id).steer is True
    deleted = owner_client.delete(f"{QUEUE}{new_id}/")
    assert deleted.status_code == 204, deleted.content
    assert owner_client.get(QUEUE).json()["queued"] == []
    # The old ID is gone from the outbox; Dex is asked next, and it does not answer.
    assert owner_client.delete(f"{QUEUE}{new_id}/").status_code == 503


def test_the_outbox_counts_toward_the_queue_limit(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, settings: Any
) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "MAX_QUEUED_MESSAGES": 2, "ENGINE_TIMEOUT": 1}
    messages = f"/api/v1/sessions/{SESSION_ID}/messages/"
    for text in ("one", "two"):
        assert owner_client.post(messages, {"text": text}, format="json").status_code == 202
    full = owner_client.post(messages, {"text": "three"}, format="json")
    assert full.status_code == 409, full.content
    assert "full" in full.json()["detail"]
    assert sorted(OutboxMessage.objects.values_list("text", flat=True)) == ["one", "two"]


@pytest.mark.parametrize(("method", "path", "body"), QUEUE_WRITES)
def test_queue_calls_answer_503_when_the_engine_is_down(
    owner_client: APIClient,
    owned_session: AgentSession,
    engine_down: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    response = getattr(owner_client, method)(path, body, format="json")
    assert response.status_code == 503
    assert engine_down in response.json()["detail"]
    assert response.json()["unavailable"] == "engine"


@pytest.mark.parametrize("body", [{"text": "  "}, {"plan_mode": True}, {"text": ""}])
def test_an_edit_without_text_is_400_before_dex_is_asked(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, body: Any
) -> None:
    response = owner_client.put(f"{QUEUE}{MESSAGE_ID}/", body, format="json")
    assert response.status_code == 400
    assert response.json()["text"]


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("post", f"/api/v1/sessions/{SESSION_ID}/messages/", {"text": "hi"}), *QUEUE_WRITES],
)
def test_a_stopped_session_refuses_queue_writes_with_409_and_lists_no_queue(
    owner_client: APIClient,
    owned_session: AgentSession,
    engine_down: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    AgentSession.objects.filter(pk=owned_session.pk).update(status="stopped")
    response = getattr(owner_client, method)(path, body, format="json")
    assert response.status_code == 409
    assert response.json() == {"detail": "This session is stopped; start a new one."}
    # Its queued messages will never run: the queue is empty without asking the engine.
    assert owner_client.get(QUEUE).json() == {"queued": [], "steered": [], "partial": False}


def test_a_subagents_session_takes_no_message_and_keeps_none(
    owner: Any, owner_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    # It answers its parent's task in one turn and completes: a message would never be read.
    child = AgentSessionFactory.create(
        id="SubFlow:ses_fffffffffffffffffffffffffffffff9-CallSubagent-1-0", owner=owner,
        agent=owned_session.agent, parent=owned_session, parent_tool_call_id="call_1",
    )
    response = owner_client.post(
        f"/api/v1/sessions/{child.pk}/messages/", {"text": "hi"}, format="json"
    )
    assert response.status_code == 409, response.content
    assert "subagent's session" in response.json()["detail"]
    assert not OutboxMessage.objects.filter(session=child).exists()


def test_an_implausible_message_id_is_404_before_dex_is_asked(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    response = owner_client.delete(f"{QUEUE}{'0' * 65}/")
    assert response.status_code == 404
    assert "queued message" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body"), TURN_WRITES)
def test_answers_and_plan_executions_are_the_owners_alone(
    other_client: APIClient,
    staff_client: APIClient,
    owned_session: AgentSession,
    engine_down: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    assert getattr(other_client, method)(path, body, format="json").status_code == 404
    response = getattr(staff_client, method)(path, body, format="json")
    assert response.status_code == 403
    assert "owner" in response.json()["detail"]


@pytest.mark.parametrize(("method", "path", "body"), TURN_WRITES)
def test_answers_and_plan_executions_answer_503_when_the_engine_is_down(
    owner_client: APIClient,
    owned_session: AgentSession,
    engine_down: str,
    method: str,
    path: str,
    body: Any,
) -> None:
    response = getattr(owner_client, method)(path, body, format="json")
    assert response.status_code == 503
    assert engine_down in response.json()["detail"]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        ({}, {"call_id", "answer"}),
        ({"call_id": "call_1"}, {"answer"}),
        ({"call_id": "call_1", "answer": "   "}, {"answer"}),
        ({"call_id": "", "answer": "blue"}, {"call_id"}),
        ({"call_id": "c" * 256, "answer": "blue"}, {"call_id"}),
    ],
)
def test_an_answer_without_call_id_or_text_is_400_before_dex_is_asked(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, body: Any,
    fields: set[str],
) -> None:
    response = owner_client.post(INPUT, body, format="json")
    assert response.status_code == 400
    assert set(response.json()) == fields
    assert all(response.json()[field] for field in fields)


@pytest.mark.parametrize("body", [{}, {"revision": 0}, {"revision": "latest"}])
def test_a_plan_execution_without_a_revision_is_400_before_dex_is_asked(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str, body: Any
) -> None:
    response = owner_client.post(PLAN_EXECUTE, body, format="json")
    assert response.status_code == 400
    assert response.json()["revision"]


def test_a_stopped_session_takes_no_answer_and_executes_no_plan(
    owner_client: APIClient, owned_session: AgentSession, engine_down: str
) -> None:
    AgentSession.objects.filter(pk=owned_session.pk).update(status="stopped")
    answer = owner_client.post(INPUT, {"call_id": "call_1", "answer": "blue"}, format="json")
    assert answer.status_code == 409
    assert answer.json() == {"detail": "This session is stopped; start a new one."}
    execute = owner_client.post(PLAN_EXECUTE, {"revision": 1}, format="json")
    assert execute.status_code == 409
    assert execute.json() == {
        "detail": "This session is stopped; start a new one.",
        "reason": "session_stopped",
    }


def test_unknown_session_is_404(owner_client: APIClient) -> None:
    assert owner_client.get("/api/v1/sessions/ses_missing/").status_code == 404


def test_schema_is_served_to_authenticated_users(owner_client: APIClient) -> None:
    response = owner_client.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    paths = response.json()["paths"]
    for path in (
        "/api/v1/agents/",
        "/api/v1/sessions/",
        "/api/v1/sessions/{session_id}/",
        "/api/v1/sessions/{session_id}/messages/",
        "/api/v1/sessions/{session_id}/history/",
        "/api/v1/sessions/{session_id}/queue/",
        "/api/v1/sessions/{session_id}/queue/{message_id}/",
        "/api/v1/sessions/{session_id}/queue/{message_id}/steer/",
        "/api/v1/sessions/{session_id}/input/",
        "/api/v1/sessions/{session_id}/plan/execute/",
    ):
        assert path in paths
    answer = paths["/api/v1/sessions/{session_id}/input/"]["post"]
    # Every operation is throttled per user: 429 everywhere.
    body_errors = {"400", "401", "403", "404", "409", "413", "415", "429", "503"}
    assert set(answer["responses"]) == {"202", *body_errors}
    execute = paths["/api/v1/sessions/{session_id}/plan/execute/"]["post"]
    assert set(execute["responses"]) == {"202", *body_errors}
    queued = paths["/api/v1/sessions/{session_id}/queue/{message_id}/"]
    assert set(queued["put"]["responses"]) == {"201", *body_errors}
    assert set(queued["delete"]["responses"]) == {
        "204", "401", "403", "404", "409", "429", "503"
    }
    steer = paths["/api/v1/sessions/{session_id}/queue/{message_id}/steer/"]["post"]
    assert set(steer["responses"]) == {"202", "401", "403", "404", "409", "429", "503"}
    schemas = response.json()["components"]["schemas"]
    assert set(schemas["MessageQueued"]["properties"]) == {
        "queued", "id", "delivery", "pending_reason", "pending_detail", "turn", "session"
    }
    messages = paths["/api/v1/sessions/{session_id}/messages/"]["post"]["responses"]
    assert set(messages["200"]["content"]) == {"application/json", "text/event-stream"}
    events = paths["/api/v1/sessions/{session_id}/events/"]["get"]["responses"]
    assert set(events["200"]["content"]) == {"text/event-stream"}
    assert set(schemas["MessageQueue"]["properties"]) == {"queued", "steered", "partial"}
    entry = schemas["QueuedMessageOutput"]["properties"]
    assert set(entry) == {"id", "text", "plan_mode", "created_at", "delivery", "held_reason"}
    resolve = paths["/api/v1/sessions/{session_id}/interrupts/{interrupt_id}/"]["post"]
    assert {"200", "202", "409"} <= set(resolve["responses"])
    assert set(schemas["InterruptNotPending"]["properties"]) == {"detail", "decision"}
    assert set(schemas["RecordedDecision"]["properties"]) == {
        "approved", "decided_by", "decided_at", "rejection_message", "edited_arguments",
        "delivery",
    }
    assert set(schemas["PlanNotExecutableError"]["properties"]) == {"detail", "reason"}
    reason = schemas["PlanNotExecutableError"]["properties"]["reason"]["$ref"].rsplit("/", 1)[1]
    assert set(schemas[reason]["enum"]) >= {
        "stale_revision", "not_executable", "busy", "queued", "already_requested",
    }
    snapshot = schemas["SessionSnapshot"]["properties"]
    for field in ("pending_input", "pending_timer", "plan", "plan_execution_requested",
                  "turn_mode"):
        assert field in snapshot
    assert set(schemas["PendingUserInput"]["properties"]) == {"call_id", "prompt", "choices"}
    assert set(schemas["PendingTimer"]["properties"]) == {
        "call_id", "fires_at", "duration_seconds", "reason",
    }
    assert set(schemas["SessionPlan"]["properties"]) == {"revision", "status", "tasks"}
    assert set(schemas["PlanTask"]["properties"]) == {"content", "status"}


def test_healthz_names_what_is_down(client: Any, engine_down: str, heartbeat_file: Path) -> None:
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json() == {
        "web": "up",
        "engine": "down",
        "worker": "down",
        "detail": "The Dex engine and the Dex worker are down.",
        "unavailable": "engine",
    }


def test_healthz_reports_a_fresh_worker_heartbeat(
    client: Any, engine_down: str, heartbeat_file: Path
) -> None:
    heartbeat_file.touch()
    response = client.get("/healthz")
    assert response.status_code == 503
    assert response.json()["worker"] == "up"
    assert response.json()["unavailable"] == "engine"


def test_healthz_treats_a_stale_heartbeat_as_down(
    client: Any, engine_down: str, heartbeat_file: Path
) -> None:
    import os
    import time

    heartbeat_file.touch()
    # Past the 4 s a beat may be old: a SIGKILLed worker reads as down within 5 s.
    stale = time.time() - 4.5
    os.utime(heartbeat_file, (stale, stale))
    assert client.get("/healthz").json()["worker"] == "down"


def _agents(api: APIClient) -> dict[str, Any]:
    return {agent["slug"]: agent for agent in api.get("/api/v1/agents/").json()["results"]}


def test_an_agent_whose_provider_key_is_missing_cannot_start(
    owner_client: APIClient, staff_client: APIClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEXAGENTS_TEST_MISSING_KEY", raising=False)
    AgentDefinitionFactory.create(
        slug="claude",
        model="anthropic/claude-sonnet-4-5",
        api_base="",
        api_key_env="DEXAGENTS_TEST_MISSING_KEY",
    )
    listed = _agents(owner_client)
    assert listed["claude"]["configured"] is False
    assert "DEXAGENTS_TEST_MISSING_KEY" not in listed["claude"]["not_configured_reason"]
    assert "DEXAGENTS_TEST_MISSING_KEY" in _agents(staff_client)["claude"]["not_configured_reason"]

    answer = owner_client.post(
        "/api/v1/sessions/", {"agent": "claude", "message": "hi"}, format="json"
    )
    assert answer.status_code == 400
    assert "not configured" in answer.json()["agent"][0]
    assert not AgentSession.objects.exists()

    monkeypatch.setenv("DEXAGENTS_TEST_MISSING_KEY", "sk-test-value")
    listed = _agents(staff_client)
    assert listed["claude"]["configured"] is True
    assert listed["claude"]["not_configured_reason"] is None
    assert "sk-test-value" not in str(listed)


def test_an_oversized_body_is_a_json_413_and_creates_nothing(
    owner_client: APIClient, settings: Any
) -> None:
    AgentDefinitionFactory.create(slug="demo")
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 10_000
    answer = owner_client.post(
        "/api/v1/sessions/", {"agent": "demo", "message": "x" * 20_000}, format="json"
    )
    assert answer.status_code == 413
    assert "10000 bytes" in answer.json()["detail"]
    assert not AgentSession.objects.exists()
