"""The Dex worker's side: what runs inside ``manage.py dexworker``.

Owns: the shared agent session Flow (``flow``), the LiteLLM runner that makes each model call
(``runner``) and reads its reply (``model_replies``), the plan prompts (``plan_prompts``),
generated titles (``titles``) and the worker's liveness beats (``heartbeat``). Model providers
are configured in ``agents_app.providers``.

May import: usage and budgets (``agents_app.usage``) and the foundation.
"""
