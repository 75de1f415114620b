"""Kept path for host projects: ``agents_app.ops_views``, as settings and imports named it
before the app had packages. The code is in ``agents_app.api.health``."""

from agents_app.api.health import readiness_view

__all__ = ["readiness_view"]
