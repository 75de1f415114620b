"""Reads of agents and sessions (HackSoft "selectors"), one module per concern.

- ``agent_catalog``: the enabled agents, why one cannot start, the tools it offers;
- ``session_reads``: access to a session, the lists, the detail beside the Dex snapshot,
  the queue with the outbox's messages;
- ``approval_lists``: the approvals dashboard's lists and count (``approval_list_pending``
  builds the ``GET /api/v1/approvals/`` items itself; no DRF serializer renders them);
- ``platform_health``: ``/healthz``, ``/readyz`` and which part is down;
- ``api_tokens``: a user's API tokens;
- ``triggers``: the inbound trigger a delivery's URL names, and a trigger's URL.
- ``schedules``: a user's schedules, their runs, next run times and the form's preview.

Callers import the module that holds a read (``from agents_app.selectors import
session_reads``); this package re-exports nothing.

May import: the sessions index, search and outbox, the Dex gateway, the worker side, usage
and notices, and the foundation; never the faces (API, pages, live relay) above
(tests/test_layering.py).
"""
