"""The REST API under ``/api/v1/`` (DRF, drf-spectacular), its health and readiness probes.

Owns: the API views (``views``: sessions, agents, messages, plans, history; ``approvals``,
``tokens``, ``usage``, ``notifications``), their OpenAPI documentation (``schema``,
``session_schema``), request-field and query checks (``fields``, ``query``), paging, throttling,
the async views that read Dex without a thread per call (``async_views``), the snapshot read's
ASGI short path (``snapshot_asgi``) and ``/readyz`` (``health``). Routes are in
``agents_app.urls``.

May import: the live relay (``agents_app.live``: SSE and long-poll reads), the domain
(``selectors``, ``services``) and everything below it (tests/test_layering.py).
"""
