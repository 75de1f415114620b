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

import pytest

from bench.transport import CRITICAL_PATH_ROUND_TRIPS, TURN_COUNTS
from bench.turn import thread_cpu_ms

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"([\d.]+)"


def test_the_transport_bench_times_every_pattern_and_prints_both_bounds() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.transport", "--ops", "40", "--turns", "5"],
        cwd=REPOSITORY_ROOT, env=env, capture_output=True, text=True, timeout=180,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = {}
    for key, name in [
        ("unary", "unary call"), ("stream", "task stream opened and closed"),
        ("round_trip", "task round trip on a stream"), ("one_way", "frame with no answer"),
    ]:
        row = re.search(rf"^  {name}\s+{NUMBER}ms\s+{NUMBER}ms\s+{NUMBER}ms\s+{NUMBER}ms\s+"
                        rf"(\d+)\s+{NUMBER}ms$", out, re.MULTILINE)
        assert row, (name, out)
        wall_p50, _, client, server, count, per_turn = map(float, row.groups())
        # Each pattern ran against the child (a missing answer would have hung, then timed
        # out), and its CPU per turn is its count times both sides' CPU.
        assert wall_p50 > 0 and client > 0
        assert count == TURN_COUNTS[key]
        # (printed to 3 and 2 decimals: allow their rounding)
        assert per_turn == pytest.approx(count * (client + server), abs=count * 0.001 + 0.005)
        rows[key] = (wall_p50, per_turn)
    total = sum(per_turn for _, per_turn in rows.values())
    bound = re.search(rf"CPU bound: {NUMBER} ms over (\d+) cores = {NUMBER} ms", out)
    assert bound, out
    assert float(bound.group(1)) == pytest.approx(total, abs=0.05)
    assert float(bound.group(3)) == pytest.approx(total / int(bound.group(2)), abs=0.05)
    latency = re.search(rf"latency bound: .* one after another = {NUMBER} ms", out)
    assert latency, out
    expected = (CRITICAL_PATH_ROUND_TRIPS * rows["round_trip"][0]
                + TURN_COUNTS["unary"] * rows["unary"][0])
    assert float(latency.group(1)) == pytest.approx(expected, abs=0.02)
    assert re.search(rf"LangGraph \+ SqliteSaver, the whole turn in one process: p50 {NUMBER}"
                     " ms", out)


def test_the_main_thread_reading_counts_its_own_cpu_and_leaves_out_other_threads() -> None:
    def spin() -> None:
        # Until this thread itself has used 0.3 s of CPU, however loaded the machine is.
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass

    before = thread_cpu_ms(os.getpid())
    worker = threading.Thread(target=spin)
    worker.start()
    worker.join()
    assert thread_cpu_ms(os.getpid()) - before < 150
    before = thread_cpu_ms(os.getpid())
    spin()
    assert thread_cpu_ms(os.getpid()) - before >= 300
