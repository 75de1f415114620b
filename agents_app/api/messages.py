"""A session's messages: ``/api/v1/sessions/<id>/messages/`` and one message's whole text.

``SessionMessageApi`` pages back through the stored messages (``GET``) and queues a user
message (``POST``: kept in the outbox while Dex does not answer; ``?wait=`` and ``Accept:
text/event-stream`` follow the turn that takes it); ``SessionMessageTextApi`` reads a long
message's text part by part. ``MESSAGE_MAX_CHARS`` bounds every user text the API takes, and
``QueueFull`` is the 409 of a full queue, which the queue's edit answers too.

May import: of ``agents_app.api``: ``events`` (send-and-wait, SSE) and the shared modules
(``async_views``, ``fields``, ``query``, ``schema``, ``session_access``,
``session_schema``); the live relay, the domain and everything below it.
"""

import json
from urllib.parse import urlencode

from django.http import StreamingHttpResponse
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound
from rest_framework.renderers import BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response

from agents_app.api.async_views import AsyncAPIView, db, release_database
from agents_app.api.events import (
    MESSAGE_TURN,
    SERVER_SENT_EVENT,
    EventStreamRenderer,
    WaitQuerySerializer,
    budget_held,
    event_stream_response,
    frames_once,
    turn_wait_answer,
    wants_event_stream,
)
from agents_app.api.fields import BodySerializer, StrictBooleanField, StrictCharField
from agents_app.api.query import query_values
from agents_app.api.schema import CONFLICT, error_response, field_errors_serializer
from agents_app.api.session_access import (
    SessionOwnedMixin,
    SessionStopped,
    SubagentSessionInput,
)
from agents_app.api.session_schema import DELIVERY_FIELD, SNAPSHOT_SCHEMA, SessionMessageSerializer
from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway, event_stream
from agents_app.live import session_events
from agents_app.models import SESSION_STATUS_STOPPED
from agents_app.services import session_input
from agents_app.services.session_input import session_message_send

MESSAGE_MAX_CHARS = 100_000
MESSAGE_PAGE_DEFAULT = 50
MESSAGE_PAGE_MAX = 200


MESSAGE_QUEUED = inline_serializer(
    "MessageQueued",
    {
        "queued": serializers.BooleanField(),
        "id": serializers.CharField(
            help_text="The message's ID, the same before and after delivery; "
            "the queue endpoints take it."
        ),
        "delivery": DELIVERY_FIELD,
        "pending_reason": serializers.ChoiceField(
            choices=["unavailable", "active_session_limit", "budget"],
            allow_null=True,
            help_text="Why a pending message waits: unavailable (the engine or every worker did "
            "not answer), active_session_limit (you already run "
            "DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER turns; it goes when one ends) or budget "
            "(a budget of yours or of the agent is spent; it goes when the budget allows); "
            "null when delivered.",
        ),
        "pending_detail": serializers.CharField(
            allow_null=True,
            help_text="With pending_reason budget: which budget is spent and when it resets; "
            "else null.",
        ),
        "turn": type(MESSAGE_TURN)(
            required=False,
            help_text="With wait: the turn that took the message, and whether it "
            "ended within the wait.",
        ),
        "session": type(SNAPSHOT_SCHEMA)(
            required=False,
            help_text="With wait: the session's snapshot (as GET "
            "/api/v1/sessions/<id>/ answers) when the turn ended or the wait ran "
            "out.",
        ),
    },
)


class QueueFull(APIException):
    """409: as many messages as a session queues already wait
    (``DEXAGENTS["MAX_QUEUED_MESSAGES"]``)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "queue_full"

    def __init__(self) -> None:
        limit = dexagents_setting("MAX_QUEUED_MESSAGES")
        super().__init__(
            f"The message queue is full (at most {limit} messages, whose texts may take "
            "2 MiB together; non-ASCII characters count up to 12 bytes each): let the agent "
            "take some, or delete or steer one, then send again."
        )


class SessionMessageApi(SessionOwnedMixin, AsyncAPIView):
    """``/api/v1/sessions/<id>/messages/``.

    ``GET`` (owner or staff) ``?before=<sequence>&limit=<1..200, default 50>``: one page of
    retained messages, oldest first, ``{"messages", "next_before", "next"}``; ``before`` is
    exclusive and absent means "the newest"; ``next_before`` is the ``before`` of the next older
    page and ``next`` its URL, both ``null`` at the oldest retained message (context compaction
    deletes summarized messages past the agent's retention limit). Only the page's messages are
    loaded from Dex.

    ``POST`` (owner only) ``{"text", "plan_mode"?: false}``: queue a user message; 202
    ``{"queued": true, "id", "delivery"}`` where ``id`` is the queued message's Dex Channel
    message ID (the ``/queue/<id>/`` endpoints take it). A message an idle session took at once
    answers with another ID that the queue endpoints answer 404 for. When the engine or every
    worker does not answer, the message is kept by the platform and delivered later
    (``delivery`` ``pending``; its ``id`` works with the queue endpoints before and after
    delivery). Staff reading someone else's session get 403; a stopped session or a full queue
    409.

    Send and wait, ``?wait=<seconds>`` (up to ``DEXAGENTS_MAX_WAIT_SECONDS``): the request
    is held until the turn that takes the message ends, then answers 200 with the body above
    plus ``"turn": {"finished": true, "turn_id", "status": "completed"|"failed"|"cancelled"}`` and
    ``"session"`` (the snapshot, as ``GET /api/v1/sessions/<id>/`` answers). It also answers
    200 when the session is stopped (``status`` ``stopped``) or the message is deleted or
    edited before a turn takes it (``deleted`` / ``replaced``, ``turn_id`` null). When the
    wait runs out first, 202 with ``finished`` false (``turn_id`` null while no turn has taken
    it). It
    waits on the session's events, holding no database connection and no worker slot; a
    client that leaves mid-wait loses nothing (the message was accepted before the wait).

    ``Accept: text/event-stream``: 200 and Server-Sent Events: first ``{"type":
    "message_accepted", "queued", "id", "delivery"}``, then the events of the turn that takes
    the message (websocket frames, ``id:`` = resume token) up to its ``turn_completed`` /
    ``turn_failed`` / ``turn_cancelled`` (or a ``session_stopped``, or the ``queue_changed``
    that deleted or replaced the message before a turn took it), then the stream ends; ``wait`` (or
    ``DEXAGENTS_MAX_WAIT_SECONDS``) bounds it, after which ``GET .../events/`` with
    ``Last-Event-ID`` follows on.
    """

    class MessageInputSerializer(BodySerializer):
        text = StrictCharField(max_length=MESSAGE_MAX_CHARS)
        plan_mode = StrictBooleanField(
            required=False,
            default=False,
            help_text="Ask the agent for a plan before it acts (stored with the message).",
        )

    class MessagePageInputSerializer(serializers.Serializer):
        before = serializers.IntegerField(required=False, min_value=1)
        limit = serializers.IntegerField(
            required=False, min_value=1, max_value=MESSAGE_PAGE_MAX, default=MESSAGE_PAGE_DEFAULT
        )

    @extend_schema(
        parameters=[MessagePageInputSerializer, OpenApiParameter("format", exclude=True)],
        responses={
            400: error_response(
                400,
                field_errors_serializer(MessagePageInputSerializer, name="MessagePageQueryError"),
                "A bad before or limit.",
            ),
            200: inline_serializer(
                "MessagePage",
                {
                    "messages": SessionMessageSerializer(many=True),
                    "next_before": serializers.IntegerField(allow_null=True),
                    "next": serializers.URLField(allow_null=True),
                },
            )
        },
    )
    async def get(self, request: Request, session_id: str) -> Response:
        session = await db(self.session_get)(request, session_id)
        query = self.MessagePageInputSerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        limit = query.validated_data["limit"]
        page = await dex_gateway.call(
            dex_gateway.session_messages_before(
                session_id=session.id, before=query.validated_data.get("before"), limit=limit
            )
        )
        older = page["next_before"]
        following = None
        if older is not None:
            following = request.build_absolute_uri(
                f"{request.path}?{urlencode({'before': older, 'limit': limit})}"
            )
        return Response({**page, "next": following})

    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, EventStreamRenderer]

    @extend_schema(
        request=MessageInputSerializer,
        parameters=[WaitQuerySerializer, OpenApiParameter("format", exclude=True)],
        responses={
            (202, "application/json"): MESSAGE_QUEUED,
            (200, "application/json"): OpenApiResponse(
                response=MESSAGE_QUEUED,
                description="With wait, the turn that took the message ended within it "
                "(turn.finished true).",
            ),
            (200, "text/event-stream"): OpenApiResponse(
                response=SERVER_SENT_EVENT,
                description="With Accept: text/event-stream: a message_accepted frame, then "
                "the events of the turn that takes the message (websocket frames as SSE "
                "data, id = resume token), ending with turn_completed, turn_failed or "
                "turn_cancelled (or "
                "session_stopped, or the queue_changed that deleted or replaced the message)."
            ),
            400: error_response(
                400,
                field_errors_serializer(
                    MessageInputSerializer, name="MessageInputError", extra_fields=("wait",)
                ),
                "A bad text, plan_mode or wait.",
            ),
            409: error_response(
                409,
                CONFLICT,
                "The session is stopped or is a subagent's session, or its queue is full "
                "(DEXAGENTS_MAX_QUEUED_MESSAGES "
                "messages wait, or their texts with this one would pass 2 MiB of JSON); "
                "nothing changed.",
            ),
        },
    )
    async def post(self, request: Request, session_id: str) -> Response | StreamingHttpResponse:
        query = WaitQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        wait = query.validated_data.get("wait")
        stream = wants_event_stream(request)
        after = ""
        if wait or stream:
            session = await db(self.session_get_for_owner)(request, session_id)
            # Where the turn that takes the message will be found: read before sending.
            try:
                after = await dex_gateway.call(
                    event_stream.session_events_tail_token(session_id=session.id)
                )
            except dex_gateway.EngineUnavailableError:
                after = ""  # the message goes to the outbox; its turn is found from the start
        # A write: the outbox and Dex's answer decide together, so it stays one sync unit.
        response: Response = await db(self._post)(request, session_id)
        if not (wait or stream):
            return response
        accepted = dict(response.data)
        # No turn takes a message a spent budget holds until the budget allows it (the next
        # UTC day or month, or an administrator): waiting for one would only hold the request.
        held = budget_held(accepted)
        if stream:
            await release_database()
            opening = session_events.sse_event(
                json.dumps({"type": "message_accepted", **accepted}, separators=(",", ":"))
            )
            if held:
                return event_stream_response(frames_once(opening))
            return event_stream_response(
                session_events.sse_frames(
                    session_events.turn_events(session.id, after, accepted["id"]),
                    first=b"retry: 2000\n\n" + opening,
                    max_seconds=wait or float(dexagents_setting("MAX_WAIT_SECONDS")),
                )
            )
        assert wait is not None
        finished, waited = await turn_wait_answer(
            request, session, after=after, client_id=accepted["id"], seconds=0 if held else wait
        )
        return Response(
            {**accepted, **waited},
            status=status.HTTP_200_OK if finished else status.HTTP_202_ACCEPTED,
        )

    def _post(self, request: Request, session_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.MessageInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            raise SessionStopped()
        if session.parent_id is not None:
            raise SubagentSessionInput()
        try:
            accepted = session_message_send(
                session=session,
                text=serializer.validated_data["text"],
                plan_mode=serializer.validated_data["plan_mode"],
            )
        except session_input.QueueFullError:
            raise QueueFull() from None
        return Response(
            {
                "queued": True,
                "id": accepted.id,
                "delivery": accepted.delivery,
                "pending_reason": accepted.pending_reason or None,
                "pending_detail": accepted.pending_detail or None,
            },
            status=status.HTTP_202_ACCEPTED,
        )


#: The largest message sequence a session stores (``dex_agents.message_sequence_key``).
MAX_MESSAGE_SEQUENCE = 999_999_999_999


class SessionMessageTextApi(SessionOwnedMixin, AsyncAPIView):
    """``GET /api/v1/sessions/<id>/messages/<sequence>/text/?part=<n>`` (owner or staff): one
    part of a stored message's whole text, ``{"sequence", "part", "parts", "text_length",
    "text"}``; parts are numbered from 0 and hold at most 512 KiB of UTF-8 each
    (``dex_agents.TEXT_PART_BYTES``), so a long text is read part by part.

    A message in a snapshot or a page carries ``text_length`` when its ``text`` is not the
    whole: a 20 MB tool result, whose record keeps its first MiB of JSON, is stored whole
    (up to 32 MiB), and a message past the page's byte budget arrives cut. Here it is whole.
    404 for a message the session does not store (compaction deletes summarized messages past
    the retention limit) and for a part past the last (its detail says how many there are).
    """

    class TextPartInputSerializer(serializers.Serializer):
        part = serializers.IntegerField(
            required=False, min_value=0, default=0, help_text="Zero-based part number."
        )

    @extend_schema(
        parameters=[TextPartInputSerializer, OpenApiParameter("format", exclude=True)],
        responses={
            400: error_response(
                400,
                field_errors_serializer(TextPartInputSerializer, name="MessageTextQueryError"),
                "A part that is not a whole number from 0.",
            ),
            200: inline_serializer(
                "MessageText",
                {
                    "sequence": serializers.IntegerField(),
                    "part": serializers.IntegerField(help_text="Zero-based."),
                    "parts": serializers.IntegerField(
                        help_text="How many parts the whole text has (at least 1)."
                    ),
                    "text_length": serializers.IntegerField(
                        help_text="The whole text's length in characters."
                    ),
                    "text": serializers.CharField(
                        help_text="This part: at most 512 KiB of UTF-8, cut between characters."
                    ),
                },
            ),
        },
    )
    async def get(self, request: Request, session_id: str, sequence: int) -> Response:
        session = await db(self.session_get)(request, session_id)
        query = self.TextPartInputSerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        part = query.validated_data["part"]
        if not 1 <= sequence <= MAX_MESSAGE_SEQUENCE:
            raise NotFound(f"The session has no message {sequence}.")
        try:
            answer = await dex_gateway.call(
                dex_gateway.session_message_text(
                    session_id=session.id, sequence=sequence, part=part
                )
            )
        except dex_gateway.MessageNotFoundError as error:
            raise NotFound(str(error)) from None
        except dex_gateway.MessagePartOutOfRangeError as error:
            raise NotFound(str(error)) from None
        return Response(answer)
