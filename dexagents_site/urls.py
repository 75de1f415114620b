"""Top-level URL configuration.

- ``/admin/``: Django admin (MCP servers, tools, agent definitions).
- ``/api/v1/``: the REST API (agents_app.urls).
- ``/api/schema/``: the OpenAPI 3 schema (drf-spectacular).
- ``/healthz``: unauthenticated liveness of web, engine and worker.
- ``/accounts/login/``, ``/accounts/logout/`` (POST): Django's session login for the pages.
- ``/``, ``/sessions/``, ``/sessions/<id>/``, ``/approvals/``: the pages (agents_app.page_urls).
"""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView

from agents_app.apis import health_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("agents_app.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("healthz", health_view, name="healthz"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="agents_app/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("agents_app.page_urls")),
]
