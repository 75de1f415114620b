"""``manage.py`` turns a wrong setting or an unreachable service into one clear line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dex_agents.testing import free_port

ROOT = Path(__file__).resolve().parent.parent


def _manage(tmp_path: Path, *argv: str, **env: str) -> subprocess.CompletedProcess[str]:
    keep = {key: value for key, value in os.environ.items()
            if key not in ("DATABASE_URL", "REDIS_URL", "DEXAGENTS_WORKERS")}
    return subprocess.run(
        [sys.executable, "manage.py", *argv], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
        env={**keep, "DEXAGENTS_VAR_DIR": str(tmp_path / "var"), **env},
    )


@pytest.mark.parametrize(("variable", "value", "says"), [
    ("DATABASE_URL", "user:secret@db/name", "DATABASE_URL must be a database URL"),
    ("DEXAGENTS_WORKERS", "0", "DEXAGENTS_WORKERS must be between 1 and 64, not 0"),
    ("REDIS_URL", "http://cache:6379", "REDIS_URL"),
])
def test_a_wrong_setting_is_one_line_naming_the_variable(
    tmp_path: Path, variable: str, value: str, says: str
) -> None:
    done = _manage(tmp_path, "check", **{variable: value})
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("dexagents: configuration error: "), done.stderr
    assert says in lines[-1]
    assert "Traceback" not in done.stderr
    assert "secret" not in done.stderr


def test_dev_names_a_database_that_does_not_answer(tmp_path: Path) -> None:
    port = free_port()
    done = _manage(tmp_path, "dev", DATABASE_URL=f"postgres://u:secret@127.0.0.1:{port}/x",
                   PORT=str(free_port()))
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"dexagents could not start: the database (postgresql 127.0.0.1:{port}/x) did not "
        "answer: "), done.stderr
    assert "Traceback" not in done.stderr and "secret" not in done.stderr
