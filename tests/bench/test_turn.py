"""``bench.turn`` at two blob thresholds in one run (real engines, workers and the SDK): the
side-by-side table, and the agent config that makes the threshold matter."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.turn import agent_config_for

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
NUMBER = r"([\d.]+)"


@pytest.mark.parametrize("size", [1000, 8000, 20_000])
def test_agent_config_for_is_about_the_size_asked(size: int) -> None:
    config = agent_config_for(size)
    assert config is not None
    assert abs(len(json.dumps(config)) - size) <= 1
    assert config["tools"] and config["system_prompt"]


def test_no_agent_config_for_zero() -> None:
    assert agent_config_for(0) is None


def test_the_turn_prints_both_thresholds_side_by_side_and_loads_blobs_only_below() -> None:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_MODE": "PRODUCTION"}
    done = subprocess.run(
        [sys.executable, "-m", "bench.turn", "--turns", "3", "--warmup", "1", "--sync", "normal",
         "--no-dbos", "--no-floor", "--agent-config-bytes", "4000"],
        cwd=REPOSITORY_ROOT, env=env, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    rows = {}
    for threshold in ("65536", "1024"):
        row = re.search(rf"^  --sync normal, blobs > {threshold}\s+{NUMBER}\s+{NUMBER}\s+"
                        rf"{NUMBER}\s+{NUMBER}\s+{NUMBER}$", out, re.MULTILINE)
        assert row, (threshold, out)
        rows[threshold] = list(map(float, row.groups()))
    # The 4,000-byte config is inline under the default threshold and a blob the worker
    # loads at 1024.
    assert rows["65536"][4] == 0
    assert rows["1024"][4] > 0
    # The engine's default (1024) comes first and is the base of the ratios.
    ratio = re.search(rf"^  ratio 65536 / 1024\s+{NUMBER}x\s+{NUMBER}x\s+{NUMBER}x", out,
                      re.MULTILINE)
    assert ratio, out
    assert float(ratio.group(1)) == pytest.approx(rows["65536"][0] / rows["1024"][0], abs=0.01)
    assert float(ratio.group(3)) == pytest.approx(rows["65536"][2] / rows["1024"][2], abs=0.01)
