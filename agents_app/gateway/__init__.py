"""The web side's only door to the Dex engine, and its snapshot cache.

Owns: every Dex call of web and Celery processes: a session's lifecycle and reads
(``dex_gateway``, which also hands on the runners and errors below), what people send a
running session (``input_rpcs``), its AgentEvents Stream (``event_stream``), the start and stop
of schedules' Flows (``schedule_flows``); the machinery
under them: where calls run (``engine_loop``: the private event loop thread and deadlines),
the SDK client per event loop (``engine_connection``), the translation of SDK errors
(``engine_errors``), the JSON-ready shapes of Dex values (``session_data``); and the cache of
the last snapshot read per session (``snapshot_cache``).

May import: the worker side (the shared Flow's registration) and the foundation.
"""
