"""The dexagents Django project.

The Celery app is imported here so that ``@shared_task`` binds to it whenever Django
starts (Celery's "First steps with Django" layout).
"""

from dexagents_site.celery import app as celery_app

__all__ = ("celery_app",)
