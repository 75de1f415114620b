"""The per-process shared reader of a session's Stream (``session_feed``, issue 24 "Many
watchers"), against the real embedded engine (``engine`` fixture) and the real Dex SDK.

Engine reads are counted with the web side's own ``dexagents_event_stream_reads_total``
counter, which ``session_feed`` increments once per ReadStream call.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest
from prometheus_client import REGISTRY

from agents_app.gateway import event_stream
from agents_app.live import session_feed
from dex_agents import AgentEvent, AgentEventType
from tests.e2e.relay_stack import dex_client, retained_tokens

SESSION_ID = "ses_" + "c" * 32

Messages = AsyncGenerator[event_stream.SessionEventMessage | None, None]


def stream_reads() -> float:
    return REGISTRY.get_sample_value("dexagents_event_stream_reads_total") or 0.0


async def wait_for(description: str, probe: Callable[[], bool], deadline: float = 30.0) -> None:
    limit = time.monotonic() + deadline
    while not probe():
        assert time.monotonic() < limit, f"timed out waiting for {description}"
        await asyncio.sleep(0.01)


async def write_markers(engine: str, markers: range) -> list[str]:
    """Append one ``tool_log`` event per marker; return the Stream's tokens, oldest first."""
    async with dex_client(engine) as (client, flow):
        for marker in markers:
            await client.write_stream(SESSION_ID, flow.agent_events, "feed-test", AgentEvent(
                AgentEventType.TOOL_LOG, None, "feed-test", 1, {"marker": marker}))
        return await retained_tokens(client, flow, SESSION_ID)


async def take(messages: Messages, count: int, into: list[Any] | None = None,
               deadline: float = 60.0) -> list[Any]:
    """The next ``count`` items of ``messages`` (markers, or None), within ``deadline`` s."""
    items = [] if into is None else into
    async with asyncio.timeout(deadline):
        for _ in range(count):
            item = await anext(messages)
            items.append(None if item is None else item.event["data"]["marker"])
    return items


@pytest.fixture
def quick_linger(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_feed, "FEED_LINGER_SECONDS", 0.05)


async def test_many_readers_of_one_session_share_one_engine_read_per_message(
    engine: str, quick_linger: None
) -> None:
    await write_markers(engine, range(10))
    before = stream_reads()
    readers = [session_feed.read_messages(SESSION_ID, "") for _ in range(20)]
    seen = await asyncio.gather(*(take(reader, 10) for reader in readers))
    assert seen == [list(range(10))] * 20
    assert session_feed.live_feed_count() == 1
    # Alone, each of the 20 readers would long-poll once per message: 200 reads.
    reads = stream_reads() - before
    print(f"{reads:.0f} engine reads for 20 readers of 10 messages")
    assert reads <= 20

    await write_markers(engine, range(10, 15))
    seen = await asyncio.gather(*(take(reader, 5) for reader in readers))
    assert seen == [list(range(10, 15))] * 20
    assert stream_reads() - before <= 30
    for reader in readers:
        await reader.aclose()
    await wait_for("the shared reader to stop", lambda: session_feed.live_feed_count() == 0)


async def test_a_late_reader_with_an_old_token_catches_up_exactly_then_shares(
    engine: str, quick_linger: None
) -> None:
    tokens = await write_markers(engine, range(200))  # more than the shared reader keeps
    first = session_feed.read_messages(SESSION_ID, "")
    assert await take(first, 200) == list(range(200))

    # Far behind the shared reader: reads on its own until it reaches what it keeps.
    late = session_feed.read_messages(SESSION_ID, tokens[10])
    assert await take(late, 189) == list(range(11, 200))
    # Among its recent messages: no engine read of its own at all.
    before = stream_reads()
    recent = session_feed.read_messages(SESSION_ID, tokens[190])
    assert await take(recent, 9) == list(range(191, 200))
    assert stream_reads() == before

    # All three now follow the one shared reader: each new message once, in order.
    await write_markers(engine, range(200, 205))
    for reader in (first, late, recent):
        assert await take(reader, 5) == list(range(200, 205))
    assert stream_reads() - before <= 5 + 1
    for reader in (first, late, recent):
        await reader.aclose()
    await wait_for("the shared reader to stop", lambda: session_feed.live_feed_count() == 0)


async def test_a_reader_ahead_of_the_shared_reader_gets_exactly_what_follows_its_token(
    engine: str, quick_linger: None
) -> None:
    tokens = await write_markers(engine, range(300))
    # The shared reader starts at the oldest message, with this reader, and replays them all.
    replaying = session_feed.read_messages(SESSION_ID, "")
    assert await take(replaying, 1) == [0]
    ahead = session_feed.read_messages(SESSION_ID, tokens[-1])
    following = asyncio.create_task(take(ahead, 3))
    await write_markers(engine, range(300, 303))
    assert await following == [300, 301, 302]
    # The replaying reader let more than FEED_QUEUE_MESSAGES wait: it lost nothing.
    assert await take(replaying, 302) == list(range(1, 303))
    await replaying.aclose()
    await ahead.aclose()


async def test_a_reader_that_stops_reading_does_not_hold_back_the_others(
    engine: str, quick_linger: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(session_feed, "FEED_QUEUE_MESSAGES", 5)
    await write_markers(engine, range(1))
    slow = session_feed.read_messages(SESSION_ID, "")
    fast = session_feed.read_messages(SESSION_ID, "")
    assert await take(slow, 1) == [0]
    assert await take(fast, 1) == [0]
    # The slow reader reads nothing while 40 messages go by; the fast one gets them all.
    fast_seen: list[Any] = []
    following = asyncio.create_task(take(fast, 40, fast_seen))
    await write_markers(engine, range(1, 41))
    assert await following == list(range(1, 41))
    # Detached after 5 queued messages, the slow reader loses nothing: it reads the rest
    # on its own, exactly once and in order, then joins the shared reader again.
    assert await take(slow, 40) == list(range(1, 41))
    before = stream_reads()
    await write_markers(engine, range(41, 43))
    assert await take(slow, 2) == [41, 42]
    assert await take(fast, 2) == [41, 42]
    assert stream_reads() - before <= 2 + 1
    await slow.aclose()
    await fast.aclose()


async def test_an_unretained_token_gets_none_first_and_a_cancelled_reader_leaks_nothing(
    engine: str, quick_linger: None
) -> None:
    await write_markers(engine, range(3))
    reader = session_feed.read_messages(SESSION_ID, "not-a-token-of-this-stream")
    assert await take(reader, 4) == [None, 0, 1, 2]
    # A reader cancelled while it waits (a closed socket) leaves the feed; the feed stops.
    waiting = asyncio.create_task(take(reader, 1))
    await wait_for("the reader to wait", lambda: session_feed.live_feed_count() == 1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await reader.aclose()
    await wait_for("the shared reader to stop", lambda: session_feed.live_feed_count() == 0)


async def test_a_followed_tail_moves_with_the_stream_without_engine_reads_of_its_own(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``follow_tail`` starts the shared reader at the newest token; ``known_tail`` then gives
    the newest token from this process (the snapshot short path's stamp), follows writes of
    other processes, and the reader stops ``FEED_TAIL_SECONDS`` after the last ask."""
    monkeypatch.setattr(session_feed, "FEED_TAIL_SECONDS", 0.5)
    tokens = await write_markers(engine, range(3))
    assert session_feed.known_tail(SESSION_ID) is None
    session_feed.follow_tail(SESSION_ID, tokens[-1])
    assert session_feed.known_tail(SESSION_ID) == tokens[-1]

    newer = await write_markers(engine, range(3, 5))
    await wait_for("the tail to move", lambda: session_feed.known_tail(SESSION_ID) == newer[-1])
    # Asking costs no engine read: only the shared reader's long polls read.
    before = stream_reads()
    for _ in range(50):
        assert session_feed.known_tail(SESSION_ID) == newer[-1]
    assert stream_reads() - before <= 1
    await wait_for("the shared reader to stop", lambda: session_feed.live_feed_count() == 0,
                   deadline=10)
    assert session_feed.known_tail(SESSION_ID) is None


async def test_a_reader_behind_the_tail_is_not_taken_for_it(
    engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A shared reader that a client started at an old token says nothing of the tail until
    an engine read of the newest token (``follow_tail``) finds it there; a failed engine call
    makes it unsure again until one of its reads succeeded and the tail was confirmed."""
    monkeypatch.setattr(session_feed, "FEED_TAIL_SECONDS", 0.5)
    tokens = await write_markers(engine, range(5))
    reader = session_feed.read_messages(SESSION_ID, tokens[0])
    assert await take(reader, 4) == [1, 2, 3, 4]
    # Caught up, but no long poll has come back empty yet and no engine read said so.
    assert session_feed.known_tail(SESSION_ID) is None
    session_feed.follow_tail(SESSION_ID, tokens[-1])
    assert session_feed.known_tail(SESSION_ID) == tokens[-1]
    feed = session_feed._feeds[asyncio.get_running_loop()][SESSION_ID]
    feed._failed_read()
    assert session_feed.known_tail(SESSION_ID) is None
    # Until a read succeeds again, an engine read of the tail cannot vouch for the feed: it
    # is not reading (a retry's backoff), so writes could go by unseen.
    session_feed.follow_tail(SESSION_ID, tokens[-1])
    assert session_feed.known_tail(SESSION_ID) is None
    newer = await write_markers(engine, range(5, 6))
    assert await take(reader, 1) == [5]
    assert session_feed.known_tail(SESSION_ID) is None
    session_feed.follow_tail(SESSION_ID, newer[-1])
    assert session_feed.known_tail(SESSION_ID) == newer[-1]
    await reader.aclose()
    await wait_for("the shared reader to stop", lambda: session_feed.live_feed_count() == 0,
                   deadline=10)


async def test_a_feed_only_snapshot_reads_keep_stops_when_the_engine_fails(engine: str) -> None:
    """Nobody reads from a feed that only snapshot reads keep: at the engine's first failure it
    stops instead of retrying (each retry would keep the process's shared gRPC connection in
    reconnect backoff after the engine is back); one a reader holds keeps retrying."""
    tokens = await write_markers(engine, range(1))
    session_feed.follow_tail(SESSION_ID, tokens[-1])
    feed = session_feed._feeds[asyncio.get_running_loop()][SESSION_ID]
    with pytest.raises(session_feed._Unheld):
        feed._failed_read()

    reader = session_feed.read_messages(SESSION_ID, tokens[-1])
    waiting = asyncio.create_task(take(reader, 1))
    await wait_for("the reader to hold the feed", lambda: feed.holders > 0)
    feed._failed_read()  # held: no stop
    assert session_feed.known_tail(SESSION_ID) is None
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await reader.aclose()
