"""DRF exception handling for the whole REST API.

DRF's own handler answers only its ``APIException`` family; Django's ``RequestDataTooBig``
(raised while DRF parses a body larger than ``DATA_UPLOAD_MAX_MEMORY_SIZE``) would otherwise
reach Django's generic 400 page, which is HTML (with a traceback under DEBUG).
"""

from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus a JSON 413 ``{"detail"}`` for request bodies over the size limit.

    Returns:
        The error response, or ``None`` for exceptions Django should handle (server errors).
    """
    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is larger than the limit of {limit} bytes."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return drf_exception_handler(exc, context)
