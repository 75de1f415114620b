"""What the Django database keeps about sessions that live on Dex.

Owns: the index of sessions and approvals kept current from the worker (``session_index``,
``approval_index``) and reconciled from Dex (``index_reconcile``), full-text search over
messages (``session_search``), and the outbox of accepted user messages, approval decisions and
turn cancels on their way to Dex (``outbox``), with what holds a message back besides the engine
(``outbox_holds``: the owner's running-turn cap, spent budgets).

May import: the Dex gateway, usage and budgets, notices, and the foundation
(tests/test_layering.py).
"""
