"""Benchmark of the first Dex RPC after ``make run`` says ready (issue 13).

Starts the platform the way ``make run`` does: ``manage.py dev`` as a real process (the
embedded engine, the demo model, a Dex worker, Celery, beat and uvicorn, each its own
process) on its own var dir, SQLite database and free ports. Once it prints its ready line,
the bench logs in with the API token it printed and, as a user right after start:

1. ``POST /api/v1/sessions/ {"agent": "demo", "message": "hello"}``: the session's first turn
   starts (a RunModel Step on the worker, the demo model answering);
2. at once, ``POST /api/v1/sessions/<id>/messages/``: the first message POST, whose
   ``send_user_message`` RPC runs on the same worker while that first turn runs;
3. the peer, in the same run: the next ``--next`` message POSTs to that session, one after
   the other (the steady state).

Each POST is timed from the request to the response. A message the web could not hand to
Dex within ``DEXAGENTS_ENGINE_TIMEOUT`` (5 s) is still accepted (202, ``delivery`` pending,
delivered later by Celery); the bench prints the count of those. Nothing is asserted.

Prints, per ``--runs`` (each a fresh stack): time to ready, the session create, the first
message POST, the median of the next ones and the ratio first / median.
Run: ``.venv/bin/python -m bench.first_rpc``, or ``make bench-first-rpc``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from dex_agents.testing import free_port
from tests.e2e.conftest import PYTHON, Proc, Processes, wait_until
from tests.e2e.relay_stack import stack_environment

READY_LINE = "dexagents is ready at"
TOKEN_LINE = "API token for the demo user:"


@dataclass
class Run:
    """What one fresh ``manage.py dev`` saw; every time in seconds."""

    ready: float = 0.0
    session_create: float = 0.0
    first_message: float = 0.0
    next_messages: list[float] = field(default_factory=list)
    pending: int = 0

    @property
    def next_median(self) -> float:
        return statistics.median(self.next_messages)

    @property
    def ratio(self) -> float:
        return self.first_message / self.next_median


def _line_when(proc: Proc, marker: str, timeout: float) -> str:
    """The first output line of ``proc`` holding ``marker``, polled every 20 ms (the time to
    ready's resolution)."""

    def probe() -> str | None:
        for line in proc.lines:
            if marker in line:
                return line
        if proc.popen.poll() is not None:
            raise RuntimeError(f"manage.py dev exited:\n{proc.output()[-4000:]}")
        return None

    return wait_until(f"manage.py dev to print {marker!r}", probe, timeout=timeout,
                      interval=0.02)


def _timed_post(api: httpx.Client, path: str, body: dict[str, object],
                run: Run) -> tuple[float, dict[str, object]]:
    """POST ``body``; return the seconds it took and the JSON answer (a 2xx)."""
    started = time.perf_counter()
    answer = api.post(path, json=body)
    seconds = time.perf_counter() - started
    answer.raise_for_status()
    data: dict[str, object] = answer.json()
    if data.get("delivery") == "pending":
        run.pending += 1
    return seconds, data


def measure_once(root: Path, *, following: int, ready_timeout: float) -> Run:
    """Start ``manage.py dev`` under ``root``, time the POSTs, stop it.

    Raises:
        AssertionError: The stack printed no ready line within ``ready_timeout`` seconds.
        RuntimeError: ``manage.py dev`` exited before it was ready.
        httpx.HTTPError: A POST failed.
    """
    var_dir = root / "var"
    var_dir.mkdir(parents=True)
    web_port = free_port()
    env = stack_environment(var_dir, web_port=web_port, engine_port=free_port(),
                            model_port=free_port(), extra={"LOG_LEVEL": "WARNING"})
    processes = Processes(env)
    run = Run()
    try:
        started = time.monotonic()
        dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(web_port)])
        _line_when(dev, READY_LINE, ready_timeout)
        run.ready = time.monotonic() - started
        token = _line_when(dev, TOKEN_LINE, 10).rsplit(":", 1)[1].strip()
        with httpx.Client(base_url=f"http://127.0.0.1:{web_port}", timeout=60,
                          headers={"Authorization": f"Bearer {token}"}) as api:
            run.session_create, session = _timed_post(
                api, "/api/v1/sessions/", {"agent": "demo", "message": "hello"}, run)
            messages = f"/api/v1/sessions/{session['id']}/messages/"
            run.first_message, _ = _timed_post(api, messages, {"text": "first"}, run)
            for number in range(following):
                seconds, _ = _timed_post(api, messages, {"text": f"next {number}"}, run)
                run.next_messages.append(seconds)
    finally:
        processes.stop_all(timeout=60)
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1,
                        help="fresh stacks, one after the other (each takes ~30-60 s)")
    parser.add_argument("--next", type=int, default=10, dest="following",
                        help="message POSTs after the first (the steady state)")
    parser.add_argument("--ready-timeout", type=float, default=300.0,
                        help="seconds to wait for manage.py dev's ready line")
    args = parser.parse_args()

    runs: list[Run] = []
    for number in range(1, args.runs + 1):
        print(f"run {number}/{args.runs}: starting manage.py dev ...", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-first-rpc-") as root:
            run = measure_once(Path(root), following=args.following,
                               ready_timeout=args.ready_timeout)
        runs.append(run)
        print(f"  ready in {run.ready:.1f} s; session create {run.session_create * 1000:.0f} ms; "
              f"first message POST {run.first_message * 1000:.0f} ms; next {args.following}: "
              f"median {run.next_median * 1000:.0f} ms (max {max(run.next_messages) * 1000:.0f}"
              f" ms); ratio {run.ratio:.1f}x; kept pending past the engine timeout: "
              f"{run.pending}", flush=True)
    if len(runs) > 1:
        print(f"over {len(runs)} runs: ready median {statistics.median(r.ready for r in runs):.1f}"
              f" s; first message POST median "
              f"{statistics.median(r.first_message for r in runs) * 1000:.0f} ms; steady "
              f"median {statistics.median(r.next_median for r in runs) * 1000:.0f} ms; ratio "
              f"median {statistics.median(r.ratio for r in runs):.1f}x")


if __name__ == "__main__":
    main()
