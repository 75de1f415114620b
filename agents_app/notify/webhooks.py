"""Outgoing webhooks (issue 27 "Webhooks"): signed JSON POSTs of platform events.

An event is emitted once, from where its fact is committed (``agents_app.sessions.session_index``):
``webhook_event_emit`` writes one ``WebhookDelivery`` row per active webhook that subscribed
to it, keyed by the event's idempotency key, in the caller's transaction; once it commits, a
Celery task (``tasks.deliver_webhook``) sends each row, retrying with exponential backoff.

The body is ``{"id", "event", "created_at", "data"}``; the headers
``X-Dexagents-Timestamp: <unix seconds>`` and
``X-Dexagents-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>" with the secret>``
let a receiver check that the platform sent it and when (README "Notifications and webhooks").
``webhook_ping`` records a ``ping`` test event for one webhook (admin's "Send a test
event"), delivered the same way.

A URL whose host resolves to a non-public address (private, loopback, link-local, shared,
reserved, multicast) is refused when the webhook is saved and again before every send, and
the request goes to the address that was checked (DNS rebinding cannot swap it in between);
``DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE=true`` lifts the rule (tests, a receiver on the LAN).
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import json
import logging
import time
import uuid
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from django.db import transaction
from django.utils import timezone

from agents_app import task_queue
from agents_app.models import Webhook, WebhookDelivery, WebhookEvent
from agents_app.webhook_urls import (
    IpAddress,
    WebhookAddressError,
    WebhookHostUnresolvedError,
    webhook_url_check,
)

logger = logging.getLogger(__name__)

SIGNATURE_HEADER = "X-Dexagents-Signature"
TIMESTAMP_HEADER = "X-Dexagents-Timestamp"
EVENT_HEADER = "X-Dexagents-Event"
#: Seconds one delivery attempt may take (connect, send, read the answer).
SEND_TIMEOUT_SECONDS = 10.0
#: Characters of a receiver's answer or error kept in the delivery log.
ERROR_MAX_CHARS = 500

class WebhookDeliveryFailed(Exception):
    """One attempt failed in a way worth retrying: no answer, or an answer that is not 2xx."""


def webhook_signature(*, secret: str, timestamp: int, body: bytes) -> str:
    """``"sha256=" + hex(HMAC-SHA256(secret, b"<timestamp>." + body))``: the value of
    ``X-Dexagents-Signature`` (the scheme Stripe and GitHub use).

    Args:
        secret: The webhook's secret, as shown in admin.
        timestamp: Unix seconds, the value of ``X-Dexagents-Timestamp``.
        body: The raw request body, byte for byte.
    """
    signed = str(int(timestamp)).encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


def webhook_signature_verify(
    *, secret: str, timestamp: str, body: bytes, signature: str, tolerance_seconds: int = 300,
    now: float | None = None,
) -> bool:
    """Whether ``signature`` signs ``body`` at ``timestamp`` with ``secret`` and the
    timestamp is within ``tolerance_seconds`` of ``now`` (replay protection); what a receiver
    does, constant-time."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - sent_at) > tolerance_seconds:
        return False
    expected = webhook_signature(secret=secret, timestamp=sent_at, body=body)
    return hmac.compare_digest(expected, signature)


def webhook_event_id(key: str) -> str:
    """The body's ``id`` of the event with idempotency key ``key``: the same for every
    webhook and every retry, so a receiver can drop repeats."""
    return "evt_" + hashlib.sha256(key.encode()).hexdigest()[:32]


def webhook_event_emit(*, event: str, key: str, data: dict[str, Any]) -> int:
    """Record ``event`` for every active webhook subscribed to it and queue the deliveries
    once the current transaction commits.

    Args:
        event: A ``WebhookEvent`` value.
        key: The event's idempotency key; a key recorded before for a webhook adds nothing.
        data: The body's ``data`` (JSON-serializable; no credentials).

    Returns:
        How many deliveries were recorded now.
    """
    webhooks = [hook for hook in Webhook.objects.filter(active=True) if event in hook.events]
    if not webhooks:
        return 0
    event_id = webhook_event_id(key)
    payload = _payload(event_id=event_id, event=event, data=data)
    created_ids = []
    for hook in webhooks:
        delivery, created = WebhookDelivery.objects.get_or_create(
            webhook=hook,
            key=key,
            defaults={"event": event, "event_id": event_id, "payload": payload},
        )
        if created:
            created_ids.append(delivery.pk)
    if created_ids:
        transaction.on_commit(lambda: task_queue.webhook_deliveries_schedule(created_ids))
    return len(created_ids)


def _payload(*, event_id: str, event: str, data: dict[str, Any]) -> str:
    return json.dumps(
        {"id": event_id, "event": event, "created_at": timezone.now().isoformat(), "data": data},
        separators=(",", ":"),
        default=str,
    )


def webhook_ping(*, webhook: Webhook, sent_by: str) -> WebhookDelivery:
    """Record a ``ping`` test event for ``webhook`` (admin's "Send a test event", like
    GitHub's ping) and queue its delivery once the current transaction commits. It is
    signed, sent and retried like every event (``tasks.deliver_webhook``) and logged in
    ``WebhookDelivery``; each call is a new event (its own ``id``), whatever the webhook
    subscribed to.

    Args:
        webhook: The webhook to test; an inactive one gets a delivery that fails at once
            ("The webhook is inactive.").
        sent_by: The user name of who asked, shown in the body's ``data``.

    Returns:
        The new delivery (``pending``).
    """
    key = f"{WebhookEvent.PING}:{webhook.pk}:{uuid.uuid4().hex}"
    event_id = webhook_event_id(key)
    data = {
        "webhook": webhook.name,
        "webhook_id": webhook.pk,
        "events": list(webhook.events),
        "sent_by": sent_by,
        "zen": "A test event: answer with any 2xx.",
    }
    with transaction.atomic():
        delivery = WebhookDelivery.objects.create(
            webhook=webhook, key=key, event=WebhookEvent.PING, event_id=event_id,
            payload=_payload(event_id=event_id, event=WebhookEvent.PING, data=data),
        )
        transaction.on_commit(lambda: task_queue.webhook_deliveries_schedule([delivery.pk]))
    return delivery


def webhook_event_emit_safely(*, event: str, key: str, data: dict[str, Any]) -> None:
    """``webhook_event_emit`` that logs instead of raising: a webhook never fails the write
    it reports (README "Notifications and webhooks")."""
    try:
        with transaction.atomic():
            webhook_event_emit(event=event, key=key, data=data)
    except Exception as error:
        logger.warning("Webhook event %s (%s) not recorded: %s", event, key, error)


def _pinned_target(url: str, address: IpAddress) -> tuple[str, dict[str, str], dict[str, Any]]:
    """The URL rewritten to call ``address``, the ``Host`` header and the TLS server name,
    so the connection goes to the address that was checked."""
    parts = urlsplit(url)
    host = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{host}:{parts.port}" if parts.port else host
    target = urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))
    hostname = parts.hostname or ""
    host_header = f"{hostname}:{parts.port}" if parts.port else hostname
    if ":" in hostname:
        host_header = f"[{hostname}]:{parts.port}" if parts.port else f"[{hostname}]"
    extensions: dict[str, Any] = {"sni_hostname": hostname} if parts.scheme == "https" else {}
    return target, {"Host": host_header}, extensions


def webhook_delivery_send(*, delivery_id: int) -> str:
    """Make one attempt at delivering the ``WebhookDelivery`` ``delivery_id``.

    Redirects are not followed (they could lead to a private address). A delivery already
    delivered or failed, or whose webhook was deactivated, is left alone.

    Returns:
        The delivery's status afterwards: ``delivered``, ``failed`` (its URL is refused now:
        never retried) or the status it already had.

    Raises:
        WebhookDeliveryFailed: No 2xx answer this time (recorded as the last error); the
            caller retries.
    """
    delivery = WebhookDelivery.objects.select_related("webhook").filter(pk=delivery_id).first()
    if delivery is None:
        return WebhookDelivery.Status.FAILED
    if delivery.status != WebhookDelivery.Status.PENDING:
        return delivery.status
    hook = delivery.webhook
    now = timezone.now()
    if not hook.active:
        _record(delivery, status=WebhookDelivery.Status.FAILED, error="The webhook is inactive.",
                count=False)
        return WebhookDelivery.Status.FAILED
    try:
        addresses = webhook_url_check(url=hook.url)
    except WebhookHostUnresolvedError as error:
        _record(delivery, status=WebhookDelivery.Status.PENDING, error=str(error))
        raise WebhookDeliveryFailed(str(error)) from None
    except WebhookAddressError as error:
        _record(delivery, status=WebhookDelivery.Status.FAILED, error=f"Refused: {error}")
        return WebhookDelivery.Status.FAILED
    body = delivery.payload.encode()
    timestamp = int(time.time())
    target, headers, extensions = _pinned_target(hook.url, addresses[0])
    headers.update({
        "Content-Type": "application/json",
        "User-Agent": "dexagents-webhooks/1",
        EVENT_HEADER: delivery.event,
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: webhook_signature(secret=hook.secret, timestamp=timestamp, body=body),
    })
    try:
        with httpx.Client(timeout=SEND_TIMEOUT_SECONDS, follow_redirects=False,
                          trust_env=False) as client:
            answer = client.post(target, content=body, headers=headers, extensions=extensions)
    except httpx.HTTPError as error:
        message = f"{type(error).__name__}: {error}"[:ERROR_MAX_CHARS]
        _record(delivery, status=WebhookDelivery.Status.PENDING, error=message)
        raise WebhookDeliveryFailed(message) from None
    if 200 <= answer.status_code < 300:
        _record(delivery, status=WebhookDelivery.Status.DELIVERED, error="",
                response_status=answer.status_code, delivered_at=now)
        return WebhookDelivery.Status.DELIVERED
    message = f"HTTP {answer.status_code}: {answer.text[:ERROR_MAX_CHARS]}"
    _record(delivery, status=WebhookDelivery.Status.PENDING, error=message,
            response_status=answer.status_code)
    raise WebhookDeliveryFailed(message)


def webhook_delivery_give_up(*, delivery_id: int) -> None:
    """Mark a delivery ``failed`` after its last retry; its last error stays."""
    WebhookDelivery.objects.filter(
        pk=delivery_id, status=WebhookDelivery.Status.PENDING
    ).update(status=WebhookDelivery.Status.FAILED)


def _record(
    delivery: WebhookDelivery,
    *,
    status: str,
    error: str,
    count: bool = True,
    response_status: int | None = None,
    delivered_at: datetime.datetime | None = None,
) -> None:
    delivery.status = status
    delivery.last_error = error
    delivery.last_attempt_at = timezone.now()
    if count:
        delivery.attempts += 1
    if response_status is not None:
        delivery.response_status = response_status
    if delivered_at is not None:
        delivery.delivered_at = delivered_at
    delivery.save(update_fields=[
        "status", "last_error", "last_attempt_at", "attempts", "response_status", "delivered_at",
    ])
