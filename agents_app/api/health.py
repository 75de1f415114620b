"""Operations endpoints outside the API: ``/healthz`` (liveness) and ``/readyz`` (readiness).

Both answer without authentication and are never cached; ``/metrics`` is
``agents_app.metrics.metrics_view``. May import the domain's reads (``selectors``).
"""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_safe

from agents_app.selectors.platform_health import health_get, readiness_get


@never_cache
@require_safe
def readiness_view(request: HttpRequest) -> JsonResponse:
    """``GET /readyz`` (no auth): 200 when the database, Redis (when configured), the engine
    and at least one Dex worker are up, else 503; body: ``selectors.readiness_get``."""
    body = readiness_get()
    return JsonResponse(body, status=200 if body["ready"] else 503)


@never_cache
@require_GET
def health_view(request: HttpRequest) -> JsonResponse:
    """``GET /healthz`` (no auth): 200 when web, engine and worker are up, else 503.

    Body: ``{"web": "up", "engine": "up"|"down", "worker": "up"|"down"}``; a 503 adds
    ``detail`` and ``unavailable`` (the first part down), as every 503 of the API does.
    """
    parts = health_get()
    return JsonResponse(parts, status=503 if "unavailable" in parts else 200)
