"""Top-level URL configuration.

- ``/admin/``: Django admin (MCP servers, tools, agent definitions).
- ``/api/v1/``: the REST API (agents_app.urls).
- ``/api/schema/``: the OpenAPI 3 schema (drf-spectacular).
- ``/healthz``: unauthenticated liveness of web, engine and worker.
"""

from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from agents_app.apis import health_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("agents_app.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("healthz", health_view, name="healthz"),
]
