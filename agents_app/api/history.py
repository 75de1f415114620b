"""``GET /api/v1/sessions/<id>/history/``: the session's ended Step methods, for the chat
page's Timeline tab.

May import: of ``agents_app.api``: ``async_views``, ``session_access``; the gateway and
``dex_agents``.
"""

from typing import Any

from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from agents_app.api.async_views import AsyncAPIView, db
from agents_app.api.session_access import SessionOwnedMixin
from agents_app.gateway import dex_gateway
from dex_agents import STEP_OUTCOMES, StepHistoryEntry

#: Steps whose input is the ID of the tool call they belong to (``dex_agents`` Steps).
TOOL_CALL_STEPS = frozenset({
    "AwaitToolApproval", "CallTool", "CallSingleAttemptTool", "RecordToolFailure",
    "RecordToolOutcomeUnknown", "DurableWait", "AwaitUserInput", "CallSubagent",
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
