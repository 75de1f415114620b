"""Finding the processes a test or the chaos suite started, from ``/proc``.

A run puts ``VARIABLE=mark`` into the environment of what it starts; a child inherits it, so
every process of the run carries it, wherever it was reparented to.
"""

from __future__ import annotations

from pathlib import Path


def marked_pids(variable: str, mark: str) -> list[int]:
    """PIDs of live processes whose environment holds ``variable=mark``.

    A process that is gone, a zombie or not ours (``environ`` unreadable) is left out.
    """
    needle = f"{variable}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found
