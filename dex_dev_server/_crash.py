"""Crash points: the engine SIGKILLs itself at a named point, for the kill -9 tests.

``DEX_DEV_SERVER_CRASH_AT="<point>:<n>[,<point>:<n>...]"`` makes the engine process send
itself ``SIGKILL`` the ``n``-th time it reaches ``<point>`` (read once, at import). A test
that kills the engine from outside cannot choose the instant between two statements; this
lets it kill the process inside a transaction, or between reading a blob and answering, as a
power cut or the OOM killer would. Unset (always, outside tests), :func:`crash_point` returns
at once.

The points:

- ``blob-write``: inside the transaction that stores new blobs and their first references,
  before ``COMMIT``.
- ``blob-collect``: inside the transaction that deleted blobs nothing references any more,
  before ``COMMIT``.
- ``blob-committed``: after such a transaction committed, before the engine acts on it
  (answers the RPC, sends the next task).
- ``load-blobs``: in ``LoadBlobs``, with the answer read from the store and not yet sent (a
  worker hydrating a task).
"""

from __future__ import annotations

import os
import signal

#: The environment variable read at import.
CRASH_ENV = "DEX_DEV_SERVER_CRASH_AT"


def _plan(spec: str) -> dict[str, int]:
    plan: dict[str, int] = {}
    for item in spec.split(","):
        point, _, count = item.strip().rpartition(":")
        if point:
            plan[point] = int(count)
    return plan


_PLAN = _plan(os.environ.get(CRASH_ENV, ""))


def crash_point(point: str) -> None:
    """SIGKILL this process if the plan says so for this visit of ``point``."""
    if not _PLAN or point not in _PLAN:
        return
    _PLAN[point] -= 1
    if _PLAN[point] <= 0:
        os.kill(os.getpid(), signal.SIGKILL)
