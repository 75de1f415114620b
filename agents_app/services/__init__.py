"""Writes of agents and sessions (HackSoft "services"), one module per concern.

- ``session_lifecycle``: start, generated title, statuses read from Dex, stop, rename,
  archive, delete;
- ``session_input``: user messages and the queue, answers to questions, plan execution,
  turn cancels;
- ``approval_decisions``: approving or rejecting a tool call that waits, and its audit;
- ``api_tokens``: API tokens and ``manage.py createtoken``'s user;
- ``schedules``: schedules' create, edit, pause, resume, delete and their Flows' reconcile;
  ``schedule_runs``: the schedule Flow's database work (plan, arrive, fire one slot once).

Callers import the module that holds a write (``from agents_app.services import
session_input``); this package re-exports nothing. The demo data is ``agents_app.demo.seed``.

May import: the sessions index and outbox, the Dex gateway, the worker side, usage and
notices, and the foundation; never the faces (API, pages, live relay) above
(tests/test_layering.py).
"""
