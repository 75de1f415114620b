"""``POST /api/v1/agents/<slug>/triggers/<name>/``: an inbound trigger's delivery (issue 29).

No token or browser session: the delivery's HMAC-SHA256 signature with the trigger's secret
is its authentication (``services.triggers.signature_verify``). The checks run in this order,
so a sender without the secret learns nothing but whether the trigger exists:

=====  ==============================================================================
404    no such agent or trigger, either is disabled, or its run-as user is inactive
413    the body (its ``Content-Length``, or what was read) is over the trigger's limit
401    the signature header is missing, malformed, stale (a timestamp more than five
       minutes from now: Slack and dexagents styles) or wrong
200    ``{"challenge"}``: Slack style, the body is Slack's ``url_verification``; nothing
       starts
400    ``{"detail"}``: the body is not JSON; ``{"body": [...]}``: not a JSON object, or
       the template failed on it (naming the missing field); ``{"idempotency_key": [...]}``:
       the key is too long, or missing where the trigger requires it (Slack style: the
       body's ``event_id`` stands in for a missing header)
409    a delivery with the same idempotency key is still starting its session
200    the idempotency key was delivered before: the first delivery's session, nothing new
503    ``{"detail"}``: the agent's model provider is not configured (the detail names the
       key variable); nothing was kept
202    a new session started (its first message is the rendered template)
503    ``{"detail", "unavailable"}``: the engine or the worker did not take the start;
       nothing was kept
=====  ==============================================================================

May import: of ``agents_app.api`` only ``async_views``, ``schema``, ``session_access`` and
``sessions`` (the created session's fields);
the domain and everything below it.
"""

from __future__ import annotations

import io

from django.urls import reverse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, AuthenticationFailed, NotFound, ValidationError
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.validators import ProhibitSurrogateCharactersValidator

from agents_app.api.async_views import AsyncAPIView, db
from agents_app.api.schema import (
    CONFLICT,
    NOT_AUTHENTICATED,
    NOT_FOUND,
    REQUEST_TOO_LARGE,
    error_response,
)
from agents_app.api.session_access import DexErrorsMixin
from agents_app.api.sessions import SessionCreatedSerializer
from agents_app.models import AgentSession, AgentTrigger, TriggerSignatureStyle
from agents_app.rest_errors import UNAVAILABLE_PARTS, BoundedJSONParser
from agents_app.selectors import triggers as trigger_reads
from agents_app.services import triggers as trigger_services


class TriggerBodyTooLarge(APIException):
    """413: the body is over the trigger's ``max_body_bytes``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "request_too_large"


class TriggerDeliveryInProgress(APIException):
    """409: a delivery with the same idempotency key is still starting its session."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "delivery_in_progress"


class TriggerAgentNotConfigured(APIException):
    """503: the trigger's agent cannot start, its model provider is not configured; the
    sender cannot fix it, the operators can."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "agent_not_configured"


class TriggerSessionSerializer(SessionCreatedSerializer):
    """The session a delivery started (202) or that its idempotency key started before
    (200): ``POST /api/v1/sessions/``'s answer where it applies, with the session's API
    ``url`` and the delivery's ``trigger``, ``idempotency_key`` and ``repeated``.

    Context: ``request`` (for the absolute ``url``), ``delivery`` (a ``TriggerDelivery``)
    and ``repeated`` (bool).
    """

    url = serializers.SerializerMethodField(help_text="The session's API URL.")
    trigger = serializers.SerializerMethodField(help_text="The trigger's name.")
    idempotency_key = serializers.SerializerMethodField(
        help_text="The delivery's idempotency key; empty when it sent none."
    )
    repeated = serializers.SerializerMethodField(
        help_text="true: the key was delivered before and this is that delivery's session "
        "(200); false: a new session (202)."
    )

    class Meta(SessionCreatedSerializer.Meta):
        fields = (
            "id", "url", "agent", "trigger", "title", "status", "created_at", "first_message",
            "idempotency_key", "repeated",
        )

    def get_url(self, session: AgentSession) -> str:
        path = reverse("agents_api:session-detail", kwargs={"session_id": session.pk})
        request = self.context.get("request")
        return request.build_absolute_uri(path) if request is not None else path

    def get_trigger(self, session: AgentSession) -> str:
        return str(self.context["delivery"].trigger.name)

    def get_idempotency_key(self, session: AgentSession) -> str:
        return str(self.context["delivery"].idempotency_key)

    def get_repeated(self, session: AgentSession) -> bool:
        return bool(self.context["repeated"])


TRIGGER_DELIVERY_ERROR = inline_serializer(
    "TriggerDeliveryError",
    {
        "body": serializers.ListField(
            child=serializers.CharField(), required=False,
            help_text="The body is not a JSON object, or the template failed on it (naming "
            "the field the body lacks, e.g. \"'pull_request' has no field 'title'\").",
        ),
        "idempotency_key": serializers.ListField(
            child=serializers.CharField(), required=False,
            help_text="The idempotency key is too long, or missing where the trigger requires "
            "it.",
        ),
        "non_field_errors": serializers.ListField(
            child=serializers.CharField(), required=False,
            help_text="Kept for the shape of every 400; this endpoint names body or "
            "idempotency_key instead.",
        ),
        "detail": serializers.CharField(
            required=False, help_text="The body is not JSON (or nests too deep)."
        ),
    },
)
TRIGGER_UNAVAILABLE_ERROR = inline_serializer(
    "TriggerUnavailableError",
    {
        "detail": serializers.CharField(
            help_text="What is down, or that the agent's model provider is not configured "
            "(naming the key variable the server lacks). Nothing was kept; send it again later."
        ),
        "unavailable": serializers.ChoiceField(
            choices=list(UNAVAILABLE_PARTS), required=False,
            help_text="The part of the platform that is down; absent when the agent's provider "
            "is not configured.",
        ),
    },
)
SLACK_CHALLENGE = inline_serializer(
    "TriggerSlackChallenge",
    {"challenge": serializers.CharField(help_text="The url_verification body's challenge.")},
)
_SIGNATURE_HEADER_PARAMETERS = [
    OpenApiParameter(
        name, OpenApiTypes.STR, OpenApiParameter.HEADER, required=False, description=text
    )
    for name, text in (
        ("X-Dexagents-Signature", "Signature style dexagents: sha256=<hex HMAC-SHA256 of "
         "\"<timestamp>.<raw body>\" with the trigger's secret>, as the platform's own "
         "webhooks sign."),
        ("X-Dexagents-Timestamp", "Signature style dexagents: Unix seconds; refused more "
         "than five minutes from now."),
        ("X-Hub-Signature-256", "Signature style github: sha256=<hex HMAC-SHA256 of the raw "
         "body>, as GitHub sends it."),
        ("X-Slack-Signature", "Signature style slack: v0=<hex HMAC-SHA256 of "
         "\"v0:<timestamp>:<raw body>\">, as Slack sends it."),
        ("X-Slack-Request-Timestamp", "Signature style slack: Unix seconds; refused more than "
         "five minutes from now."),
        ("Idempotency-Key", "The default idempotency header (a trigger may name another, "
         "such as X-GitHub-Delivery): a repeated value answers 200 with the first delivery's "
         "session. Signature style slack: without it, the body's event_id is the key."),
    )
]


class AgentTriggerApi(DexErrorsMixin, AsyncAPIView):
    """``POST /api/v1/agents/<slug>/triggers/<name>/``: deliver an event to a trigger.

    Body: a JSON object, signed (module docstring for the answers, in the order they are
    checked). The trigger's template renders it into the first message of a new session of
    the agent, owned by the trigger's run-as user; a repeated idempotency key starts nothing
    and answers the first delivery's session.
    """

    authentication_classes = ()
    permission_classes = (AllowAny,)
    # The sender is a service without a user; per-user budgets do not apply, and a per-IP
    # one would refuse the deliveries of senders that share addresses (GitHub's hooks).
    throttle_classes = ()
    engine_methods = frozenset({"POST"})

    def get_authenticate_header(self, request: Request) -> str:
        """The ``WWW-Authenticate`` of a 401 (which DRF turns into 403 without one)."""
        return 'HMAC-SHA256 realm="dexagents trigger"'

    @extend_schema(
        operation_id="agents_triggers_deliver",
        auth=[],
        request={"application/json": OpenApiTypes.OBJECT},
        parameters=_SIGNATURE_HEADER_PARAMETERS,
        responses={
            202: OpenApiResponse(
                TriggerSessionSerializer, description="A new session started."
            ),
            200: OpenApiResponse(
                PolymorphicProxySerializer(
                    "TriggerRepeatOrChallenge",
                    serializers=[TriggerSessionSerializer, SLACK_CHALLENGE],
                    resource_type_field_name=None,
                ),
                description="The idempotency key was delivered before: that delivery's "
                "session; nothing new started. Or (style slack) the body is Slack's "
                "url_verification: its challenge, echoed; nothing started.",
            ),
            400: error_response(
                400, TRIGGER_DELIVERY_ERROR,
                "The body is not a JSON object, the template failed on it, or the idempotency "
                "key is bad.",
            ),
            401: error_response(
                401, NOT_AUTHENTICATED,
                "The signature header is missing, malformed, stale (Slack and dexagents "
                "styles: a timestamp more than five minutes from now) or does not match the "
                "body.",
            ),
            404: error_response(
                404, NOT_FOUND, "No such agent or trigger, or it is disabled."
            ),
            409: error_response(
                409, CONFLICT,
                "A delivery with this idempotency key is still starting its session.",
            ),
            413: error_response(
                413, REQUEST_TOO_LARGE, "The body is larger than the trigger's limit."
            ),
            503: error_response(
                503, TRIGGER_UNAVAILABLE_ERROR,
                "The agent's model provider is not configured on the server, or the engine or "
                "the worker did not take the start. Nothing was kept.",
            ),
        },
    )
    async def post(self, request: Request, slug: str, name: str) -> Response:
        response: Response = await db(self._deliver)(request, slug, name)
        return response

    def _deliver(self, request: Request, slug: str, name: str) -> Response:
        try:
            trigger = trigger_reads.trigger_get_enabled(agent_slug=slug, name=name)
        except AgentTrigger.DoesNotExist:
            raise NotFound("No such trigger.") from None
        body = _body_read(request, limit=trigger.max_body_bytes)
        try:
            trigger_services.signature_verify(
                trigger=trigger, body=body, headers=request.headers
            )
        except trigger_services.TriggerSignatureError as error:
            raise AuthenticationFailed(str(error)) from None
        data = BoundedJSONParser().parse(io.BytesIO(body))
        if not isinstance(data, dict):
            raise ValidationError({"body": ["The body must be a JSON object."]})
        try:
            challenge = trigger_services.trigger_url_verification(trigger=trigger, body=data)
            if challenge is not None:
                return Response({"challenge": challenge}, status=status.HTTP_200_OK)
            message = trigger_services.trigger_message_render(trigger=trigger, body=data)
        except trigger_services.TriggerMessageError as error:
            raise ValidationError({"body": [str(error)]}) from None
        try:
            key = trigger_services.delivery_idempotency_key(
                trigger=trigger, headers=request.headers, body=data
            )
        except trigger_services.TriggerKeyError as error:
            raise ValidationError({"idempotency_key": [str(error)]}) from None
        # Text the database cannot store (a lone UTF-16 surrogate such as "\ud800", which JSON
        # can spell) is refused as POST /api/v1/sessions/ refuses it.
        for field, text in (("body", message), ("idempotency_key", key)):
            try:
                ProhibitSurrogateCharactersValidator()(text)
            except ValidationError as error:
                raise ValidationError({field: error.detail}) from None
        if not key and trigger.idempotency_required:
            also = (
                " (or an event_id in the body)"
                if trigger.signature_style == TriggerSignatureStyle.SLACK else ""
            )
            raise ValidationError({"idempotency_key": [
                f"This trigger requires the {trigger.idempotency_header} header{also}."
            ]})
        try:
            delivery, created = trigger_services.trigger_deliver(
                trigger=trigger, idempotency_key=key, message=message
            )
        except trigger_services.TriggerDeliveryInProgress as error:
            raise TriggerDeliveryInProgress(str(error)) from None
        except trigger_services.TriggerAgentNotConfigured as error:
            raise TriggerAgentNotConfigured(str(error)) from None
        body_out = TriggerSessionSerializer(
            delivery.session,
            context={"request": request, "delivery": delivery, "repeated": not created},
        ).data
        return Response(
            body_out, status=status.HTTP_202_ACCEPTED if created else status.HTTP_200_OK
        )


def _body_read(request: Request, *, limit: int) -> bytes:
    """The raw body, read up to ``limit`` bytes.

    Raises:
        TriggerBodyTooLarge: ``Content-Length`` or the body read is over ``limit``.
    """
    refusal = f"The body is larger than this trigger's limit of {limit} bytes."
    try:
        declared = int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        declared = 0
    if declared > limit:
        raise TriggerBodyTooLarge(refusal)
    body: bytes = request._request.read(limit + 1)
    if len(body) > limit:
        raise TriggerBodyTooLarge(refusal)
    return body

