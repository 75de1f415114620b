"""The DBOS peer of ``bench/turn.py`` (``bench/dbos_turn_peer.py``) as the bench runs it: a real
process on a real SQLite file, each turn one workflow of five durable steps."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from bench.turn import DbosSide


def test_a_dbos_turn_runs_five_durable_steps_and_answers(tmp_path: Path) -> None:
    side = DbosSide(tmp_path)
    try:
        for workflow_id in ("turn-a", "turn-b"):
            assert side.turn(workflow_id) > 0
        assert side.cpu() > 0
    finally:
        side.close()
    assert side.process.returncode == 0
    # Every turn ran the model twice and each of the three tools once (warm-up included).
    lines = side.log_path.read_text().splitlines()
    assert lines.count("model turn-1") == 2 * 3
    assert lines.count("tool lookup") == 3 * 3
    with sqlite3.connect(tmp_path / "dbos.sqlite3") as connection:
        steps = connection.execute(
            "SELECT workflow_uuid, COUNT(*) FROM operation_outputs GROUP BY workflow_uuid"
        ).fetchall()
    assert dict(steps) == {"warm-up": 5, "turn-a": 5, "turn-b": 5}
