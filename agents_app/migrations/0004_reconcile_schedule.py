# Periodic reconciliation of the session and approvals index with django-celery-beat.

from django.db import migrations

TASK_NAME = "agents_app: reconcile the session and approvals index with Dex"
DEFAULT_SECONDS = 60


def schedule_create(apps, schema_editor):
    """Create the PeriodicTask once; its interval is then edited in admin (Periodic tasks)."""
    IntervalSchedule = apps.get_model("django_celery_beat", "IntervalSchedule")
    PeriodicTask = apps.get_model("django_celery_beat", "PeriodicTask")
    if PeriodicTask.objects.filter(name=TASK_NAME).exists():
        return
    interval, _ = IntervalSchedule.objects.get_or_create(every=DEFAULT_SECONDS, period="seconds")
    PeriodicTask.objects.create(
        name=TASK_NAME,
        task="agents_app.reconcile_session_index",
        interval=interval,
        enabled=True,
        # A run queued while no Celery worker listens is useless once the next one is due.
        expire_seconds=DEFAULT_SECONDS,
        description="Repair session statuses and pending approvals from Dex snapshots.",
    )


def schedule_delete(apps, schema_editor):
    apps.get_model("django_celery_beat", "PeriodicTask").objects.filter(name=TASK_NAME).delete()


class Migration(migrations.Migration):

    dependencies = [
        ("agents_app", "0003_approval_index"),
        ("django_celery_beat", "0019_alter_periodictasks_options"),
    ]

    operations = [migrations.RunPython(schedule_create, schedule_delete)]
