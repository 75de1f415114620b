"""Where the demo MCP servers keep their state: JSON files under the var directory.

The directory is ``$DEXAGENTS_VAR_DIR/demo_mcp`` (default ``<repository>/var/demo_mcp``), so a
write made by an agent can be observed, and counted, from outside the server. The server
registry passes ``DEXAGENTS_VAR_DIR`` to the child as a plain value (``env_values``, set by
``seed_demo`` to the installation's var directory).
Writers hold an exclusive ``flock`` on ``<file>.lock`` for the whole read-modify-write.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
VAR_DIR_ENV = "DEXAGENTS_VAR_DIR"


def state_dir() -> Path:
    """``$DEXAGENTS_VAR_DIR/demo_mcp`` (default ``<repo>/var/demo_mcp``), created if missing."""
    root = Path(os.environ.get(VAR_DIR_ENV) or REPO_ROOT / "var")
    directory = root / "demo_mcp"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


def state_read(name: str, default: Any) -> Any:
    """The JSON value stored in ``<state dir>/<name>``, or ``default`` when there is none."""
    path = state_dir() / name
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return default


@contextlib.contextmanager
def state_locked(name: str) -> Iterator[Path]:
    """Hold the exclusive lock of ``<state dir>/<name>`` and yield the file's path."""
    path = state_dir() / name
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield path
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def state_write(path: Path, value: Any) -> None:
    """Replace ``path`` with ``value`` as JSON atomically (write, fsync, rename)."""
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(value, handle, ensure_ascii=False, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
