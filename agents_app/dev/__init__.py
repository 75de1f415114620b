"""The one-command development stack (``make run``, ``manage.py dev``) and its broker.

Owns: the supervisor of the engine, worker, Celery and web processes (``devstack``) and kombu's
``filesystem://`` transport made safe for concurrent readers (``kombu_filesystem``), the
embedded default's Celery broker.

May import: the foundation only (settings); it starts the other parts as processes.
"""
