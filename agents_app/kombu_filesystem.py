"""Kept path for host projects: ``agents_app.kombu_filesystem``, as settings and imports named it
before the app had packages. The code is in ``agents_app.dev.kombu_filesystem``."""

from agents_app.dev.kombu_filesystem import Transport

__all__ = ["Transport"]
