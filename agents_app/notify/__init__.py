"""Notices of what happens in sessions: approval emails and in-app notices
(``notifications``), and signed outgoing webhooks (``webhooks``).

May import: the foundation only; sends are queued as Celery tasks by name
(``agents_app.task_queue``).
"""
