"""Operations endpoints outside the API: ``/readyz`` (readiness) and ``/metrics``.

``/healthz`` (liveness) stays in ``agents_app.api.views``; ``/metrics`` is
``agents_app.metrics.metrics_view``.
"""

from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from agents_app.selectors.platform_health import readiness_get


@never_cache
@require_safe
def readiness_view(request: HttpRequest) -> JsonResponse:
    """``GET /readyz`` (no auth): 200 when the database, Redis (when configured), the engine
    and at least one Dex worker are up, else 503; body: ``platform_health.readiness_get``."""
    body = readiness_get()
    return JsonResponse(body, status=200 if body["ready"] else 503)
