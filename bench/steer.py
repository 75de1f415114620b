"""Benchmark of Steer: how long from the Steer RPC until the running turn's model has answered it.

Starts the embedded engine and a Worker child with the scripted agent Flows of
``tests/dex_agents`` (``dex_agents.testing.AgentTestStack``), then, ``--runs`` times each,
interleaved:

1. Steer: a session waits in a long ``durable_wait`` (a tool Step of the turn is running);
   the bench queues a message and steers it, and times from the ``steer_queued_message`` call
   until the snapshot shows the turn's answer to it (the DurableWait Step woken and finished,
   ResumeTurn, one RunModel, the commit).
2. The peer, in the same run: a message sent to an idle session, timed from
   ``send_user_message`` until the snapshot shows its answer (AwaitUserMessage, one RunModel,
   the commit). A steer should cost about as much as an ordinary turn start.

Prints p50 / p99 of both and the ratio. Nothing is asserted.
Run: ``.venv/bin/python -m bench.steer`` (``--quick`` for a smaller, faster pass).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.relay import percentile
from dex_agents import AgentSessionClient, AgentSnapshot
from dex_agents.testing import AgentTestStack, wait_for_agent_snapshot
from tests.dex_agents.scripted_agent import STATE_DIR_ENV, STEERING_FLOW_TYPE, build_flows

REPO = Path(__file__).resolve().parents[1]
WORKER_MODULE = "tests.dex_agents.scripted_worker"


async def until(
    sessions: AgentSessionClient, session_id: str, done: Callable[[AgentSnapshot], bool]
) -> None:
    """Poll the snapshot back to back until ``done`` (the timing resolution is one RPC)."""
    give_up_at = time.monotonic() + 60
    while time.monotonic() < give_up_at:
        if done(await sessions.get_agent_snapshot(session_id)):
            return
    raise TimeoutError(f"{session_id} did not finish")


def answered(text: str) -> Callable[[AgentSnapshot], bool]:
    return lambda snapshot: bool(snapshot.messages) and snapshot.messages[-1].text.endswith(text)


async def steer_once(sessions: AgentSessionClient, number: int) -> float:
    session_id = f"steer-{number}"
    await sessions.start_session(session_id, "wait: 3600")
    await wait_for_agent_snapshot(
        sessions, session_id, lambda snapshot: snapshot.pending_timer, description="a timer"
    )
    assert await sessions.send_user_message(session_id, "change", client_id="s")
    started = time.perf_counter()
    assert await sessions.steer_queued_message(session_id, "s")
    await until(sessions, session_id, answered("steered=['change']"))
    return time.perf_counter() - started


async def send_once(sessions: AgentSessionClient, number: int) -> float:
    session_id = f"send-{number}"
    await sessions.start_session(session_id)
    await wait_for_agent_snapshot(
        sessions, session_id, lambda snapshot: snapshot.state, description="a started session"
    )
    started = time.perf_counter()
    assert await sessions.send_user_message(session_id, "hello")
    await until(sessions, session_id, answered("echo: hello"))
    return time.perf_counter() - started


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as directory:
        flows = build_flows()
        async with AgentTestStack(
            Path(directory),
            flows,
            WORKER_MODULE,
            worker_cwd=REPO,
            worker_env={STATE_DIR_ENV: directory},
        ) as stack:
            flow = next(flow for flow in flows if flow.get_flow_type() == STEERING_FLOW_TYPE)
            sessions = stack.sessions(flow)
            await stack.start_worker()
            await send_once(sessions, -1)  # warm-up
            steers: list[float] = []
            sends: list[float] = []
            for number in range(runs):
                steers.append(await steer_once(sessions, number))
                sends.append(await send_once(sessions, number))
    steer_p50, send_p50 = statistics.median(steers), statistics.median(sends)
    print(f"runs: {runs} each, interleaved")
    print(
        f"steer during a running durable_wait -> answered: p50 {steer_p50 * 1000:.1f} ms, "
        f"p99 {percentile(steers, 0.99) * 1000:.1f} ms"
    )
    print(
        f"peer: message to an idle session -> answered: p50 {send_p50 * 1000:.1f} ms, "
        f"p99 {percentile(sends, 0.99) * 1000:.1f} ms"
    )
    print(f"ratio (steer / idle send, p50): {steer_p50 / send_p50:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="5 runs each")
    arguments = parser.parse_args()
    sys.exit(asyncio.run(main(5 if arguments.quick else arguments.runs)))
