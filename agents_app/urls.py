"""REST routes under ``/api/v1/``."""

from django.urls import path

from agents_app.api.agents import AgentListApi
from agents_app.api.approvals import (
    ApprovalBulkDecideApi,
    ApprovalDecisionListApi,
    ApprovalListApi,
    InterruptResolveApi,
)
from agents_app.api.events import SessionEventsApi
from agents_app.api.history import SessionHistoryApi
from agents_app.api.messages import SessionMessageApi, SessionMessageTextApi
from agents_app.api.notifications import NotificationPreferenceApi
from agents_app.api.queue import QueuedMessageApi, QueuedMessageSteerApi, SessionQueueApi
from agents_app.api.schedules import (
    ScheduleDetailApi,
    ScheduleListCreateApi,
    SchedulePreviewApi,
    ScheduleRunListApi,
)
from agents_app.api.sessions import (
    SessionArchiveApi,
    SessionDetailApi,
    SessionListCreateApi,
    SessionStopApi,
    SessionUnarchiveApi,
)
from agents_app.api.tokens import ApiTokenListCreateApi, ApiTokenRevokeApi
from agents_app.api.triggers import AgentTriggerApi
from agents_app.api.turns import (
    SessionElicitationAnswerApi,
    SessionPlanExecuteApi,
    SessionTurnCancelApi,
    SessionUserInputApi,
)
from agents_app.api.usage import UsageApi

app_name = "agents_api"

urlpatterns = [
    path("agents/", AgentListApi.as_view(), name="agent-list"),
    path(
        "agents/<slug:slug>/triggers/<slug:name>/",
        AgentTriggerApi.as_view(),
        name="agent-trigger",
    ),
    path("approvals/", ApprovalListApi.as_view(), name="approval-list"),
    path("approvals/decisions/", ApprovalDecisionListApi.as_view(), name="approval-decision-list"),
    path("approvals/bulk/", ApprovalBulkDecideApi.as_view(), name="approval-bulk"),
    path("schedules/", ScheduleListCreateApi.as_view(), name="schedule-list"),
    path("schedules/preview/", SchedulePreviewApi.as_view(), name="schedule-preview"),
    path("schedules/<int:schedule_id>/", ScheduleDetailApi.as_view(), name="schedule-detail"),
    path(
        "schedules/<int:schedule_id>/runs/", ScheduleRunListApi.as_view(), name="schedule-runs"
    ),
    path("tokens/", ApiTokenListCreateApi.as_view(), name="token-list"),
    path("tokens/<int:token_id>/", ApiTokenRevokeApi.as_view(), name="token-detail"),
    path("usage/", UsageApi.as_view(), name="usage"),
    path("me/notifications/", NotificationPreferenceApi.as_view(), name="me-notifications"),
    path("sessions/", SessionListCreateApi.as_view(), name="session-list"),
    path("sessions/<str:session_id>/", SessionDetailApi.as_view(), name="session-detail"),
    path(
        "sessions/<str:session_id>/messages/",
        SessionMessageApi.as_view(),
        name="session-messages",
    ),
    path(
        "sessions/<str:session_id>/messages/<int:sequence>/text/",
        SessionMessageTextApi.as_view(),
        name="session-message-text",
    ),
    path(
        "sessions/<str:session_id>/events/", SessionEventsApi.as_view(), name="session-events"
    ),
    path("sessions/<str:session_id>/queue/", SessionQueueApi.as_view(), name="session-queue"),
    path(
        "sessions/<str:session_id>/queue/<str:message_id>/",
        QueuedMessageApi.as_view(),
        name="session-queued-message",
    ),
    path(
        "sessions/<str:session_id>/queue/<str:message_id>/steer/",
        QueuedMessageSteerApi.as_view(),
        name="session-queued-message-steer",
    ),
    path("sessions/<str:session_id>/input/", SessionUserInputApi.as_view(), name="session-input"),
    path(
        "sessions/<str:session_id>/elicitations/<str:elicitation_id>/",
        SessionElicitationAnswerApi.as_view(),
        name="session-elicitation",
    ),
    path(
        "sessions/<str:session_id>/plan/execute/",
        SessionPlanExecuteApi.as_view(),
        name="session-plan-execute",
    ),
    path(
        "sessions/<str:session_id>/history/",
        SessionHistoryApi.as_view(),
        name="session-history",
    ),
    path("sessions/<str:session_id>/stop/", SessionStopApi.as_view(), name="session-stop"),
    path(
        "sessions/<str:session_id>/archive/", SessionArchiveApi.as_view(), name="session-archive"
    ),
    path(
        "sessions/<str:session_id>/unarchive/",
        SessionUnarchiveApi.as_view(),
        name="session-unarchive",
    ),
    path(
        "sessions/<str:session_id>/turn/cancel/",
        SessionTurnCancelApi.as_view(),
        name="session-turn-cancel",
    ),
    path(
        "sessions/<str:session_id>/interrupts/<str:interrupt_id>/",
        InterruptResolveApi.as_view(),
        name="session-interrupt",
    ),
]
