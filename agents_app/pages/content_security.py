"""The Content-Security-Policy header of every page (django-csp 4).

The pages load only this site's own files: ES modules (no inline scripts or handlers), one
stylesheet and the vendored libraries under ``static/vendor/``. The policy itself is the
``CONTENT_SECURITY_POLICY`` setting (``dexagents_site/settings.py``); this middleware adds the
one thing a static setting cannot say, the websocket origin of the host the page was served
from (``ws://<host>`` and ``wss://<host>``), for browsers that do not count same-host
websockets as ``'self'`` (CSP Level 3's matching of ``'self'`` says they should). Views
that send their own header keep it: django-csp never overwrites one, which is how the API docs pages
(``agents_app.api.schema.DOCS_CONTENT_SECURITY_POLICY``) keep their wider policy.
"""

from __future__ import annotations

from csp.middleware import CSPMiddleware, PolicyParts
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponseBase


def websocket_sources(request: HttpRequest) -> list[str]:
    """``["ws://<host>", "wss://<host>"]`` for the request's validated ``Host`` (with its
    port), or ``[]`` when the host is not one of ``ALLOWED_HOSTS``."""
    try:
        host = request.get_host()
    except DisallowedHost:
        return []
    return [f"ws://{host}", f"wss://{host}"]


class ContentSecurityPolicyMiddleware(CSPMiddleware):
    """django-csp's middleware, with the page's own websocket origin added to ``connect-src``."""

    def get_policy_parts(
        self,
        request: HttpRequest,
        response: HttpResponseBase,
        report_only: bool = False,
    ) -> PolicyParts:
        parts = super().get_policy_parts(request, response, report_only)
        sources = websocket_sources(request)
        if sources:
            update = dict(parts.update or {})
            earlier = update.get("connect-src") or []
            if isinstance(earlier, str):
                earlier = [earlier]
            update["connect-src"] = [*earlier, *sources]
            parts.update = update
        return parts
