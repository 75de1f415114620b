"""Kept path for host projects: ``agents_app.apis``, as settings and imports named it
before the app had packages. ``health_view`` is in ``agents_app.api.health``, ``SchemaView``
in ``agents_app.api.schema_view``."""

from agents_app.api.health import health_view
from agents_app.api.schema_view import SchemaView

__all__ = ["SchemaView", "health_view"]
