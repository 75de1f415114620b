"""Inbound triggers (issue 29): a delivery's signature, its message, and the one session that
a delivery (and every repeat of it) starts.

``signature_verify`` checks a delivery's HMAC-SHA256 signature in the trigger's style
(``models.TriggerSignatureStyle``) with a constant-time compare; ``trigger_message_render``
renders the trigger's template with the body (``agents_app.trigger_templates``);
``trigger_url_verification`` answers Slack's ``url_verification`` challenge;
``delivery_idempotency_key`` reads a delivery's key (the trigger's header, or for the Slack
style the body's ``event_id``); ``trigger_deliver`` starts the session through
``session_lifecycle.session_create`` (so budgets, the running-turn cap and the outbox apply),
once per idempotency key, and only when the agent's model provider is configured;
``trigger_secret_new`` makes a secret, ``trigger_secret_rotate`` replaces one.

Signature formats, as their senders document them:

- GitHub, "Validating webhook deliveries": ``X-Hub-Signature-256: sha256=<hex>``, the HMAC of
  the raw body;
- Slack, "Verifying requests from Slack": ``X-Slack-Signature: v0=<hex>``, the HMAC of
  ``v0:<X-Slack-Request-Timestamp>:<raw body>``; a timestamp more than five minutes from now
  is refused (replays);
- dexagents: ``X-Dexagents-Signature: sha256=<hex>``, the HMAC of
  ``<X-Dexagents-Timestamp>.<raw body>``, exactly as this platform signs its outgoing webhooks
  (``notify.webhooks``; README "Notifications and webhooks"), with Slack's five minutes.

May import: ``session_lifecycle`` and everything below the domain (tests/test_layering.py).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import time
from collections.abc import Mapping
from typing import Any

from django.db import IntegrityError, transaction

from agents_app.models import AgentTrigger, TriggerDelivery, TriggerSignatureStyle
from agents_app.services.session_lifecycle import session_create
from agents_app.trigger_templates import TriggerTemplateError, message_render

logger = logging.getLogger(__name__)

#: How far (seconds) a Slack- or dexagents-style delivery's timestamp may be from now (Slack:
#: 5 minutes).
TIMESTAMP_TOLERANCE_SECONDS = 300
#: The longest message a delivery may render (as ``api.messages.MESSAGE_MAX_CHARS``).
TRIGGER_MESSAGE_MAX_CHARS = 100_000
#: The longest idempotency key stored (``TriggerDelivery.idempotency_key``).
IDEMPOTENCY_KEY_MAX_CHARS = 200
#: How long (seconds) a repeated delivery waits for the session a concurrent first delivery
#: with the same key is starting, before answering that it is still in progress.
REPEAT_WAIT_SECONDS = 15.0
_REPEAT_POLL_SECONDS = 0.05

#: The signature header of each style (and Slack's timestamp header).
SIGNATURE_HEADERS = {
    TriggerSignatureStyle.DEXAGENTS: "X-Dexagents-Signature",
    TriggerSignatureStyle.GITHUB: "X-Hub-Signature-256",
    TriggerSignatureStyle.SLACK: "X-Slack-Signature",
}
#: The timestamp header of the styles that sign one (Unix seconds).
TIMESTAMP_HEADERS = {
    TriggerSignatureStyle.DEXAGENTS: "X-Dexagents-Timestamp",
    TriggerSignatureStyle.SLACK: "X-Slack-Request-Timestamp",
}


class TriggerSignatureError(Exception):
    """The delivery's signature is missing, malformed, stale (Slack) or wrong (401); the
    message says which, never what the right one would be."""


class TriggerMessageError(ValueError):
    """The body does not make a message: the template reads a field it lacks (the message
    names it), fails, or renders an empty or too long text (400)."""


class TriggerKeyError(ValueError):
    """The delivery's idempotency key is longer than ``IDEMPOTENCY_KEY_MAX_CHARS`` (400); the
    message names where it came from (the header or the body's ``event_id``)."""


class TriggerDeliveryInProgress(Exception):
    """A delivery with this idempotency key is still starting its session (409)."""


class TriggerAgentNotConfigured(Exception):
    """The trigger's agent cannot start: its model provider is not configured in this
    environment (503). The message names the missing key variable, never a value."""


def trigger_secret_new() -> str:
    """A new signing secret: ``trsec_`` and 43 URL-safe characters (256 random bits)."""
    return "trsec_" + secrets.token_urlsafe(32)


def trigger_secret_rotate(*, trigger: AgentTrigger) -> str:
    """Give ``trigger`` a new secret (``trigger_secret_new``) and save it.

    Returns:
        The new secret, for the one time it is shown.
    """
    trigger.secret = trigger_secret_new()
    trigger.save(update_fields=["secret", "updated_at"])
    return trigger.secret


def _hmac_hex(secret: str, message: bytes) -> str:
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def signature_verify(
    *, trigger: AgentTrigger, body: bytes, headers: Mapping[str, str], now: float | None = None
) -> None:
    """Check the delivery's signature in ``trigger.signature_style`` (module docstring).

    Args:
        body: The raw request body, exactly as received.
        headers: The request's headers (case-insensitive mapping, e.g. ``request.headers``).
        now: The current Unix time in seconds (for the timestamp); defaults to the clock.

    Raises:
        TriggerSignatureError: Missing or malformed header, a timestamp (Slack, dexagents)
            more than ``TIMESTAMP_TOLERANCE_SECONDS`` from ``now``, or a signature that is not
            the HMAC-SHA256 of the signed text with the trigger's secret.
    """
    style = TriggerSignatureStyle(trigger.signature_style)
    header = SIGNATURE_HEADERS[style]
    given = headers.get(header, "")
    if not given:
        raise TriggerSignatureError(f"The {header} header is missing.")
    prefix = "v0=" if style == TriggerSignatureStyle.SLACK else "sha256="
    signed = body
    stamp_header = TIMESTAMP_HEADERS.get(style)
    if stamp_header is not None:
        stamp = headers.get(stamp_header, "")
        if not stamp:
            raise TriggerSignatureError(f"The {stamp_header} header is missing.")
        if not stamp.isdigit() or len(stamp) > 12:
            raise TriggerSignatureError(
                f"The {stamp_header} header must be a whole number of seconds since the epoch."
            )
        current = time.time() if now is None else now
        if abs(current - int(stamp)) > TIMESTAMP_TOLERANCE_SECONDS:
            raise TriggerSignatureError(f"The {stamp_header} is more than five minutes from now.")
        if style == TriggerSignatureStyle.SLACK:
            signed = b"v0:" + stamp.encode() + b":" + body
        else:
            signed = stamp.encode() + b"." + body
    expected = prefix + _hmac_hex(trigger.secret, signed)
    if not trigger.secret or not hmac.compare_digest(given.encode(), expected.encode()):
        raise TriggerSignatureError(f"The {header} signature does not match the body.")


def trigger_message_render(*, trigger: AgentTrigger, body: dict[str, Any]) -> str:
    """``trigger.message_template`` rendered with ``body``.

    Raises:
        TriggerMessageError: The template failed (a missing field is named:
            ``'pull_request' has no field 'title'``), or the text is blank or longer than
            ``TRIGGER_MESSAGE_MAX_CHARS``.
    """
    try:
        text = message_render(source=trigger.message_template, body=body)
    except TriggerTemplateError as error:
        raise TriggerMessageError(str(error)) from None
    if not text.strip():
        raise TriggerMessageError("The trigger's template rendered an empty message.")
    if len(text) > TRIGGER_MESSAGE_MAX_CHARS:
        raise TriggerMessageError(
            f"The rendered message has {len(text)} characters; at most "
            f"{TRIGGER_MESSAGE_MAX_CHARS} are allowed."
        )
    return text


def trigger_url_verification(*, trigger: AgentTrigger, body: dict[str, Any]) -> str | None:
    """The challenge to echo when ``body`` is Slack's Events API ``url_verification`` request
    (``{"type": "url_verification", "challenge": "..."}``, sent signed when an app's Request
    URL is saved; Slack, "Events API: url_verification"), else ``None``. Only a trigger of
    style ``slack`` answers it; for the others such a body is an ordinary event.

    Raises:
        TriggerMessageError: A ``url_verification`` body whose ``challenge`` is not a
            non-empty string.
    """
    if trigger.signature_style != TriggerSignatureStyle.SLACK:
        return None
    if body.get("type") != "url_verification":
        return None
    challenge = body.get("challenge")
    if not isinstance(challenge, str) or not challenge:
        raise TriggerMessageError("A url_verification body needs a 'challenge' string.")
    return challenge


def delivery_idempotency_key(
    *, trigger: AgentTrigger, headers: Mapping[str, str], body: dict[str, Any]
) -> str:
    """The delivery's idempotency key: the trigger's ``idempotency_header``, stripped; for a
    trigger of style ``slack`` without that header, the body's ``event_id`` (Slack sends no
    idempotency header, and a retry, marked ``X-Slack-Retry-Num``, repeats the event's
    ``event_id``; Slack, "Events API: retries"). ``""`` when there is none.

    Raises:
        TriggerKeyError: The key is longer than ``IDEMPOTENCY_KEY_MAX_CHARS``.
    """
    key = headers.get(trigger.idempotency_header, "").strip()
    if key or trigger.signature_style != TriggerSignatureStyle.SLACK:
        return _key_checked(key, f"The {trigger.idempotency_header} header")
    event_id = body.get("event_id")
    # Slack's event IDs are strings; a number stands for itself too, so that two deliveries
    # of one event never both start a session.
    if isinstance(event_id, int) and not isinstance(event_id, bool):
        event_id = str(event_id)
    key = event_id.strip() if isinstance(event_id, str) else ""
    retry = headers.get("X-Slack-Retry-Num", "")
    if retry:
        logger.info(
            "Trigger %s: Slack retry %s (%s) of event %r",
            trigger, retry, headers.get("X-Slack-Retry-Reason", "no reason given"), key,
        )
    return _key_checked(key, "The body's event_id")


def _key_checked(key: str, source: str) -> str:
    if len(key) > IDEMPOTENCY_KEY_MAX_CHARS:
        raise TriggerKeyError(f"{source} is longer than {IDEMPOTENCY_KEY_MAX_CHARS} characters.")
    return key


def _provider_require(trigger: AgentTrigger) -> None:
    """Refuse a start whose first turn would fail for want of a model key.

    Raises:
        TriggerAgentNotConfigured: ``trigger.agent.provider_status()`` is not configured (the
            check ``POST /api/v1/sessions/`` makes; ``agents_app.providers.provider_status``).
    """
    status = trigger.agent.provider_status()
    if status.configured:
        return
    logger.warning(
        "Trigger %s refused a delivery: the agent %s cannot start: %s",
        trigger, trigger.agent.slug, status.reason,
    )
    raise TriggerAgentNotConfigured(
        f"The agent {trigger.agent.slug!r} cannot start: its model provider is not "
        f"configured on this server. {status.reason} Nothing was started; send the delivery "
        "again once it is."
    )


def trigger_deliver(
    *, trigger: AgentTrigger, idempotency_key: str, message: str
) -> tuple[TriggerDelivery, bool]:
    """Start the session of one delivery of ``trigger``, or find the one its key started.

    The delivery's row is committed first (``session`` empty) under the unique
    (trigger, key) constraint, then the session starts (``session_create``: owner
    ``trigger.run_as``, first message ``message``) and the row names it. A concurrent
    delivery with the same key fails the insert and waits (at most
    ``REPEAT_WAIT_SECONDS``) for the session; if the first delivery's start fails, its row
    is deleted and the waiting one starts the session itself. An empty key never matches.
    A new start is refused, keeping no row, when the agent's model provider is not
    configured (a repeated key still finds its session).

    Returns:
        ``(delivery, created)``: ``created`` is False when the key was delivered before
        (``delivery.session`` is the first delivery's session).

    Raises:
        TriggerDeliveryInProgress: The first delivery with this key is still starting its
            session after the wait.
        TriggerAgentNotConfigured: The agent's model provider is not configured; nothing is
            kept.
        dex_gateway.EngineUnavailableError: Dex did not take the start; nothing is kept.
    """
    deadline = time.monotonic() + REPEAT_WAIT_SECONDS
    while True:
        try:
            with transaction.atomic():
                delivery = TriggerDelivery.objects.create(
                    trigger=trigger, idempotency_key=idempotency_key
                )
            break
        except IntegrityError:
            first = (
                TriggerDelivery.objects.select_related("session")
                .filter(trigger=trigger, idempotency_key=idempotency_key)
                .first()
            )
            if first is not None and first.session_id is not None:
                return first, False
            if time.monotonic() > deadline:
                raise TriggerDeliveryInProgress(
                    "A delivery with this idempotency key is still starting its session; "
                    "send it again shortly."
                ) from None
            if first is not None:
                time.sleep(_REPEAT_POLL_SECONDS)
            # else: the first delivery's start failed and its row is gone; claim it again.
    try:
        _provider_require(trigger)
        session = session_create(owner=trigger.run_as, agent=trigger.agent, message=message)
    except BaseException:
        delivery.delete()
        raise
    delivery.session = session
    delivery.save(update_fields=["session"])
    logger.info(
        "Trigger %s started session %s (idempotency key %r)",
        trigger, session.pk, idempotency_key,
    )
    return delivery, True
