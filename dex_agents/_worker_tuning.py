"""A dex-python-sdk workaround that makes each Step cheaper on a pull Worker.

Used by every Worker process this repository starts (``manage.py dexworker`` and
``dex_agents.testing.run_agent_worker``); measured by ``bench/turn.py`` (issue 13).
"""

from __future__ import annotations

import functools


def cache_sdk_version() -> None:
    """Read the SDK's own version once per process instead of once per task stream.

    dex-python-sdk 1.23.0 calls ``importlib.metadata.version("dex-python-sdk")`` each time a
    pull Worker registers a task stream (``dex._pull_worker``), which parses the package's
    METADATA file: 1.5 to 3 ms of CPU, and the SDK opens a stream for about every task. The
    installed version cannot change under a running process, so the cached answer is the same.
    Does nothing if the SDK no longer has that function.
    """
    from dex import _pull_worker

    current = getattr(_pull_worker, "sdk_version", None)
    if callable(current) and not hasattr(current, "cache_info"):
        _pull_worker.sdk_version = functools.cache(current)
