"""``python -m dex_dev_server --sync full --profile PATH``: the options a benchmark runs with."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from . import flows
from .conftest import REPO, EngineProcess, engine_client, eventually


async def _read_profile(engine: EngineProcess, path: Path) -> dict[str, object]:
    await asyncio.to_thread(path.unlink, missing_ok=True)
    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGUSR1)
    await eventually(path.exists)
    profile: dict[str, object] = json.loads(await asyncio.to_thread(path.read_text))
    return profile


async def test_sigusr1_writes_per_method_counts_and_commits(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    engine = EngineProcess(
        tmp_path / "engine.sqlite3",
        tmp_path / "engine.log",
        ["--sync", "full", "--profile", str(path)],
    )
    engine.start()
    try:
        before = await _read_profile(engine, path)
        assert before["commits"] == 0
        async with engine_client(engine.address, tmp_path / "blobs") as client:
            await client.start_flow(flows.CHAIN, "profiled-1", 2)
            await client.start_flow(flows.CHAIN, "profiled-2", 2)
        after = await _read_profile(engine, path)
        methods = after["methods"]
        assert isinstance(methods, dict)
        assert methods["StartFlow"]["calls"] == 2
        assert methods["StartFlow"]["seconds"] > 0
        assert isinstance(after["commits"], int) and after["commits"] >= 2
        assert engine.terminate() == 0
        # The last reading is written at exit too.
        assert json.loads(path.read_text())["methods"]["StartFlow"]["calls"] == 2
    finally:
        engine.stop()


def test_an_unknown_sync_mode_is_a_usage_error() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dex_dev_server", "--sync", "off"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "--sync: invalid choice: 'off'" in done.stderr


async def test_sigusr1_without_a_profile_is_logged_and_the_engine_keeps_serving(
    tmp_path: Path,
) -> None:
    engine = EngineProcess(tmp_path / "engine.sqlite3", tmp_path / "engine.log")
    engine.start()
    try:
        assert engine.proc is not None
        os.kill(engine.proc.pid, signal.SIGUSR1)
        proc = engine.proc

        def logged() -> bool:
            assert proc.poll() is None, "SIGUSR1 ended the engine"
            return "profiling is off" in engine.log.read_text()

        await eventually(logged)
        async with engine_client(engine.address, tmp_path / "blobs") as client:
            assert await client.health_check()
        assert engine.terminate() == 0
    finally:
        engine.stop()
