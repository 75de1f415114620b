"""``bench/transport.py`` end to end (a real server child, real grpc.aio, the LangGraph peer) and
the main-thread CPU reading ``bench/turn.py`` uses for its lower bound."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

from bench.turn import _process_cpu

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def test_the_transport_bench_times_every_pattern_and_prints_both_bounds() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.transport", "--ops", "30", "--turns", "5"],
        cwd=REPOSITORY_ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    # Each pattern ran against the child (a missing answer would have hung, then timed out)
    # and cost both sides some CPU.
    for name, count in [
        ("unary call", 3), ("task stream opened and closed", 9),
        ("task round trip on a stream", 10), ("frame with no answer", 18),
    ]:
        row = re.search(rf"^  {name}\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+([\d.]+)ms\s+"
                        rf"{count}x$", out, re.MULTILINE)
        assert row, (name, out)
        wall_p50 = float(row.group(1))
        assert wall_p50 > 0
    assert re.search(r"LangGraph \+ SqliteSaver, the whole turn in one process: p50 [\d.]+ ms", out)
    assert re.search(r"CPU bound: [\d.]+ ms over \d+ cores = [\d.]+ ms = [\d.]+x LangGraph", out)
    assert re.search(r"latency bound: 6 task round trips \+ 3 unary calls .* = [\d.]+x", out)


def test_the_main_thread_reading_leaves_out_other_threads() -> None:
    def spin() -> None:
        # Until this thread itself has used 0.3 s of CPU, however loaded the machine is.
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass

    before_all, before_main = _process_cpu(os.getpid()), _process_cpu(os.getpid(), True)
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    spent_all = _process_cpu(os.getpid()) - before_all
    spent_main = _process_cpu(os.getpid(), True) - before_main
    # The spinning thread's CPU shows in the process's figure, not in the main thread's.
    assert spent_all >= 0.25
    assert spent_main < 0.15
