"""``bench.engine --long-session`` end to end (real engine and Worker children, the real SDK):
it builds the sessions, reads their snapshots at each threshold and prints the table whose
"flat?" column is the ratio of its own p50s."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench._cli import byte_counts

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"([\d.]+)"


def test_the_long_session_table_has_every_threshold_size_and_ratio() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.engine", "--long-session", "--quick", "--reads", "3",
         "--blob-thresholds", "65536,1024"],
        cwd=REPOSITORY_ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    cells = rf"\s+{NUMBER} /\s+{NUMBER}" * 3
    p50s = {}
    for threshold in ("65536", "1024"):
        row = re.search(rf"^  {threshold}{cells}\s+{NUMBER}x\s+{NUMBER}x$", out, re.MULTILINE)
        assert row, (threshold, out)
        figures = list(map(float, row.groups()))
        p50s[threshold] = figures[0:6:2]
        assert all(p50 > 0 for p50 in p50s[threshold])
        # flat? is the largest session's p50 over the smallest's, then over the middle one's.
        assert figures[6] == pytest.approx(figures[4] / figures[0], abs=0.01)
        assert figures[7] == pytest.approx(figures[4] / figures[2], abs=0.01)
    ratio = re.search(rf"^  1024 / 65536\s+{NUMBER}x /\s+{NUMBER}x", out, re.MULTILINE)
    assert ratio, out
    assert float(ratio.group(1)) == pytest.approx(p50s["1024"][0] / p50s["65536"][0], abs=0.02)
    for size in ("100", "1,000", "5,000"):
        assert re.search(rf"^  65536\s+{size}(\s+{NUMBER}){{5}}$", out, re.MULTILINE), out


@pytest.mark.parametrize(("text", "values"), [("65536,1024", (65536, 1024)), ("0", (0,))])
def test_byte_counts_reads_a_comma_separated_list(text: str, values: tuple[int, ...]) -> None:
    assert byte_counts(text) == values


@pytest.mark.parametrize("text", ["", "64k", "1024,-1"])
def test_byte_counts_refuses_anything_else(text: str) -> None:
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        byte_counts(text)
