"""REST API under ``/api/v1/`` and the ``/healthz`` probe.

Every API view requires an authenticated user (token or session) and only ever sees the
caller's own sessions; another user's session answers 404 like an unknown one. Views parse,
call a selector or service, and shape the answer; Dex errors map to 503 (engine
unreachable) and 404 (engine has no such session).
"""

from typing import Any

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, NotFound
from rest_framework.generics import ListAPIView
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app import dex_gateway, selectors, services
from agents_app.models import AgentDefinition, AgentSession
from agents_app.selectors import (
    agent_get_enabled,
    agent_list_enabled,
    health_get,
    session_get_for_owner,
    session_history_get,
    session_list_for_owner,
    session_snapshot_get,
)
from agents_app.services import (
    SESSION_STATUS_STOPPED,
    session_create,
    session_message_send,
    session_status_record,
)

MESSAGE_MAX_CHARS = 100_000


class EngineUnavailable(APIException):
    """503: the Dex engine did not answer."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "The Dex engine is not reachable; try again shortly."
    default_code = "engine_unavailable"


class DexErrorsMixin:
    """Translate ``dex_gateway`` errors raised by a view into API errors."""

    def handle_exception(self, exc: Exception) -> Response:
        if isinstance(exc, dex_gateway.EngineUnavailableError):
            exc = EngineUnavailable(str(exc))
        elif isinstance(exc, dex_gateway.SessionNotFoundError):
            exc = NotFound("The engine has no record of this session.")
        return super().handle_exception(exc)  # type: ignore[misc]


def _provider_reason(reason: str, *, request: Any) -> str:
    """The provider check's reason for staff; others learn only that an administrator must act.

    The detailed reason names environment variables, which only operators need to know.
    """
    user = getattr(request, "user", None)
    if user is not None and user.is_staff:
        return reason
    return "An administrator must configure its API key."


class AgentListApi(ListAPIView):
    """``GET /api/v1/agents/``: enabled agents."""

    class AgentOutputSerializer(serializers.ModelSerializer):
        tools = serializers.SerializerMethodField()
        configured = serializers.SerializerMethodField()
        not_configured_reason = serializers.SerializerMethodField()

        class Meta:
            model = AgentDefinition
            fields = (
                "slug", "name", "description", "model", "tools", "configured",
                "not_configured_reason",
            )

        def get_tools(self, agent: AgentDefinition) -> list[str]:
            return [tool.exposed_name for tool in agent.exposed_tools()]

        def get_configured(self, agent: AgentDefinition) -> bool:
            return agent.provider_status().configured

        def get_not_configured_reason(self, agent: AgentDefinition) -> str | None:
            status = agent.provider_status()
            if status.configured:
                return None
            return _provider_reason(status.reason, request=self.context.get("request"))

    serializer_class = AgentOutputSerializer

    def get_queryset(self) -> Any:
        return agent_list_enabled()


class SessionOutputSerializer(serializers.ModelSerializer):
    agent: serializers.SlugRelatedField[AgentDefinition] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )

    class Meta:
        model = AgentSession
        fields = ("id", "agent", "title", "status", "created_at", "updated_at")


class SessionListCreateApi(DexErrorsMixin, ListAPIView):
    """``GET /api/v1/sessions/`` lists the caller's sessions (filter ``?status=``);
    ``POST`` ``{"agent": slug, "message"?: str}`` starts one and answers 201 ``{"id", ...}``.
    """

    class SessionCreateInputSerializer(serializers.Serializer):
        agent = serializers.CharField(max_length=64)
        message = serializers.CharField(required=False, max_length=MESSAGE_MAX_CHARS)

        def validate_agent(self, value: str) -> AgentDefinition:
            try:
                agent = agent_get_enabled(slug=value)
            except AgentDefinition.DoesNotExist:
                raise serializers.ValidationError(f"Unknown or disabled agent {value!r}.") from None
            status = agent.provider_status()
            if not status.configured:
                reason = _provider_reason(status.reason, request=self.context.get("request"))
                raise serializers.ValidationError(
                    f"The agent {value!r} cannot start: its model provider is not configured. "
                    f"{reason}"
                )
            return agent

    serializer_class = SessionOutputSerializer
    filterset_fields = ("status", "agent__slug")

    def get_queryset(self) -> Any:
        return session_list_for_owner(owner=self.request.user)

    @extend_schema(request=SessionCreateInputSerializer, responses={201: SessionOutputSerializer})
    def post(self, request: Request) -> Response:
        serializer = self.SessionCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        session = session_create(
            owner=request.user,
            agent=serializer.validated_data["agent"],
            message=serializer.validated_data.get("message", ""),
        )
        return Response(SessionOutputSerializer(session).data, status=status.HTTP_201_CREATED)


SNAPSHOT_SCHEMA = inline_serializer(
    name="SessionSnapshot",
    fields={
        "id": serializers.CharField(),
        "agent": serializers.CharField(),
        "status": serializers.CharField(),
        "messages": serializers.ListField(child=serializers.DictField()),
        "pending_interrupts": serializers.ListField(child=serializers.DictField()),
        "awaiting_approval": serializers.BooleanField(),
        "tool_calls": serializers.ListField(child=serializers.DictField()),
        "usage": serializers.DictField(allow_null=True),
        "queued_message_count": serializers.IntegerField(),
        "last_turn_error": serializers.CharField(allow_null=True),
        "events_after": serializers.CharField(
            allow_blank=True,
            help_text="AgentEvents resume token read before this snapshot ('' when none): "
            "connect /ws/sessions/<id>/events/?after=<it> to follow the session from here.",
        ),
    },
)


class SessionOwnedMixin(DexErrorsMixin):
    """Look up the caller's session from the URL; 404 for unknown or foreign IDs."""

    def session_get(self, request: Request, session_id: str) -> AgentSession:
        try:
            return session_get_for_owner(owner=request.user, session_id=session_id)
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None


class SessionDetailApi(SessionOwnedMixin, APIView):
    """``GET /api/v1/sessions/<id>/``: the session's live snapshot from Dex."""

    @extend_schema(responses={200: SNAPSHOT_SCHEMA})
    def get(self, request: Request, session_id: str) -> Response:
        session = self.session_get(request, session_id)
        # Read before the snapshot: relaying from it then misses nothing the snapshot lacks.
        events_after = selectors.session_events_after_get(session=session)
        snapshot = session_snapshot_get(session=session)
        session_status_record(session=session, status=snapshot["status"])
        return Response(
            {"id": session.id, "agent": session.agent.slug, **snapshot,
             "events_after": events_after}
        )


class SessionMessageApi(SessionOwnedMixin, APIView):
    """``POST /api/v1/sessions/<id>/messages/`` ``{"text"}``: queue a user message (202)."""

    class MessageInputSerializer(serializers.Serializer):
        text = serializers.CharField(max_length=MESSAGE_MAX_CHARS)

    @extend_schema(
        request=MessageInputSerializer,
        responses={
            202: inline_serializer("MessageQueued", {"queued": serializers.BooleanField()}),
            409: inline_serializer("SessionStopped", {"detail": serializers.CharField()}),
        },
    )
    def post(self, request: Request, session_id: str) -> Response:
        session = self.session_get(request, session_id)
        serializer = self.MessageInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if session.status == SESSION_STATUS_STOPPED:
            return Response({"detail": "This session is stopped; start a new one."},
                            status=status.HTTP_409_CONFLICT)
        if not session_message_send(session=session, text=serializer.validated_data["text"]):
            raise serializers.ValidationError({"text": ["The session refused this message."]})
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)


class SessionHistoryApi(SessionOwnedMixin, APIView):
    """``GET /api/v1/sessions/<id>/history/``: completed Steps, oldest first."""

    @extend_schema(
        responses={
            200: inline_serializer(
                "StepHistoryEntry",
                {
                    "step_type": serializers.CharField(),
                    "step_execution_id": serializers.CharField(),
                    "event_type": serializers.CharField(),
                    "final_attempt": serializers.IntegerField(),
                },
                many=True,
            )
        }
    )
    def get(self, request: Request, session_id: str) -> Response:
        session = self.session_get(request, session_id)
        entries = session_history_get(session=session)
        return Response(
            [
                {
                    "step_type": entry.step_type,
                    "step_execution_id": entry.step_execution_id,
                    "event_type": entry.event_type,
                    "final_attempt": entry.final_attempt,
                }
                for entry in entries
            ]
        )


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """``GET /healthz`` (no auth): 200 when web, engine and worker are up, else 503.

    Body: ``{"web": "up", "engine": "up"|"down", "worker": "up"|"down"}``.
    """
    parts = health_get()
    healthy = all(state == "up" for state in parts.values())
    return JsonResponse(parts, status=200 if healthy else 503)


class ApprovalListApi(DexErrorsMixin, APIView):
    """``GET /api/v1/approvals/`` (staff only): tool calls waiting for approval.

    Read from the Dex snapshots of the 200 most recent sessions that are not stopped
    (``selectors.APPROVAL_SESSION_LIMIT``); not paginated.
    """

    permission_classes = (IsAdminUser,)

    @extend_schema(
        responses={
            200: inline_serializer(
                "PendingApproval",
                {
                    "session": serializers.CharField(),
                    "agent": serializers.CharField(),
                    "owner": serializers.CharField(),
                    "interrupt_id": serializers.CharField(),
                    "tool_call_id": serializers.CharField(),
                    "tool_name": serializers.CharField(),
                    "arguments": serializers.CharField(help_text="JSON text."),
                    "deadline": serializers.DateTimeField(allow_null=True),
                },
                many=True,
            )
        }
    )
    def get(self, request: Request) -> Response:
        return Response(selectors.approval_list_pending())


class InterruptConflict(APIException):
    """409: the interrupt no longer waits for a decision."""

    status_code = status.HTTP_409_CONFLICT
    default_detail = "This tool call no longer waits for a decision."
    default_code = "interrupt_not_pending"


class InterruptResolveApi(DexErrorsMixin, APIView):
    """``POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/`` (staff only, any session):
    ``{"approved": bool, "rejection_message"?: str}`` answers a pending tool call.

    200 ``{"resolved": true}`` once Dex accepted, with an ``ApprovalDecision`` audit row;
    409 when it was already decided or is past its deadline; 404 for an unknown session or
    interrupt. ``rejection_message`` is ignored on approval.
    """

    permission_classes = (IsAdminUser,)

    class InterruptResolveInputSerializer(serializers.Serializer):
        approved = serializers.BooleanField()
        rejection_message = serializers.CharField(
            required=False, allow_blank=True, max_length=MESSAGE_MAX_CHARS
        )

    @extend_schema(
        request=InterruptResolveInputSerializer,
        responses={
            200: inline_serializer("InterruptResolved", {"resolved": serializers.BooleanField()})
        },
    )
    def post(self, request: Request, session_id: str, interrupt_id: str) -> Response:
        serializer = self.InterruptResolveInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            session = selectors.session_get_for_staff(session_id=session_id)
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None
        try:
            services.interrupt_resolve(
                session=session,
                interrupt_id=interrupt_id,
                approved=serializer.validated_data["approved"],
                rejection_message=serializer.validated_data.get("rejection_message", ""),
                decided_by=request.user,
            )
        except services.InterruptNotFoundError:
            raise NotFound("No such interrupt.") from None
        except services.InterruptNotPendingError as error:
            raise InterruptConflict(str(error)) from None
        return Response({"resolved": True})


class SessionStopApi(DexErrorsMixin, APIView):
    """``POST /api/v1/sessions/<id>/stop/`` (owner or staff): stop the session's Dex Flow.

    202 ``{"status": "stopped"}``; the index row becomes ``stopped`` and the snapshot stays
    readable. Other users get 404, as for an unknown session.
    """

    @extend_schema(
        request=None,
        responses={202: inline_serializer("SessionStopped", {"status": serializers.CharField()})},
    )
    def post(self, request: Request, session_id: str) -> Response:
        try:
            session = selectors.session_get_for_owner_or_staff(
                user=request.user, session_id=session_id
            )
        except AgentSession.DoesNotExist:
            raise NotFound("No such session.") from None
        services.session_stop(session=session)
        return Response({"status": session.status}, status=status.HTTP_202_ACCEPTED)
