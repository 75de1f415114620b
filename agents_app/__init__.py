"""The dexagents Django app: agents, sessions, approvals, the REST API, pages and the worker side.

Packages by concern, in layers (docs/ARCHITECTURE.md "Inside agents_app"; tests/test_layering.py
``AGENTS_APP_LAYERS``): the faces ``api``, ``pages``, ``live``, ``demo``, ``dev``; the domain
``selectors`` and ``services``; ``sessions`` (the Django index and the outbox); ``gateway`` (the
door to Dex); ``worker`` (the Flow and the LiteLLM runner); ``usage`` and ``notify``; and the
foundation modules beside this file (``conf``, ``models``, ``providers``, ``auth``, ...). The
flat modules that only hand names on (``apis``, ``routing``, ``lifespan``, ...) are the paths
host projects' settings named before the packages.
"""
