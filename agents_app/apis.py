"""Kept path for host projects: ``agents_app.apis``, as settings and imports named it
before the app had packages. The code is in ``agents_app.api.views``."""

from agents_app.api.views import SchemaView, health_view

__all__ = ["SchemaView", "health_view"]
