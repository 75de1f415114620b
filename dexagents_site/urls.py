"""Top-level URL configuration.

- ``/admin/``: Django admin (MCP servers, tools, agent definitions).
- ``/api/v1/``: the REST API (agents_app.urls).
- ``/api/schema/``: the OpenAPI 3 schema (drf-spectacular), for token or session callers;
  anonymous callers get 401 JSON.
- ``/api/docs/`` (Swagger UI) and ``/api/redoc/`` (Redoc): the schema as pages, served from
  drf-spectacular-sidecar's static files (nothing is fetched from elsewhere; Redoc's bundle
  from ``/api/redoc/redoc.standalone.js``, without its CDN logo); logged-in browsers only,
  others are redirected to the login page.
- ``/favicon.ico``: a permanent redirect to the site's SVG icon (pages also link it).
- ``/healthz``: unauthenticated liveness of web, engine and worker.
- ``/readyz``: unauthenticated readiness (database, Redis, engine, a fresh worker), JSON.
- ``/metrics``: Prometheus metrics, for loopback callers or ``DEXAGENTS_METRICS_TOKEN``.
- ``/accounts/login/``, ``/accounts/logout/`` (POST): Django's session login for the pages.
- ``/``, ``/sessions/``, ``/sessions/<id>/``, ``/approvals/``: the pages (agents_app.pages.urls).
"""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.auth.decorators import login_required
from django.templatetags.static import static
from django.urls import include, path
from django.views.decorators.http import require_safe
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularRedocView, SpectacularSwaggerSplitView

from agents_app.api.health import health_view, readiness_view
from agents_app.api.schema import offline_docs_page, redoc_bundle_view
from agents_app.api.schema_view import SchemaView
from agents_app.metrics import metrics_view

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("agents_app.urls")),
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    # GET only (405 for other methods, before the login redirect).
    # The split view serves Swagger UI's settings as a script of its own, so the page has no
    # inline script (a strict Content-Security-Policy can be turned on).
    path(
        "api/docs/",
        offline_docs_page(
            require_safe(
                login_required(SpectacularSwaggerSplitView.as_view(url_name="api-schema"))
            )
        ),
        name="api-docs",
    ),
    path(
        "api/redoc/",
        offline_docs_page(
            require_safe(
                login_required(
                    SpectacularRedocView.as_view(
                        url_name="api-schema", template_name="agents_app/api_redoc.html"
                    )
                )
            )
        ),
        name="api-redoc",
    ),
    # Redoc's bundle without the one file it would load from another host (its logo).
    path(
        "api/redoc/redoc.standalone.js",
        require_safe(login_required(redoc_bundle_view)),
        name="api-redoc-bundle",
    ),
    # Browsers ask for /favicon.ico where a page names no icon (the API's JSON, Swagger UI
    # before its own loads): the site's SVG icon rather than a logged 404.
    path(
        "favicon.ico",
        require_safe(RedirectView.as_view(url=static("agents_app/favicon.svg"), permanent=True)),
        name="favicon",
    ),
    path("healthz", health_view, name="healthz"),
    path("readyz", readiness_view, name="readyz"),
    path("metrics", metrics_view, name="metrics"),
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(
            template_name="agents_app/login.html", redirect_authenticated_user=True
        ),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", include("agents_app.pages.urls")),
]
