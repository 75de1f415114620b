"""The demo model: a scripted, deterministic OpenAI-compatible server, and the demo data.

LiteLLM talks to it over real HTTP as an ``openai/...`` model whose ``api_base`` is
``DEXAGENTS["DEMO_MODEL_API_BASE"]`` (the seeded ``demo`` and ``demo-small`` agents). Its script
(``script``) reads the directives (``/slow``, ``/tool``, ``/fail`` and the rest, listed in that
module's docstring) and plans the reply, ``openai_wire`` gives the reply the OpenAI wire shapes,
and ``model_server`` serves them. Run it with ``python -m agents_app.demo.model_server``.

The demo rows (the demo MCP servers and their tools, the ``demo`` and ``demo-small`` agents, the
``demo`` user and the ``admin`` superuser) are created by ``seed.demo_seed``, which ``manage.py
seed_demo`` runs.

May import: the domain, the worker side (titles, plan prompts) and everything below it.
"""
