"""Kept path for host projects: ``agents_app.api_pagination``, as settings and imports named it
before the app had packages. The code is in ``agents_app.api.pagination``."""

from agents_app.api.pagination import StrictLimitOffsetPagination

__all__ = ["StrictLimitOffsetPagination"]
