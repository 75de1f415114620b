"""REST API under ``/api/v1/`` and the ``/healthz`` probe.

Every API view requires an authenticated user (token or session) and only ever sees the
caller's own sessions; another user's session answers 404 like an unknown one. Views parse,
call a selector or service, and shape the answer; Dex errors map to 503
``{"detail", "unavailable"}`` naming the part that is down (``"engine"`` or ``"worker"``) and
404 (engine has no such session).
"""

import asyncio
import contextlib
import dataclasses
import json
import math
from collections.abc import AsyncIterator, Mapping
from typing import Any
from urllib.parse import urlencode

from django.db import connections
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from drf_spectacular.views import SpectacularAPIView
from rest_framework import exceptions, serializers, status
from rest_framework.exceptions import APIException, NotFound, PermissionDenied, ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.async_views import AsyncAPIView, db
from agents_app.api.fields import (
    BodySerializer,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    body_refuse,
)
from agents_app.api.query import KnownQueryParametersFilter
from agents_app.api.schema import (
    CONFLICT,
    NOT_ACCEPTABLE,
    error_response,
    field_errors_serializer,
)
from agents_app.api.session_schema import (
    PendingInterruptSerializer,
    SessionListUsageSerializer,
    SessionMessageSerializer,
    SessionUsageSerializer,
    ToolCallRecordSerializer,
)
from agents_app.conf import dexagents_setting
from agents_app.gateway import dex_gateway, event_stream, snapshot_cache
from agents_app.live import session_events, session_feed
from agents_app.models import SESSION_STATUS_STOPPED, AgentDefinition, AgentSession
from agents_app.rest_errors import (
    ServiceUnavailable,
    unavailable_detail,
)
from agents_app.selectors import agent_catalog, platform_health, session_reads
from agents_app.services import session_input, session_lifecycle
from agents_app.sessions.session_search import message_matches_get, search_words
from agents_app.usage.usage_records import (
    SESSION_LIST_USAGE,
    session_row_usage,
    session_usage_totals,
)
from agents_app.worker.titles import title_without_controls
from dex_agents import STEP_OUTCOMES, StepHistoryEntry

MESSAGE_MAX_CHARS = 100_000
MESSAGE_PAGE_DEFAULT = 50
MESSAGE_PAGE_MAX = 200


def query_values(request: Request) -> dict[str, str]:
    """The query string as a plain dict (the last value of a repeated parameter).

    A serializer given the ``QueryDict`` itself reads it as an HTML form and takes an empty
    value (``?before=``) for a missing one; from a dict, ``""`` is validated like any value
    (400 for a number field), as the schema says.
    """
    return {key: request.query_params[key] for key in request.query_params}


class SessionTooLarge(ServiceUnavailable):
    """503: the engine cannot load this session's state in one piece."""

    default_code = "session_too_large"

    def __init__(self) -> None:
        super().__init__(
            "engine",
            "This session's stored conversation is too large for the engine to load at once "
            "(more than 4 MiB); start a new session.",
        )


class DexErrorsMixin:
    """Translate ``dex_gateway`` errors raised by a view into API errors: 503
    ``{"detail", "unavailable"}`` naming the part that is down; for a session Dex refused as
    not running, 409 ``SessionStopped`` when its Flow no longer runs (the index is marked
    stopped, ``session_lifecycle.session_stopped_detect``), else 404.

    ``engine_methods`` names the HTTP methods that call Dex, so can answer 503; the schema
    (``agents_app.api.schema.ApiAutoSchema``) documents 503 for exactly those.
    """

    engine_methods: frozenset[str] = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, dex_gateway.SessionNotFoundError) and self._flow_closed():
            exc = SessionStopped()
        if isinstance(exc, dex_gateway.SessionTooLargeError):
            exc = SessionTooLarge()
        elif isinstance(exc, dex_gateway.EngineUnavailableError):
            part = platform_health.unavailable_part(error=exc)
            detail = str(exc)
            if part == "worker" and exc.cause == "timeout":
                detail = unavailable_detail("worker")
            exc = ServiceUnavailable(part, detail)
        elif isinstance(exc, dex_gateway.SessionNotFoundError):
            exc = NotFound("The engine has no record of this session.")
        return super().handle_exception(exc)  # type: ignore[misc]

    def _flow_closed(self) -> bool:
        """Whether the URL's session is indexed and its Flow no longer runs in Dex."""
        session_id = getattr(self, "kwargs", {}).get("session_id")
        session = AgentSession.objects.filter(pk=session_id).first() if session_id else None
        if session is None:
            return False
        try:
            return session_lifecycle.session_stopped_detect(session=session)
        except (dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError):
            return False


class AgentListApi(ListAPIView):
    """``GET /api/v1/agents/``: enabled agents, with the tools a session of each may use.

    ``tools`` lists exposed tool names; ``tool_details`` describes each (server, effect, whether
    it waits for approval) for the portal. Credentials never appear: only whether the agent's
    provider is configured, and, for staff, what is missing.
    """

    class AgentOutputSerializer(serializers.ModelSerializer):
        tools = serializers.SerializerMethodField()
        tool_details = serializers.SerializerMethodField()
        configured = serializers.SerializerMethodField()
        not_configured_reason = serializers.SerializerMethodField()

        class Meta:
            model = AgentDefinition
            fields = (
                "slug",
                "name",
                "description",
                "model",
                "tools",
                "tool_details",
                "configured",
                "not_configured_reason",
            )

        def get_tools(self, agent: AgentDefinition) -> list[str]:
            return [tool.exposed_name for tool in agent.exposed_tools()]

        @extend_schema_field(
            inline_serializer(
                "AgentTool",
                {
                    "name": serializers.CharField(),
                    "server": serializers.CharField(),
                    "tool": serializers.CharField(),
                    "title": serializers.CharField(),
                    "description": serializers.CharField(),
                    "effect": serializers.CharField(),
                    "requires_approval": serializers.BooleanField(),
                },
                many=True,
            )
        )
        def get_tool_details(self, agent: AgentDefinition) -> list[dict[str, Any]]:
            return agent_catalog.agent_tools_describe(agent=agent)

        def get_configured(self, agent: AgentDefinition) -> bool:
            return agent.provider_status().configured

        def get_not_configured_reason(self, agent: AgentDefinition) -> str | None:
            request = self.context.get("request")
            return agent_catalog.agent_not_configured_reason(
                agent=agent, user=getattr(request, "user", None)
            )

    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> Any:
        return agent_catalog.agent_list_enabled()


class SessionMatchSerializer(serializers.Serializer):
    """The message a search matched (``session_search.MessageMatch``)."""

    sequence = serializers.IntegerField()
    role = serializers.ChoiceField(choices=["user", "assistant"])
    snippet = serializers.CharField(help_text="Plain text around the matched words.")
    highlights = serializers.ListField(
        child=serializers.ListField(child=serializers.IntegerField(), min_length=2, max_length=2),
        help_text="[start, end) character offsets of the matched words in snippet.",
    )


class SessionOutputSerializer(serializers.ModelSerializer):
    agent: serializers.SlugRelatedField[AgentDefinition] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    owner = serializers.SerializerMethodField()
    awaiting_approval = serializers.SerializerMethodField()
    usage = serializers.SerializerMethodField()
    archived = serializers.SerializerMethodField()
    match = serializers.SerializerMethodField()

    class Meta:
        model = AgentSession
        fields: tuple[str, ...] = (
            "id",
            "agent",
            "owner",
            "title",
            "status",
            "awaiting_approval",
            "archived",
            "usage",
            "match",
            "created_at",
            "updated_at",
        )

    def get_archived(self, session: AgentSession) -> bool:
        return session.archived_at is not None

    @extend_schema_field(SessionMatchSerializer(allow_null=True))
    def get_match(self, session: AgentSession) -> dict[str, Any] | None:
        """With ``?search=``: the session's message that matched best, else ``null``."""
        found = self.context.get("matches", {}).get(session.pk)
        return found.as_data() if found is not None else None

    def get_owner(self, session: AgentSession) -> str:
        return str(session.owner.get_username())

    @extend_schema_field(SessionListUsageSerializer)
    def get_usage(self, session: AgentSession) -> dict[str, Any]:
        """The session's recorded model calls summed (the Django usage rows; the snapshot's
        ``usage`` is Dex's own total)."""
        if hasattr(session, "usage_requests"):
            return session_row_usage(session)
        total = session_usage_totals(session_ids=[session.pk]).get(session.pk)
        if total is None:
            return session_row_usage(session)  # zeros
        return {name: total[name] for name in SESSION_LIST_USAGE}

    def get_awaiting_approval(self, session: AgentSession) -> bool:
        pending = getattr(session, "pending_approval_count", None)
        if pending is None:
            pending = session.approval_requests.filter(state="pending").count()
        return bool(pending)


class SessionCreatedSerializer(SessionOutputSerializer):
    first_message = serializers.SerializerMethodField(
        help_text="Present when the first message did not start the session's turn at once: "
        "you already run DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER turns, so it waits (pending, "
        "pending_reason active_session_limit) and goes when one ends; or a budget of yours or "
        "of the agent is spent, so it waits in the queue (pending_reason budget, "
        "pending_detail naming the budget and when it resets) and goes when the budget "
        "allows it; null otherwise. With wait, where it stands when the answer is sent "
        "(delivered once a turn took it; a message a budget holds answers at once)."
    )

    class Meta(SessionOutputSerializer.Meta):
        fields: tuple[str, ...] = (*SessionOutputSerializer.Meta.fields, "first_message")

    @extend_schema_field(
        inline_serializer(
            "HeldFirstMessage",
            {
                "id": serializers.CharField(),
                "delivery": serializers.CharField(),
                "pending_reason": serializers.CharField(),
                "pending_detail": serializers.CharField(
                    help_text="The reason in words (a budget's names it and when it "
                    "resets); empty otherwise."
                ),
            },
            allow_null=True,
        )
    )
    def get_first_message(self, session: AgentSession) -> dict[str, str] | None:
        held = getattr(session, "first_message", None)
        if held is None:
            return None
        return {
            "id": held.id,
            "delivery": held.delivery,
            "pending_reason": held.pending_reason,
            "pending_detail": held.pending_detail,
        }


class WaitQuerySerializer(serializers.Serializer):
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


class AsyncListAPIView(AsyncAPIView, ListAPIView):
    """DRF's ``ListAPIView`` under ``AsyncAPIView``'s dispatch: a subclass writes ``async def``
    handlers and runs the list (ORM, pagination) with ``await db(self.list)(request)``."""


class QueuedMessageOutputSerializer(serializers.Serializer):
    """One queued or steered message, as the queue endpoint and the snapshot list it."""

    id = serializers.CharField(
        help_text="The message's ID: the one its POST answered (32 hex characters), kept "
        "from the outbox through delivery; the queue endpoints take it."
    )
    text = serializers.CharField()
    plan_mode = serializers.BooleanField()
    created_at = serializers.DateTimeField(
        allow_null=True, help_text="When the session accepted it (null for old messages)."
    )
    delivery = serializers.ChoiceField(
        choices=["delivered", "pending"],
        help_text="pending: accepted and kept by the platform while the engine or every "
        "worker did not answer, or while a budget is spent; it joins the session's queue "
        "once delivered.",
    )
    held_reason = serializers.CharField(
        required=False,
        help_text="Only on a pending message a spent budget holds: which budget and when it "
        "resets.",
    )


DELIVERY_FIELD = serializers.ChoiceField(
    choices=["delivered", "pending"],
    help_text="delivered: the engine has it. pending: the engine or every worker did not "
    "answer; the platform keeps it and delivers it once they do.",
)
SESSION_STOPPED_CONFLICT = error_response(
    409, CONFLICT, "The session is stopped; nothing changed."
)
SESSION_STOPPED_DETAIL = "This session is stopped; start a new one."


class SessionStopped(APIException):
    """409: the session is stopped, so nothing can be sent to it or change its queue."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = SESSION_STOPPED_DETAIL
    default_code = "session_stopped"


SNAPSHOT_FIELDS: dict[str, serializers.Field] = {
    "id": serializers.CharField(),
    "agent": serializers.CharField(),
    "model": serializers.CharField(),
    "title": serializers.CharField(),
    "owner": serializers.CharField(),
    "status": serializers.CharField(
        help_text="waiting_for_user_message, running_model, running_tools, "
        "waiting_for_user_input, starting before the session's first state, or stopped."
    ),
    "messages": SessionMessageSerializer(
        many=True,
        help_text="The newest retained messages, oldest first: at most 200, and as many as "
        "fit about 1 MiB (GET .../messages/ pages back through older ones).",
    ),
    "pending_interrupts": PendingInterruptSerializer(
        many=True, help_text="Tool calls waiting for a staff member's decision, oldest first."
    ),
    "awaiting_approval": serializers.BooleanField(),
    "tool_calls": ToolCallRecordSerializer(
        many=True,
        help_text="The running turn's tool calls in the model's order; empty between "
        "turns (the conversation in messages keeps every call and its result).",
    ),
    "usage": SessionUsageSerializer(help_text="Totals over every turn of the session."),
    "queued_message_count": serializers.IntegerField(),
    "queued_messages": QueuedMessageOutputSerializer(many=True),
    "steered_messages": QueuedMessageOutputSerializer(
        many=True,
        help_text="Messages steered into the running turn that its model has not seen yet.",
    ),
    "last_turn_error": serializers.CharField(allow_null=True),
    "has_older_messages": serializers.BooleanField(),
    "can_send": serializers.BooleanField(),
    "can_approve": serializers.BooleanField(),
    "events_after": serializers.CharField(
        allow_blank=True,
        help_text="AgentEvents resume token read before this snapshot ('' when none): "
        "connect /ws/sessions/<id>/events/?after=<it> to follow the session from here.",
    ),
    "live_events_after": serializers.CharField(
        allow_blank=True,
        help_text="Where a live view starts: before the running turn's turn_started, so "
        "the text it already streamed shows; events_after when no turn runs.",
    ),
    "turn_id": serializers.CharField(allow_null=True),
    "turn_mode": serializers.ChoiceField(
        choices=["chat", "planning", "executing"],
        help_text="What the running or last turn does: chat, planning (plan mode: only "
        "write_todos runs) or executing (the plan).",
    ),
    "pending_input": inline_serializer(
        "PendingUserInput",
        {
            "call_id": serializers.CharField(help_text="POST .../input/ names it."),
            "prompt": serializers.CharField(),
            "choices": serializers.ListField(
                child=serializers.CharField(), help_text="Empty for a free-text answer."
            ),
        },
        allow_null=True,
        help_text="The question the model asked (request_user_input), or null.",
    ),
    "pending_elicitations": inline_serializer(
        "PendingElicitation",
        {
            "kind": serializers.ChoiceField(choices=["elicitation"]),
            "elicitation_id": serializers.CharField(
                help_text="POST .../elicitations/<elicitation_id>/ answers it."
            ),
            "call_id": serializers.CharField(help_text="The tool call that asks."),
            "tool_name": serializers.CharField(),
            "server": serializers.CharField(help_text="The MCP server that asks."),
            "mode": serializers.ChoiceField(
                choices=["form", "url"],
                help_text="form: fill requested_schema; url: open url yourself, then "
                "answer accept (done), decline or cancel.",
            ),
            "message": serializers.CharField(help_text="The server's text for the user."),
            "requested_schema": serializers.DictField(
                allow_null=True,
                help_text="The form (MCP's restricted JSON Schema: a flat object of string, "
                "number, integer, boolean and enum properties, with required); null in "
                "URL mode.",
            ),
            "field_order": serializers.ListField(
                child=serializers.CharField(),
                help_text="The form's property names in the server's order (empty in URL "
                "mode); a JSON reader may not keep the order of requested_schema's keys.",
            ),
            "url": serializers.CharField(allow_null=True, help_text="URL mode only."),
            "requested_at": serializers.DateTimeField(),
            "deadline": serializers.DateTimeField(
                help_text="Unanswered by then, the server is told the question was "
                "cancelled."
            ),
        },
        many=True,
        help_text="Questions MCP servers ask during the running turn's tool calls, oldest "
        "first; each call waits for its answer.",
    ),
    "pending_timer": inline_serializer(
        "PendingTimer",
        {
            "call_id": serializers.CharField(),
            "fires_at": serializers.DateTimeField(),
            "duration_seconds": serializers.IntegerField(),
            "reason": serializers.CharField(),
        },
        allow_null=True,
        help_text="The running durable_wait, or null; steering a message ends it early.",
    ),
    "plan": inline_serializer(
        "SessionPlan",
        {
            "revision": serializers.IntegerField(),
            "status": serializers.ChoiceField(choices=["draft", "active", "completed"]),
            "tasks": inline_serializer(
                "PlanTask",
                {
                    "content": serializers.CharField(),
                    "status": serializers.ChoiceField(
                        choices=["pending", "in_progress", "completed"]
                    ),
                },
                many=True,
            ),
        },
        allow_null=True,
        help_text="The session's plan (null before the first one and once cleared).",
    ),
    "plan_execution_requested": serializers.BooleanField(
        help_text="POST .../plan/execute/ was accepted and its turn has not started yet."
    ),
    "summary": inline_serializer(
        name="ContextSummary",
        fields={
            "through_sequence": serializers.IntegerField(),
            "text": serializers.CharField(),
            "generation": serializers.IntegerField(),
            "first_retained_sequence": serializers.IntegerField(),
        },
        allow_null=True,
        help_text="Context compaction: the summary of messages 1..through_sequence the "
        "model sees instead of them; messages before first_retained_sequence were deleted. "
        "null until a compaction ran.",
    ),
}
SNAPSHOT_SCHEMA = inline_serializer(name="SessionSnapshot", fields=SNAPSHOT_FIELDS)


OWNER_ONLY_DETAIL = (
    "Only the session's owner may write to it (messages, its queue, answers, plan "
    "execution); staff may read it, stop it and decide its approvals."
)


class SessionOwnedMixin(DexErrorsMixin):
    """Look up the session from the URL: the owner's, or any for staff (who read every session
    they may approve); 404 for unknown or foreign IDs, so foreign IDs are not revealed."""

    def session_get(self, request: Request, session_id: str) -> AgentSession:
        try:
            return session_reads.session_get_for_owner_or_staff(
                user=request.user, session_id=session_id
            )
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None

    def session_get_for_owner(self, request: Request, session_id: str) -> AgentSession:
        """``session_get``, then 403 for staff reading someone else's session: only its owner
        writes to it."""
        session = self.session_get(request, session_id)
        if session.owner_id != request.user.pk:
            raise PermissionDenied(OWNER_ONLY_DETAIL)
        return session


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


def _wants_event_stream(request: Request) -> bool:
    return getattr(request.accepted_renderer, "format", "") == EventStreamRenderer.format


def event_stream_response(frames: Any) -> StreamingHttpResponse:
    """A ``text/event-stream`` answer streaming ``frames`` (bytes, ``session_events``): not
    cached, not buffered by proxies that honour ``X-Accel-Buffering``."""
    response = StreamingHttpResponse(frames, content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def release_database() -> None:
    """Close this request's database connections before a long wait, so a waiting request
    holds none (the next ORM call opens one again)."""
    await db(connections.close_all)()


class SnapshotWaitQuerySerializer(WaitQuerySerializer):
    events_after = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=512,
        help_text="With wait: answer as soon as the session's events go past this token "
        "(the events_after of the snapshot the client has); without it, at the session's "
        "next event from now.",
    )


#: How old a cached snapshot may get before a read asks the engine again whether the Flow
#: still runs (``session_flow_running``, no worker involved).
FLOW_CHECK_SECONDS = 5.0


def flow_check_due(cached: snapshot_cache.Entry, *, stopped: bool, now: Any) -> bool:
    """Whether a read served from ``cached`` must first ask the engine whether the session's
    Flow still runs: not for a stopped session, else once ``FLOW_CHECK_SECONDS`` passed since
    the entry's last check (``now``: an aware ``datetime``)."""
    return not stopped and (now - cached.flow_checked_at).total_seconds() > FLOW_CHECK_SECONDS


async def snapshot_read(request: Request, session: AgentSession) -> dict[str, Any]:
    """The ``GET /api/v1/sessions/<id>/`` answer for ``session`` (``SessionDetailApi``).

    A session that has not changed since its last read is answered from ``snapshot_cache``
    without the worker RPC (the stamp: its newest event token and its index row).

    Raises:
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError.
    """
    # Read before the snapshot: relaying from it then misses nothing the snapshot lacks.
    events_after = await dex_gateway.call(
        event_stream.session_events_tail_token(session_id=session.id)
    )
    stopped = session.status == SESSION_STATUS_STOPPED
    stamp = snapshot_cache.stamp_of(
        events_after=events_after, status=session.status, updated_at=session.updated_at
    )
    cached = await snapshot_cache.get(session.id, stamp)
    flow_running = None
    if cached is not None:
        # Nothing changed since the last read: no worker RPC. Whether the Flow still runs is
        # asked of the engine alone, at most every FLOW_CHECK_SECONDS.
        snapshot, read_at = cached.snapshot, cached.read_at
        now = timezone.now()
        if flow_check_due(cached, stopped=stopped, now=now):
            flow_running = await dex_gateway.call(
                dex_gateway.session_flow_running(session_id=session.id)
            )
            if flow_running:
                await snapshot_cache.put(
                    session.id, dataclasses.replace(cached, flow_checked_at=now)
                )
    else:
        read_at = timezone.now()
        snapshot_read = dex_gateway.call(dex_gateway.session_snapshot(session_id=session.id))
        if stopped:
            snapshot = await snapshot_read
        else:
            # A Flow stopped behind the index's back keeps its last status in the snapshot;
            # both reads at once: one engine round trip instead of two.
            snapshot, flow_running = await asyncio.gather(
                snapshot_read,
                dex_gateway.call(dex_gateway.session_flow_running(session_id=session.id)),
            )
        await snapshot_cache.put(
            session.id, snapshot_cache.Entry(stamp, snapshot, read_at, read_at)
        )
    answer: dict[str, Any] = await db(SessionDetailApi.answer)(
        request=request,
        session=session,
        snapshot=snapshot,
        read_at=read_at,
        flow_running=flow_running,
        events_after=events_after,
    )
    return answer


#: How long send-and-wait re-reads a snapshot that does not show the turn's end yet (the
#: turn_completed event is written just before its Step commits).
TURN_END_SETTLE_SECONDS = 2.0


def _budget_held(accepted: Mapping[str, Any] | None) -> bool:
    """Whether the message ``accepted`` describes (a send's answer, a held ``first_message``)
    waits because a budget is spent (``session_input.PENDING_BUDGET``)."""
    return accepted is not None and accepted.get("pending_reason") == session_input.PENDING_BUDGET


async def _frames_once(frame: bytes) -> AsyncIterator[bytes]:
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


class SessionDetailApi(SessionOwnedMixin, AsyncAPIView):
    """``GET /api/v1/sessions/<id>/`` (owner or staff): the session's live snapshot from Dex.

    Besides the snapshot: ``model``, ``title``, ``owner``, ``has_older_messages`` (older
    messages than the snapshot's 200 exist: page them with ``GET .../messages/?before=``),
    ``can_send`` (the caller owns it and it is not stopped), ``can_approve`` (staff),
    ``events_after`` (the newest AgentEvents token, read before the snapshot) and
    ``live_events_after`` (before the running turn's first event, else ``events_after``).
    A stopped session reports ``status`` ``stopped``, no running turn and no pending approval
    (its Flow no longer runs, so nothing can be decided).

    Long-poll: ``?wait=<seconds>&events_after=<token>`` answers as soon as the session's
    AgentEvents go past ``events_after`` (the ``events_after`` of the snapshot the client
    has; without it, the session's next event from now) with an event that can change the
    snapshot (streamed text, reasoning, tool progress and logs do not: they are for live
    views, ``session_events.LIVE_ONLY_TYPES``), or when ``wait`` runs out, with the
    snapshot as then; a token that is not this session's answers at once. The request holds
    no database connection while it waits. An event is written just before its Step commits,
    so a snapshot read right after it can, for a few milliseconds, lack that Step's change;
    its ``events_after`` is then past that event, and the change shows on the next read.
    """

    @extend_schema(
        parameters=[SnapshotWaitQuerySerializer],
        responses={
            200: SNAPSHOT_SCHEMA,
            400: error_response(
                400,
                field_errors_serializer(SnapshotWaitQuerySerializer, name="SnapshotQueryError"),
                "A bad wait or events_after.",
            ),
        },
    )
    async def get(self, request: Request, session_id: str) -> Response:
        session = await db(self.session_get)(request, session_id)
        query = SnapshotWaitQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        wait = query.validated_data.get("wait")
        if wait:
            # Long-poll: answer once the session's events go past the client's token.
            await release_database()
            after = query.validated_data.get("events_after")
            if after is None:
                after = await dex_gateway.call(
                    event_stream.session_events_tail_token(session_id=session.id)
                )
            # A token that is not this session's answers at once, with a fresh one.
            with contextlib.suppress(event_stream.EventsTokenInvalidError):
                await session_events.change_wait(session_id=session.id, after=after, seconds=wait)
        return Response(await snapshot_read(request, session))

    class SessionUpdateInputSerializer(BodySerializer):
        title = StrictCharField(
            required=False,
            max_length=session_lifecycle.SESSION_TITLE_MAX_CHARS,
            help_text="The new title, 1 to 200 characters once control characters (bidi "
            "controls included) are removed; no generated title replaces it.",
        )
        archived = StrictBooleanField(
            required=False,
            help_text="true archives the session (hidden from lists, still usable); false "
            "brings it back.",
        )

        def validate_title(self, value: str) -> str:
            title = title_without_controls(value)
            if not title:
                raise serializers.ValidationError("A title needs a character that shows.")
            return title

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            if not attrs:
                raise serializers.ValidationError(
                    {"non_field_errors": ["Give a title or archived."]}
                )
            return attrs

    @extend_schema(
        request=SessionUpdateInputSerializer,
        responses={
            200: SessionOutputSerializer,
            400: error_response(
                400,
                field_errors_serializer(
                    SessionUpdateInputSerializer, name="SessionUpdateInputError"
                ),
                "A bad title or archived, or neither.",
            ),
        },
    )
    async def patch(self, request: Request, session_id: str) -> Response:
        """Rename or archive the session (owner only; staff get 403)."""
        return Response(await db(self._update)(request, session_id))

    def _update(self, request: Request, session_id: str) -> dict[str, Any]:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.SessionUpdateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        values = serializer.validated_data
        if "title" in values:
            session_lifecycle.session_rename(session=session, title=values["title"])
        if "archived" in values:
            session_lifecycle.session_archive_set(session=session, archived=values["archived"])
        return dict(SessionOutputSerializer(session).data)

    @extend_schema(request=None, responses={204: None})
    async def delete(self, request: Request, session_id: str) -> Response:
        """Delete the session (owner or staff): its Flow is stopped, it leaves the index
        (404 everywhere from now on) and the engine deletes its history."""
        await db(self._delete)(request, session_id)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _delete(self, request: Request, session_id: str) -> None:
        session = self.session_get(request, session_id)
        body_refuse(request.data)
        session_lifecycle.session_delete(session=session)

    @staticmethod
    def answer(
        *,
        request: Request,
        session: AgentSession,
        snapshot: dict[str, Any],
        read_at: Any,
        flow_running: bool | None,
        events_after: str,
    ) -> dict[str, Any]:
        """The Django side of the answer (index writes, outbox, extras), in one thread hop."""
        session_lifecycle.session_status_record(
            session=session, status=snapshot["status"], observed_at=read_at
        )
        # flow_running is None for a cached snapshot checked recently (snapshot_read).
        if session.status != SESSION_STATUS_STOPPED and flow_running is not None:
            session_lifecycle.session_stopped_detect(session=session, flow_running=flow_running)
        if session.status == SESSION_STATUS_STOPPED:
            snapshot = session_reads.snapshot_as_stopped(snapshot=snapshot)
        snapshot = session_reads.snapshot_with_outbox(session=session, snapshot=snapshot)
        return session_detail_body(
            session_id=session.id,
            agent_slug=session.agent.slug,
            extras=session_reads.session_detail_extras(session=session, user=request.user),
            snapshot=snapshot,
            events_after=events_after,
            live_events_after=session_reads.session_live_events_after(
                session=session, snapshot=snapshot, events_after=events_after
            ),
        )


def session_detail_body(
    *,
    session_id: str,
    agent_slug: str,
    extras: dict[str, Any],
    snapshot: dict[str, Any],
    events_after: str,
    live_events_after: str,
) -> dict[str, Any]:
    """The ``GET /api/v1/sessions/<id>/`` answer (``SessionDetailApi``) from its parts, in the
    order of its keys: ``id``, ``agent`` (the agent's slug), ``extras``
    (``session_reads.session_detail_extras``), the snapshot as readers see it (stopped, with the
    outbox), ``events_after``, ``live_events_after``. No database access."""
    return {
        "id": session_id,
        "agent": agent_slug,
        **extras,
        **snapshot,
        "events_after": events_after,
        "live_events_after": live_events_after,
    }


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

#: How a send-and-wait ended (``turn_wait_answer``): the ``turn`` of ``MESSAGE_QUEUED`` and
#: of a session created with ``?wait=``.
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


class SessionCreatedWaitedSerializer(SessionCreatedSerializer):
    """The schema of ``POST /api/v1/sessions/``'s 201: the new session, plus ``turn`` and
    ``session`` when ``?wait=`` was given and the session has a first message."""

    turn = type(MESSAGE_TURN)(
        required=False,
        help_text="With wait: the session's first turn, and whether it ended within the wait.",
    )
    session = type(SNAPSHOT_SCHEMA)(
        required=False,
        help_text="With wait: the session's snapshot (as GET /api/v1/sessions/<id>/ answers) "
        "when the first turn ended or the wait ran out.",
    )

    class Meta(SessionCreatedSerializer.Meta):
        fields = (*SessionCreatedSerializer.Meta.fields, "turn", "session")


class SessionListCreateApi(DexErrorsMixin, AsyncListAPIView):
    """``GET /api/v1/sessions/`` lists the caller's sessions, staff: everyone's, newest first.

    Query: ``status`` (an index status, or ``awaiting_approval``), ``agent__slug``, ``search``
    (title, agent slug or name, or the words of a user or assistant message: each session
    then has ``match``, the message that matched with a snippet), ``archived`` (``true``:
    only archived sessions; default only the others), ``ordering`` (``created_at``,
    ``updated_at``, ``title``, ``status``, each may start with ``-``), ``limit``/``offset``.

    ``POST`` ``{"agent": slug, "message"?: str, "plan_mode"?: false, "tools"?: [exposed tool
    names]}`` starts one and answers 201 ``{"id", ...}``; ``plan_mode`` makes the first message
    ask for a plan (as on ``.../messages/``); ``tools`` narrows the agent's tools for this
    session. With
    ``?wait=<seconds>`` and a message, the answer waits for the first turn (as
    ``POST .../messages/?wait=`` does) and adds ``turn`` and ``session`` (the snapshot).
    """

    class SessionCreateInputSerializer(BodySerializer):
        agent = StrictCharField(max_length=64)
        message = StrictCharField(required=False, max_length=MESSAGE_MAX_CHARS)
        plan_mode = StrictBooleanField(
            required=False,
            default=False,
            help_text="The first message asks the agent for a plan before it acts.",
        )
        tools = serializers.ListField(
            child=StrictCharField(max_length=64), required=False, max_length=500
        )

        def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
            names = attrs.get("tools")
            if names is not None:
                offered = {tool.exposed_name for tool in attrs["agent"].exposed_tools()}
                unknown = sorted(set(names) - offered)
                if unknown:
                    raise serializers.ValidationError(
                        {"tools": [f"The agent has no tool named {name!r}." for name in unknown]}
                    )
            return attrs

        def validate_agent(self, value: str) -> AgentDefinition:
            try:
                agent = agent_catalog.agent_get_enabled(slug=value)
            except AgentDefinition.DoesNotExist:
                raise serializers.ValidationError(f"Unknown or disabled agent {value!r}.") from None
            request = self.context.get("request")
            reason = agent_catalog.agent_not_configured_reason(
                agent=agent, user=getattr(request, "user", None)
            )
            if reason is not None:
                raise serializers.ValidationError(
                    f"The agent {value!r} cannot start: its model provider is not configured. "
                    f"{reason}"
                )
            return agent

    serializer_class = SessionOutputSerializer
    filter_backends = (KnownQueryParametersFilter,)
    #: The list reads the Django index only.
    engine_methods = frozenset({"POST"})

    class SessionListQuerySerializer(serializers.Serializer):
        status = serializers.ChoiceField(
            choices=[*session_reads.SESSION_LIST_STATUSES],
            required=False,
            allow_blank=True,
            help_text="An index status (e.g. waiting_for_user_message, stopped), or "
            "awaiting_approval for sessions with a pending approval.",
        )
        agent__slug = serializers.CharField(required=False, allow_blank=True, max_length=64)
        search = serializers.CharField(
            required=False,
            allow_blank=True,
            max_length=200,
            help_text="Part of the title, agent slug or agent name, or words of a message.",
        )
        ordering = serializers.ChoiceField(
            choices=[*session_reads.SESSION_ORDERINGS],
            required=False,
            allow_blank=True,
            help_text="Sort key; default -created_at.",
        )
        archived = serializers.BooleanField(
            required=False,
            default=False,
            help_text="true: only archived sessions; false (default): only the others.",
        )

    @extend_schema(
        parameters=[SessionListQuerySerializer],
        responses={
            200: SessionOutputSerializer(many=True),
            400: error_response(
                400,
                field_errors_serializer(
                    SessionListQuerySerializer,
                    name="SessionListQueryError",
                    extra_fields=("limit", "offset"),
                ),
                "A bad filter, ordering, limit or offset.",
            ),
        },
    )
    async def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:  # type: ignore[override]
        response: Response = await db(self.list)(request, *args, **kwargs)
        return response

    #: What ``agents_app.api.query`` lets through besides ``limit`` and ``offset``.
    query_serializer_class = SessionListQuerySerializer

    def get_queryset(self) -> Any:
        query = self.SessionListQuerySerializer(data=query_values(self.request))
        query.is_valid(raise_exception=True)
        params = query.validated_data
        self.search_words = search_words(params.get("search", ""))
        return session_reads.session_list_visible(
            user=self.request.user,
            status=params.get("status", ""),
            agent_slug=params.get("agent__slug", ""),
            search=params.get("search", ""),
            ordering=params.get("ordering", ""),
            archived=params["archived"],
        )

    def get_serializer(self, *args: Any, **kwargs: Any) -> Any:
        """The list's serializer, with each listed session's best-matching message of the
        search (``session_search.message_matches_get``, one query for the page)."""
        words = getattr(self, "search_words", [])
        if words and args and kwargs.get("many"):
            rows = list(args[0])
            args = (rows, *args[1:])
            kwargs.setdefault("context", self.get_serializer_context())
            kwargs["context"]["matches"] = message_matches_get(
                words=words, session_ids=[row.pk for row in rows]
            )
        return super().get_serializer(*args, **kwargs)

    @extend_schema(
        request=SessionCreateInputSerializer,
        parameters=[WaitQuerySerializer],
        responses={
            201: SessionCreatedWaitedSerializer,
            400: error_response(
                400,
                field_errors_serializer(
                    SessionCreateInputSerializer,
                    name="SessionCreateInputError",
                    extra_fields=("wait",),
                ),
                "A bad agent, message, tools or wait.",
            ),
        },
    )
    async def post(self, request: Request) -> Response:
        query = WaitQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        wait = query.validated_data.get("wait")
        # A write: Dex's answer and the index row decide together, so it stays one sync unit.
        session, body = await db(self._create)(request)
        if not (wait and self._has_message(request)):
            return Response(body, status=status.HTTP_201_CREATED)
        # Send and wait: the first turn (the session's first turn_started) and its end; a
        # first message held by the running-turn cap is waited for by its outbox ID, which
        # the turn that takes it names in client_ids.
        held = body.get("first_message")
        _, waited = await turn_wait_answer(
            request, session, after="", client_id=held["id"] if held else "",
            seconds=0 if _budget_held(held) else wait,
        )
        # The index row as it is now (the turn changed its status), not as it was created.
        body = await db(self._created_again)(session)
        return Response({**body, **waited}, status=status.HTTP_201_CREATED)

    @staticmethod
    def _created_again(session: AgentSession) -> dict[str, Any]:
        session_reads.session_index_values_reload(session=session)
        return dict(SessionCreatedSerializer(session).data)

    @staticmethod
    def _has_message(request: Request) -> bool:
        message = request.data.get("message") if isinstance(request.data, dict) else None
        return isinstance(message, str) and bool(message.strip())

    def _create(self, request: Request) -> tuple[AgentSession, dict[str, Any]]:
        serializer = self.SessionCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = session_lifecycle.session_create(
            owner=request.user,
            agent=serializer.validated_data["agent"],
            message=serializer.validated_data.get("message", ""),
            plan_mode=serializer.validated_data["plan_mode"],
            tool_names=serializer.validated_data.get("tools"),
        )
        return session, dict(SessionCreatedSerializer(session).data)


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
        if not _wants_event_stream(request):
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
                "The session is stopped, or its queue is full (DEXAGENTS_MAX_QUEUED_MESSAGES "
                "messages wait, or their texts with this one would pass 2 MiB of JSON); "
                "nothing changed.",
            ),
        },
    )
    async def post(self, request: Request, session_id: str) -> Response | StreamingHttpResponse:
        query = WaitQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        wait = query.validated_data.get("wait")
        stream = _wants_event_stream(request)
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
        held = _budget_held(accepted)
        if stream:
            await release_database()
            opening = session_events.sse_event(
                json.dumps({"type": "message_accepted", **accepted}, separators=(",", ":"))
            )
            if held:
                return event_stream_response(_frames_once(opening))
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
        try:
            accepted = session_input.session_message_send(
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


#: Longer than any Channel message ID (36) or client_id (32): not worth asking Dex about.
QUEUED_MESSAGE_ID_MAX_CHARS = 64
QUEUED_MESSAGE_GONE = (
    "No such queued message: the agent already took it, it was steered or deleted, or it never "
    "was queued (a steered message can no longer be changed)."
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


#: The largest message sequence a session stores (``dex_agents.message_sequence_key``).
MAX_MESSAGE_SEQUENCE = 999_999_999_999


class QueuedMessageGone(NotFound):
    """404: the message is not (or no longer) waiting in the queue."""

    default_detail = QUEUED_MESSAGE_GONE
    default_code = "queued_message_not_found"


class SessionQueueApi(SessionOwnedMixin, AsyncAPIView):
    """``GET /api/v1/sessions/<id>/queue/`` (owner or staff): the messages waiting for the
    session, oldest first, read from Dex in one RPC.

    ``queued`` wait for a later turn and may be edited, deleted or steered by the owner;
    ``steered`` were steered into the running turn, which gives them to its model at its next
    safe boundary. Messages accepted while the engine or every worker did not answer follow
    at the tail of ``queued`` with ``delivery`` ``pending``; when the engine does not answer
    only those are listed and ``partial`` is true. A stopped session's queue is empty.
    """

    @extend_schema(
        responses={
            200: inline_serializer(
                "MessageQueue",
                {
                    "queued": QueuedMessageOutputSerializer(many=True),
                    "steered": QueuedMessageOutputSerializer(many=True),
                    "partial": serializers.BooleanField(
                        help_text="The engine did not answer: only the messages the platform "
                        "still keeps (delivery pending) are listed."
                    ),
                },
            ),
        },
    )
    async def get(self, request: Request, session_id: str) -> Response:
        session = await db(self.session_get)(request, session_id)
        if session.status == SESSION_STATUS_STOPPED:
            return Response({"queued": [], "steered": [], "partial": False})
        # The outbox first, as session_reads.message_queue_get reads them.
        kept = await db(session_reads.message_queue_kept)(session=session)
        try:
            queue = await dex_gateway.call(
                dex_gateway.session_message_queue(session_id=session.id)
            )
        except dex_gateway.EngineUnavailableError:
            queue = None
        return Response(session_reads.message_queue_merge(queue=queue, kept=kept))


class QueuedMessageMixin(SessionOwnedMixin):
    """Checks shared by the queue writes: the owner's session (staff 403, others 404), not
    stopped (409), and a plausible message ID (404 otherwise, without asking Dex)."""

    def session_get_for_queue_write(
        self, request: Request, session_id: str, message_id: str
    ) -> AgentSession:
        session = self.session_get_for_owner(request, session_id)
        if len(message_id) > QUEUED_MESSAGE_ID_MAX_CHARS:
            raise QueuedMessageGone()
        return session

    @staticmethod
    def refuse_stopped(session: AgentSession) -> None:
        if session.status == SESSION_STATUS_STOPPED:
            raise SessionStopped()


class QueuedMessageApi(QueuedMessageMixin, APIView):
    """``/api/v1/sessions/<id>/queue/<message_id>/`` (owner only).

    ``DELETE``: remove a queued message; 204, or 404 once a turn took it.

    ``PUT`` ``{"text", "plan_mode"?: false}`` (edit): remove the message and queue ``text`` at
    the tail, in one transaction; 201 ``{"id", "delivery"}`` with the new message's Channel
    message ID. 404 when the message was already taken (then nothing changed); 400 for blank
    text.

    A message the platform still keeps (``delivery`` ``pending``) is deleted or edited there,
    without asking the engine; an edit is then accepted like a new message.

    Both: 403 for staff on someone else's session, 404 for other users, 409 when the session
    is stopped, 503 when the engine does not answer.
    """

    class QueuedMessageInputSerializer(BodySerializer):
        text = StrictCharField(max_length=MESSAGE_MAX_CHARS)
        plan_mode = StrictBooleanField(
            required=False, help_text="Left out: the old message's plan_mode is kept."
        )

    @extend_schema(
        request=None,
        responses={
            204: None,
            409: SESSION_STOPPED_CONFLICT,
        },
    )
    def delete(self, request: Request, session_id: str, message_id: str) -> Response:
        session = self.session_get_for_queue_write(request, session_id, message_id)
        self.refuse_stopped(session)
        if not session_input.queued_message_delete(session=session, message_id=message_id):
            raise QueuedMessageGone()
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(
        request=QueuedMessageInputSerializer,
        responses={
            201: inline_serializer(
                "QueuedMessageReplaced",
                {
                    "id": serializers.CharField(help_text="The new message's ID."),
                    "delivery": DELIVERY_FIELD,
                },
            ),
            409: SESSION_STOPPED_CONFLICT,
        },
    )
    def put(self, request: Request, session_id: str, message_id: str) -> Response:
        session = self.session_get_for_queue_write(request, session_id, message_id)
        serializer = self.QueuedMessageInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        self.refuse_stopped(session)
        plan_mode = serializer.validated_data.get("plan_mode")
        if plan_mode is None:
            plan_mode = session_input.queued_message_plan_mode(
                session=session, message_id=message_id
            )
            if plan_mode is None:
                raise QueuedMessageGone()
        try:
            replaced = session_input.queued_message_replace(
                session=session,
                message_id=message_id,
                text=serializer.validated_data["text"],
                plan_mode=plan_mode,
            )
        except session_input.QueueFullError:
            raise QueueFull() from None
        if replaced is None:
            raise QueuedMessageGone()
        return Response(
            {"id": replaced.id, "delivery": replaced.delivery}, status=status.HTTP_201_CREATED
        )


class QueuedMessageSteerApi(QueuedMessageMixin, APIView):
    """``POST /api/v1/sessions/<id>/queue/<message_id>/steer/`` (owner only): steer a queued
    message into the running turn.

    202 ``{"steered": true}``: the message moved to the steered queue; the turn applies it at
    its next safe boundary (tool calls that have not started end ``cancelled``, pending
    approvals are withdrawn, and the model's next call sees the message), announced by a
    ``steer_applied`` event. A message the platform still keeps (``delivery`` ``pending``) is
    steered right after its delivery. 409 ``{"detail", "reason": "budget"}`` for a message a
    spent budget holds (no turn may take it before the budget allows it; ``detail`` is the
    budget's sentence), and nothing changes. 404 once a turn took it; 403, 409 and 503 as
    for ``DELETE``.
    """

    @extend_schema(
        request=None,
        responses={
            202: inline_serializer("QueuedMessageSteered", {"steered": serializers.BooleanField()}),
            409: error_response(
                409,
                inline_serializer(
                    "QueuedMessageSteerConflict",
                    {
                        "detail": serializers.CharField(),
                        "reason": serializers.ChoiceField(
                            choices=[session_input.PENDING_BUDGET],
                            required=False,
                            help_text="budget: a spent budget holds the message.",
                        ),
                    },
                ),
                "The session is stopped, or a spent budget holds the message (reason "
                "budget); nothing changed.",
            ),
        },
    )
    def post(self, request: Request, session_id: str, message_id: str) -> Response:
        session = self.session_get_for_queue_write(request, session_id, message_id)
        body_refuse(request.data)
        self.refuse_stopped(session)
        try:
            steered = session_input.queued_message_steer(session=session, message_id=message_id)
        except session_input.MessageHeldError as held:
            return Response(
                {"detail": str(held), "reason": session_input.PENDING_BUDGET},
                status=status.HTTP_409_CONFLICT,
            )
        if not steered:
            raise QueuedMessageGone()
        return Response({"steered": True}, status=status.HTTP_202_ACCEPTED)


#: Longer than any tool call ID a provider hands out; not worth asking Dex about.
USER_INPUT_CALL_ID_MAX_CHARS = 255


class UserInputNotPending(APIException):
    """409: no question with that call ID waits for an answer."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = (
        "No question with this call_id waits for an answer: it was answered, a steered "
        "message withdrew it, or it was never asked."
    )
    default_code = "user_input_not_pending"


class SessionUserInputApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/input/`` (owner only) ``{"call_id", "answer"}``: answer the
    question the session's model asked with the built-in ``request_user_input`` tool.

    ``call_id`` is the snapshot's ``pending_input.call_id``. 202 ``{"answered": true}``: the
    turn goes on, with the answer in the conversation as a user message right after the
    question's tool result (``user_input_answered`` event). 409 ``{"detail"}`` when no
    question with that ``call_id`` is open (answered already, or withdrawn by a steered
    message), or the session is stopped; 400 with field messages for a missing or blank
    field; 403 for staff on someone else's session, 404 for other users; 503 when the engine
    does not answer.
    """

    class UserInputAnswerSerializer(BodySerializer):
        call_id = StrictCharField(
            max_length=USER_INPUT_CALL_ID_MAX_CHARS,
            help_text="The open question's call_id (the snapshot's pending_input.call_id).",
        )
        answer = StrictCharField(
            max_length=MESSAGE_MAX_CHARS, help_text="One of the choices, or free text."
        )

    @extend_schema(
        request=UserInputAnswerSerializer,
        responses={
            202: inline_serializer("UserInputAnswered", {"answered": serializers.BooleanField()}),
            409: error_response(
                409,
                CONFLICT,
                "No question with this call_id is open (answered, withdrawn by a steered "
                "message, or never asked), or the session is stopped.",
            ),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.UserInputAnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            raise SessionStopped()
        if not session_input.user_input_answer(
            session=session,
            call_id=serializer.validated_data["call_id"],
            answer=serializer.validated_data["answer"],
        ):
            raise UserInputNotPending()
        return Response({"answered": True}, status=status.HTTP_202_ACCEPTED)


#: What a refused answer to an MCP server's question (``dex_agents.ElicitationAnswerResult``)
#: means.
ELICITATION_REFUSALS = {
    "not_pending": (
        "This question no longer waits for an answer: it was answered, it expired, or the "
        "session withdrew it (a steered message, the tool call ended)."
    ),
    "expired": "This question expired before the answer arrived; the server was told cancel.",
    "session_stopped": SESSION_STOPPED_DETAIL,
}


class ElicitationNotPending(APIException):
    """409 ``{"detail", "reason"}``: the question does not wait for an answer."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "elicitation_not_pending"

    def __init__(self, reason: str) -> None:
        detail = ELICITATION_REFUSALS.get(reason, ELICITATION_REFUSALS["not_pending"])
        super().__init__({"detail": detail, "reason": reason})


#: The key of messages about an answer's content as a whole (DRF's own name for them).
NON_FIELD_ERRORS = "non_field_errors"


class SessionElicitationAnswerApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/elicitations/<elicitation_id>/`` (owner only)
    ``{"action", "content"?}``: answer a question an MCP server asks during one of the
    session's running tool calls (the snapshot's ``pending_elicitations``).

    ``action`` is ``accept`` (a form: with ``content``, the values by field name, checked
    against the server's ``requested_schema``; URL mode: "done", without content),
    ``decline`` or ``cancel``. 202 ``{"answered": true, "action"}``: the call goes on with the
    answer (``elicitation_closed``). 400 with messages per field, under ``content`` (messages
    about the content as a whole under ``content.non_field_errors``); the question keeps
    waiting. 409 ``{"detail", "reason"}`` when it no longer waits (``not_pending``,
    ``expired``, ``session_stopped``); 403 for staff on someone else's session, 404 for other
    users; 503 when the engine or the worker does not answer.
    """

    class ElicitationAnswerSerializer(BodySerializer):
        action = serializers.ChoiceField(
            choices=["accept", "decline", "cancel"],
            help_text="accept: the values in content (a form) or done (URL mode); decline: "
            "no; cancel: dismiss the question.",
        )
        content = serializers.DictField(
            required=False,
            allow_null=True,
            help_text="accept on a form only: {field name: value}; text, number, boolean, or "
            "a list of choices for a multiple-choice field.",
        )

    @extend_schema(
        request=ElicitationAnswerSerializer,
        responses={
            202: inline_serializer(
                "ElicitationAnswered",
                {
                    "answered": serializers.BooleanField(),
                    "action": serializers.ChoiceField(choices=["accept", "decline", "cancel"]),
                },
            ),
            409: inline_serializer(
                "ElicitationNotPendingError",
                {
                    "detail": serializers.CharField(),
                    "reason": serializers.ChoiceField(choices=sorted(ELICITATION_REFUSALS)),
                },
            ),
        },
    )
    def post(self, request: Request, session_id: str, elicitation_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.ElicitationAnswerSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            raise ElicitationNotPending("session_stopped")
        action = serializer.validated_data["action"]
        result = session_input.elicitation_answer(
            session=session,
            elicitation_id=elicitation_id,
            action=action,
            content=serializer.validated_data.get("content"),
        )
        if result.reason == "invalid":
            errors = {
                (name or NON_FIELD_ERRORS): list(messages)
                for name, messages in result.errors.items()
            }
            raise ValidationError({"content": errors})
        if not result.accepted:
            raise ElicitationNotPending(result.reason)
        return Response({"answered": True, "action": action}, status=status.HTTP_202_ACCEPTED)


#: What a refused plan execution's ``reason`` (``dex_agents.PlanExecutionResult``) means.
PLAN_REFUSALS = {
    "stale_revision": (
        "That revision is not the session's current plan; read the session again and review "
        "the current plan."
    ),
    "not_executable": "The plan has nothing left to execute: every task is completed.",
    "busy": (
        "The session is busy: a turn is running or waits for an answer. Execute the plan once "
        "the session waits for a message."
    ),
    "queued": "Messages wait in the queue; they run first. Execute the plan after them.",
    "already_requested": "Execution of the plan was already requested.",
    "no_session": "The session has not started yet.",
    "no_plans": "This session does not support plans.",
    "session_stopped": SESSION_STOPPED_DETAIL,
}


class PlanNotExecutable(APIException):
    """409 ``{"detail", "reason"}``: the plan cannot be executed now, and why."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "plan_not_executable"

    def __init__(self, reason: str) -> None:
        detail = PLAN_REFUSALS.get(reason, f"The plan cannot be executed now ({reason}).")
        super().__init__({"detail": detail, "reason": reason})


class SessionPlanExecuteApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/plan/execute/`` (owner only) ``{"revision"}``: execute the
    session's plan, or continue an active plan with unfinished tasks.

    ``revision`` is the plan revision the user reviewed (the snapshot's ``plan.revision``).
    202 ``{"requested": true, "revision"}``: an ``executing`` turn starts without a user
    message (``plan_started``); until it does the snapshot's ``plan_execution_requested`` is
    true. 409 ``{"detail", "reason"}`` otherwise, ``reason`` one of ``stale_revision`` (not
    the current plan), ``not_executable`` (completed), ``busy`` (a turn runs or waits for an
    answer), ``queued`` (messages wait in the queue), ``already_requested``, ``no_session``,
    ``no_plans`` or ``session_stopped``. 400 for a missing or bad ``revision``; 403, 404 and
    503 as for the other writes.
    """

    class PlanExecuteInputSerializer(BodySerializer):
        revision = StrictIntegerField(
            min_value=1, help_text="The reviewed plan revision (the snapshot's plan.revision)."
        )

    @extend_schema(
        request=PlanExecuteInputSerializer,
        responses={
            202: inline_serializer(
                "PlanExecutionRequested",
                {"requested": serializers.BooleanField(), "revision": serializers.IntegerField()},
            ),
            409: inline_serializer(
                "PlanNotExecutableError",
                {
                    "detail": serializers.CharField(),
                    "reason": serializers.ChoiceField(choices=sorted(PLAN_REFUSALS)),
                },
            ),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.PlanExecuteInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            raise PlanNotExecutable("session_stopped")
        revision = serializer.validated_data["revision"]
        result = session_input.plan_execute(session=session, revision=revision)
        if not result.accepted:
            raise PlanNotExecutable(result.reason)
        return Response(
            {"requested": True, "revision": revision}, status=status.HTTP_202_ACCEPTED
        )


TURN_CANCEL_REFUSALS = {
    "no_turn": "No turn is running, so there is nothing to cancel.",
    "turn_ended": "The turn named is not the one running.",
    "session_stopped": SESSION_STOPPED_DETAIL,
}


def turn_cancel_refusal(*, reason: str, asked: str, running: str | None) -> str:
    """The 409 ``detail`` of a refused cancel: which turn runs (or that none does) and, when
    the request named a turn (``asked``, ``""`` when it did not), that it is not that one."""
    if reason == "turn_ended" and asked:
        now = f"{running} is running now" if running else "another turn is running now"
        return (
            f"{asked} is not the running turn: {now}. Cancel that one, or leave turn_id out "
            "to cancel whichever turn runs."
        )
    if reason == "no_turn" and asked:
        return f"No turn is running, so there is nothing to cancel ({asked} is not running)."
    return TURN_CANCEL_REFUSALS.get(reason, TURN_CANCEL_REFUSALS["no_turn"])


class NoTurnRunning(APIException):
    """409 ``{"detail", "reason"}``: there is no running turn to cancel, or not the one named
    (then ``running_turn_id`` names the one that runs)."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "no_turn"

    def __init__(self, reason: str, *, asked: str = "", running: str | None = None) -> None:
        detail = turn_cancel_refusal(reason=reason, asked=asked, running=running)
        body = {"detail": detail, "reason": reason}
        if running:
            body["running_turn_id"] = running
        super().__init__(body)


class SessionTurnCancelApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/turn/cancel/`` (owner only): cancel the running turn
    ("Stop generating"); the session goes on.

    Optional body ``{"turn_id"}``: cancel only that turn (``turn-<n>``, as events and messages
    name it), so a late request cannot end the turn after it.

    202 ``{"cancelled": true, "turn_id", "status", "delivery"}``: the model call that is
    streaming is
    abandoned and the text it had sent is kept as the turn's last message, marked
    ``interrupted``; tool calls that have not started end ``cancelled``, running ones finish
    and keep their records, pending approvals are withdrawn, and the turn ends with a
    ``turn_cancelled`` event (``status`` is the session's status as indexed when the cancel
    was accepted). Queued messages stay queued: the next one starts a normal turn. Sending it
    again for the same turn changes nothing and answers 202 again. ``delivery`` is
    ``delivered``, or ``pending`` when no Dex worker answered (a restart): the cancel is kept
    and delivered once one does, and the turn ends then (``turn_id`` is then the one asked
    for, or null). 409 ``{"detail", "reason"}`` with ``reason`` ``no_turn`` when no turn runs,
    ``turn_ended`` when another turn than ``turn_id`` runs (``running_turn_id`` names it, and
    ``detail`` says both), ``session_stopped`` for a stopped
    session; 400 for a bad ``turn_id``; 403 for staff on someone else's session, 404 for other
    users; 503 when Dex does not answer and the session's index shows no turn running.
    """

    class TurnCancelInputSerializer(BodySerializer):
        turn_id = serializers.RegexField(
            r"^turn-[1-9][0-9]{0,8}$",
            required=False,
            max_length=16,
            help_text="Cancel only this turn (turn-<n>); left out: whichever runs.",
        )

    @extend_schema(
        request=TurnCancelInputSerializer,
        responses={
            202: inline_serializer(
                "TurnCancelAccepted",
                {
                    "cancelled": serializers.BooleanField(),
                    "turn_id": serializers.CharField(
                        allow_null=True,
                        help_text="The turn being cancelled (null: a kept cancel for "
                        "whichever turn runs).",
                    ),
                    "status": serializers.CharField(
                        help_text="The session's indexed status when the cancel was accepted."
                    ),
                    "delivery": DELIVERY_FIELD,
                },
            ),
            409: inline_serializer(
                "NoTurnRunningError",
                {
                    "detail": serializers.CharField(
                        help_text="Which turn runs (or that none does) and, when turn_id "
                        "was given, that it is not that one."
                    ),
                    "reason": serializers.ChoiceField(choices=sorted(TURN_CANCEL_REFUSALS)),
                    "running_turn_id": serializers.CharField(
                        required=False,
                        help_text="turn_ended only: the turn that runs.",
                    ),
                },
            ),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        serializer = self.TurnCancelInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            raise NoTurnRunning("session_stopped")
        result = session_input.session_turn_cancel(
            session=session, turn_id=serializer.validated_data.get("turn_id", "")
        )
        if not result.accepted:
            raise NoTurnRunning(
                result.reason,
                asked=serializer.validated_data.get("turn_id", ""),
                running=result.turn_id if result.reason == "turn_ended" else None,
            )
        session.refresh_from_db(fields=["status"])
        return Response(
            {
                "cancelled": True,
                "turn_id": result.turn_id,
                "status": session.status,
                "delivery": result.delivery,
            },
            status=status.HTTP_202_ACCEPTED,
        )


#: Steps whose input is the ID of the tool call they belong to (``dex_agents`` Steps).
TOOL_CALL_STEPS = frozenset({
    "AwaitToolApproval", "CallTool", "CallSingleAttemptTool", "RecordToolFailure",
    "RecordToolOutcomeUnknown", "DurableWait", "AwaitUserInput",
})


class SessionHistoryApi(SessionOwnedMixin, AsyncAPIView):
    """``GET /api/v1/sessions/<id>/history/``: the session's ended Step methods, oldest first
    (the chat page's Timeline tab reads it; owner and staff)."""

    @extend_schema(
        responses={
            200: inline_serializer(
                "StepHistoryEntry",
                {
                    "step_type": serializers.CharField(),
                    "step_execution_id": serializers.CharField(
                        help_text="``<step_type>-<n>``, shared by both methods and every "
                        "attempt of one Step execution."
                    ),
                    "event_type": serializers.ChoiceField(
                        choices=sorted(dex_gateway.HISTORY_EVENT_TYPES)
                    ),
                    "method": serializers.ChoiceField(choices=["wait_for", "execute"]),
                    "status": serializers.ChoiceField(choices=["completed", "failed"]),
                    "final_attempt": serializers.IntegerField(
                        help_text="The one-based attempt that ended the method."
                    ),
                    "started_at": serializers.DateTimeField(
                        allow_null=True,
                        help_text="When the method's first attempt began (UTC).",
                    ),
                    "duration_seconds": serializers.FloatField(
                        help_text="Seconds from started_at to the end, retries included."
                    ),
                    "failed_attempt": serializers.IntegerField(
                        allow_null=True,
                        help_text="The attempt `error` belongs to: the last that failed.",
                    ),
                    "error": serializers.CharField(
                        allow_null=True,
                        help_text="That attempt's error (at most 1,000 characters).",
                    ),
                    "tool_call_id": serializers.CharField(
                        allow_null=True,
                        help_text="The tool call a tool, approval, wait or question Step "
                        "belongs to.",
                    ),
                    "tool_name": serializers.CharField(
                        allow_null=True,
                        help_text="That call's tool, when the Step recorded it (approvals).",
                    ),
                    "outcome": serializers.ChoiceField(
                        choices=sorted(STEP_OUTCOMES),
                        allow_null=True,
                        help_text="What a completed method's ending meant, when `status` "
                        "alone hides it: a model call refused by the provider (`failed`) or "
                        "cancelled; an approval approved, rejected, withdrawn or expired.",
                    ),
                    "outcome_detail": serializers.CharField(
                        allow_null=True,
                        help_text="That outcome's detail: the provider's refusal, the "
                        "rejection message (at most 1,000 characters).",
                    ),
                },
                many=True,
            )
        }
    )
    async def get(self, request: Request, session_id: str) -> Response:
        session = await db(self.session_get)(request, session_id)
        entries = await dex_gateway.call(dex_gateway.session_history(session_id=session.id))
        return Response([_history_entry_data(entry) for entry in entries])


def _history_entry_data(entry: StepHistoryEntry) -> dict[str, Any]:
    """One ``/history/`` item (see ``SessionHistoryApi``'s schema)."""
    return {
        "step_type": entry.step_type,
        "step_execution_id": entry.step_execution_id,
        "event_type": entry.event_type,
        "method": "wait_for" if entry.event_type.startswith("step_wait_for") else "execute",
        "status": "failed" if entry.event_type.endswith("_failed") else "completed",
        "final_attempt": entry.final_attempt,
        "started_at": (
            entry.started_at.isoformat().replace("+00:00", "Z") if entry.started_at else None
        ),
        "duration_seconds": round(entry.duration_seconds, 3),
        "failed_attempt": entry.failed_attempt,
        "error": entry.failure,
        "tool_call_id": entry.input_text if entry.step_type in TOOL_CALL_STEPS else None,
        "tool_name": entry.tool_name,
        "outcome": entry.outcome,
        "outcome_detail": entry.outcome_detail,
    }


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """``GET /healthz`` (no auth): 200 when web, engine and worker are up, else 503.

    Body: ``{"web": "up", "engine": "up"|"down", "worker": "up"|"down"}``; a 503 adds
    ``detail`` and ``unavailable`` (the first part down), as every 503 of the API does.
    """
    parts = platform_health.health_get()
    return JsonResponse(parts, status=503 if "unavailable" in parts else 200)


class SchemaView(SpectacularAPIView):
    """``GET /api/schema/``: drf-spectacular's schema view whose errors are JSON.

    The schema itself is YAML (``application/vnd.oai.openapi``) or JSON (``?format=json``),
    but a 401 for an anonymous caller is ``{"detail"}`` as JSON like every API error, not a
    YAML document.
    """

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        if response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)


class SessionArchiveApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/archive/`` and ``.../unarchive/`` (owner only): the same
    as ``PATCH .../`` with ``{"archived": true}`` or ``false``; 200 with the session."""

    archived = True
    engine_methods: frozenset[str] = frozenset()

    @extend_schema(request=None, responses={200: SessionOutputSerializer})
    def post(self, request: Request, session_id: str) -> Response:
        session = self.session_get_for_owner(request, session_id)
        body_refuse(request.data)
        session_lifecycle.session_archive_set(session=session, archived=self.archived)
        return Response(SessionOutputSerializer(session).data)


class SessionUnarchiveApi(SessionArchiveApi):
    __doc__ = SessionArchiveApi.__doc__
    archived = False


class SessionStopApi(DexErrorsMixin, APIView):
    """``POST /api/v1/sessions/<id>/stop/`` (owner or staff): stop the session's Dex Flow.

    202 ``{"status": "stopped"}``; the index row becomes ``stopped`` and the snapshot stays
    readable. Other users get 404, as for an unknown session.
    """

    @extend_schema(
        request=None,
        responses={
            202: inline_serializer(
                "SessionStopAccepted",
                {
                    "status": serializers.ChoiceField(
                        choices=[SESSION_STATUS_STOPPED],
                        help_text="The session's index status, now stopped.",
                    )
                },
            )
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        try:
            session = session_reads.session_get_for_owner_or_staff(
                user=request.user, session_id=session_id
            )
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None
        body_refuse(request.data)
        session_lifecycle.session_stop(session=session)
        return Response({"status": session.status}, status=status.HTTP_202_ACCEPTED)
