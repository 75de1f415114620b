"""Peer for bench.turn: the same agent turn as a LangGraph graph checkpointed by ``SqliteSaver``.

The graph is model → three parallel tool calls (``Send``) → model, the shape of one
``AgentSessionFlow`` turn that asks for three READ tools. The "model" is scripted, like the
scripted runner of ``tests/dex_agents/scripted_agent.py``, and every model call and tool call
appends the same lines to an invocation log file that the scripted runner writes, so both sides
do the same work outside their durability layer. ``SqliteSaver`` runs at its defaults (the
issue's "equal durability" note): it only sets WAL; ``synchronous`` stays SQLite's FULL.

Only the benchmark imports this module; ``langgraph`` and ``langgraph-checkpoint-sqlite`` are in
the ``bench`` extra, not in what users install.
"""

from __future__ import annotations

import json
import operator
import sqlite3
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

#: The user message of the benchmark's turn; the scripted runner reads it the same way.
TURN_MESSAGE = "tools: lookup, lookup, lookup"


class TurnState(TypedDict):
    """The graph's state: the turn's messages, appended by each node."""

    messages: Annotated[list[dict[str, Any]], operator.add]


class ToolCall(TypedDict):
    """What ``Send`` hands one tool node."""

    id: str
    name: str
    arguments: str


class _Log:
    """Appends ``kind name`` lines, as ``dex_agents.testing.InvocationLog`` does."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def record(self, kind: str, name: str) -> None:
        with self.path.open("a") as handle:
            handle.write(f"{kind} {name}\n")


def build_graph(
    db_path: Path | None, log_path: Path
) -> tuple[CompiledStateGraph[Any], sqlite3.Connection | None]:
    """The compiled graph with a ``SqliteSaver`` on ``db_path`` and its connection.

    ``db_path=None`` compiles it without a checkpointer (and returns no connection). Close the
    connection when done. Each ``invoke`` needs its own ``thread_id`` (one per turn, as each
    of our turns is a fresh session).
    """
    log = _Log(log_path)

    def model(state: TurnState) -> dict[str, Any]:
        log.record("model", "turn-1")
        messages = state["messages"]
        results = [m for m in messages if m["role"] == "tool"]
        if not results:
            names = [n.strip() for n in messages[0]["content"].partition(":")[2].split(",")]
            calls = [
                {"id": f"call-{i}", "name": name, "arguments": json.dumps({"n": i})}
                for i, name in enumerate(names, start=1)
            ]
            return {"messages": [{"role": "assistant", "content": "", "tool_calls": calls}]}
        answer = "; ".join(f"{m['name']}=succeeded: {m['content']}" for m in results)
        return {"messages": [{"role": "assistant", "content": answer}]}

    def route(state: TurnState) -> list[Send] | str:
        calls = state["messages"][-1].get("tool_calls")
        if not calls:
            return END
        return [Send("tool", call) for call in calls]

    def tool(call: ToolCall) -> dict[str, Any]:
        log.record("tool", call["name"])
        log.record("key", f"{call['name']} {call['id']} attempt=1")
        return {
            "messages": [
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "name": call["name"],
                    "content": f"{call['name']} ok",
                }
            ]
        }

    builder = StateGraph(TurnState)
    builder.add_node("model", model)
    builder.add_node("tool", tool)  # type: ignore[arg-type]  # a Send target takes its own input
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", route, ["tool", END])
    builder.add_edge("tool", "model")
    if db_path is None:
        return builder.compile(), None
    connection = sqlite3.connect(str(db_path), check_same_thread=False)
    return builder.compile(checkpointer=SqliteSaver(connection)), connection


def run_turn(graph: CompiledStateGraph[Any], thread_id: str) -> str:
    """Run one turn on a fresh thread; return the final answer.

    Raises:
        AssertionError: If the turn did not end with three tool results and an answer.
    """
    state = graph.invoke(
        {"messages": [{"role": "user", "content": TURN_MESSAGE}]},
        {"configurable": {"thread_id": thread_id}},
    )
    messages = state["messages"]
    assert len(messages) == 6, messages
    answer: str = messages[-1]["content"]
    return answer
