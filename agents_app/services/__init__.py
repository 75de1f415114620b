"""Writes of agents and sessions (HackSoft "services"), one module per concern.

- ``session_lifecycle``: start, generated title, statuses read from Dex, stop, rename,
  archive, delete;
- ``session_input``: user messages and the queue, answers to questions, plan execution,
  turn cancels;
- ``approval_decisions``: approving or rejecting a tool call that waits, and its audit;
- ``api_tokens``: API tokens and ``manage.py createtoken``'s user;
- ``triggers``: an inbound trigger's delivery: its signature, its message, the one session
  per idempotency key; trigger secrets;
- ``subagents``: the shared Flow's ``SubagentDirectory`` (issue 29): child sessions' index rows,
  their stops;
- ``schedules``: schedules' create, edit, pause, resume, delete and their Flows' reconcile;
  ``schedule_runs``: the schedule Flow's database work (plan, arrive, fire one slot once).

A session's title is written in three places: ``session_lifecycle.session_rename`` (its
owner), ``session_lifecycle.session_title_generate`` (Celery, after the first turn) and
``session_input._title_from_first_message`` (a session started without a message takes the
title of its first message); a change that must follow every title change hooks all three.

Callers import the module that holds a write (``from agents_app.services import
session_input``); this package re-exports nothing. The demo data is ``agents_app.demo.seed``.

May import: the sessions index and outbox, the Dex gateway, the worker side, usage and
notices, and the foundation; never the faces (API, pages, live relay) above
(tests/test_layering.py).
"""
