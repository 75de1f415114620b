"""``GET/PUT /api/v1/me/notifications/``: the caller's own notification choices (issue 27
"Notifications"; staff only, since only staff decide approvals).

- ``GET``: 200 ``{"email_on_approval", "email"}``; ``email`` is the address emails go to
  (read-only here, set in admin; blank: no email is sent).
- ``PUT`` ``{"email_on_approval": bool}``: 200 with the same shape; 400 with field messages
  for a missing or non-boolean value or an unknown field.

Non-staff callers get 403, anonymous ones 401. Admin edits the same rows
(*Notification preferences*).
"""

from __future__ import annotations

from typing import cast

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.fields import BodySerializer, StrictBooleanField
from agents_app.api.schema import error_response, field_errors_serializer
from agents_app.models import NotificationPreference


class NotificationPreferenceBodySerializer(BodySerializer):
    """The body of ``PUT /api/v1/me/notifications/``."""

    email_on_approval = StrictBooleanField(
        help_text="Email me when a tool call starts waiting for approval, and a reminder "
        "before its deadline."
    )


class NotificationPreferenceSerializer(serializers.Serializer):
    """The caller's notification choices."""

    email_on_approval = serializers.BooleanField()
    email = serializers.EmailField(
        allow_blank=True, help_text="Where emails go (set in admin); blank: none are sent."
    )


def _answer(request: Request, preference: NotificationPreference | None) -> Response:
    return Response({
        "email_on_approval": bool(preference and preference.email_on_approval),
        "email": getattr(request.user, "email", ""),
    })


class NotificationPreferenceApi(APIView):
    """The caller's notification choices: ``GET`` reads them, ``PUT`` sets them."""

    permission_classes = (IsAdminUser,)

    @extend_schema(summary="Your notification choices (staff)",
                   responses={200: NotificationPreferenceSerializer})
    def get(self, request: Request) -> Response:
        user_id = cast(int, request.user.pk)
        preference = NotificationPreference.objects.filter(user_id=user_id).first()
        return _answer(request, preference)

    @extend_schema(
        summary="Set your notification choices (staff)",
        request=NotificationPreferenceBodySerializer,
        responses={
            200: NotificationPreferenceSerializer,
            400: error_response(
                400,
                field_errors_serializer(
                    NotificationPreferenceBodySerializer, name="NotificationPreferenceError"
                ),
            ),
        },
    )
    def put(self, request: Request) -> Response:
        body = NotificationPreferenceBodySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        preference, _ = NotificationPreference.objects.update_or_create(
            user_id=cast(int, request.user.pk),
            defaults={"email_on_approval": body.validated_data["email_on_approval"]},
        )
        return _answer(request, preference)
