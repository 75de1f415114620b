"""The host project's Celery app: the dexagents apps' tasks are ``shared_task``s found by
``autodiscover_tasks``; configuration comes from the ``CELERY_*`` settings."""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")

app = Celery("hostsite")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
