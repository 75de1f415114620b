"""A session's queue of waiting messages: ``/api/v1/sessions/<id>/queue/`` and below.

``SessionQueueApi`` lists the queued and steered messages (those the outbox still keeps at the
tail of ``queued``); ``QueuedMessageApi`` deletes or edits a queued message and
``QueuedMessageSteerApi`` steers one into the running turn, for the session's owner only
(``QueuedMessageMixin``).

May import: of ``agents_app.api``: ``messages`` (the text limit, ``QueueFull``) and the shared
modules (``async_views``, ``fields``, ``schema``, ``session_access``, ``session_schema``);
the domain and everything below it.
"""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.async_views import AsyncAPIView, db
from agents_app.api.fields import BodySerializer, StrictBooleanField, StrictCharField, body_refuse
from agents_app.api.messages import MESSAGE_MAX_CHARS, QueueFull
from agents_app.api.schema import error_response
from agents_app.api.session_access import (
    SESSION_STOPPED_CONFLICT,
    SessionOwnedMixin,
    SessionStopped,
)
from agents_app.api.session_schema import DELIVERY_FIELD, QueuedMessageOutputSerializer
from agents_app.gateway import dex_gateway
from agents_app.models import SESSION_STATUS_STOPPED, AgentSession
from agents_app.selectors import session_reads
from agents_app.services import session_input

#: Longer than any Channel message ID (36) or client_id (32): not worth asking Dex about.
QUEUED_MESSAGE_ID_MAX_CHARS = 64
QUEUED_MESSAGE_GONE = (
    "No such queued message: the agent already took it, it was steered or deleted, or it never "
    "was queued (a steered message can no longer be changed)."
)


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
