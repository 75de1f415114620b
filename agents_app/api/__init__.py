"""The REST API under ``/api/v1/`` (DRF, drf-spectacular), its health and readiness probes.

Owns: the API views, one module per resource: ``sessions`` (list, create, detail, rename,
archive, delete, stop), ``messages``, ``queue``, ``turns`` (answers to questions, plan
execution, turn cancel), ``events`` (Server-Sent Events and send-and-wait), ``history``,
``agents``, ``approvals``, ``tokens``, ``usage``, ``notifications``, ``triggers`` (an inbound
trigger's signed delivery); what the session views
share (``session_access``: the session lookup and the Dex error answers; ``snapshot``: the
snapshot read); their OpenAPI documentation (``schema``, ``session_schema``) and its view
(``schema_view``), request-field and query checks (``fields``, ``query``), paging, throttling,
the async views that read Dex without a thread per call (``async_views``), the snapshot read's
ASGI short path (``snapshot_asgi``, its database threads ``snapshot_db``) and the ``/healthz``
and ``/readyz`` probes (``health``). Routes are in ``agents_app.urls``.

May import: the live relay (``agents_app.live``: SSE and long-poll reads), the domain
(``selectors``, ``services``) and everything below it (tests/test_layering.py).
"""
