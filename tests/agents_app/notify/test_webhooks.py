"""Outgoing webhooks (agents_app.notify.webhooks): the signature, the refusal of private addresses
at save and send time, idempotent events, and delivery with retries to a real local HTTP
receiver (a thread of this process) that fails the first time."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from agents_app import tasks
from agents_app.models import Webhook, WebhookDelivery
from agents_app.notify.webhooks import (
    webhook_delivery_send,
    webhook_event_emit,
    webhook_event_id,
    webhook_signature,
    webhook_signature_verify,
)
from tests.webhook_receiver import Receiver, running_receiver

pytestmark = pytest.mark.django_db

SECRET = "whsec_test-secret"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with running_receiver() as state:
        yield state


@pytest.fixture
def allow_private(settings: Any) -> None:
    settings.DEXAGENTS = {**settings.DEXAGENTS, "WEBHOOKS_ALLOW_PRIVATE": True}


def hook(url: str, events: list[str] | None = None, **extra: Any) -> Webhook:
    return Webhook.objects.create(
        name="receiver", url=url, events=events or ["turn.completed"], secret=SECRET, **extra
    )


def test_the_signature_is_hmac_sha256_of_timestamp_dot_body() -> None:
    body = b'{"id":"evt_1","event":"turn.completed"}'
    expected = hmac.new(SECRET.encode(), b"1700000000." + body, hashlib.sha256).hexdigest()
    assert webhook_signature(secret=SECRET, timestamp=1700000000, body=body) == (
        f"sha256={expected}"
    )
    signature = f"sha256={expected}"
    assert webhook_signature_verify(secret=SECRET, timestamp="1700000000", body=body,
                                    signature=signature, now=1700000100)
    # Another body, another secret, a stale timestamp or garbage: refused.
    assert not webhook_signature_verify(secret=SECRET, timestamp="1700000000",
                                        body=body + b" ", signature=signature, now=1700000100)
    assert not webhook_signature_verify(secret="whsec_other", timestamp="1700000000",
                                        body=body, signature=signature, now=1700000100)
    assert not webhook_signature_verify(secret=SECRET, timestamp="1700000000", body=body,
                                        signature=signature, now=1700000000 + 301)
    assert not webhook_signature_verify(secret=SECRET, timestamp="soon", body=body,
                                        signature=signature)


@pytest.mark.parametrize("url", [
    "http://127.0.0.1/hook",
    "http://localhost:8000/hook",
    "http://10.1.2.3/hook",
    "http://192.168.1.10/hook",
    "http://172.16.0.5/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.64.0.1/hook",
    "http://[::1]/hook",
    "http://[fe80::1]/hook",
    "http://[::ffff:127.0.0.1]/hook",
    "http://0.0.0.0/hook",
])
def test_a_private_loopback_or_link_local_url_is_refused_at_save(url: str) -> None:
    webhook = Webhook(name="internal", url=url, events=["turn.completed"])
    with pytest.raises(ValidationError) as refused:
        webhook.full_clean(exclude=["secret"])
    assert "public addresses only" in str(refused.value.message_dict["url"])


@pytest.mark.parametrize(("url", "message"), [
    ("ftp://93.184.215.14/hook", "Enter an http:// or https:// URL"),
    ("http://user:pw@93.184.215.14/hook", "may not carry a user name or password"),
])
def test_a_url_that_is_not_plain_http_is_refused(url: str, message: str) -> None:
    webhook = Webhook(name="odd", url=url, events=["turn.completed"])
    with pytest.raises(ValidationError) as refused:
        webhook.full_clean(exclude=["secret"])
    assert message in str(refused.value.message_dict["url"])


def test_a_public_address_and_known_events_are_accepted() -> None:
    Webhook(name="public", url="https://93.184.215.14/hook",
            events=["approval.requested", "session.stopped"]).full_clean(exclude=["secret"])
    with pytest.raises(ValidationError) as refused:
        Webhook(name="public", url="https://93.184.215.14/hook",
                events=["turn.exploded"]).full_clean(exclude=["secret"])
    assert refused.value.message_dict["events"] == ["Unknown events: turn.exploded."]


def test_the_setting_allows_private_addresses(allow_private: None) -> None:
    Webhook(name="lan", url="http://127.0.0.1:9/hook",
            events=["turn.completed"]).full_clean(exclude=["secret"])


def test_a_private_url_is_refused_again_at_send_time(
    receiver: Receiver, settings: Any
) -> None:
    """Saved while allowed (or before its name pointed inside): the send checks again and
    never connects."""
    webhook = hook(receiver.url)
    webhook_event_emit(event="turn.completed", key="turn.completed:s:t1", data={})
    delivery = WebhookDelivery.objects.get(webhook=webhook)
    assert webhook_delivery_send(delivery_id=delivery.pk) == "failed"
    delivery.refresh_from_db()
    assert delivery.status == "failed"
    assert delivery.last_error.startswith("Refused: The host 127.0.0.1 resolves to a private")
    assert receiver.requests == []


def test_an_event_is_recorded_once_per_key_and_only_for_subscribers(allow_private: None) -> None:
    subscribed = hook("http://127.0.0.1:9/a", ["turn.completed", "turn.failed"])
    hook("http://127.0.0.1:9/b", ["approval.requested"])
    hook("http://127.0.0.1:9/c", ["turn.completed"], active=False)
    key = "turn.completed:ses_1:turn-1"
    assert webhook_event_emit(event="turn.completed", key=key, data={"turn_id": "turn-1"}) == 1
    assert webhook_event_emit(event="turn.completed", key=key, data={"turn_id": "turn-1"}) == 0
    rows = list(WebhookDelivery.objects.all())
    assert [(row.webhook_id, row.event, row.event_id) for row in rows] == [
        (subscribed.pk, "turn.completed", webhook_event_id(key))
    ]
    body = json.loads(rows[0].payload)
    assert set(body) == {"id", "event", "created_at", "data"}
    assert (body["id"], body["event"], body["data"]) == (
        webhook_event_id(key), "turn.completed", {"turn_id": "turn-1"}
    )


def test_a_failed_delivery_is_retried_and_the_receiver_verifies_it(
    receiver: Receiver, allow_private: None, eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """The receiver answers 500 first: the Celery task retries and the second attempt
    lands; the receiver checks the signature the way the README says."""
    receiver.statuses = [500]
    webhook = hook(receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        webhook_event_emit(event="turn.completed", key="turn.completed:ses_1:turn-1",
                           data={"session": "ses_1", "turn_id": "turn-1"})
    delivery = WebhookDelivery.objects.get(webhook=webhook)
    assert (delivery.status, delivery.attempts, delivery.response_status) == (
        "delivered", 2, 200
    )
    assert delivery.delivered_at is not None and delivery.last_error == ""
    assert len(receiver.requests) == 2
    for request in receiver.requests:
        headers = request["headers"]
        assert request["path"] == "/hooks/dexagents?x=1"
        assert headers["Host"] == f"127.0.0.1:{receiver.port}"
        assert headers["Content-Type"] == "application/json"
        assert headers["X-Dexagents-Event"] == "turn.completed"
        assert abs(int(headers["X-Dexagents-Timestamp"]) - time.time()) < 60
        assert webhook_signature_verify(
            secret=SECRET, timestamp=headers["X-Dexagents-Timestamp"], body=request["body"],
            signature=headers["X-Dexagents-Signature"],
        )
        assert request["body"] == delivery.payload.encode()
        assert SECRET not in request["body"].decode()


def test_a_delivery_that_keeps_failing_ends_failed(
    receiver: Receiver, allow_private: None, eager_celery: None,
    django_capture_on_commit_callbacks: Any,
) -> None:
    receiver.statuses = [503] * (tasks.WEBHOOK_MAX_RETRIES + 1)
    webhook = hook(receiver.url)
    with django_capture_on_commit_callbacks(execute=True):
        webhook_event_emit(event="turn.completed", key="k", data={})
    delivery = WebhookDelivery.objects.get(webhook=webhook)
    assert (delivery.status, delivery.attempts, delivery.response_status) == (
        "failed", tasks.WEBHOOK_MAX_RETRIES + 1, 503
    )
    assert delivery.last_error == "HTTP 503: ok"


def test_the_backoff_doubles_up_to_an_hour() -> None:
    assert [tasks.webhook_retry_countdown(n) for n in range(10)] == [
        10, 20, 40, 80, 160, 320, 640, 1280, 2560, 3600
    ]


def test_send_a_test_event_pings_each_active_webhook_signed_and_logged(
    receiver: Receiver, allow_private: None, eager_celery: None, superuser: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Admin's "Send a test event" (like GitHub's ping): a ``ping`` event, signed like every
    event, delivered by the Celery task (a 500 first, so retried) and logged in *Webhook
    deliveries*; an inactive webhook gets none. Repeating it sends a new event."""
    receiver.statuses = [500]
    active = hook(receiver.url, ["approval.requested"])
    inactive = Webhook.objects.create(name="paused", url=receiver.url, events=["turn.failed"],
                                      secret=SECRET, active=False)
    client = Client()
    client.force_login(superuser)
    changelist = reverse("admin:agents_app_webhook_changelist")
    with django_capture_on_commit_callbacks(execute=True):
        answer = client.post(changelist, {
            "action": "send_test_event", "_selected_action": [active.pk, inactive.pk],
        }, follow=True)
    assert answer.status_code == 200
    page = answer.content.decode()
    assert "Test event (<code>ping</code>) queued for receiver" in page
    assert "No test event for paused: the webhook is inactive." in page

    delivery = WebhookDelivery.objects.get()
    assert (delivery.webhook_id, delivery.event, delivery.status, delivery.attempts) == (
        active.pk, "ping", "delivered", 2
    )
    assert len(receiver.requests) == 2
    for request in receiver.requests:
        headers = request["headers"]
        assert headers["X-Dexagents-Event"] == "ping"
        assert webhook_signature_verify(
            secret=SECRET, timestamp=headers["X-Dexagents-Timestamp"], body=request["body"],
            signature=headers["X-Dexagents-Signature"],
        )
        assert not webhook_signature_verify(
            secret="whsec_other", timestamp=headers["X-Dexagents-Timestamp"],
            body=request["body"], signature=headers["X-Dexagents-Signature"],
        )
    body = json.loads(receiver.requests[-1]["body"])
    assert (body["id"], body["event"]) == (delivery.event_id, "ping")
    assert body["data"]["webhook_id"] == active.pk
    assert body["data"]["events"] == ["approval.requested"]
    assert body["data"]["sent_by"] == superuser.get_username()
    assert SECRET not in receiver.requests[-1]["body"].decode()

    # The delivery log lists it under the ping filter; a second ping is a second event.
    log = client.get(reverse("admin:agents_app_webhookdelivery_changelist") + "?event__exact=ping")
    assert log.status_code == 200
    assert [row.pk for row in log.context["cl"].result_list] == [delivery.pk]
    with django_capture_on_commit_callbacks(execute=True):
        client.post(changelist, {"action": "send_test_event", "_selected_action": [active.pk]})
    ids = set(WebhookDelivery.objects.values_list("event_id", flat=True))
    assert len(ids) == 2 and len(receiver.requests) == 3


def test_no_webhook_subscribes_to_ping() -> None:
    with pytest.raises(ValidationError) as refused:
        Webhook(name="public", url="https://93.184.215.14/hook",
                events=["ping"]).full_clean(exclude=["secret"])
    assert refused.value.message_dict["events"] == ["Unknown events: ping."]
