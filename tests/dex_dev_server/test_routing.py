"""Which idle pull stream the embedded engine gives a Flow's task (spec "Routing"): the worker
that served the Flow's previous task first, since it keeps the Flow's per-session state (the
MCP connections of an agent session live in one worker)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from dex_dev_server._dispatch import Dispatcher, idle_per_queue
from dex_dev_server._state import WorkerStream

FLOW_TYPE = "AgentSession"


def stream(sid: int, worker: str, *, own_queue: bool = False, served: int = 0) -> WorkerStream:
    return WorkerStream(
        sid=sid,
        queue=worker if own_queue else FLOW_TYPE,
        app_worker_id=worker,
        flow_types=frozenset({FLOW_TYPE}),
        out=asyncio.Queue(),
        served=served,
    )


def pick(streams: list[WorkerStream], sticky: str) -> Any:
    engine = SimpleNamespace(
        streams={item.sid: item for item in streams}, declined_until={}, rpc_declined_until={}
    )
    run = SimpleNamespace(flow_type=FLOW_TYPE, sticky=sticky)
    # Newest first, and counted per queue, as ``_match_tasks`` gathers them.
    idle = [item for item in streams[::-1] if item.idle]
    chosen = Dispatcher._pick_stream(
        engine, run, set(), rpc=False, t=0.0,  # type: ignore[arg-type]
        candidates=idle, idle_peers=idle_per_queue(idle),
    )
    return None if chosen is None else (chosen.app_worker_id, chosen.sid)


def test_the_sticky_worker_wins_over_a_fresh_stream_of_another_worker() -> None:
    # The sticky worker's streams have carried tasks; worker b has a fresh one. Fresh streams
    # used to win, so a session's calls moved between workers and its MCP state split.
    streams = [
        stream(1, "a", own_queue=True, served=3),
        stream(2, "a", served=5),
        stream(3, "b", served=0),
        stream(4, "b", own_queue=True, served=0),
    ]
    assert pick(streams, sticky="a")[0] == "a"
    assert pick(streams, sticky="b") == ("b", 4)


def test_without_an_idle_stream_of_the_sticky_worker_another_worker_takes_it() -> None:
    busy = stream(1, "a", own_queue=True)
    busy.task_id = "t-1"
    assert pick([busy, stream(2, "b", served=2)], sticky="a") == ("b", 2)


def test_a_flow_without_a_sticky_worker_prefers_fresh_streams() -> None:
    streams = [stream(1, "a", served=4), stream(2, "b", served=0)]
    assert pick(streams, sticky="") == ("b", 2)


def test_a_queue_s_only_idle_stream_wins_over_surplus_ones() -> None:
    # Worker a has two idle streams on its own queue, so it is retiring one of them (which
    # one depends on timing inside the worker); its only idle stream on the Flow type's queue
    # stays. A task sent to the retiring one came back unanswered and was sent again (2.7 such
    # round trips per agent turn, issue 24). The fresh own-queue stream used to win.
    streams = [
        stream(1, "a", served=6),
        stream(2, "a", own_queue=True, served=3),
        stream(3, "a", own_queue=True, served=0),
    ]
    assert pick(streams, sticky="a") == ("a", 1)


def test_among_surplus_streams_a_fresh_one_on_the_own_queue_is_taken() -> None:
    streams = [
        stream(1, "a", served=2),
        stream(2, "a", served=0),
        stream(3, "a", own_queue=True, served=4),
        stream(4, "a", own_queue=True, served=0),
    ]
    assert pick(streams, sticky="a") == ("a", 4)
    # A busy stream is not counted: its queue's other stream is the only idle one there.
    streams[3].task_id = "t-1"
    assert pick(streams, sticky="a") == ("a", 3)
