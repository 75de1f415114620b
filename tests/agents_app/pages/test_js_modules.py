"""The pages' shared ES modules, tested with Node's own test runner (``node --test``).

The ``.mjs`` tests live in ``tests/agents_app/pages/js/`` and import the modules the browser
loads from ``agents_app/static/agents_app/``; this wrapper lets ``make test`` run them.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

JS_TESTS = Path(__file__).resolve().parent / "js"


def test_shared_es_modules_pass_their_node_tests() -> None:
    node = shutil.which("node")
    assert node, "Node.js 18 or newer tests the pages' ES modules: apt-get install nodejs"
    tests = sorted(str(path) for path in JS_TESTS.glob("*.test.mjs"))
    assert tests, f"no *.test.mjs files under {JS_TESTS}"
    done = subprocess.run(
        [node, "--test", *tests], capture_output=True, text=True, timeout=120, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "# fail 0" in output, output
