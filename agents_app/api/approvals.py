"""REST endpoints of the approvals inbox (staff only; LangGraph's Agent Inbox is the model).

- ``GET /api/v1/approvals/``: every tool call waiting for a decision, oldest first.
- ``GET /api/v1/approvals/decisions/``: the audit trail, newest first, paginated.
- ``POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/``: approve (optionally with edited
  arguments) or reject one call.
- ``POST /api/v1/approvals/bulk/``: the same verdict for several calls, one result each.

Both lists take the filters ``agent`` (slug), ``tool`` (tool name), ``owner`` (username) and
``session`` (ID): whole values, case ignored except in the session ID. Writes go through
``approval_decisions.interrupt_resolve``; reads through ``approval_lists.approval_list_pending`` and
``approval_lists.approval_list_decided``.
"""

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.generics import ListAPIView
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.fields import BodySerializer, StrictBooleanField, StrictCharField
from agents_app.api.query import KnownQueryParametersFilter, query_parameters_check, query_values
from agents_app.api.schema import error_response, field_errors_serializer
from agents_app.api.session_access import SESSION_STOPPED_DETAIL, DexErrorsMixin, SessionStopped
from agents_app.api.session_schema import DELIVERY_FIELD
from agents_app.gateway import dex_gateway
from agents_app.models import (
    SESSION_STATUS_STOPPED,
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
)
from agents_app.selectors import approval_lists, session_reads
from agents_app.services import approval_decisions

#: The most calls one bulk decision may name.
BULK_ITEMS_MAX = 100

EDITED_ARGUMENTS_HELP = (
    "The JSON text the approved call ran with instead of the model's arguments (approve with "
    "edits); null when not edited."
)


class ApprovalFilterQuerySerializer(serializers.Serializer):
    """The filters both approvals lists take (``approval_lists.ApprovalFilters``): each matches a
    whole value, ``agent``, ``tool`` and ``owner`` ignoring case; blank does not narrow."""

    agent = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=64,
        help_text="Agent slug, whole, case ignored (`Demo` finds `demo`).",
    )
    tool = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=255,
        help_text="Tool name as the model calls it (`server__tool`), whole, case ignored.",
    )
    owner = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=150,
        help_text="Session owner's username, whole, case ignored (`DEMO` finds `demo`).",
    )
    session = serializers.CharField(
        required=False, allow_blank=True, max_length=64, help_text="Session ID, exact."
    )

    def filters(self) -> approval_lists.ApprovalFilters:
        """The validated filters."""
        data = self.validated_data
        return approval_lists.ApprovalFilters(
            agent=data.get("agent", ""),
            tool=data.get("tool", ""),
            owner=data.get("owner", ""),
            session=data.get("session", ""),
        )


class DecisionListQuerySerializer(ApprovalFilterQuerySerializer):
    decision = serializers.ChoiceField(
        choices=[
            state
            for state in ApprovalRequest.State.values
            if state != ApprovalRequest.State.PENDING
        ],
        required=False,
        allow_blank=True,
        help_text="Only rows with this outcome.",
    )


class ApprovalListApi(APIView):
    """``GET /api/v1/approvals/`` (staff only): every tool call waiting for approval, oldest
    first, from the Django approvals index (``agents_app.sessions.session_index``); not paginated.
    Query: ``agent``, ``tool``, ``owner``, ``session`` narrow it (whole values; case ignored
    except in the session ID).

    ``state`` is ``pending``, ``expired`` once the deadline passed and before the worker
    recorded it (the call can no longer be approved), or ``decided`` when staff decided while
    the engine or every worker did not answer: ``decision`` (who, when, the verdict, delivery
    ``pending``) is delivered once they do.
    """

    permission_classes = (IsAdminUser,)

    @extend_schema(
        parameters=[ApprovalFilterQuerySerializer],
        responses={
            200: inline_serializer(
                "PendingApproval",
                {
                    "session": serializers.CharField(),
                    "session_title": serializers.CharField(),
                    "parent_session": serializers.CharField(
                        allow_null=True,
                        help_text="The session a subagent call of which started this one.",
                    ),
                    "parent_session_title": serializers.CharField(allow_null=True),
                    "agent": serializers.CharField(),
                    "owner": serializers.CharField(),
                    "interrupt_id": serializers.CharField(),
                    "tool_call_id": serializers.CharField(),
                    "tool_name": serializers.CharField(),
                    "arguments": serializers.CharField(help_text="JSON text."),
                    "requested_at": serializers.DateTimeField(),
                    "deadline": serializers.DateTimeField(allow_null=True),
                    "state": serializers.ChoiceField(choices=["pending", "expired", "decided"]),
                    "decision": inline_serializer(
                        "UndeliveredDecision",
                        {
                            "approved": serializers.BooleanField(),
                            "decided_by": serializers.CharField(),
                            "decided_at": serializers.DateTimeField(),
                            "rejection_message": serializers.CharField(allow_blank=True),
                            "edited_arguments": serializers.CharField(
                                allow_null=True, help_text=EDITED_ARGUMENTS_HELP
                            ),
                            "delivery": serializers.ChoiceField(choices=["pending"]),
                        },
                        allow_null=True,
                        help_text="With state decided: the decision waiting for delivery.",
                    ),
                },
                many=True,
            ),
            400: error_response(
                400,
                field_errors_serializer(
                    ApprovalFilterQuerySerializer, name="ApprovalFilterQueryError"
                ),
                "A bad filter.",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        query_parameters_check(request=request, known=ApprovalFilterQuerySerializer().fields)
        query = ApprovalFilterQuerySerializer(data=query_values(request))
        query.is_valid(raise_exception=True)
        return Response(approval_lists.approval_list_pending(filters=query.filters()))


class ApprovalDecisionListApi(ListAPIView):
    """``GET /api/v1/approvals/decisions/`` (staff only): the audit trail, newest first,
    paginated (``limit``/``offset``).

    One row per approval that stopped waiting: approved (with the arguments the call ran with
    when staff edited them) or rejected, with who decided, when and their message; expired;
    or withdrawn (its turn failed or the session stopped). Query: ``agent``, ``tool``,
    ``owner``, ``session`` and ``decision`` narrow it.
    """

    permission_classes = (IsAdminUser,)
    filter_backends = (KnownQueryParametersFilter,)

    class DecisionOutputSerializer(serializers.Serializer):
        session = serializers.CharField(source="session_id")
        session_title = serializers.CharField(source="session.title")
        agent = serializers.CharField(source="session.agent.slug")
        owner = serializers.CharField(source="session.owner.username")
        interrupt_id = serializers.CharField()
        tool_call_id = serializers.CharField()
        tool_name = serializers.CharField()
        arguments = serializers.CharField(help_text="JSON text, as the model produced it.")
        edited_arguments = serializers.SerializerMethodField(help_text=EDITED_ARGUMENTS_HELP)
        decision = serializers.CharField(source="state")
        decided_by = serializers.CharField(allow_null=True)
        decided_at = serializers.DateTimeField(source="decision_at")
        message = serializers.CharField(source="outcome_message")

        def get_edited_arguments(self, row: Any) -> str | None:
            return getattr(row, "edited_arguments", None) or None

    serializer_class = DecisionOutputSerializer

    @extend_schema(
        parameters=[DecisionListQuerySerializer],
        responses={
            200: DecisionOutputSerializer(many=True),
            400: error_response(
                400,
                field_errors_serializer(
                    DecisionListQuerySerializer,
                    name="DecisionListQueryError",
                    extra_fields=("limit", "offset"),
                ),
                "A bad filter, limit or offset.",
            ),
        },
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return self.list(request, *args, **kwargs)

    #: What ``agents_app.api.query`` lets through besides ``limit`` and ``offset``.
    query_serializer_class = DecisionListQuerySerializer

    def get_queryset(self) -> Any:
        query = DecisionListQuerySerializer(data=query_values(self.request))
        query.is_valid(raise_exception=True)
        return approval_lists.approval_list_decided(
            filters=query.filters(), decision=query.validated_data.get("decision", "")
        )


def _recorded_decision_fields() -> dict[str, serializers.Field]:
    return {
        "approved": serializers.BooleanField(),
        "decided_by": serializers.CharField(help_text="Username of the staff member."),
        "decided_at": serializers.DateTimeField(),
        "rejection_message": serializers.CharField(allow_blank=True),
        "edited_arguments": serializers.CharField(
            allow_null=True, help_text=EDITED_ARGUMENTS_HELP
        ),
        "delivery": serializers.ChoiceField(
            choices=["delivered", "pending", "refused"],
            help_text="pending: the engine or every worker did not answer yet; the platform "
            "delivers it once they do. refused: the tool call stopped waiting first.",
        ),
    }


RECORDED_DECISION_SCHEMA = inline_serializer("RecordedDecision", _recorded_decision_fields())
RECORDED_DECISION_OR_NULL_SCHEMA = inline_serializer(
    "RecordedDecisionOrNull",
    _recorded_decision_fields(),
    allow_null=True,
    help_text="The recorded decision; null when nobody decided (it expired or was withdrawn).",
)


def decision_to_data(decision: ApprovalDecision) -> dict[str, Any]:
    """A recorded decision as ``RECORDED_DECISION_SCHEMA`` shows it."""
    return {
        "approved": decision.approved,
        "decided_by": decision.decided_by.get_username(),
        "decided_at": serializers.DateTimeField().to_representation(decision.decided_at),
        "rejection_message": decision.rejection_message,
        "edited_arguments": decision.edited_arguments or None,
        "delivery": decision.delivery,
    }


def interrupt_conflict(detail: str, decision: ApprovalDecision | None = None) -> Response:
    """409 ``{"detail", "decision"}``: the interrupt no longer waits for a decision;
    ``decision`` is the recorded one (who, when, the verdict), or null when nobody decided
    (it expired or was withdrawn). A Response, not an APIException, which would turn every
    value into a string."""
    return Response(
        {"detail": detail, "decision": decision_to_data(decision) if decision else None},
        status=status.HTTP_409_CONFLICT,
    )


def _decide(
    *,
    request: Request,
    session_id: str,
    interrupt_id: str,
    approved: bool,
    rejection_message: str,
    edited_arguments: Any,
) -> Response:
    """One decision as the single endpoint answers it (200, 202 or 409).

    Raises:
        NotFound: Unknown session or interrupt.
        SessionStopped: The session is stopped.
        ValidationError: ``edited_arguments`` do not fit the tool's schema
            (``{"edited_arguments": [messages]}``).
        dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError: See
            ``approval_decisions.interrupt_resolve``.
    """
    try:
        session = session_reads.session_get_for_staff(session_id=session_id)
    except AgentSession.DoesNotExist:
        raise NotFound("No such session.") from None
    if session.status == SESSION_STATUS_STOPPED:
        raise SessionStopped()
    try:
        decision = approval_decisions.interrupt_resolve(
            session=session,
            interrupt_id=interrupt_id,
            approved=approved,
            rejection_message=rejection_message,
            decided_by=request.user,
            edited_arguments=edited_arguments,
        )
    except approval_decisions.ApprovalArgumentsInvalidError as error:
        raise ValidationError({"edited_arguments": error.messages}) from None
    except approval_decisions.InterruptNotFoundError:
        raise NotFound("No such interrupt.") from None
    except approval_decisions.InterruptAlreadyDecidedError as error:
        return interrupt_conflict(str(error), error.decision)
    except approval_decisions.SessionIsStoppedError:
        raise SessionStopped() from None
    except approval_decisions.InterruptNotPendingError as error:
        return interrupt_conflict(str(error))
    delivered = decision.delivery == Delivery.DELIVERED
    return Response(
        {
            "resolved": delivered,
            "delivery": decision.delivery,
            "decision": decision_to_data(decision),
        },
        status=status.HTTP_200_OK if delivered else status.HTTP_202_ACCEPTED,
    )


#: Characters a rejection message may have (what the model reads as the reason; a longer
#: text is a 400 on ``rejection_message``).
REJECTION_MESSAGE_MAX_CHARS = 2_000


class InterruptResolveInputSerializer(BodySerializer):
    approved = StrictBooleanField()
    rejection_message = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=REJECTION_MESSAGE_MAX_CHARS,
        help_text="Why the call is rejected, for the model: at most 2,000 characters.",
    )
    edited_arguments = serializers.DictField(
        required=False,
        help_text="Approve with edits: the arguments (a JSON object) the call runs with "
        "instead of the model's, checked against the tool's input schema, which must name "
        "every property unless it allows others (400 {\"edited_arguments\": [messages]} when "
        "it refuses them). Only with approved true: sent with a rejection, 400.",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        """Edits go with an approval only: a rejection carrying them is refused (400), not
        silently dropped, so a client that meant to approve learns of its mistake."""
        if not attrs.get("approved") and "edited_arguments" in attrs:
            raise ValidationError({"edited_arguments": [EDITS_NEED_APPROVAL]})
        return attrs


#: The field message of a rejection that carries edited arguments.
EDITS_NEED_APPROVAL = (
    "Edited arguments go only with an approval: send approved true to run the call with "
    "them, or leave edited_arguments out to reject it."
)


class InterruptResolveApi(DexErrorsMixin, APIView):
    """``POST /api/v1/sessions/<id>/interrupts/<interrupt_id>/`` (staff only, any session):
    ``{"approved": bool, "rejection_message"?: str, "edited_arguments"?: object}`` answers a
    pending tool call.

    The decision is recorded at once (an ``ApprovalDecision`` audit row: who, when, the
    verdict, the model's and the edited arguments), then delivered to Dex. 200 ``{"resolved":
    true, "delivery": "delivered", "decision"}`` once Dex accepted; 202 ``{"resolved": false,
    "delivery": "pending", "decision"}`` when the engine or every worker did not answer: the
    platform delivers it once they do, and the approvals list shows the call as ``decided``
    meanwhile. 409 ``{"detail", "decision"}`` when it was already decided (``detail`` says
    ``"Already approved by <user> at <time> UTC."``, ``decision`` is the recorded one) or is
    past its deadline or withdrawn (``decision`` null); 400 with field messages when
    ``edited_arguments`` do not fit the tool's input schema (a property the schema does not
    name is refused unless the schema allows others) or come with ``approved`` false; 404 for
    an unknown session or interrupt. ``rejection_message`` is ignored on approval. 409 also
    when the session is stopped (``"This session is stopped; start a new one."``, also when
    Dex reports the stop first).
    """

    permission_classes = (IsAdminUser,)

    def handle_exception(self, exc: Exception) -> Response:
        """Every 409 of this endpoint has ``decision``: null for a stopped session."""
        response = super().handle_exception(exc)
        if response.status_code == status.HTTP_409_CONFLICT and isinstance(response.data, dict):
            response.data.setdefault("decision", None)
        return response

    @extend_schema(
        request=InterruptResolveInputSerializer,
        responses={
            200: inline_serializer(
                "InterruptResolved",
                {
                    "resolved": serializers.BooleanField(),
                    "delivery": DELIVERY_FIELD,
                    "decision": RECORDED_DECISION_SCHEMA,
                },
            ),
            202: inline_serializer(
                "InterruptDecisionPending",
                {
                    "resolved": serializers.BooleanField(),
                    "delivery": DELIVERY_FIELD,
                    "decision": RECORDED_DECISION_SCHEMA,
                },
            ),
            409: inline_serializer(
                "InterruptNotPending",
                {
                    "detail": serializers.CharField(),
                    "decision": RECORDED_DECISION_OR_NULL_SCHEMA,
                },
            ),
        },
    )
    def post(self, request: Request, session_id: str, interrupt_id: str) -> Response:
        serializer = InterruptResolveInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        return _decide(
            request=request,
            session_id=session_id,
            interrupt_id=interrupt_id,
            approved=data["approved"],
            rejection_message=data.get("rejection_message", ""),
            edited_arguments=data.get("edited_arguments"),
        )


class BulkItemSerializer(BodySerializer):
    session = StrictCharField(max_length=64)
    interrupt_id = StrictCharField(max_length=255)


class BulkDecisionInputSerializer(BodySerializer):
    items = serializers.ListField(
        child=BulkItemSerializer(), min_length=1, max_length=BULK_ITEMS_MAX
    )
    approved = StrictBooleanField()
    rejection_message = StrictCharField(
        required=False,
        allow_blank=True,
        max_length=REJECTION_MESSAGE_MAX_CHARS,
        help_text="Why the call is rejected, for the model: at most 2,000 characters.",
    )


class ApprovalBulkDecideApi(APIView):
    """``POST /api/v1/approvals/bulk/`` (staff only): ``{"items": [{"session",
    "interrupt_id"}], "approved": bool, "rejection_message"?: str}`` gives every listed call
    the same verdict (no edits: edited arguments are decided one call at a time).

    Calls are decided in the order given, each as the single endpoint decides it, and one
    failing does not stop the others. 200 ``{"results": [{"session", "interrupt_id",
    "status", "detail", "decision"}]}`` in the same order: ``status`` is the single
    endpoint's HTTP status for that call (200 decided, 202 decided and delivered later, 404
    unknown, 409 already decided, past its deadline, withdrawn or the session stopped, 503
    the engine could not be asked), ``detail`` a sentence for anything but 200 and 202, and
    ``decision`` the recorded decision (ours, or for 409 the one that won), else null.
    """

    permission_classes = (IsAdminUser,)

    @extend_schema(
        request=BulkDecisionInputSerializer,
        responses={
            200: inline_serializer(
                "BulkDecisionResults",
                {
                    "results": inline_serializer(
                        "BulkDecisionResult",
                        {
                            "session": serializers.CharField(),
                            "interrupt_id": serializers.CharField(),
                            "status": serializers.ChoiceField(
                                choices=[200, 202, 404, 409, 503],
                                help_text="The single endpoint's HTTP status for this call.",
                            ),
                            "detail": serializers.CharField(allow_blank=True),
                            "decision": RECORDED_DECISION_OR_NULL_SCHEMA,
                        },
                        many=True,
                    )
                },
            )
        },
    )
    def post(self, request: Request) -> Response:
        serializer = BulkDecisionInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        results = []
        for item in data["items"]:
            results.append(
                {
                    "session": item["session"],
                    "interrupt_id": item["interrupt_id"],
                    **self._one(
                        request,
                        session_id=item["session"],
                        interrupt_id=item["interrupt_id"],
                        approved=data["approved"],
                        rejection_message=data.get("rejection_message", ""),
                    ),
                }
            )
        return Response({"results": results})

    @staticmethod
    def _one(
        request: Request,
        *,
        session_id: str,
        interrupt_id: str,
        approved: bool,
        rejection_message: str,
    ) -> dict[str, Any]:
        try:
            response = _decide(
                request=request,
                session_id=session_id,
                interrupt_id=interrupt_id,
                approved=approved,
                rejection_message=rejection_message,
                edited_arguments=None,
            )
        except NotFound as error:
            return {"status": 404, "detail": str(error.detail), "decision": None}
        except SessionStopped:
            return {"status": 409, "detail": SESSION_STOPPED_DETAIL, "decision": None}
        except dex_gateway.SessionNotFoundError:
            return {
                "status": 404,
                "detail": "The engine has no record of this session.",
                "decision": None,
            }
        except dex_gateway.EngineUnavailableError as error:
            return {"status": 503, "detail": str(error), "decision": None}
        body = response.data
        return {
            "status": response.status_code,
            "detail": body.get("detail", ""),
            "decision": body.get("decision"),
        }
