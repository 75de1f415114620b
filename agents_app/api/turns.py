"""Writes that act on a session's running or next turn; each answers 409 with a
``reason`` when it cannot.

``SessionUserInputApi`` answers the question the model asked (``request_user_input``),
``SessionElicitationAnswerApi`` a question an MCP server asks during a tool call,
``SessionPlanExecuteApi`` executes the reviewed plan, ``SessionTurnCancelApi`` cancels the
running turn ("Stop generating"). All are for the session's owner only.

May import: of ``agents_app.api``: ``messages`` (the text limit) and the shared modules
(``fields``, ``schema``, ``session_access``, ``session_schema``); the domain and everything
below it.
"""

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import APIException, ValidationError
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.fields import BodySerializer, StrictCharField, StrictIntegerField
from agents_app.api.messages import MESSAGE_MAX_CHARS
from agents_app.api.schema import CONFLICT, error_response
from agents_app.api.session_access import SESSION_STOPPED_DETAIL, SessionOwnedMixin, SessionStopped
from agents_app.api.session_schema import DELIVERY_FIELD
from agents_app.models import SESSION_STATUS_STOPPED
from agents_app.services import session_input

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
