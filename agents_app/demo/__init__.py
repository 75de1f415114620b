"""The demo model: a scripted, deterministic OpenAI-compatible server (``model_server``).

LiteLLM talks to it over real HTTP when no provider key is set; its directives (``/slow``,
``/tool``, ``/plan`` and the rest) are listed in its module docstring. Run it with
``python -m agents_app.demo.model_server``.

The demo rows (the demo MCP servers and their tools, the ``demo`` and ``demo-small`` agents,
the ``demo`` user and the ``admin`` superuser) are created by ``seed.demo_seed``, which
``manage.py seed_demo`` runs.

May import: the domain, the worker side (titles, plan prompts) and everything below it.
"""
