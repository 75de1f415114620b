"""Kept path for host projects: ``agents_app.api_schema``, as settings and imports named it
before the app had packages. The code is in ``agents_app.api.schema``."""

from agents_app.api.schema import ApiAutoSchema

__all__ = ["ApiAutoSchema"]
