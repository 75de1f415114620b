"""The graph the LangGraph Agent Server serves in ``bench/peer_server.py``
(``bench/langgraph_server_graph.py``), run in plain LangGraph in this virtualenv; and the pieces
of the bench that need no server (its virtualenv and the server are too slow for the suite)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest

from bench import langgraph_server_graph
from bench.langgraph_peer import build_graph, run_turn
from bench.langgraph_server_graph import EXPECTED_ANSWER, turn_answer, turn_input
from bench.peer_server import (
    PEER_GRAPH,
    PEER_REQUIREMENTS,
    STAMP_NAME,
    peer_environment,
    peer_venv,
    process_tree_cpu_seconds,
)


def test_the_served_graph_runs_one_turn_of_three_tools_and_answers() -> None:
    state = langgraph_server_graph.graph.invoke(turn_input())

    messages = state["messages"]
    assert [message["role"] for message in messages] == [
        "user", "assistant", "tool", "tool", "tool", "assistant"]
    assert [call["name"] for call in messages[1]["tool_calls"]] == ["lookup"] * 3
    assert [message["content"] for message in messages[2:5]] == ["lookup ok"] * 3
    assert sorted(message["tool_call_id"] for message in messages[2:5]) == [
        "call-1", "call-2", "call-3"]
    assert turn_answer(state) == EXPECTED_ANSWER
    assert langgraph_server_graph.graph.checkpointer is None


def test_the_served_graph_is_the_file_the_server_loads() -> None:
    assert Path(langgraph_server_graph.__file__).resolve() == PEER_GRAPH
    # Standalone: the server's virtualenv has langgraph and nothing of this project.
    imports = [line for line in PEER_GRAPH.read_text().splitlines()
               if line.startswith(("import ", "from "))]
    assert imports and all(
        line.split()[1].split(".")[0] in {"json", "operator", "pathlib", "typing", "langgraph"}
        for line in imports), imports


def test_turn_answer_refuses_an_unfinished_turn() -> None:
    with pytest.raises(ValueError, match="not one finished turn"):
        turn_answer({"messages": [{"role": "user", "content": "x"}]})


def test_the_checkpointed_peer_of_bench_turn_still_logs_every_call(tmp_path: Path) -> None:
    graph, connection = build_graph(tmp_path / "peer.sqlite3", tmp_path / "peer.log")
    assert connection is not None
    try:
        assert run_turn(graph, "thread-1") == EXPECTED_ANSWER
    finally:
        connection.close()
    lines = (tmp_path / "peer.log").read_text().splitlines()
    assert lines.count("model turn-1") == 2
    assert lines.count("tool lookup") == 3


def test_a_stamped_virtualenv_is_reused_without_pip(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("nothing-to-install==1.0\n")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text("")
    digest = hashlib.sha256(requirements.read_bytes()).hexdigest()
    (venv / STAMP_NAME).write_text(f"{digest}\n")

    # A base Python that cannot run proves no virtualenv was made.
    assert peer_venv(venv=venv, requirements=requirements,
                     base_python=str(tmp_path / "missing")) == venv / "bin" / "python"


def test_a_stale_stamp_makes_the_virtualenv_again(tmp_path: Path) -> None:
    requirements = tmp_path / "requirements.txt"
    requirements.write_text("nothing-to-install==1.0\n")
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / STAMP_NAME).write_text("an older hash\n")

    with pytest.raises(FileNotFoundError):
        peer_venv(venv=venv, requirements=requirements, base_python=str(tmp_path / "missing"))
    assert not venv.exists()


def test_the_requirements_pin_every_package_to_one_version() -> None:
    pins = [line for line in PEER_REQUIREMENTS.read_text().splitlines()
            if line and not line.startswith("#")]
    assert all("==" in line for line in pins), pins
    names = {line.split("==")[0].lower() for line in pins}
    assert {"langgraph-api", "langgraph-runtime-inmem", "langgraph"} <= names
    assert "langgraph-api==0.16.7" in pins and "langgraph-runtime-inmem==0.36.7" in pins


def test_the_peer_environment_drops_langsmith_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGSMITH_ENDPOINT", "https://example.invalid")
    monkeypatch.setenv("LANGGRAPH_CLOUD_LICENSE_KEY", "lcl_x")
    env = peer_environment()
    assert "LANGSMITH_ENDPOINT" not in env and "LANGGRAPH_CLOUD_LICENSE_KEY" not in env
    assert env["LANGSMITH_TRACING"] == "false" and env["LANGSMITH_API_KEY"] == ""
    assert env["LANGGRAPH_NO_VERSION_CHECK"] == "true"


def test_process_tree_cpu_counts_a_child_that_ended() -> None:
    # The child burns CPU and ends; the parent has waited for it (its time moved to the
    # parent's cutime) when it says "done", and lives on until its input closes.
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import subprocess, sys\n"
         f"subprocess.run([sys.executable, '-c', {burn!r}], check=True)\n"
         "print('done', flush=True)\n"
         "sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        assert parent.stdout is not None
        assert parent.stdout.readline().strip() == "done"
        # /proc counts in clock ticks, sampled: allow for rounding below the child's 0.3 s.
        assert process_tree_cpu_seconds(parent.pid) >= 0.25
    finally:
        assert parent.stdin is not None
        parent.stdin.close()
        parent.wait(timeout=30)


def test_process_tree_cpu_of_a_process_that_is_gone_is_zero() -> None:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    assert process_tree_cpu_seconds(int(done.stdout)) == 0.0
