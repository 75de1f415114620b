"""Kept path for host projects: ``agents_app.routing``, as settings and imports named it
before the app had packages. The code is in ``agents_app.live.routing``."""

from agents_app.live.routing import websocket_urlpatterns

__all__ = ["websocket_urlpatterns"]
