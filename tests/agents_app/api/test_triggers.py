"""``POST /api/v1/agents/<slug>/triggers/<name>/`` (agents_app.api.triggers): every answer,
signatures made exactly as GitHub and Slack make them, and the trigger's admin.

Requests that start a session run against the real embedded engine (the ``engine``
fixture; the first turn needs a worker, which the end-to-end test has); refusals are decided
before any engine call (``engine_down``).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.test import APIClient

from agents_app.models import AgentSession, AgentTrigger, TriggerDelivery, TriggerSignatureStyle
from agents_app.services import triggers as trigger_services
from agents_app.trigger_templates import TriggerTemplateError, message_render, template_check
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

SECRET = "trsec_test-secret-0123456789"
URL = "/api/v1/agents/demo/triggers/github-pr/"
TEMPLATE = "New PR {{ body.pull_request.title }} by {{ body.sender.login }}"
# A body as GitHub sends it: pretty-printed, non-ASCII as is; the signature covers these
# exact bytes, not a re-serialization.
GITHUB_BODY = (
    '{\n  "action": "opened",\n  "pull_request": {\n    "title": "Fix the café menu",\n'
    '    "number": 7\n  },\n  "sender": {\n    "login": "octocat"\n  }\n}'
).encode()


@pytest.fixture
def trigger(owner: Any) -> AgentTrigger:
    return AgentTrigger.objects.create(
        agent=AgentDefinitionFactory.create(slug="demo"),
        name="github-pr",
        message_template=TEMPLATE,
        run_as=owner,
        signature_style=TriggerSignatureStyle.GITHUB,
        idempotency_header="X-GitHub-Delivery",
        secret=SECRET,
        max_body_bytes=4096,
    )


def github_headers(body: bytes, secret: str = SECRET, delivery: str = "") -> dict[str, str]:
    """Headers as GitHub sends them ("Validating webhook deliveries"): the hex HMAC-SHA256
    of the raw body, prefixed ``sha256=``."""
    signature = "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    headers = {"HTTP_X_HUB_SIGNATURE_256": signature, "HTTP_X_GITHUB_EVENT": "pull_request"}
    if delivery:
        headers["HTTP_X_GITHUB_DELIVERY"] = delivery
    return headers


def slack_headers(body: bytes, timestamp: int, secret: str = SECRET) -> dict[str, str]:
    """Headers as Slack sends them ("Verifying requests from Slack"): ``v0=`` and the hex
    HMAC-SHA256 of ``v0:<timestamp>:<body>``."""
    base = b"v0:" + str(timestamp).encode() + b":" + body
    return {
        "HTTP_X_SLACK_REQUEST_TIMESTAMP": str(timestamp),
        "HTTP_X_SLACK_SIGNATURE": "v0=" + hmac.new(secret.encode(), base, hashlib.sha256)
        .hexdigest(),
    }


def post(body: bytes, url: str = URL, **headers: str) -> Any:
    client: Any = APIClient()  # django-stubs type the body as str; bytes are sent as is
    return client.generic("POST", url, body, "application/json", **headers)


# --- 404 ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", [
    "/api/v1/agents/demo/triggers/nope/",
    "/api/v1/agents/nope/triggers/github-pr/",
])
def test_unknown_agent_or_trigger_is_404(trigger: AgentTrigger, url: str) -> None:
    response = post(GITHUB_BODY, url, **github_headers(GITHUB_BODY))
    assert response.status_code == 404, response.content
    assert response.json() == {"detail": "No such trigger."}


def test_a_disabled_trigger_or_agent_or_an_inactive_run_as_user_is_404(
    trigger: AgentTrigger,
) -> None:
    trigger.enabled = False
    trigger.save()
    assert post(GITHUB_BODY, **github_headers(GITHUB_BODY)).status_code == 404
    trigger.enabled = True
    trigger.save()
    trigger.agent.enabled = False
    trigger.agent.save()
    assert post(GITHUB_BODY, **github_headers(GITHUB_BODY)).status_code == 404
    trigger.agent.enabled = True
    trigger.agent.save()
    trigger.run_as.is_active = False
    trigger.run_as.save()
    assert post(GITHUB_BODY, **github_headers(GITHUB_BODY)).status_code == 404


# --- 413 ---------------------------------------------------------------------------------


def test_a_body_over_the_limit_is_413_before_the_signature(trigger: AgentTrigger) -> None:
    body = json.dumps({"pad": "x" * 5000}).encode()
    response = post(body)  # unsigned: the size is checked first
    assert response.status_code == 413, response.content
    assert response.json() == {
        "detail": "The body is larger than this trigger's limit of 4096 bytes."
    }
    signed = post(body, **github_headers(body))
    assert signed.status_code == 413


def test_a_body_at_the_limit_is_not_413(trigger: AgentTrigger, engine_down: str) -> None:
    body = b"[" + b" " * 4094 + b"]"
    assert len(body) == 4096
    response = post(body, **github_headers(body))
    assert response.status_code == 400, response.content  # a JSON array, not an object


# --- 401 ---------------------------------------------------------------------------------


def test_a_missing_signature_is_401(trigger: AgentTrigger) -> None:
    response = post(GITHUB_BODY)
    assert response.status_code == 401, response.content
    assert response.json() == {"detail": "The X-Hub-Signature-256 header is missing."}
    assert response.headers["WWW-Authenticate"].startswith("HMAC-SHA256")


@pytest.mark.parametrize("headers", [
    github_headers(GITHUB_BODY, secret="trsec_another"),
    github_headers(GITHUB_BODY + b" "),  # another body
    {"HTTP_X_HUB_SIGNATURE_256": github_headers(GITHUB_BODY)["HTTP_X_HUB_SIGNATURE_256"][7:]},
    {"HTTP_X_HUB_SIGNATURE_256": "sha1=" + hmac.new(
        SECRET.encode(), GITHUB_BODY, hashlib.sha1).hexdigest()},
    {"HTTP_X_DEXAGENTS_SIGNATURE": github_headers(GITHUB_BODY)["HTTP_X_HUB_SIGNATURE_256"]},
])
def test_a_wrong_signature_is_401(trigger: AgentTrigger, headers: dict[str, str]) -> None:
    response = post(GITHUB_BODY, **headers)
    assert response.status_code == 401, response.content
    assert AgentSession.objects.count() == 0 and TriggerDelivery.objects.count() == 0


def test_slack_timestamps_more_than_five_minutes_away_are_401(trigger: AgentTrigger) -> None:
    trigger.signature_style = TriggerSignatureStyle.SLACK
    trigger.save()
    body = b'{"event": {"text": "hi"}}'
    for skew in (-301, 301):
        stamp = int(time.time()) + skew
        response = post(body, **slack_headers(body, stamp))
        assert response.status_code == 401, response.content
        assert "five minutes" in response.json()["detail"]
    missing = slack_headers(body, int(time.time()))
    del missing["HTTP_X_SLACK_REQUEST_TIMESTAMP"]
    assert post(body, **missing).status_code == 401
    # Signed for one timestamp, sent with another: the timestamp is part of what is signed.
    now = int(time.time())
    moved = slack_headers(body, now)
    moved["HTTP_X_SLACK_REQUEST_TIMESTAMP"] = str(now - 1)
    assert post(body, **moved).status_code == 401


def test_the_dexagents_style_signs_as_the_platforms_webhooks_do(trigger: AgentTrigger) -> None:
    """``X-Dexagents-Signature: sha256=`` the HMAC of ``<timestamp>.<body>`` (README,
    "Notifications and webhooks"), timestamps within five minutes."""
    trigger.signature_style = TriggerSignatureStyle.DEXAGENTS
    trigger.message_template = "{{ body.nope }}"  # its 400 shows the signature passed
    trigger.save()

    def ours(stamp: int, body: bytes = GITHUB_BODY) -> dict[str, str]:
        signed = str(stamp).encode() + b"." + body
        return {
            "HTTP_X_DEXAGENTS_TIMESTAMP": str(stamp),
            "HTTP_X_DEXAGENTS_SIGNATURE": "sha256=" + hmac.new(
                SECRET.encode(), signed, hashlib.sha256).hexdigest(),
        }

    now = int(time.time())
    assert post(GITHUB_BODY, **ours(now)).status_code == 400
    stale = post(GITHUB_BODY, **ours(now - 301))
    assert stale.status_code == 401 and "five minutes" in stale.json()["detail"]
    # GitHub's signature (the body alone) under the dexagents header is refused.
    github = github_headers(GITHUB_BODY)["HTTP_X_HUB_SIGNATURE_256"]
    assert post(
        GITHUB_BODY, HTTP_X_DEXAGENTS_TIMESTAMP=str(now), HTTP_X_DEXAGENTS_SIGNATURE=github
    ).status_code == 401
    assert post(GITHUB_BODY, **github_headers(GITHUB_BODY)).status_code == 401


# --- 400 ---------------------------------------------------------------------------------


def test_a_body_that_is_not_json_is_400(trigger: AgentTrigger) -> None:
    body = b"payload=%7B%7D"
    response = post(body, **github_headers(body))
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("JSON parse error")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"text"', b"3", b"null"])
def test_a_body_that_is_not_an_object_is_400(trigger: AgentTrigger, body: bytes) -> None:
    response = post(body, **github_headers(body))
    assert response.status_code == 400, response.content
    assert response.json() == {"body": ["The body must be a JSON object."]}


def test_a_missing_field_is_400_naming_it(trigger: AgentTrigger) -> None:
    body = json.dumps({"pull_request": {"number": 7}, "sender": {"login": "octocat"}}).encode()
    response = post(body, **github_headers(body))
    assert response.status_code == 400, response.content
    assert response.json() == {"body": ["'pull_request' has no field 'title'"]}
    body = json.dumps({"sender": {"login": "octocat"}}).encode()
    response = post(body, **github_headers(body))
    assert response.json() == {"body": ["'body' has no field 'pull_request'"]}
    assert TriggerDelivery.objects.count() == 0


def test_an_empty_rendered_message_is_400(trigger: AgentTrigger) -> None:
    trigger.message_template = "{{ body.text }}"
    trigger.save()
    body = b'{"text": "   "}'
    response = post(body, **github_headers(body))
    assert response.json() == {"body": ["The trigger's template rendered an empty message."]}


def test_idempotency_key_required_or_too_long_is_400(trigger: AgentTrigger) -> None:
    trigger.idempotency_required = True
    trigger.save()
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY))
    assert response.status_code == 400, response.content
    assert response.json() == {
        "idempotency_key": ["This trigger requires the X-GitHub-Delivery header."]
    }
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="k" * 201))
    assert response.status_code == 400
    assert list(response.json()) == ["idempotency_key"]


# --- 202, 200, 409, 503 ------------------------------------------------------------------


def test_a_github_delivery_starts_one_session_and_a_repeat_answers_it(
    trigger: AgentTrigger, owner: Any, engine: str
) -> None:
    delivery = "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    first = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery=delivery))
    assert first.status_code == 202, first.content
    answer = first.json()
    session = AgentSession.objects.get(pk=answer["id"])
    assert session.owner == owner and session.agent.slug == "demo"
    assert session.title == "New PR Fix the café menu by octocat"
    assert answer["url"] == f"http://testserver/api/v1/sessions/{session.pk}/"
    assert answer["agent"] == "demo" and answer["trigger"] == "github-pr"
    assert answer["idempotency_key"] == delivery and answer["repeated"] is False
    assert answer["status"] == "starting" and answer["first_message"] is None

    again = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery=delivery))
    assert again.status_code == 200, again.content
    assert again.json()["id"] == session.pk and again.json()["repeated"] is True
    assert AgentSession.objects.count() == 1
    assert TriggerDelivery.objects.get().session_id == session.pk

    other = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="another"))
    assert other.status_code == 202 and other.json()["id"] != session.pk


def test_deliveries_without_a_key_each_start_a_session(
    trigger: AgentTrigger, engine: str
) -> None:
    ids = {post(GITHUB_BODY, **github_headers(GITHUB_BODY)).json()["id"] for _ in range(2)}
    assert len(ids) == 2
    assert list(TriggerDelivery.objects.values_list("idempotency_key", flat=True)) == ["", ""]


def test_a_slack_delivery_signed_as_slack_signs_starts_a_session(
    trigger: AgentTrigger, engine: str
) -> None:
    trigger.signature_style = TriggerSignatureStyle.SLACK
    trigger.idempotency_header = "Idempotency-Key"
    trigger.message_template = "Slack: {{ body.event.text }} from <@{{ body.event.user }}>"
    trigger.save()
    body = b'{"type":"event_callback","event":{"type":"app_mention","text":"deploy?","user":"U1"}}'
    response = post(body, **slack_headers(body, int(time.time())), HTTP_IDEMPOTENCY_KEY="Ev1")
    assert response.status_code == 202, response.content
    session = AgentSession.objects.get(pk=response.json()["id"])
    assert session.title == "Slack: deploy? from <@U1>"


def test_a_start_the_engine_refuses_keeps_nothing(
    trigger: AgentTrigger, engine_down: str
) -> None:
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 503, response.content
    assert response.json()["unavailable"] == "engine"
    assert TriggerDelivery.objects.count() == 0 and AgentSession.objects.count() == 0


def test_a_repeat_while_the_first_is_starting_is_409(
    trigger: AgentTrigger, engine_down: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trigger_services, "REPEAT_WAIT_SECONDS", 0.2)
    TriggerDelivery.objects.create(trigger=trigger, idempotency_key="d1")  # session: starting
    started = time.monotonic()
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 409, response.content
    assert "still starting" in response.json()["detail"]
    assert time.monotonic() - started >= 0.2


# --- Slack: url_verification and retries -------------------------------------------------

# Slack's example ("Events API: url_verification"), sent compact as Slack sends it.
SLACK_CHALLENGE_BODY = (
    b'{"token":"Jhj5dZrVaK7ZwHHjRyZWjbDl","challenge":'
    b'"3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P","type":"url_verification"}'
)


@pytest.fixture
def slack_trigger(trigger: AgentTrigger) -> AgentTrigger:
    trigger.signature_style = TriggerSignatureStyle.SLACK
    trigger.idempotency_header = "Idempotency-Key"
    trigger.message_template = "Slack: {{ body.event.text }}"
    trigger.save()
    return trigger


def test_slacks_url_verification_is_answered_with_its_challenge(
    slack_trigger: AgentTrigger, engine_down: str
) -> None:
    """Signed as usual, answered 200 with the challenge; nothing starts (the engine is down,
    so a start would be 503)."""
    response = post(SLACK_CHALLENGE_BODY, **slack_headers(SLACK_CHALLENGE_BODY, int(time.time())))
    assert response.status_code == 200, response.content
    assert response.json() == {
        "challenge": "3eZbrw1aBm2rZgRNFdxV2595E9CY3gmdALWMmHkvFXO7tYXAYM8P"
    }
    assert TriggerDelivery.objects.count() == 0 and AgentSession.objects.count() == 0
    # The signature is checked first: a challenge with a wrong one is 401.
    forged = post(SLACK_CHALLENGE_BODY, **slack_headers(
        SLACK_CHALLENGE_BODY, int(time.time()), secret="trsec_another"))
    assert forged.status_code == 401 and "challenge" not in forged.json()
    empty = b'{"type":"url_verification","challenge":""}'
    refused = post(empty, **slack_headers(empty, int(time.time())))
    assert refused.status_code == 400
    assert refused.json() == {"body": ["A url_verification body needs a 'challenge' string."]}


def test_only_the_slack_style_answers_a_challenge(
    trigger: AgentTrigger, engine_down: str
) -> None:
    response = post(SLACK_CHALLENGE_BODY, **github_headers(SLACK_CHALLENGE_BODY))
    assert response.status_code == 400, response.content  # an event the template cannot read
    assert response.json() == {"body": ["'body' has no field 'pull_request'"]}


def test_a_slack_retry_is_recognised_by_its_event_id(
    slack_trigger: AgentTrigger, engine: str
) -> None:
    """Slack sends no idempotency header; its retries repeat the body's ``event_id`` with
    ``X-Slack-Retry-Num`` and a new timestamp and signature ("Events API: retries")."""
    body = (b'{"type":"event_callback","event_id":"Ev42","event":{"type":"app_mention",'
            b'"text":"deploy?","user":"U1"}}')
    first = post(body, **slack_headers(body, int(time.time())))
    assert first.status_code == 202, first.content
    assert first.json()["idempotency_key"] == "Ev42"
    retry = post(body, **slack_headers(body, int(time.time()) + 1),
                 HTTP_X_SLACK_RETRY_NUM="1", HTTP_X_SLACK_RETRY_REASON="http_timeout")
    assert retry.status_code == 200, retry.content
    assert retry.json()["id"] == first.json()["id"] and retry.json()["repeated"] is True
    assert AgentSession.objects.count() == 1
    # The configured header, when sent, wins over event_id.
    keyed = post(body, **slack_headers(body, int(time.time())), HTTP_IDEMPOTENCY_KEY="K1")
    assert keyed.status_code == 202 and keyed.json()["idempotency_key"] == "K1"
    assert sorted(TriggerDelivery.objects.values_list("idempotency_key", flat=True)) == [
        "Ev42", "K1"]


def test_event_id_satisfies_a_required_key_for_slack_only(
    slack_trigger: AgentTrigger, engine_down: str
) -> None:
    slack_trigger.idempotency_required = True
    slack_trigger.save()
    without = b'{"type":"event_callback","event":{"text":"hi"}}'
    response = post(without, **slack_headers(without, int(time.time())))
    assert response.status_code == 400
    assert response.json() == {"idempotency_key": [
        "This trigger requires the Idempotency-Key header (or an event_id in the body)."]}
    with_id = b'{"type":"event_callback","event_id":"Ev1","event":{"text":"hi"}}'
    response = post(with_id, **slack_headers(with_id, int(time.time())))
    assert response.status_code == 503 and response.json()["unavailable"] == "engine"
    # GitHub style: a body's event_id is no key.
    slack_trigger.signature_style = TriggerSignatureStyle.GITHUB
    slack_trigger.save()
    response = post(with_id, **github_headers(with_id))
    assert response.status_code == 400 and "idempotency_key" in response.json()


# --- 503: the agent's model provider is not configured -----------------------------------


def test_an_agent_whose_provider_is_not_configured_starts_nothing(
    trigger: AgentTrigger, engine_down: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The check ``POST /api/v1/sessions/`` makes (400 there), made before anything starts:
    503 ``{"detail"}`` naming the variable, never its value; a warning is logged."""
    agent = trigger.agent
    agent.model, agent.api_base, agent.api_key_env = "anthropic/claude-sonnet-4-5", "", ""
    agent.save()
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with caplog.at_level("WARNING", logger="agents_app.services.triggers"):
        response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 503, response.content
    assert response.json() == {"detail": (
        "The agent 'demo' cannot start: its model provider is not configured on this server. "
        "Set the environment variable ANTHROPIC_API_KEY for the worker, then restart it. "
        "Nothing was started; send the delivery again once it is.")}
    assert TriggerDelivery.objects.count() == 0 and AgentSession.objects.count() == 0
    assert any(
        record.levelname == "WARNING" and "ANTHROPIC_API_KEY" in record.getMessage()
        for record in caplog.records
    )

    # A named variable holding something that cannot be a key: named, its value never shown.
    agent.api_key_env = "DEMO_TRIGGER_KEY"
    agent.save()
    monkeypatch.setenv("DEMO_TRIGGER_KEY", "sk-secret-value\u0001")
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 503
    assert "DEMO_TRIGGER_KEY" in response.json()["detail"]
    assert "sk-secret-value" not in response.content.decode()

    # Configured again: the start goes on to the engine (down here: its own 503).
    monkeypatch.setenv("DEMO_TRIGGER_KEY", "sk-secret-value")
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 503 and response.json()["unavailable"] == "engine"


def test_a_repeated_key_still_answers_its_session_when_the_provider_is_gone(
    trigger: AgentTrigger, engine_down: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    session = AgentSessionFactory.create(owner=trigger.run_as, agent=trigger.agent)
    TriggerDelivery.objects.create(trigger=trigger, idempotency_key="d1", session=session)
    trigger.agent.model, trigger.agent.api_base = "anthropic/claude-sonnet-4-5", ""
    trigger.agent.save()
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    response = post(GITHUB_BODY, **github_headers(GITHUB_BODY, delivery="d1"))
    assert response.status_code == 200, response.content
    assert response.json()["id"] == session.pk and response.json()["repeated"] is True


# --- templates and admin -----------------------------------------------------------------


def test_template_syntax_is_checked_by_the_model() -> None:
    with pytest.raises(TriggerTemplateError, match="Line 1"):
        template_check(source="{{ body.x ")
    trigger = AgentTrigger(message_template="Hi {% if %}", secret="s")
    with pytest.raises(ValidationError) as raised:
        trigger.full_clean()
    assert "message_template" in raised.value.message_dict


def test_templates_are_sandboxed_and_read_keys_before_dict_methods() -> None:
    body = {"items": 3, "list": [{"name": "a"}]}
    assert message_render(source="{{ body.items }} {{ body.list[0].name }}", body=body) == "3 a"
    with pytest.raises(TriggerTemplateError, match="'list' has no item '5'"):
        message_render(source="{{ body.list[5] }}", body=body)
    with pytest.raises(TriggerTemplateError, match="unsafe"):
        message_render(source="{{ body.list.__class__.__mro__ }}", body=body)


def test_admin_shows_the_secret_once_and_refuses_a_bad_template(
    superuser: Any, owner: Any
) -> None:
    agent = AgentDefinitionFactory.create(slug="demo")
    client = Client()
    client.force_login(superuser)
    form = {
        "agent": agent.pk, "name": "pr", "description": "", "enabled": "on",
        "run_as": owner.pk, "message_template": "PR {{ body.title ", "signature_style": "github",
        "idempotency_header": "X-GitHub-Delivery", "max_body_bytes": "262144",
        "deliveries-TOTAL_FORMS": "0", "deliveries-INITIAL_FORMS": "0",
    }
    refused = client.post("/admin/agents_app/agenttrigger/add/", form)
    assert refused.status_code == 200
    assert "Line 1:" in refused.content.decode()
    form["message_template"] = "PR {{ body.title }}"
    created = client.post("/admin/agents_app/agenttrigger/add/", form, follow=True)
    trigger = AgentTrigger.objects.get()
    assert trigger.secret.startswith("trsec_")
    page = created.content.decode()
    assert trigger.secret in page and "not shown again" in page
    change = client.get(f"/admin/agents_app/agenttrigger/{trigger.pk}/change/").content.decode()
    assert trigger.secret not in change
    assert trigger.secret_hint.split("…")[1] in change
    assert "http://127.0.0.1:8000/api/v1/agents/demo/triggers/pr/" in change

    old = trigger.secret
    rotated = client.post(
        "/admin/agents_app/agenttrigger/",
        {"action": "rotate_secrets", "_selected_action": [trigger.pk]},
        follow=True,
    )
    trigger.refresh_from_db()
    assert trigger.secret != old and trigger.secret in rotated.content.decode()


def test_admin_lists_the_deliveries_with_links_to_their_sessions(
    superuser: Any, trigger: AgentTrigger
) -> None:
    session = AgentSessionFactory.create(
        owner=trigger.run_as, agent=trigger.agent, title="New PR by octocat"
    )
    TriggerDelivery.objects.create(trigger=trigger, idempotency_key="d-42", session=session)
    TriggerDelivery.objects.create(trigger=trigger, idempotency_key="d-43")  # starting
    client = Client()
    client.force_login(superuser)
    page = client.get(f"/admin/agents_app/agenttrigger/{trigger.pk}/change/").content.decode()
    assert f'href="/sessions/{session.pk}/">New PR by octocat</a>' in page
    assert f'href="/admin/agents_app/agentsession/{session.pk}/change/"' in page
    assert "d-42" in page and "d-43" in page and "(starting)" in page
    assert SECRET not in page


def test_a_lone_surrogate_the_message_would_carry_is_400(trigger: AgentTrigger) -> None:
    # JSON may spell a lone UTF-16 surrogate; the database cannot store it (was a 500).
    body = b'{"pull_request": {"number": 1, "title": "t"}, "sender": {"login": "\\ud800"}}'
    response = post(body, **github_headers(body, delivery="d-surrogate"))
    assert response.status_code == 400, response.content
    assert response.json() == {"body": ["Surrogate characters are not allowed: U+D800."]}
    assert TriggerDelivery.objects.count() == 0


def test_a_timestamp_that_is_no_number_is_401_saying_so(slack_trigger: AgentTrigger) -> None:
    body = b'{"event": {"text": "hi"}}'
    for stamp in ("abc", "1733.5", "-1"):
        headers = slack_headers(body, int(time.time()))
        headers["HTTP_X_SLACK_REQUEST_TIMESTAMP"] = stamp
        response = post(body, **headers)
        assert response.status_code == 401, response.content
        assert "whole number of seconds" in response.json()["detail"], stamp


def test_slack_event_ids_key_deliveries_and_name_their_source(
    slack_trigger: AgentTrigger, engine_down: str
) -> None:
    long_id = json.dumps({"event_id": "E" * 201, "event": {"text": "hi"}}).encode()
    response = post(long_id, **slack_headers(long_id, int(time.time())))
    assert response.status_code == 400, response.content
    assert response.json()["idempotency_key"] == [
        "The body's event_id is longer than 200 characters."
    ]
    slack_trigger.idempotency_required = True
    slack_trigger.save()
    # A number is a key too (it used to be ignored, so each delivery started a session).
    numbered = json.dumps({"event_id": 12345, "event": {"text": "hi"}}).encode()
    response = post(numbered, **slack_headers(numbered, int(time.time())))
    assert response.status_code == 503, response.content  # got past the key, to the engine
