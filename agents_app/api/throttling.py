"""Fair use: per-user request rates for the REST API (DRF throttling on the Django cache).

Two budgets per authenticated user, counted apart: reads (``GET``, ``HEAD``, ``OPTIONS``) and
writes (every other method), at ``DEXAGENTS["THROTTLE_READS"]`` and
``DEXAGENTS["THROTTLE_WRITES"]`` (env ``DEXAGENTS_THROTTLE_READS`` / ``_WRITES``; DRF's rate
syntax ``<count>/<s|min|hour|day>``, or ``off``). They apply to everyone, staff included, and
to the pages' own API calls (they are the same endpoints). A request over a budget answers
429 ``{"detail"}`` with ``Retry-After`` (seconds), DRF's ``Throttled``; nothing it carried is
kept. The counts live in the default cache: shared by every web process with ``REDIS_URL``,
per process otherwise (so N web processes without Redis allow N times the rate).

Rates are read on every request (``dexagents_setting``), not at import as DRF's own
``SimpleRateThrottle.THROTTLE_RATES`` is, so a settings change in tests is seen.

A snapshot read that ``agents_app.api.snapshot_asgi`` (the short path) counted and then handed
to Django carries ``COUNTED_SCOPE_KEY`` in its ASGI scope and is not counted again.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import SAFE_METHODS
from rest_framework.throttling import UserRateThrottle

from agents_app.conf import dexagents_setting
from agents_app.rates import rate_or_none

#: The ASGI scope key of a request already counted (``agents_app.api.snapshot_asgi``).
COUNTED_SCOPE_KEY = "dexagents.throttles_counted"


class _MethodRateThrottle(UserRateThrottle):
    """A per-user budget for one kind of method; the other kind passes untouched."""

    setting = ""
    counts_safe_methods = True

    def get_rate(self) -> str | None:
        return rate_or_none(str(dexagents_setting(self.setting)))

    def allow_request(self, request: Any, view: Any) -> bool:
        if (request.method in SAFE_METHODS) != self.counts_safe_methods:
            return True
        # A snapshot read that agents_app.api.snapshot_asgi counted before handing it to Django.
        scope = getattr(getattr(request, "_request", None), "scope", None)
        if isinstance(scope, dict) and scope.get(COUNTED_SCOPE_KEY):
            return True
        # DRF resolves the rate in __init__; resolve again so a changed setting applies.
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)


class UserReadRateThrottle(_MethodRateThrottle):
    """``GET``/``HEAD``/``OPTIONS`` per user at ``DEXAGENTS["THROTTLE_READS"]``."""

    scope = "reads"
    setting = "THROTTLE_READS"
    counts_safe_methods = True


class UserWriteRateThrottle(_MethodRateThrottle):
    """Every other method per user at ``DEXAGENTS["THROTTLE_WRITES"]``."""

    scope = "writes"
    setting = "THROTTLE_WRITES"
    counts_safe_methods = False
