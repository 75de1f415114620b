"""``GET /api/schema/``: the view that serves the OpenAPI schema.

Apart from ``agents_app.api.schema`` because drf-spectacular's views module reads
``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`` (``schema.ApiAutoSchema``) as it is imported, so
importing it from ``schema`` itself would be circular.

May import: drf-spectacular and DRF only.
"""

from typing import Any

from drf_spectacular.views import SpectacularAPIView
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response


class SchemaView(SpectacularAPIView):
    """``GET /api/schema/``: drf-spectacular's schema view whose errors are JSON.

    The schema itself is YAML (``application/vnd.oai.openapi``) or JSON (``?format=json``),
    but a 401 for an anonymous caller is ``{"detail"}`` as JSON like every API error, not a
    YAML document.
    """

    def finalize_response(
        self, request: Request, response: Response, *args: Any, **kwargs: Any
    ) -> Response:
        if response.status_code >= 400:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().finalize_response(request, response, *args, **kwargs)
