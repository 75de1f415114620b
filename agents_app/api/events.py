"""A session's AgentEvents over HTTP: Server-Sent Events, and requests that wait on the
session's event Stream.

Owns ``GET /api/v1/sessions/<id>/events/`` (``SessionEventsApi``); the SSE answer that the
message ``POST`` shares (``EventStreamRenderer``, ``wants_event_stream``,
``event_stream_response``); send-and-wait (``turn_wait_answer``: wait for the turn that takes
a message, then read the snapshot) with its ``?wait=`` query (``WaitQuerySerializer``) and
OpenAPI shapes (``SERVER_SENT_EVENT``, ``MESSAGE_TURN``). The Stream is read through the live
relay (``agents_app.live.session_events``); no wait holds a database connection.

May import: of ``agents_app.api``: ``async_views``, ``query``, ``schema``,
``session_access``, ``snapshot``; the live relay, the domain and everything below it.
"""

import asyncio
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any

from django.http import StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import exceptions, serializers
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.request import Request

from agents_app.api.async_views import AsyncAPIView, db, release_database
from agents_app.api.query import query_values
from agents_app.api.schema import NOT_ACCEPTABLE, error_response, field_errors_serializer
from agents_app.api.session_access import SessionOwnedMixin
from agents_app.api.snapshot import snapshot_read
from agents_app.conf import dexagents_setting
from agents_app.gateway import event_stream
from agents_app.live import session_events, session_feed
from agents_app.models import AgentSession
from agents_app.services import session_input

SERVER_SENT_EVENT = inline_serializer(
    "ServerSentEvent",
    {
        "data": serializers.CharField(
            required=False,
            help_text="One frame as JSON text: {\"type\": \"event\", \"token\", \"event\"}, "
            "{\"type\": \"snapshot_required\"} or (first, on a message POST) "
            "{\"type\": \"message_accepted\", ...}.",
        ),
        "id": serializers.CharField(required=False, help_text="The event's resume token."),
        "event": serializers.CharField(required=False),
        "retry": serializers.IntegerField(required=False),
    },
)


#: How a send-and-wait ended (``turn_wait_answer``): the ``turn`` of ``messages.MESSAGE_QUEUED``
#: and of a session created with ``?wait=``.
MESSAGE_TURN = inline_serializer(
    "MessageTurn",
    {
        "finished": serializers.BooleanField(),
        "turn_id": serializers.CharField(
            allow_null=True,
            help_text="null while no turn has taken the message yet.",
        ),
        "status": serializers.ChoiceField(
            choices=["completed", "failed", "cancelled", "stopped", "deleted", "replaced"],
            allow_null=True,
            help_text="How the wait ended: the turn completed, failed or was cancelled "
            "(POST .../turn/cancel/); the session "
            "was stopped; the message was deleted or edited (replaced) before a turn "
            "took it. null while it goes on.",
        ),
    },
)


class WaitQuerySerializer(serializers.Serializer):
    """``?wait=<seconds>`` of the requests that may wait (a message ``POST``, a session's
    creation): a finite number from 0 up to ``DEXAGENTS_MAX_WAIT_SECONDS``, else 400."""

    # The bound in the schema is this process's setting when it loaded; validate_wait reads it
    # on every request.
    wait = serializers.FloatField(
        required=False,
        min_value=0,
        max_value=float(dexagents_setting("MAX_WAIT_SECONDS")),
        help_text="Seconds the request may wait (at most DEXAGENTS_MAX_WAIT_SECONDS, 300 by "
        "default).",
    )

    def validate_wait(self, value: float) -> float:
        limit = float(dexagents_setting("MAX_WAIT_SECONDS"))
        if not math.isfinite(value) or value > limit:
            raise serializers.ValidationError(f"Give a number of seconds up to {limit:g}.")
        return value


class EventStreamRenderer(BaseRenderer):
    """``text/event-stream``: what a client that wants Server-Sent Events asks for. The
    streams themselves are ``StreamingHttpResponse``; this renderer only answers errors
    before a stream starts (JSON text, which ``ApiJsonErrorsMiddleware`` labels
    ``application/json``)."""

    media_type = "text/event-stream"
    format = "event-stream"
    charset = None

    def render(self, data: Any, accepted_media_type: str | None = None,
               renderer_context: Mapping[str, Any] | None = None) -> bytes:
        return JSONRenderer().render(data)


def wants_event_stream(request: Request) -> bool:
    """Whether content negotiation picked ``EventStreamRenderer`` (``Accept:
    text/event-stream``) for ``request``."""
    return getattr(request.accepted_renderer, "format", "") == EventStreamRenderer.format


def event_stream_response(frames: Any) -> StreamingHttpResponse:
    """A ``text/event-stream`` answer streaming ``frames`` (bytes, ``session_events``): not
    cached, not buffered by proxies that honour ``X-Accel-Buffering``."""
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


#: How long send-and-wait re-reads a snapshot that does not show the turn's end yet (the
#: turn_completed event is written just before its Step commits).
TURN_END_SETTLE_SECONDS = 2.0


def budget_held(accepted: Mapping[str, Any] | None) -> bool:
    """Whether the message ``accepted`` describes (a send's answer, a held ``first_message``)
    waits because a budget is spent (``session_input.PENDING_BUDGET``)."""
    return accepted is not None and accepted.get("pending_reason") == session_input.PENDING_BUDGET


async def frames_once(frame: bytes) -> AsyncIterator[bytes]:
    """A stream of one SSE ``frame`` that then ends."""
    yield frame


async def turn_wait_answer(
    request: Request, session: AgentSession, *, after: str, client_id: str, seconds: float
) -> tuple[bool, dict[str, Any]]:
    """Send and wait: wait up to ``seconds`` for the end of the turn that takes the message
    sent under ``client_id`` (``""``: the session's first turn), read from ``after``
    (``session_events.turn_wait``), then read the snapshot; when the turn ended, read again
    (briefly, with backoff) until the snapshot no longer shows it running (its
    ``turn_completed`` is written just before its Step commits). Holds no database connection
    while it waits.

    Returns:
        ``(finished, {"turn": {"finished", "turn_id", "status"}, "session": snapshot})``.

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError (the reads).
    """
    await release_database()
    try:
        outcome = await session_events.turn_wait(
            session_id=session.id, after=after, client_id=client_id, seconds=seconds
        )
    except event_stream.EventsTokenInvalidError:
        outcome = None
    finished = outcome is not None and outcome.finished
    snapshot = await snapshot_read(request, session)
    if finished and outcome is not None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TURN_END_SETTLE_SECONDS
        delay = 0.005
        while snapshot.get("turn_id") == outcome.turn_id and snapshot.get("status") != "stopped":
            if loop.time() + delay > deadline:
                break
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.25)
            snapshot = await snapshot_read(request, session)
    turn = {
        "finished": finished,
        "turn_id": (outcome.turn_id or None) if outcome is not None else None,
        "status": outcome.status if finished and outcome is not None else None,
    }
    return finished, {"turn": turn, "session": snapshot}


class SessionEventsApi(SessionOwnedMixin, AsyncAPIView):
    """``GET /api/v1/sessions/<id>/events/`` (owner or staff): the session's AgentEvents as
    Server-Sent Events, the websocket relay's frames over plain HTTP.

    Each Stream message is one SSE message: ``id:`` its resume token, ``data:`` the
    websocket's frame (``{"type": "event", "token", "event"}``). ``{"type":
    "snapshot_required"}`` (no ``id``) says events were lost to the client: reload the
    snapshot, and the stream goes on. A ``: heartbeat`` comment comes after 15 s without an
    event. Resume with the ``Last-Event-ID`` header (browsers' ``EventSource`` sends it) or
    ``?after=<token>`` (the snapshot's ``events_after``); the header wins; neither starts at
    the oldest retained message. The stream holds no database connection and survives an
    engine restart (it waits and resumes). It ends after ``DEXAGENTS_MAX_WAIT_SECONDS`` (300 s
    by default) with a ``: reconnect`` comment; the client resumes with ``Last-Event-ID``
    (``EventSource`` does so by itself, after the ``retry:`` 2 s the stream announces).
    """

    renderer_classes = [EventStreamRenderer, JSONRenderer]

    class EventsQuerySerializer(serializers.Serializer):
        after = serializers.CharField(
            required=False, allow_blank=True, max_length=512,
            help_text="Resume after this token (ignored when Last-Event-ID is sent).",
        )

    @extend_schema(
        # ?format= only picks a renderer; the stream is the one answer this view has.
        parameters=[
            EventsQuerySerializer,
            OpenApiParameter("format", exclude=True),
            OpenApiParameter(
                "Last-Event-ID", OpenApiTypes.STR, OpenApiParameter.HEADER,
                description="Resume after this token (an id: the stream sent); wins over "
                "after. Browsers' EventSource sends it when it reconnects.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                response=SERVER_SENT_EVENT,
                description="Server-Sent Events: id = resume token, data = a websocket frame."
            ),
            400: error_response(
                400,
                field_errors_serializer(EventsQuerySerializer, name="EventsQueryError"),
                "A bad after.",
            ),
            406: error_response(
                406, NOT_ACCEPTABLE, "Accept names a type other than text/event-stream."
            ),
        },
    )
    async def get(self, request: Request, session_id: str) -> StreamingHttpResponse:
        session = await db(self.session_get)(request, session_id)
        query = self.EventsQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        after = request.headers.get("Last-Event-ID", "").strip() or query.validated_data.get(
            "after", ""
        )
        if not wants_event_stream(request):
            # Accept named JSON (or nothing of ours): this view has no JSON answer.
            raise exceptions.NotAcceptable(
                "This endpoint streams Server-Sent Events: send Accept: text/event-stream "
                "(or */*)."
            )
        await release_database()
        return event_stream_response(
            session_events.sse_frames(
                session_feed.read_messages(session.id, after),
                first=b"retry: 2000\n\n",
                max_seconds=float(dexagents_setting("MAX_WAIT_SECONDS")),
            )
        )
