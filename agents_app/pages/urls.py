"""Routes of the browser pages, mounted where the host project includes them (the dexagents
project mounts them at the site root; the page modules find them through base.html)."""

from django.urls import path

from agents_app.pages import views

app_name = "pages"

urlpatterns = [
    path("", views.portal_view, name="portal"),
    path("sessions/", views.session_list_view, name="session-list"),
    path("sessions/<str:session_id>/", views.session_detail_view, name="session-detail"),
    path("approvals/", views.approvals_view, name="approvals"),
    path("usage/", views.usage_view, name="usage"),
    path("schedules/", views.schedule_list_view, name="schedule-list"),
    path("schedules/new/", views.schedule_form_view, name="schedule-new"),
    path("schedules/<int:schedule_id>/edit/", views.schedule_form_view, name="schedule-edit"),
    path(
        "schedules/<int:schedule_id>/enabled/",
        views.schedule_enabled_view,
        name="schedule-enabled",
    ),
    path(
        "settings/notifications/",
        views.notification_settings_view,
        name="notification-settings",
    ),
]
