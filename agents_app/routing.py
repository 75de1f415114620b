"""Websocket routes, mounted by ``dexagents_site.asgi`` under ``agents_app.auth``'s middleware.

``/ws/sessions/<id>/events/`` relays a session's AgentEvents (``agents_app.consumers``).
"""

from django.urls import URLPattern, URLResolver, path

from agents_app.consumers import SessionEventsConsumer

websocket_urlpatterns: list[URLPattern | URLResolver] = [
    path(
        "ws/sessions/<str:session_id>/events/",
        SessionEventsConsumer.as_asgi(),
        name="ws-session-events",
    ),
]
