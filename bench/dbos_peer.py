"""Peer for bench.engine: a chain of no-op durable steps in DBOS on SQLite.

Run as ``python -m bench.dbos_peer STEPS DB_PATH``; prints one JSON line with the total
seconds and per-step deltas. Kept in its own process so DBOS's globals and threads never
meet the engine benchmark's event loop.
"""

from __future__ import annotations

import itertools
import json
import sys
import time

from dbos import DBOS

_marks: list[float] = []


@DBOS.step()
def noop(value: int) -> int:
    _marks.append(time.perf_counter())
    return value + 1


@DBOS.workflow()
def chain(steps: int) -> int:
    value = 0
    for _ in range(steps):
        value = noop(value)
    return value


def main() -> int:
    steps, db_path = int(sys.argv[1]), sys.argv[2]
    DBOS(config={"name": "dexagents-bench", "system_database_url": f"sqlite:///{db_path}"})
    DBOS.launch()
    try:
        chain(5)  # warm-up: schema, connections
        _marks.clear()
        started = time.perf_counter()
        assert chain(steps) == steps
        total = time.perf_counter() - started
    finally:
        DBOS.destroy()
    deltas = [b - a for a, b in itertools.pairwise(_marks)]
    print(json.dumps({"total": total, "deltas": deltas}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
