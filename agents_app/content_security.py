"""Kept path for host projects: ``agents_app.content_security``, as settings and imports named it
before the app had packages. The code is in ``agents_app.pages.content_security``."""

from agents_app.pages.content_security import ContentSecurityPolicyMiddleware

__all__ = ["ContentSecurityPolicyMiddleware"]
