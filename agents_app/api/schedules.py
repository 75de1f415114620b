"""REST endpoints of the caller's own schedules (issue 29, "Schedules").

- ``GET /api/v1/schedules/``: the caller's schedules (paginated, by name);
  ``POST``: a new one (201), 400 with field messages.
- ``GET | PUT | PATCH | DELETE /api/v1/schedules/<id>/``: one of them; pause and resume are
  ``PATCH {"enabled": false | true}``. 404 for another user's schedule.
- ``GET /api/v1/schedules/<id>/runs/``: its runs, newest slot first (paginated).
- ``POST /api/v1/schedules/preview/`` ``{"cron" | "interval_seconds", "timezone"}``: the next
  5 run times (the form's preview), or 400 with field messages.

Each schedule reads with ``next_runs`` (the next 5 times, ISO 8601 in its zone; ``[]`` while
paused) and ``last_run``. Staff manage everyone's schedules in Django admin.

May import: the domain (``selectors.schedules``, ``services.schedules``), the API's shared
pieces and the foundation.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import serializers, status
from rest_framework.exceptions import NotFound
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.fields import BodySerializer
from agents_app.models import (
    AgentDefinition,
    AgentSession,
    MissedRunPolicy,
    Schedule,
    ScheduleRun,
    ScheduleRunOutcome,
    ScheduleTarget,
)
from agents_app.selectors import schedules as schedule_reads
from agents_app.services import schedules as schedule_writes

NOT_YOURS = "You have no schedule with this ID."


class ScheduleOutputSerializer(serializers.ModelSerializer):
    """One schedule as its owner reads it."""

    agent: serializers.SlugRelatedField[AgentDefinition] = serializers.SlugRelatedField(
        slug_field="slug", read_only=True
    )
    session = serializers.CharField(
        source="session_id", read_only=True, allow_null=True,
        help_text="The persistent session (target 'session'); null until its first run.",
    )
    next_runs = serializers.SerializerMethodField()
    last_run = serializers.SerializerMethodField()

    class Meta:
        model = Schedule
        fields = (
            "id", "name", "agent", "message", "cron", "interval_seconds", "timezone", "target",
            "session", "enabled", "missed_run_policy", "created_at", "updated_at", "next_runs",
            "last_run",
        )

    def get_next_runs(self, schedule: Schedule) -> list[str]:
        """The next 5 run times, ISO 8601 in the schedule's zone; ``[]`` while paused."""
        return schedule_reads.schedule_next_runs(schedule=schedule)

    @extend_schema_field(
        inline_serializer(
            "ScheduleLastRun",
            {"slot": serializers.DateTimeField(), "outcome": serializers.CharField()},
            allow_null=True,
        )
    )
    def get_last_run(self, schedule: Schedule) -> dict[str, Any] | None:
        slot = getattr(schedule, "last_slot", None)
        if slot is None:
            return None
        return {"slot": serializers.DateTimeField().to_representation(slot),
                "outcome": getattr(schedule, "last_outcome", "")}


class ScheduleRunOutputSerializer(serializers.ModelSerializer):
    """One run: its slot (UTC), outcome, detail and session."""

    session = serializers.CharField(source="session_id", read_only=True, allow_null=True)
    outcome = serializers.ChoiceField(choices=ScheduleRunOutcome.choices, read_only=True)

    class Meta:
        model = ScheduleRun
        fields = ("slot", "outcome", "detail", "session", "created_at", "updated_at")


class ScheduleInputSerializer(BodySerializer):
    """A schedule's writable fields; ``PATCH`` takes any subset."""

    agent = serializers.SlugField(help_text="Slug of an enabled agent.")
    name = serializers.CharField(max_length=100)
    message = serializers.CharField(
        help_text="Plain text each run sends; placeholders {scheduled_for} and "
        "{schedule_name} (write a literal brace twice)."
    )
    cron = serializers.CharField(
        required=False, allow_blank=True, default="", max_length=120,
        help_text="5 fields (minute hour day month weekday), or 6 with seconds last. "
        "Exactly one of cron and interval_seconds.",
    )
    interval_seconds = serializers.IntegerField(
        required=False, allow_null=True, default=None,
        help_text="Seconds between runs (at least 5), aligned to the Unix epoch.",
    )
    timezone = serializers.CharField(required=False, default="UTC", max_length=64,
                                     help_text="IANA zone the cron is read in.")
    target = serializers.ChoiceField(choices=ScheduleTarget.choices, required=False,
                                     default=ScheduleTarget.NEW_SESSION)
    session = serializers.CharField(
        required=False, allow_null=True, default=None,
        help_text="With target 'session': one of your live sessions of the agent; empty: "
        "created by the first run.",
    )
    enabled = serializers.BooleanField(required=False, default=True)
    missed_run_policy = serializers.ChoiceField(
        choices=MissedRunPolicy.choices, required=False, default=MissedRunPolicy.SKIP
    )


class ScheduleCreateInputSerializer(ScheduleInputSerializer):
    """``POST /api/v1/schedules/``'s body."""


class ScheduleReplaceInputSerializer(ScheduleInputSerializer):
    """``PUT /api/v1/schedules/<id>/``'s body: every field (absent ones take defaults)."""


class ScheduleChangeInputSerializer(ScheduleInputSerializer):
    """``PATCH /api/v1/schedules/<id>/``'s body: any subset of the fields."""


class SchedulePreviewInputSerializer(BodySerializer):
    cron = serializers.CharField(required=False, allow_blank=True, default="")
    interval_seconds = serializers.IntegerField(required=False, allow_null=True, default=None)
    timezone = serializers.CharField(required=False, default="UTC", max_length=64)


def _resolve(data: dict[str, Any]) -> dict[str, Any]:
    """The input's ``agent`` slug and ``session`` ID as rows (``None`` when unknown: the
    service's checks then name the field, without telling another user's rows apart)."""
    values = dict(data)
    if "agent" in values:
        values["agent"] = AgentDefinition.objects.filter(slug=values["agent"]).first()
    if "session" in values and values["session"] is not None:
        found = AgentSession.objects.filter(pk=values["session"]).first()
        if found is None:
            raise serializers.ValidationError(
                {"session": ["Choose one of your own sessions of the schedule's agent."]}
            )
        values["session"] = found
    return values


def _saved(call: Any, **kwargs: Any) -> Schedule:
    try:
        return call(**kwargs)
    except schedule_writes.ScheduleValidationError as error:
        raise serializers.ValidationError(error.errors) from None


class ScheduleListCreateApi(ListAPIView):
    """``/api/v1/schedules/``: ``GET`` the caller's schedules; ``POST`` a new one (201, its
    Flow started when enabled), 400 with field messages (cron, time zone, interval below 5 s,
    both or neither of cron and interval, a message placeholder, a session not theirs)."""

    serializer_class = ScheduleOutputSerializer

    def get_queryset(self) -> Any:
        return schedule_reads.schedule_list(owner=self.request.user)

    @extend_schema(summary="List your schedules")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(summary="Create a schedule", request=ScheduleCreateInputSerializer,
                   responses={201: ScheduleOutputSerializer})
    def post(self, request: Request) -> Response:
        serializer = ScheduleCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        created = _saved(schedule_writes.schedule_create, owner=request.user,
                         **_resolve(serializer.validated_data))
        schedule = schedule_reads.schedule_get(owner=request.user, schedule_id=created.pk)
        return Response(ScheduleOutputSerializer(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetailApi(APIView):
    """``/api/v1/schedules/<id>/``: read, replace (``PUT``), change (``PATCH``; ``{"enabled":
    false}`` pauses) or delete (204) one of the caller's schedules; 404 for anyone else's."""

    serializer_class = ScheduleOutputSerializer

    def _mine(self, request: Request, schedule_id: int) -> Schedule:
        try:
            return schedule_reads.schedule_get(owner=request.user, schedule_id=schedule_id)
        except Schedule.DoesNotExist:
            raise NotFound(NOT_YOURS) from None

    @extend_schema(summary="Read one of your schedules")
    def get(self, request: Request, schedule_id: int) -> Response:
        return Response(ScheduleOutputSerializer(self._mine(request, schedule_id)).data)

    def _change(self, request: Request, schedule_id: int, *, partial: bool) -> Response:
        schedule = self._mine(request, schedule_id)
        kind = ScheduleChangeInputSerializer if partial else ScheduleReplaceInputSerializer
        serializer = kind(data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        _saved(schedule_writes.schedule_update, schedule=schedule,
               **_resolve(serializer.validated_data))
        fresh = schedule_reads.schedule_get(owner=request.user, schedule_id=schedule.pk)
        return Response(ScheduleOutputSerializer(fresh).data)

    @extend_schema(summary="Replace one of your schedules", request=ScheduleReplaceInputSerializer,
                   responses={200: ScheduleOutputSerializer})
    def put(self, request: Request, schedule_id: int) -> Response:
        return self._change(request, schedule_id, partial=False)

    @extend_schema(summary="Change, pause or resume one of your schedules",
                   request=ScheduleChangeInputSerializer,
                   responses={200: ScheduleOutputSerializer})
    def patch(self, request: Request, schedule_id: int) -> Response:
        return self._change(request, schedule_id, partial=True)

    @extend_schema(summary="Delete one of your schedules", request=None, responses={204: None})
    def delete(self, request: Request, schedule_id: int) -> Response:
        schedule_writes.schedule_delete(schedule=self._mine(request, schedule_id))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ScheduleRunListApi(ListAPIView):
    """``GET /api/v1/schedules/<id>/runs/``: the schedule's runs, newest slot first; 404 for
    another user's schedule."""

    serializer_class = ScheduleRunOutputSerializer

    def get_queryset(self) -> Any:
        if getattr(self, "swagger_fake_view", False):  # drf-spectacular reading the schema
            return ScheduleRun.objects.none()
        try:
            schedule = schedule_reads.schedule_get(
                owner=self.request.user, schedule_id=self.kwargs["schedule_id"]
            )
        except Schedule.DoesNotExist:
            raise NotFound(NOT_YOURS) from None
        return schedule_reads.schedule_runs(schedule=schedule)

    @extend_schema(summary="List a schedule's runs")
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)


class SchedulePreviewApi(APIView):
    """``POST /api/v1/schedules/preview/``: validate schedule times and list the next 5 run
    times (ISO 8601 in ``timezone``): 200 ``{"next_runs": [...]}``, or 400 with field
    messages. Saves nothing."""

    @extend_schema(
        summary="Preview a schedule's next run times",
        request=SchedulePreviewInputSerializer,
        responses={200: inline_serializer(
            "SchedulePreview", {"next_runs": serializers.ListField(child=serializers.CharField())}
        )},
    )
    def post(self, request: Request) -> Response:
        serializer = SchedulePreviewInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        preview = schedule_reads.schedule_preview(**serializer.validated_data)
        if preview.errors:
            raise serializers.ValidationError(preview.errors)
        return Response({"next_runs": preview.next_runs})
