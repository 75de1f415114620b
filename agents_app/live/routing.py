"""Websocket routes, mounted by ``dexagents_site.asgi`` under ``agents_app.auth``'s middleware.

``/ws/sessions/<id>/events/`` relays a session's AgentEvents; ``/ws/approvals/`` tells staff
dashboards when pending approvals change (``agents_app.live.consumers``); any other path closes
with 4404.
"""

from django.urls import URLPattern, URLResolver, path, re_path

from agents_app.live.consumers import ApprovalsConsumer, SessionEventsConsumer, UnknownPathConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    path(
        "ws/sessions/<str:session_id>/events/",
        SessionEventsConsumer.as_asgi(),
        name="ws-session-events",
    ),
    path("ws/approvals/", ApprovalsConsumer.as_asgi(), name="ws-approvals"),
    # Last: any other path closes with 4404 rather than a handshake error (HTTP 500).
    re_path(r"", UnknownPathConsumer.as_asgi(), name="ws-unknown"),
]
