"""The filesystem Celery broker (``agents_app.dev.kombu_filesystem``): whole message files only,
and a Celery worker that meets a file that is not a whole message drops it and goes on."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kombu import Connection
from kombu.transport import filesystem

from agents_app.dev.kombu_filesystem import PARTIAL_SUFFIX, Transport
from tests.e2e.conftest import PYTHON, Proc, Processes

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
def celery_worker(tmp_path: Path) -> Iterator[tuple[Processes, Proc]]:
    """A real ``celery -A dexagents_site worker`` on the project's filesystem broker under a
    private var dir (``DEXAGENTS_VAR_DIR`` of the yielded ``Processes``' env), ready."""
    env = {key: value for key, value in os.environ.items() if key != "REDIS_URL"}
    env["DEXAGENTS_VAR_DIR"] = str(tmp_path / "var")
    processes = Processes(env)
    try:
        worker = processes.start("celery", [
            PYTHON, "-m", "celery", "-A", "dexagents_site", "worker", "--pool=solo",
            "--loglevel=INFO", "--without-mingle", "--without-gossip", "-n", "kombu-fs@%h"])
        worker.wait_for_line(" ready.", timeout=DEADLINE_SECONDS)
        yield processes, worker
    finally:
        processes.stop_all()


def test_the_celery_worker_goes_past_files_that_are_not_whole_messages(
    celery_worker: tuple[Processes, Proc],
) -> None:
    processes, worker = celery_worker
    queue = Path(processes.env["DEXAGENTS_VAR_DIR"]) / "celery" / "queue"
    for name, content in NOT_WHOLE.items():
        (queue / name).write_bytes(content)
    processes.run([PYTHON, "-c", "from dexagents_site import celery_app; "
                   "celery_app.send_task('mcp_registry.discover_all_servers')"],
                  timeout=DEADLINE_SECONDS)
    worker.wait_for_line("Task mcp_registry.discover_all_servers[", timeout=DEADLINE_SECONDS)
    dropped = [line for line in list(worker.lines) if "not a whole message" in line]
    assert len(dropped) == len(NOT_WHOLE), worker.output()
    assert worker.popen.poll() is None


@pytest.mark.parametrize(("transport", "survives"), [(Transport, True),
                                                     (filesystem.Transport, False)])
def test_an_empty_exchange_table_is_an_exchange_with_no_queues(
    folder: Path, transport: type[filesystem.Transport], survives: bool
) -> None:
    """What another process's declare leaves for an instant (kombu creates the table file and
    writes it later); kombu's own transport is the control and raises."""
    name = _queue_name()
    table = folder.parent / "control" / f"{name}.exchange"
    table.write_bytes(b"")
    with _connection(folder, transport) as connection:
        if not survives:
            with pytest.raises(ValueError):
                connection.SimpleQueue(name)
            return
        queue = connection.SimpleQueue(name)
        try:
            queue.put({"n": 3})
            assert queue.get(timeout=5).payload == {"n": 3}
        finally:
            queue.close()
    assert [row[2] for row in json.loads(table.read_text())] == [name]


_BIND = """
import os
import sys
from kombu import Connection, Exchange, Queue
from agents_app.dev.kombu_filesystem import Transport
options = {"data_folder_in": sys.argv[1], "data_folder_out": sys.argv[1],
           "control_folder": sys.argv[2], "store_processed": False}
with Connection("filesystem://localhost//", transport=Transport,
                transport_options=options) as connection:
    channel = connection.channel()
    print("ready", flush=True)
    while not os.path.exists(sys.argv[5]):  # all start binding together
        pass
    for n in range(int(sys.argv[4])):
        Queue(f"{sys.argv[3]}-{n}", Exchange(f"shared{n}", type="direct"),
              routing_key=sys.argv[3])(channel).declare()
"""


def test_processes_declaring_queues_at_once_keep_every_binding(folder: Path) -> None:
    """Four processes each bind a queue to the same new exchanges at the same time; none fails
    and every table lists the four queues (kombu's transport could read a table another had
    just created empty, or truncate another's entry)."""
    control = folder.parent / "control"
    per_process = 100
    go = folder.parent / "go"
    processes = [subprocess.Popen([PYTHON, "-c", _BIND, str(folder), str(control), f"p{index}",
                                   str(per_process), str(go)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for index in range(4)]
    for process in processes:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n", process.communicate(timeout=5)
    go.touch()
    for process in processes:
        _, stderr = process.communicate(timeout=DEADLINE_SECONDS)
        assert process.returncode == 0, stderr
    for n in range(per_process):
        queues = {row[2] for row in json.loads((control / f"shared{n}.exchange").read_text())}
        assert queues == {f"p{index}-{n}" for index in range(4)}, n
