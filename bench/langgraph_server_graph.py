"""The benchmark turn as a LangGraph graph on its own: model → three tool calls (``Send``) → model.

The shape of one ``AgentSessionFlow`` turn that asks for three READ tools, with a scripted
"model" (like the scripted runner of ``tests/dex_agents/scripted_agent.py``): the first model
call asks for one tool per name after the ``:`` of the user message, the tools answer
``<name> ok``, the second model call quotes every result.

Standalone on purpose: it imports the standard library and ``langgraph`` only, nothing of this
project, so two virtualenvs load it:

- ours, as ``bench.langgraph_server_graph``: ``bench/langgraph_peer.py`` compiles
  ``graph_builder()`` with a ``SqliteSaver`` (``bench.turn``);
- the LangGraph Agent Server's own (``bench/peer_server.py``), as the file
  ``bench/langgraph_server_graph.py:graph``: ``graph`` is compiled without a checkpointer, since
  the server supplies its own.

No ``from __future__ import annotations``: LangGraph reads the state and node input types at
run time, in a module the server loads from its path.
"""

import json
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

#: The user message of the benchmark's turn; the scripted runner reads it the same way.
TURN_MESSAGE = "tools: lookup, lookup, lookup"
#: The final answer of a turn that started with ``TURN_MESSAGE``.
EXPECTED_ANSWER = "; ".join(["lookup=succeeded: lookup ok"] * 3)


class TurnState(TypedDict):
    """The graph's state: the turn's messages (``{"role", "content", ...}`` dicts), appended
    by each node."""

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


def graph_builder(log_path: Path | None = None) -> StateGraph[Any]:
    """The turn's graph, not compiled (the caller picks the checkpointer).

    With ``log_path``, every model call appends ``model turn-1`` and every tool call
    ``tool <name>`` and ``key <name> <call id> attempt=1`` to that file, the lines the scripted
    runner writes, so both sides of ``bench.turn`` do the same work outside their durability
    layer; without it the nodes write nothing.
    """
    log = _Log(log_path) if log_path is not None else None

    def model(state: TurnState) -> dict[str, Any]:
        if log is not None:
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
        if log is not None:
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
    return builder


def turn_input() -> dict[str, Any]:
    """The input of one turn: ``{"messages": [the user message TURN_MESSAGE]}``."""
    return {"messages": [{"role": "user", "content": TURN_MESSAGE}]}


def turn_answer(state: dict[str, Any]) -> str:
    """The final answer in a finished turn's state (``{"messages": [...]}``).

    Raises:
        ValueError: If the state is not user message, tool calls, three tool results, answer.
    """
    messages = state.get("messages") or []
    roles = [message.get("role") for message in messages]
    if roles != ["user", "assistant", "tool", "tool", "tool", "assistant"]:
        raise ValueError(f"not one finished turn of three tools: {roles}")
    answer: str = messages[-1]["content"]
    return answer


#: What the LangGraph Agent Server serves (``graphs={"agent": "<this file>:graph"}``).
graph: CompiledStateGraph[Any] = graph_builder().compile()
