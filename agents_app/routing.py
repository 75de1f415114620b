"""Websocket routes, mounted by ``dexagents_site.asgi`` under the auth middleware.

``/ws/sessions/<id>/events/`` (ARCHITECTURE.md "Interfaces") is added with its consumer.
"""

from django.urls import URLPattern, URLResolver

websocket_urlpatterns: list[URLPattern | URLResolver] = []
