"""What clients watch live: websocket consumers, their routes, the relay of a session's events.

Owns: the Channels consumers (``consumers``) and routes (``routing``), the one shared reader
per session and event loop of a session's AgentEvents Dex Stream (``session_feed``), what
clients get from it: frames, turn outcomes and SSE (``session_events``), and the web process's
ASGI lifespan that connects before it serves (``lifespan``).

May import: the domain (``selectors``) and everything below it (tests/test_layering.py); never
the REST API or the pages.
"""
