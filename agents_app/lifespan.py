"""Kept path for host projects: ``agents_app.lifespan``, as settings and imports named it
before the app had packages. The code is in ``agents_app.live.lifespan``."""

from agents_app.live.lifespan import WebWarmUp

__all__ = ["WebWarmUp"]
