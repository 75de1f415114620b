"""``python -m dex_dev_server --sync full --profile PATH``: the options a benchmark runs with."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dex import AsyncClient, BlobCacheConfig, ClientOptions, Registry, WorkerTarget, open_blob_cache

from . import flows
from .conftest import REPO, EngineProcess
from .flows import ALL_FLOWS


def _read_profile(engine: EngineProcess, path: Path) -> dict[str, object]:
    path.unlink(missing_ok=True)
    assert engine.proc is not None
    os.kill(engine.proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not path.exists():
        assert time.monotonic() < deadline, "the engine wrote no profile after SIGUSR1"
        time.sleep(0.02)
    profile: dict[str, object] = json.loads(path.read_text())
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
        before = _read_profile(engine, path)
        assert before["commits"] == 0
        registry = Registry(ALL_FLOWS, allow_async_handlers=True)
        cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "blobs"), 16 * 1024 * 1024))
        client = AsyncClient(
            registry,
            cache,
            ClientOptions(server_address=engine.address, worker_target=WorkerTarget(pull=True)),
        )
        try:
            await client.start_flow(flows.CHAIN, "profiled-1", 2)
            await client.start_flow(flows.CHAIN, "profiled-2", 2)
        finally:
            await client.close()
        after = _read_profile(engine, path)
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
        deadline = time.monotonic() + 10
        while "profiling is off" not in engine.log.read_text():
            assert engine.proc.poll() is None, "SIGUSR1 ended the engine"
            assert time.monotonic() < deadline, "nothing logged for SIGUSR1"
            await asyncio.sleep(0.02)
        registry = Registry(ALL_FLOWS, allow_async_handlers=True)
        cache = open_blob_cache(BlobCacheConfig(str(tmp_path / "blobs"), 16 * 1024 * 1024))
        client = AsyncClient(
            registry,
            cache,
            ClientOptions(server_address=engine.address, worker_target=WorkerTarget(pull=True)),
        )
        try:
            assert await client.health_check()
        finally:
            await client.close()
        assert engine.terminate() == 0
    finally:
        engine.stop()
