"""The filesystem Celery broker (``agents_app.kombu_filesystem``): whole message files only,
and a Celery worker that meets a file that is not a whole message drops it and goes on."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from kombu.transport import filesystem

from agents_app.kombu_filesystem import PARTIAL_SUFFIX, Transport

REPO_ROOT = Path(__file__).resolve().parents[2]
DEADLINE_SECONDS = 60.0
# What a producer leaves when it dies after kombu's open and before its write, and a message
# cut short.
NOT_WHOLE = {"0_a_empty.celery.msg": b"", "0_b_cut.celery.msg": b"{\"body\": \"eyJh"}


def _options(folder: Path) -> dict[str, object]:
    return {
        "data_folder_in": str(folder),
        "data_folder_out": str(folder),
        "control_folder": str(folder.parent / "control"),
        "store_processed": False,
    }


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    queue = tmp_path / "queue"
    queue.mkdir()
    (tmp_path / "control").mkdir()
    return queue


def _queue_name() -> str:
    # A name of its own per test: kombu remembers queues it declared per process, and would
    # not bind a remembered name again in another test's (empty) control folder.
    return f"jobs{uuid.uuid4().hex}"


def _connection(folder: Path, transport: type[filesystem.Transport]) -> Connection:
    return Connection("filesystem://localhost//", transport=transport,
                      transport_options=_options(folder))


def test_a_message_file_appears_only_whole_and_nothing_partial_is_left(folder: Path) -> None:
    with _connection(folder, Transport) as connection:
        name = _queue_name()
        queue = connection.SimpleQueue(name)
        try:
            queue.put({"n": 1})
            names = os.listdir(folder)
            assert len(names) == 1 and names[0].endswith(f".{name}.msg"), names
            assert not any(name.endswith(PARTIAL_SUFFIX) for name in names)
            message = queue.get(timeout=5)
            assert message.payload == {"n": 1}
            message.ack()
        finally:
            queue.close()


@pytest.mark.parametrize(("transport", "survives"), [(Transport, True),
                                                     (filesystem.Transport, False)])
def test_a_consumer_drops_a_file_that_is_not_a_whole_message(
    folder: Path, transport: type[filesystem.Transport], survives: bool
) -> None:
    """kombu's own transport is the control: it raises on the first such file."""
    with _connection(folder, transport) as connection:
        name = _queue_name()
        queue = connection.SimpleQueue(name)
        try:
            queue.put({"n": 2})
            for file_name, content in NOT_WHOLE.items():
                (folder / file_name.replace("celery", name)).write_bytes(content)
            if survives:
                message = queue.get(timeout=5)
                assert message.payload == {"n": 2}
                assert os.listdir(folder) == []
            else:
                with pytest.raises(ValueError):
                    queue.get(timeout=5)
        finally:
            queue.close()


@pytest.fixture
def celery_worker(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], deque[str], Path]]:
    """A real ``celery -A dexagents_site worker`` on the project's filesystem broker under a
    private var dir; yields the process, its output lines so far and the var dir."""
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["DEXAGENTS_VAR_DIR"] = str(tmp_path / "var")
    process = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "dexagents_site", "worker", "--pool=solo",
         "--loglevel=INFO", "--without-mingle", "--without-gossip", "-n", "kombu-fs@%h"],
        cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    lines: deque[str] = deque(maxlen=2000)

    def relay() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line.rstrip("\n"))

    threading.Thread(target=relay, daemon=True).start()
    try:
        _wait_for(lines, process, " ready.")
        yield process, lines, tmp_path / "var"
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for(lines: deque[str], process: subprocess.Popen[str], marker: str) -> str:
    deadline = time.monotonic() + DEADLINE_SECONDS
    while time.monotonic() < deadline:
        found = next((line for line in list(lines) if marker in line), None)
        if found is not None:
            return found
        assert process.poll() is None, (
            f"the Celery worker exited ({process.returncode}):\n" + "\n".join(lines))
        time.sleep(0.05)
    raise AssertionError(f"no line with {marker!r} within {DEADLINE_SECONDS} s:\n"
                         + "\n".join(lines))


def test_the_celery_worker_goes_past_files_that_are_not_whole_messages(
    celery_worker: tuple[subprocess.Popen[str], deque[str], Path],
) -> None:
    process, lines, var = celery_worker
    queue = var / "celery" / "queue"
    for name, content in NOT_WHOLE.items():
        (queue / name).write_bytes(content)
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["DEXAGENTS_VAR_DIR"] = str(var)
    subprocess.run(
        [sys.executable, "-c",
         "from dexagents_site import celery_app; "
         "celery_app.send_task('mcp_registry.discover_all_servers')"],
        cwd=REPO_ROOT, env=env, check=True, timeout=DEADLINE_SECONDS,
    )
    _wait_for(lines, process, "Task mcp_registry.discover_all_servers[")
    dropped = [line for line in list(lines) if "not a whole message" in line]
    assert len(dropped) == len(NOT_WHOLE), "\n".join(lines)
    assert process.poll() is None
