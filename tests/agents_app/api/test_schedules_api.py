"""``/api/v1/schedules/`` (``agents_app.api.schedules``): every 400 names its field, owner
scoping, pause and the preview. No engine runs (``engine_down``): a saved schedule's Flow is
left to ``schedules_reconcile``; the Flow itself runs in ``tests/e2e/test_schedules.py``."""

from __future__ import annotations

from typing import Any

import pytest

from agents_app.models import AgentSession, Schedule
from tests.factories import AgentDefinitionFactory

pytestmark = pytest.mark.django_db

GOOD = {"agent": "demo", "name": "daily", "message": "Report for {scheduled_for}",
        "cron": "0 9 * * 1-5", "timezone": "Europe/Paris"}


@pytest.fixture(autouse=True)
def demo_agent(engine_down: str) -> Any:
    return AgentDefinitionFactory.create(slug="demo")


def test_create_read_and_list(owner_client: Any, other_client: Any) -> None:
    created = owner_client.post("/api/v1/schedules/", GOOD, format="json")
    assert created.status_code == 201, created.content
    body = created.json()
    assert body["agent"] == "demo" and body["target"] == "new_session" and body["enabled"]
    assert len(body["next_runs"]) == 5
    assert all(run.endswith(("+01:00", "+02:00")) and "T09:00:00" in run
               for run in body["next_runs"])
    assert body["last_run"] is None
    assert owner_client.get(f"/api/v1/schedules/{body['id']}/").json()["name"] == "daily"
    assert [s["id"] for s in owner_client.get("/api/v1/schedules/").json()["results"]] == [
        body["id"]]
    assert other_client.get("/api/v1/schedules/").json()["results"] == []
    assert other_client.get(f"/api/v1/schedules/{body['id']}/").status_code == 404
    assert owner_client.get(f"/api/v1/schedules/{body['id']}/runs/").json()["results"] == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "0 25 * * *"}, "cron"),
        ({"cron": "* * *"}, "cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"interval_seconds": 60}, "cron"),  # both
        ({"cron": ""}, "cron"),  # neither
        ({"cron": "", "interval_seconds": 2}, "interval_seconds"),  # below the 5 s floor
        ({"cron": "* * * * * *"}, "cron"),  # every second
        ({"message": "Hi {name}"}, "message"),
        ({"message": "Hi {0}"}, "message"),
        ({"agent": "nope"}, "agent"),
        ({"target": "elsewhere"}, "target"),
        ({"missed_run_policy": "always"}, "missed_run_policy"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_bad_fields_answer_400_naming_them(owner_client: Any, change: dict[str, Any],
                                          field: str) -> None:
    response = owner_client.post("/api/v1/schedules/", {**GOOD, **change}, format="json")
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()
    assert not Schedule.objects.exists()


def test_a_session_not_theirs_is_refused(owner_client: Any, other_user: Any, owner: Any,
                                         demo_agent: Any) -> None:
    theirs = AgentSession.objects.create(id="ses_" + "a" * 32, owner=other_user,
                                         agent=demo_agent)
    mine = AgentSession.objects.create(id="ses_" + "b" * 32, owner=owner, agent=demo_agent)
    for session in (theirs.id, "ses_" + "f" * 32):
        response = owner_client.post("/api/v1/schedules/", {
            **GOOD, "target": "session", "session": session}, format="json")
        assert response.status_code == 400 and "session" in response.json(), response.content
    with_new_target = owner_client.post(
        "/api/v1/schedules/", {**GOOD, "session": mine.id}, format="json")
    assert with_new_target.status_code == 400 and "session" in with_new_target.json()
    ok = owner_client.post("/api/v1/schedules/", {
        **GOOD, "target": "session", "session": mine.id}, format="json")
    assert ok.status_code == 201 and ok.json()["session"] == mine.id


def test_pause_resume_and_delete_bump_the_generation(owner_client: Any) -> None:
    created = owner_client.post("/api/v1/schedules/", GOOD, format="json").json()
    url = f"/api/v1/schedules/{created['id']}/"
    paused = owner_client.patch(url, {"enabled": False}, format="json")
    assert paused.status_code == 200 and paused.json()["enabled"] is False
    assert paused.json()["next_runs"] == []
    assert Schedule.objects.get(pk=created["id"]).generation == 2
    bad = owner_client.patch(url, {"cron": "nope"}, format="json")
    assert bad.status_code == 400 and "cron" in bad.json()
    assert Schedule.objects.get(pk=created["id"]).generation == 2
    resumed = owner_client.patch(url, {"enabled": True}, format="json")
    assert resumed.json()["enabled"] is True and len(resumed.json()["next_runs"]) == 5
    assert owner_client.delete(url).status_code == 204
    assert not Schedule.objects.exists()


def test_preview(owner_client: Any) -> None:
    ok = owner_client.post("/api/v1/schedules/preview/",
                           {"interval_seconds": 3600, "timezone": "UTC"}, format="json")
    assert ok.status_code == 200 and len(ok.json()["next_runs"]) == 5
    assert all(run.endswith(":00:00+00:00") for run in ok.json()["next_runs"])
    bad = owner_client.post("/api/v1/schedules/preview/", {"cron": "0 9 * *"}, format="json")
    assert bad.status_code == 400 and "cron" in bad.json()
