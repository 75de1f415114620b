"""Kept path for host projects: ``agents_app.page_urls``, as settings and imports named it
before the app had packages. The code is in ``agents_app.pages.urls``."""

from agents_app.pages.urls import app_name, urlpatterns

__all__ = ["app_name", "urlpatterns"]
