"""The Dex worker's side: what runs inside ``manage.py dexworker``.

Owns: the shared agent session Flow (``flow``) and the schedules' Flow (``schedule_flow``,
its database work passed in by ``dexworker``); the LiteLLM runner (``runner``) and its parts:
the session's agent definition (``agent_config``), the model input rebuilt from Dex state
(``model_input``), each provider API's wire form and request (``model_requests``), the LiteLLM
calls (``model_calls``) and the reading of their replies (``model_replies``, their streamed
deltas in ``reply_deltas``), which provider failures are retried (``provider_errors``), a
reply's tool calls (``tool_calls``) and running one on its MCP server (``tool_execution``); the
plan prompts (``plan_prompts``), generated titles (``titles``) and the worker's liveness beats
(``heartbeat``). Model providers are configured in ``agents_app.providers``.

The runner imports its parts and none of them imports it; each part's docstring names the
modules it may import (``tests/test_layering.py`` fails on an import cycle).

May import: usage and budgets (``agents_app.usage``) and the foundation.
"""
