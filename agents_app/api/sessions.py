"""The sessions resource: ``/api/v1/sessions/`` and a session's own URL, archive and stop.

``SessionListCreateApi`` lists sessions (from the Django index, with search matches) and
starts them (``?wait=`` waits for the first turn); ``SessionDetailApi`` answers the snapshot
(with long-poll), renames, archives and deletes; ``SessionArchiveApi``,
``SessionUnarchiveApi`` and ``SessionStopApi`` act on the index row and the Flow. A listed or
created session's fields are ``SessionOutputSerializer``'s and ``SessionCreatedSerializer``'s;
the snapshot's are documented in ``session_schema.SNAPSHOT_FIELDS``.

May import: of ``agents_app.api``: ``events``, ``messages`` (the message length limit),
``snapshot`` and the shared modules (``async_views``, ``fields``, ``query``, ``schema``,
``session_access``, ``session_schema``); the live relay, the domain and everything below it.
"""

import contextlib
from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.async_views import AsyncAPIView, AsyncListAPIView, db, release_database
from agents_app.api.events import MESSAGE_TURN, WaitQuerySerializer, budget_held, turn_wait_answer
from agents_app.api.fields import BodySerializer, StrictBooleanField, StrictCharField, body_refuse
from agents_app.api.messages import MESSAGE_MAX_CHARS
from agents_app.api.query import KnownQueryParametersFilter, query_values
from agents_app.api.schema import error_response, field_errors_serializer
from agents_app.api.session_access import DexErrorsMixin, SessionOwnedMixin
from agents_app.api.session_schema import SNAPSHOT_SCHEMA, SessionListUsageSerializer
from agents_app.api.snapshot import snapshot_read
from agents_app.gateway import dex_gateway, event_stream
from agents_app.live import session_events
from agents_app.models import SESSION_STATUS_STOPPED, AgentDefinition, AgentSession
from agents_app.selectors import agent_catalog, session_reads
from agents_app.selectors.agent_catalog import agent_get_enabled
from agents_app.services import session_lifecycle
from agents_app.services.session_lifecycle import session_create
from agents_app.sessions.session_search import message_matches_get, search_words
from agents_app.usage.usage_records import (
    SESSION_LIST_USAGE,
    session_row_usage,
    session_usage_totals,
)
from agents_app.worker.titles import title_without_controls


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
    parent_session = serializers.CharField(
        source="parent_id",
        read_only=True,
        allow_null=True,
        help_text="Subagents: the session whose agent__<slug> call started this one, else null.",
    )

    class Meta:
        model = AgentSession
        fields: tuple[str, ...] = (
            "id",
            "agent",
            "owner",
            "title",
            "status",
            "parent_session",
            "parent_tool_call_id",
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
    only archived sessions; default only the others), ``parent`` (a session ID: only the
    child sessions its subagent calls started), ``ordering`` (``created_at``,
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
                agent = agent_get_enabled(slug=value)
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
        # A declared field, not the Field.parent attribute: DRF's metaclass moves it into
        # _declared_fields, so the query parameter can keep its name.
        parent = serializers.CharField(  # type: ignore[assignment]
            required=False,
            allow_blank=True,
            max_length=255,
            help_text="Subagents: only the child sessions this session's agent__<slug> calls "
            "started (each with parent_tool_call_id).",
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
            parent=params.get("parent", ""),
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
            seconds=0 if budget_held(held) else wait,
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
        session = session_create(
            owner=request.user,
            agent=serializer.validated_data["agent"],
            message=serializer.validated_data.get("message", ""),
            plan_mode=serializer.validated_data["plan_mode"],
            tool_names=serializer.validated_data.get("tools"),
        )
        return session, dict(SessionCreatedSerializer(session).data)


class SnapshotWaitQuerySerializer(WaitQuerySerializer):
    events_after = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=512,
        help_text="With wait: answer as soon as the session's events go past this token "
        "(the events_after of the snapshot the client has); without it, at the session's "
        "next event from now.",
    )


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
