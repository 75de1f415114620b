"""REST API against the real embedded engine, without a worker.

Starts the engine as a real process (the ``engine`` fixture). Snapshots and messages are RPCs
that need a worker, so they are covered by the end-to-end tests.
"""

import datetime
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from agents_app.gateway import dex_gateway, engine_connection
from agents_app.models import SESSION_STATUS_STOPPED, AgentSession
from agents_app.sessions.index_reconcile import START_ABANDONED_AFTER, session_index_reconcile
from tests.factories import AgentDefinitionFactory

pytestmark = pytest.mark.django_db


def test_create_starts_a_flow_and_indexes_it(
    owner: Any, owner_client: APIClient, engine: str
) -> None:
    AgentDefinitionFactory.create(slug="demo")
    response = owner_client.post("/api/v1/sessions/", {"agent": "demo"}, format="json")
    assert response.status_code == 201, response.content
    session_id = response.json()["id"]
    assert session_id.startswith("ses_") and len(session_id) == 36
    session = AgentSession.objects.get(pk=session_id)
    assert session.owner == owner
    assert session.agent.slug == "demo"

    async def describe() -> Any:
        return await engine_connection.connection().client.describe_flow(session_id)

    info = dex_gateway.run(describe())
    assert info.flow_type == "AgentSession"

    history = owner_client.get(f"/api/v1/sessions/{session_id}/history/")
    assert history.status_code == 200
    assert isinstance(history.json(), list)


def test_history_of_a_session_dex_does_not_know_is_404(
    owner: Any, owner_client: APIClient, engine: str
) -> None:
    AgentSession.objects.create(
        id="ses_" + "0" * 32, owner=owner, agent=AgentDefinitionFactory.create(slug="demo")
    )
    response = owner_client.get(f"/api/v1/sessions/ses_{'0' * 32}/history/")
    assert response.status_code == 404


def test_healthz_sees_the_engine(client: Any, engine: str, heartbeat_file: Path) -> None:
    response = client.get("/healthz")
    assert response.json() == {
        "web": "up",
        "engine": "up",
        "worker": "down",
        "detail": "The Dex worker is down.",
        "unavailable": "worker",
    }
    assert response.status_code == 503
    heartbeat_file.touch()
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"web": "up", "engine": "up", "worker": "up"}


def test_an_rpc_without_a_worker_is_a_503_that_names_the_worker(
    owner_client: APIClient, engine: str, heartbeat_file: Path, settings: Any
) -> None:
    """The engine is up, but Dex RPCs run on a worker and none serves: the 503 says so."""
    settings.DEXAGENTS = {**settings.DEXAGENTS, "ENGINE_TIMEOUT": 1}
    AgentDefinitionFactory.create(slug="demo")
    created = owner_client.post("/api/v1/sessions/", {"agent": "demo"}, format="json")
    assert created.status_code == 201, created.content
    session_id = created.json()["id"]
    # (The queue is not here: without a worker it answers 200 with the outbox's part.)
    for path in (f"/api/v1/sessions/{session_id}/", f"/api/v1/sessions/{session_id}/messages/"):
        response = owner_client.get(path)
        assert response.status_code == 503, (path, response.content)
        body = response.json()
        assert set(body) == {"detail", "unavailable"}, body
        assert body["unavailable"] == "worker", body
        assert "worker" in body["detail"], body


def test_reconciliation_goes_past_a_session_dex_does_not_answer_for(
    owner: Any, owner_client: APIClient, engine: str, settings: Any
) -> None:
    """One snapshot RPC with no answer (no worker here; in production a killed or busy one)
    leaves that session as indexed and reconciles the others; only when Dex answers for none
    does the run fail without changing anything."""
    settings.DEXAGENTS = {**settings.DEXAGENTS, "ENGINE_TIMEOUT": 1}
    agent = AgentDefinitionFactory.create(slug="demo")
    created = owner_client.post("/api/v1/sessions/", {"agent": "demo"}, format="json")
    assert created.status_code == 201, created.content
    running_id = created.json()["id"]
    unknown = AgentSession.objects.create(
        id="ses_" + "1" * 32, owner=owner, agent=agent, status="running_model"
    )
    AgentSession.objects.filter(pk=unknown.pk).update(
        created_at=timezone.now() - START_ABANDONED_AFTER - datetime.timedelta(minutes=1)
    )

    result = session_index_reconcile(session_ids=[running_id, unknown.pk])

    assert (result.unanswered, result.missing, result.checked) == (1, 1, 1), result
    assert AgentSession.objects.get(pk=unknown.pk).status == SESSION_STATUS_STOPPED
    assert AgentSession.objects.get(pk=running_id).status != SESSION_STATUS_STOPPED
    with pytest.raises(dex_gateway.EngineUnavailableError, match="answered for none"):
        session_index_reconcile(session_ids=[running_id])
