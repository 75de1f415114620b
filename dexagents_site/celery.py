"""The Celery application of dexagents.

Configuration comes from Django settings under the ``CELERY_`` namespace: Redis when
``REDIS_URL`` is set, otherwise kombu's filesystem transport under ``var/celery/``, which
needs no server (reference/django-notes.md G3). Run a worker with
``celery -A dexagents_site worker --pool=solo``.
"""

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dexagents_site.settings")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")

app = Celery("dexagents")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
