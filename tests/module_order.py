"""The order in which pytest-xdist hands test modules to its workers, and what each took.

``make test`` runs two workers with ``--dist loadfile --no-loadscope-reorder``: a module stays
on one worker (its e2e stack serves all its tests) and modules are handed out in collection
order, one at a time as a worker runs low. Handed out longest first (the longest-processing-
time rule), the short unit modules fill the gaps at the end instead of one worker waiting
minutes for the other's last e2e module. xdist's own reorder sorts by test count, which put
the slowest modules (an e2e module has few, long tests) last.

How long a module takes comes from ``tests/module_durations.json`` (seconds per module path,
written by a run with ``DEXAGENTS_WRITE_MODULE_DURATIONS=1``); a module not listed there
counts as ``UNLISTED_E2E_SECONDS`` under ``tests/e2e/`` and ``UNLISTED_SECONDS`` elsewhere.
The end of every run prints the slowest modules (the sum of their tests' setup, call and
teardown), next to pytest's slowest tests.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

DURATIONS_FILE = Path(__file__).resolve().parent / "module_durations.json"
#: What a module missing from the file is expected to take, in seconds.
UNLISTED_E2E_SECONDS = 60.0
UNLISTED_SECONDS = 5.0
#: How many modules the run's summary lists.
SHOWN = 15


def module_of(nodeid: str) -> str:
    """``tests/x/test_y.py`` of ``tests/x/test_y.py::test_z[param]``."""
    return nodeid.split("::", 1)[0]


def expected_seconds(durations: dict[str, float], module: str) -> float:
    if module in durations:
        return durations[module]
    return UNLISTED_E2E_SECONDS if module.startswith("tests/e2e/") else UNLISTED_SECONDS


def read_durations() -> dict[str, float]:
    try:
        data = json.loads(DURATIONS_FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(key): float(value) for key, value in data.items()}


def longest_first(items: list[Any], durations: dict[str, float]) -> list[Any]:
    """``items`` grouped by module, modules by expected duration, longest first; the order of
    tests within a module and of equal modules is kept (every xdist worker must collect the
    same order)."""
    first_seen: dict[str, int] = {}
    for index, item in enumerate(items):
        first_seen.setdefault(module_of(item.nodeid), index)
    return sorted(
        items,
        key=lambda item: (
            -expected_seconds(durations, module_of(item.nodeid)),
            first_seen[module_of(item.nodeid)],
        ),
    )


class ModuleTimes:
    """Collects each module's test time on the process that reports (xdist's controller)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module_of(report.nodeid)] += report.duration

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.seconds:
            return
        ranked = sorted(self.seconds.items(), key=lambda entry: -entry[1])
        terminalreporter.write_sep("=", "slowest modules (their tests' setup, call and teardown)")
        for module, seconds in ranked[:SHOWN]:
            terminalreporter.write_line(f"{seconds:8.1f}s {module}")
        if os.environ.get("DEXAGENTS_WRITE_MODULE_DURATIONS") == "1":
            DURATIONS_FILE.write_text(
                json.dumps({module: round(seconds, 1) for module, seconds in ranked}, indent=1)
                + "\n"
            )
