"""The web side's only door to the Dex engine (``dex_gateway``) and its snapshot cache.

Owns: the SDK client and its event loop for web and Celery processes, every Dex call they make
(starting sessions, snapshots, history, channel sends, stream reads), the translation of SDK
errors, and the cache of the last snapshot read per session (``snapshot_cache``).

May import: the worker side (the shared Flow's registration) and the foundation.
"""
