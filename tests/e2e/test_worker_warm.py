"""``manage.py dexworker`` loads LiteLLM before its ready line (issue 13, the first RPC).

Loaded lazily, LiteLLM's import and tokenizer ran inside the first RunModel Step on the
worker's event loop, and every RPC sent meanwhile waited seconds (the first message POST after
``make run`` said ready passed the web's 5 s engine timeout).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e.conftest import PYTHON, Ports, Processes

pytestmark = pytest.mark.e2e


def test_the_worker_has_litellm_and_its_tokenizer_loaded_when_it_says_ready(
    processes: Processes, ports: Ports
) -> None:
    processes.migrate()
    processes.start_engine(ports.engine)
    worker = processes.start("worker", [PYTHON, "manage.py", "dexworker"])
    worker.wait_for_line("dexworker ready")

    # No session exists, so no Step has run: only the start-up can have loaded them. Native
    # libraries show in the process's memory map: LiteLLM's own (imported with it) and
    # tiktoken's (loaded by LiteLLM's token counter, which context compaction calls first).
    mapped = Path(f"/proc/{worker.popen.pid}/maps").read_text()
    assert "litellm/rust_bridge/_native" in mapped, worker.output()[-2000:]
    assert "tiktoken/_tiktoken" in mapped, worker.output()[-2000:]
