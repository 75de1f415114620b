"""The demo model: a scripted, deterministic OpenAI-compatible server (``model_server``).

LiteLLM talks to it over real HTTP when no provider key is set; its directives (``/slow``,
``/tool``, ``/plan`` and the rest) are listed in its module docstring. Run it with
``python -m agents_app.demo.model_server``. The demo rows (agent, MCP server, users) are
created by ``manage.py seed_demo``.

May import: the worker side (titles, plan prompts) and everything below it.
"""
