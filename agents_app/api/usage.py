"""``GET /api/v1/usage/``: the caller's own model usage and cost (issue 27 "Cost and usage").

Sums the caller's ``UsageRecord`` rows (one per model call of the caller's sessions; see
``agents_app.usage.usage_records``) over UTC days ``from`` to ``to``: in total, per day and per
agent. Staff see their own figures here too; everyone's are on the staff usage page.
"""

from __future__ import annotations

import datetime
from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.schema import error_response, field_errors_serializer
from agents_app.api.session_schema import UsageSerializer
from agents_app.usage.usage_records import usage_summary

#: Days a range may span at most (a year and a day, so any one calendar year fits).
USAGE_MAX_DAYS = 366
#: Days shown when the caller names no ``from``.
USAGE_DEFAULT_DAYS = 30


def utc_today() -> datetime.date:
    """Today's date in UTC, the calendar usage days follow."""
    return timezone.now().astimezone(datetime.UTC).date()


class UsageRangeSerializer(serializers.Serializer):
    """The query of ``GET /api/v1/usage/``: an inclusive range of UTC days."""

    # ``from`` is a Python keyword: the field is declared under another name and renamed.
    date_from = serializers.DateField(
        required=False,
        help_text=f"First UTC day (YYYY-MM-DD); default: {USAGE_DEFAULT_DAYS - 1} days before "
        "`to`.",
    )
    to = serializers.DateField(required=False, help_text="Last UTC day; default: today.")

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = fields.pop("date_from")
        return fields

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        # DRF reads a blank query value of an optional field as absent; a blank date is not
        # the default, it is a mistake.
        blank = {
            name: ["Give a date as YYYY-MM-DD."]
            for name in ("from", "to")
            if name in self.initial_data and not str(self.initial_data.get(name)).strip()
        }
        if blank:
            raise serializers.ValidationError(blank)
        last = attrs.get("to") or utc_today()
        first = attrs.get("from") or last - datetime.timedelta(days=USAGE_DEFAULT_DAYS - 1)
        if first > last:
            # Plain words: the usage page shows this message beside its "From" field.
            raise serializers.ValidationError({"from": ["Must not be after the last day (to)."]})
        if (last - first).days + 1 > USAGE_MAX_DAYS:
            raise serializers.ValidationError(
                {"from": [f"A range spans at most {USAGE_MAX_DAYS} days."]}
            )
        return {"from": first, "to": last}


class UsageDaySerializer(UsageSerializer):
    """One UTC day's sums."""

    day = serializers.DateField()


class UsageAgentSerializer(UsageSerializer):
    """One agent's sums over the range."""

    agent = serializers.CharField(help_text="The agent's slug.")
    name = serializers.CharField()


class UsageSummarySerializer(serializers.Serializer):
    """The caller's usage over a range of UTC days."""

    date_from = serializers.DateField(help_text="First day of the range.")
    to = serializers.DateField(help_text="Last day of the range.")
    totals = UsageSerializer()
    days = UsageDaySerializer(
        many=True, help_text="Every day of the range, oldest first (zeros when nothing ran)."
    )
    agents = UsageAgentSerializer(
        many=True, help_text="Agents the caller's sessions used in the range, costliest first."
    )

    def get_fields(self) -> dict[str, Any]:
        fields = super().get_fields()
        fields["from"] = fields.pop("date_from")
        return fields


class UsageApi(APIView):
    """``GET /api/v1/usage/?from=YYYY-MM-DD&to=YYYY-MM-DD``: the caller's model usage and cost.

    200 ``{"from", "to", "totals", "days": [...], "agents": [...]}`` (``usage_records.
    usage_summary``; money is a decimal string in US dollars). Only calls of the caller's own
    sessions count. 400 with field messages for a date that is not ``YYYY-MM-DD``, ``from``
    after ``to``, or a range over 366 days; 401 without credentials.
    """

    @extend_schema(
        summary="Your model usage and cost per day and per agent",
        parameters=[
            OpenApiParameter(
                "from", datetime.date, description="First UTC day; default: 29 days before to."
            ),
            OpenApiParameter("to", datetime.date, description="Last UTC day; default: today."),
        ],
        responses={
            200: UsageSummarySerializer,
            400: error_response(
                400,
                field_errors_serializer(UsageRangeSerializer, name="UsageRangeError"),
                "A date that is not YYYY-MM-DD, from after to, or more than 366 days.",
            ),
        },
    )
    def get(self, request: Request) -> Response:
        query = UsageRangeSerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        summary = usage_summary(
            owner_id=request.user.pk,
            date_from=query.validated_data["from"],
            date_to=query.validated_data["to"],
        )
        return Response(summary)
