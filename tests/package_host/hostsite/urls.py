"""The host project's URLs: its own pages, plus the dexagents API, pages and login."""

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.http import HttpRequest, HttpResponse
from django.urls import include, path


def home(request: HttpRequest) -> HttpResponse:
    """The host's own page, to show the apps share the site with it."""
    return HttpResponse("host project home")


urlpatterns = [
    path("", home, name="home"),
    path("admin/", admin.site.urls),
    # The pages link to the names "login" and "logout".
    path(
        "accounts/login/",
        auth_views.LoginView.as_view(template_name="agents_app/login.html"),
        name="login",
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    # Both under the host's own prefix; DEXAGENTS["API_PATH_PREFIX"] names the API's.
    path("agents/api/v1/", include("agents_app.urls")),
    path("agents/", include("agents_app.pages.urls")),
]
