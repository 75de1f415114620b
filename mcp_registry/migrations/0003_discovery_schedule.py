# Periodic tool discovery with django-celery-beat (issue 5, "Discovery").

import os

from django.db import migrations

TASK_NAME = "mcp_registry: discover the tools of every enabled MCP server"
DEFAULT_MINUTES = 60


def schedule_create(apps, schema_editor):
    """Create the PeriodicTask once; its interval is then edited in admin (Periodic tasks)."""
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    if PeriodicTask.objects.filter(name=TASK_NAME).exists():
        return
    raw = os.environ.get("DEXAGENTS_MCP_DISCOVERY_MINUTES", "").strip()
    minutes = int(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_MINUTES
    interval, _ = IntervalSchedule.objects.get_or_create(every=minutes, period="minutes")
    PeriodicTask.objects.create(
        name=TASK_NAME,
        task="mcp_registry.discover_all_servers",
        interval=interval,
        enabled=True,
        description="Refresh the stored catalogue of every enabled MCP server.",
    )


def schedule_delete(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=TASK_NAME).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("mcp_registry", "0002_tool_exposure"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule_create, schedule_delete)]
