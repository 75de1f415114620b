"""Peer for bench.turn: the agent turn as a DBOS workflow on SQLite, one process serving turns.

The turn is the shape of one ``AgentSessionFlow`` turn that asks for three READ tools, as in
``bench/langgraph_peer.py``: a model step, three tool steps run concurrently
(``asyncio.gather`` of async ``@DBOS.step`` functions), a model step with the final answer; five
durable steps in one ``@DBOS.workflow``, each turn a fresh workflow ID. The steps write the same
invocation log lines as the scripted runner and the LangGraph peer, so every side does the same
work outside its durability layer.

Durability: DBOS's SQLite system database at DBOS's defaults (no journal or synchronous
pragma: SQLite's rollback journal, ``journal_mode=DELETE``, with ``synchronous=FULL``): every step
is a committed transaction that survives a power loss, as the engine's ``--sync full`` (WAL with
``synchronous=FULL``).

Run as ``python -m bench.dbos_turn_peer DB_PATH LOG_PATH``. It prints ``ready`` once DBOS is
launched and warmed up, then for every line ``turn <id>`` on stdin runs one turn and prints
one JSON line ``{"seconds": <wall seconds of the turn>, "answer": <final answer>}``; it ends
at end of input. The parent measures this process's CPU around each turn (all its threads).
Only the benchmark runs this module; ``dbos`` is in the ``bench`` extra.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from bench.langgraph_peer import TURN_MESSAGE

_log_path = Path("/dev/null")


def _record(kind: str, name: str) -> None:
    with _log_path.open("a") as handle:
        handle.write(f"{kind} {name}\n")


@DBOS.step()
async def model(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The scripted model: three tool calls for the user message, then the answer."""
    _record("model", "turn-1")
    results = [m for m in messages if m["role"] == "tool"]
    if not results:
        names = [n.strip() for n in messages[0]["content"].partition(":")[2].split(",")]
        calls = [{"id": f"call-{i}", "name": name, "arguments": json.dumps({"n": i})}
                 for i, name in enumerate(names, start=1)]
        return {"role": "assistant", "content": "", "tool_calls": calls}
    answer = "; ".join(f"{m['name']}=succeeded: {m['content']}" for m in results)
    return {"role": "assistant", "content": answer}


@DBOS.step()
async def tool(call: dict[str, Any]) -> dict[str, Any]:
    """One READ tool call."""
    _record("tool", call["name"])
    _record("key", f"{call['name']} {call['id']} attempt=1")
    return {"role": "tool", "tool_call_id": call["id"], "name": call["name"],
            "content": f"{call['name']} ok"}


@DBOS.workflow()
async def turn(message: str) -> str:
    """model → three concurrent tools → model; returns the final answer."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": message}]
    first = await model(messages)
    messages.append(first)
    messages += await asyncio.gather(*(tool(call) for call in first["tool_calls"]))
    final = await model(messages)
    answer: str = final["content"]
    return answer


async def _turn(workflow_id: str) -> str:
    with SetWorkflowID(workflow_id):
        return await turn(TURN_MESSAGE)


async def _serve() -> None:
    loop = asyncio.get_running_loop()
    await _turn("warm-up")  # schema, connections, first imports
    print("ready", flush=True)
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        workflow_id = line.split()[1]
        started = time.perf_counter()
        answer = await _turn(workflow_id)
        print(json.dumps({"seconds": time.perf_counter() - started, "answer": answer}),
              flush=True)


def main() -> int:
    """Launch DBOS on the given SQLite file and serve turns from stdin."""
    global _log_path
    db_path, _log_path = sys.argv[1], Path(sys.argv[2])
    DBOS(config={"name": "dexagents-bench-turn", "system_database_url": f"sqlite:///{db_path}",
                 "log_level": "WARNING"})
    DBOS.launch()
    try:
        asyncio.run(_serve())
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
