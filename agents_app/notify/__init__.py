"""Notices of what happens in sessions.

Owns: the approval emails and webhook events that each fact of the session index sends
(``notifications``: its ``*_notify`` functions, called by ``sessions.session_index`` inside the
transaction that writes the fact, decide which event a fact is), and how one webhook event is
recorded, signed and delivered (``webhooks``). The event names are ``WebhookEvent`` in
``agents_app.models``.

May import: the foundation only; sends are queued as Celery tasks by name
(``agents_app.task_queue``).
"""
