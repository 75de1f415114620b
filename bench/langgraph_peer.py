"""Peer for bench.turn: the same agent turn as a LangGraph graph checkpointed by ``SqliteSaver``.

The graph is model → three parallel tool calls (``Send``) → model, the shape of one
``AgentSessionFlow`` turn that asks for three READ tools (``bench/langgraph_server_graph.py``,
standalone so that the LangGraph Agent Server of ``bench/peer_server.py`` serves the same
graph). The "model" is scripted, like the scripted runner of
``tests/dex_agents/scripted_agent.py``, and every model call and tool call appends the same
lines to an invocation log file that the scripted runner writes, so both sides do the same work
outside their durability layer. ``SqliteSaver`` runs at its defaults (the issue's "equal
durability" note): it only sets WAL; ``synchronous`` stays SQLite's FULL.

Only the benchmark imports this module; ``langgraph`` and ``langgraph-checkpoint-sqlite`` are in
the ``bench`` extra, not in what users install.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph.state import CompiledStateGraph

from bench.langgraph_server_graph import TURN_MESSAGE, graph_builder, turn_answer

__all__ = ["TURN_MESSAGE", "build_graph", "run_turn"]


def build_graph(
    db_path: Path | None, log_path: Path
) -> tuple[CompiledStateGraph[Any], sqlite3.Connection | None]:
    """The compiled graph with a ``SqliteSaver`` on ``db_path`` and its connection.

    ``db_path=None`` compiles it without a checkpointer (and returns no connection). Close the
    connection when done. Each ``invoke`` needs its own ``thread_id`` (one per turn, as each
    of our turns is a fresh session).
    """
    builder = graph_builder(log_path)
    if db_path is None:
        return builder.compile(), None
    connection = sqlite3.connect(str(db_path), check_same_thread=False)
    return builder.compile(checkpointer=SqliteSaver(connection)), connection


def run_turn(graph: CompiledStateGraph[Any], thread_id: str) -> str:
    """Run one turn on a fresh thread; return the final answer.

    Raises:
        ValueError: If the turn did not end with three tool results and an answer.
    """
    state = graph.invoke(
        {"messages": [{"role": "user", "content": TURN_MESSAGE}]},
        {"configurable": {"thread_id": thread_id}},
    )
    return turn_answer(state)
