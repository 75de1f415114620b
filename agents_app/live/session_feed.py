"""The shared reader of a session's AgentEvents Dex Stream, per event loop (issue 24, "Many
watchers").

Each session's Stream is read once per event loop (one per web process under uvicorn), by a
shared reader (``_SessionFeed``) that fans every message out to the session's readers in the
process. ``read_messages`` subscribes to it; the websocket relay
(``consumers.SessionEventsConsumer``), Server-Sent Events and the waits of
``session_events`` all read through it, and the snapshot's short path asks it for the Stream's
newest token (``known_tail``, ``follow_tail``):

- The shared reader starts with the first reader of a session, at that reader's position,
  and stops ``FEED_LINGER_SECONDS`` after the last one left (a reconnecting client finds it
  still running). It keeps the last ``FEED_RING_MESSAGES`` messages (at most
  ``FEED_RING_BYTES`` of frames), so a reader that arrives a little behind it, or at its
  position, joins without an engine read.
- A reader further behind (an older token, or ``""`` on a long Stream) reads on its own, as
  every reader did before, until its position is one the shared reader holds; it then joins
  the shared feed, so it gets every message after its token exactly once, in order.
- Each joined reader has its own queue of at most ``FEED_QUEUE_MESSAGES`` messages. A reader
  that lets it fill is detached from the feed (nothing is dropped: it reads on its own from
  its last message and joins again once it caught up), so a slow reader never holds back the
  others. The websocket's own send queue (4408) sits behind this one, unchanged.
- Retention checks, engine retries (``engine_retry``) and ``snapshot_required`` are as they
  were per reader: the shared reader checks its own reads and tells every joined reader.

Nothing here holds a database connection or a worker slot: it long-polls the engine
(``ReadStream``, at most ``LONG_POLL_SECONDS`` per call) on the caller's event loop. Every
ReadStream call is counted in ``dexagents_event_stream_reads_total``.

May import: the gateway's ``event_stream`` (the engine reads) and ``dex_gateway`` (its errors),
and the metrics; nothing else of ``agents_app.live``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import random
import time
import weakref
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

from agents_app.gateway import dex_gateway, event_stream
from agents_app.metrics import EVENT_STREAM_READS

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds one ReadStream long poll may wait for a write (Dex caps it at 60).
LONG_POLL_SECONDS = 25.0
#: Backoff while the engine is unreachable: first delay, cap (seconds).
RETRY_FIRST_SECONDS = 0.25
RETRY_MAX_SECONDS = 5.0
#: How often the reader checks that the position it read from was still retained (seconds).
VERIFY_INTERVAL_SECONDS = 1.0
#: Recent messages a session's shared reader keeps for readers that join behind it: at most
#: this many, and at most this many bytes of frames (the newest message is always kept).
FEED_RING_MESSAGES = 64
FEED_RING_BYTES = 64 * 1024
#: Messages that may wait for one joined reader before it is detached to read on its own.
FEED_QUEUE_MESSAGES = 256
#: Seconds a session's shared reader runs on after its last reader left.
FEED_LINGER_SECONDS = 2.0
#: Seconds a session's shared reader runs on after a snapshot read last asked it for the
#: Stream's newest token (``known_tail``), and how many sessions' readers snapshot reads may
#: keep running on one event loop (each is one long poll held open on the engine).
FEED_TAIL_SECONDS = 30.0
FEED_TAIL_MAX = 256

Message = event_stream.SessionEventMessage


async def engine_retry(
    call: Callable[[], Awaitable[T]], on_failure: Callable[[], None] | None = None
) -> T:
    """Await ``call()``, retrying with jittered exponential backoff (``RETRY_FIRST_SECONDS``
    doubling to ``RETRY_MAX_SECONDS``) while the engine is unreachable, so a Dex restart does
    not end a reader; ``on_failure()`` runs at each failed attempt. Any other error passes
    through."""
    delay = RETRY_FIRST_SECONDS
    failing_since = 0.0
    while True:
        try:
            result = await call()
        except dex_gateway.EngineUnavailableError as error:
            if on_failure is not None:
                on_failure()
            if not failing_since:
                failing_since = time.monotonic()
                logger.warning("Events reader waits for the engine: %s", error)
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, RETRY_MAX_SECONDS)
            continue
        if failing_since:
            logger.info("Events reader reached the engine again after %.1f s.",
                        time.monotonic() - failing_since)
        return result


async def _retained(session_id: str, token: str, newer: int = 0,
                    on_failure: Callable[[], None] | None = None) -> bool:
    return await engine_retry(
        functools.partial(
            event_stream.session_events_after_retained, session_id=session_id, after=token,
            newer=newer,
        ),
        on_failure,
    )


async def _stream_read(
    session_id: str, after: str, on_failure: Callable[[], None] | None = None
) -> Message | None:
    """One counted ReadStream long poll, retried while the engine is unreachable
    (``on_failure()`` at each failed attempt)."""

    async def read() -> Message | None:
        EVENT_STREAM_READS.inc()
        return await event_stream.session_events_read(
            session_id=session_id, after=after, wait_seconds=LONG_POLL_SECONDS
        )

    return await engine_retry(read, on_failure)


class _RetentionCheck:
    """Detects messages Dex trimmed before a reader read them (``read_messages``).

    Dex resumes a trimmed token at the next newer message without saying so, so a reader
    remembers the oldest position it read from since the last check and, right after a read
    and at most every ``VERIFY_INTERVAL_SECONDS`` (or after an idle long poll), asks whether
    it is still retained. Trimming is oldest-first, so a retained position proves every read
    since was gap-free.
    """

    __slots__ = ("on_failure", "read_since", "session_id", "unverified_from", "verified_at")

    def __init__(self, session_id: str, on_failure: Callable[[], None] | None = None) -> None:
        self.session_id = session_id
        #: Called at each failed engine attempt of a check (``engine_retry``).
        self.on_failure = on_failure
        self.unverified_from = ""
        #: Messages read since ``unverified_from``: all of them are newer than it.
        self.read_since = 0
        self.verified_at = time.monotonic()

    def read(self, read_from: str, message: Message | None) -> None:
        """Note a read from ``read_from`` that returned ``message``."""
        if message is not None and read_from and not self.unverified_from:
            self.unverified_from = read_from
            self.read_since = 0
        if message is not None and self.unverified_from:
            self.read_since += 1

    async def lost(self, *, idle: bool, force: bool = False) -> bool:
        """Settle a pending check when due (``idle``: the read found nothing; ``force``: now);
        True when messages were lost since the last one."""
        if not self.unverified_from:
            return False
        if not (force or idle or time.monotonic() - self.verified_at >= VERIFY_INTERVAL_SECONDS):
            return False
        gone = not await _retained(self.session_id, self.unverified_from, self.read_since,
                                   self.on_failure)
        self.unverified_from = ""
        self.verified_at = time.monotonic()
        if gone:
            logger.warning("Session %s: events were trimmed before the reader read them; "
                           "the client must reload the snapshot.", self.session_id)
        return gone


class _Unheld(Exception):
    """A feed that no reader holds stops at its first failed engine call (``_SessionFeed``)."""


class _Detached:
    """Queue item: the reader fell ``FEED_QUEUE_MESSAGES`` behind and left the feed."""


class _Failed:
    """Queue item: the shared reader failed with ``error``."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


_DETACHED = _Detached()
_Item = Message | None | _Detached | _Failed


class _Subscription:
    """One reader's queue of messages from its session's shared reader."""

    __slots__ = ("items", "waiter")

    def __init__(self) -> None:
        self.items: collections.deque[_Item] = collections.deque()
        self.waiter: asyncio.Future[None] | None = None

    def push(self, item: _Item, *, bounded: bool = True) -> bool:
        """Queue ``item``; False (nothing queued) when ``bounded`` and the queue is full."""
        if bounded and len(self.items) >= FEED_QUEUE_MESSAGES:
            return False
        self.items.append(item)
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        return True

    async def get(self) -> _Item:
        """Wait for and remove the oldest item."""
        while not self.items:
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None
        return self.items.popleft()


class _SessionFeed:
    """The shared reader of one session's Stream on one event loop, and its readers.

    ``position`` is the token after which its next read starts (``""``: from the oldest
    retained message, before its first read from there). ``ring`` holds the newest messages
    it read, contiguous up to ``position`` (emptied when a gap was detected), indexed by
    token in ``sequence`` (message -> its number, counting from the feed's start).

    ``at_tail``: ``position`` was the Stream's newest token at some moment since the feed's
    engine calls last failed (a long poll from it found nothing, or an engine read of the
    newest token gave it, ``confirm_tail``), so from then on ``position`` trails the newest
    token only by the messages the engine is delivering now (``known_tail``). ``failing``: an
    engine call of the feed failed and no read succeeded since; it is not at the tail then,
    whatever an engine read of the tail says, since it is not reading.
    """

    def __init__(self, session_id: str, position: str, feeds: dict[str, _SessionFeed]) -> None:
        self.session_id = session_id
        self.position = position
        self.feeds = feeds
        self.ring: collections.deque[Message] = collections.deque()
        self.ring_bytes = 0
        self.sequence: dict[str, int] = {}
        self.next_number = 0
        self.subscribers: set[_Subscription] = set()
        self.holders = 0
        self.closed = False
        self.moved: asyncio.Future[None] | None = None
        self.linger: asyncio.TimerHandle | None = None
        self.at_tail = False
        self.failing = False
        self.tail_target = ""
        self.kept_until = 0.0
        self.task = asyncio.create_task(self._run(), name=f"events feed {session_id}")

    # -- readers ------------------------------------------------------------------------------

    def hold(self) -> None:
        """One more reader relies on this feed (joined or catching up)."""
        self.holders += 1
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None

    def release(self, subscription: _Subscription) -> None:
        """A reader is gone; the feed stops ``FEED_LINGER_SECONDS`` after the last one (or
        when ``keep`` says, if that is later)."""
        self.subscribers.discard(subscription)
        self.holders -= 1
        if self.holders <= 0 and not self.closed:
            if self.linger is not None:
                self.linger.cancel()
            self.linger = asyncio.get_running_loop().call_later(
                FEED_LINGER_SECONDS, self._stop_when_idle
            )

    def keep(self, seconds: float) -> None:
        """Keep the feed reading for at least ``seconds`` more, readers or none."""
        loop = asyncio.get_running_loop()
        self.kept_until = max(self.kept_until, loop.time() + seconds)
        if self.holders <= 0 and self.linger is None and not self.closed:
            self.linger = loop.call_later(seconds, self._stop_when_idle)

    def confirm_tail(self, tail: str) -> None:
        """The engine said just now that ``tail`` is the Stream's newest token: the feed is at
        the tail once its position is there (or past it)."""
        if not self.failing and (tail == self.position or tail in self.sequence):
            self.at_tail = True
        else:
            self.tail_target = tail

    def holds(self, after: str) -> bool:
        """Whether a reader at ``after`` can join now (``join``)."""
        return not self.closed and (after == self.position or after in self.sequence)

    def join(self, subscription: _Subscription, after: str) -> bool:
        """Join ``subscription`` right after the message ``after`` when this feed holds that
        position (its own, or a message of its ring), queueing the ring's newer messages;
        False otherwise (the reader reads on its own until it gets there)."""
        if not self.holds(after):
            return False
        if after != self.position:
            number = self.sequence[after]
            first = self.next_number - len(self.ring)
            for index in range(number - first + 1, len(self.ring)):
                subscription.push(self.ring[index], bounded=False)
        self.subscribers.add(subscription)
        return True

    def moved_future(self) -> asyncio.Future[None]:
        """A future that resolves when the feed reads its next message or ends."""
        if self.moved is None or self.moved.done():
            self.moved = asyncio.get_running_loop().create_future()
        return self.moved

    # -- the shared reader --------------------------------------------------------------------

    def _wake(self) -> None:
        if self.moved is not None and not self.moved.done():
            self.moved.set_result(None)

    def _publish(self, item: Message | None) -> None:
        overflowed = [sub for sub in self.subscribers if not sub.push(item)]
        for subscription in overflowed:
            self.subscribers.discard(subscription)
            subscription.push(_DETACHED, bounded=False)

    def _keep(self, message: Message) -> None:
        self.ring.append(message)
        self.ring_bytes += len(message.frame)
        self.sequence[message.token] = self.next_number
        self.next_number += 1
        while len(self.ring) > 1 and (
            len(self.ring) > FEED_RING_MESSAGES or self.ring_bytes > FEED_RING_BYTES
        ):
            oldest = self.ring.popleft()
            self.ring_bytes -= len(oldest.frame)
            self.sequence.pop(oldest.token, None)

    def _forget_ring(self) -> None:
        self.ring.clear()
        self.sequence.clear()
        self.ring_bytes = 0

    def _failed_read(self) -> None:
        # The engine may take writes this reader does not see until it reads again.
        self.at_tail = False
        self.failing = True
        if self.holders <= 0:
            # Kept only for snapshot reads (``keep``): stop rather than retry while the engine
            # is away. Retries would keep the process's shared gRPC connection reconnecting
            # with growing backoff, so that a write sent just after the engine came back
            # could find it still waiting and be kept for later delivery; the next read
            # starts a new feed (``follow_tail``).
            raise _Unheld

    async def _run(self) -> None:
        check = _RetentionCheck(self.session_id, self._failed_read)
        try:
            while True:
                read_from = self.position
                message = await _stream_read(self.session_id, read_from, self._failed_read)
                check.read(read_from, message)
                if await check.lost(idle=message is None):
                    # Readers joining at a message before the gap must find it themselves.
                    self._forget_ring()
                    self._publish(None)
                # Both calls succeeded in the end (engine_retry); if either failed on the way,
                # writes may have gone by unseen: the tail is known again from the next read.
                failed_on_the_way, self.failing = self.failing, False
                if not failed_on_the_way and (
                    message is None
                    or (self.tail_target and self.tail_target in (read_from, message.token))
                ):
                    self.at_tail = True
                    self.tail_target = ""
                if message is not None:
                    self._keep(message)
                    self.position = message.token
                    self._publish(message)
                    self._wake()
        except asyncio.CancelledError:
            raise
        except _Unheld:
            logger.info("Events feed of session %s stopped: the engine did not answer.",
                        self.session_id)
        except Exception as error:
            logger.error("Events feed of session %s failed.", self.session_id, exc_info=error)
            self._close()
            for subscription in self.subscribers:
                subscription.push(_Failed(error), bounded=False)
            self.subscribers.clear()
        finally:
            self._close()

    def _close(self) -> None:
        self.closed = True
        if self.feeds.get(self.session_id) is self:
            del self.feeds[self.session_id]
        if self.linger is not None:
            self.linger.cancel()
            self.linger = None
        self._wake()

    def _stop_when_idle(self) -> None:
        self.linger = None
        if self.holders > 0:
            return
        kept_for = self.kept_until - asyncio.get_running_loop().time()
        if kept_for > 0:
            self.linger = asyncio.get_running_loop().call_later(kept_for, self._stop_when_idle)
            return
        self._close()
        self.task.cancel()


# Each event loop's shared readers by session ID (gRPC aio objects are bound to their loop).
_feeds: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, _SessionFeed]] = (
    weakref.WeakKeyDictionary()
)


def _feed_for(session_id: str, position: str) -> _SessionFeed:
    """The running loop's shared reader of ``session_id``, started at ``position`` when
    there is none, held for one more reader."""
    feeds = _feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(session_id)
    if feed is None or feed.closed:
        feed = feeds[session_id] = _SessionFeed(session_id, position, feeds)
    feed.hold()
    return feed


def known_tail(session_id: str) -> str | None:
    """The session's newest AgentEvents token as this event loop's shared reader of the
    session knows it, without an engine read; None when no reader here is at the Stream's
    tail (none runs, it is catching up, or its last engine read failed).

    The token trails the engine's newest by the messages being delivered to this process at
    that moment (a long poll's answer in flight: typically well under a millisecond on one
    machine), never by a message the reader could not read. Each call keeps the reader
    running for ``FEED_TAIL_SECONDS`` more.
    """
    feeds = _feeds.get(asyncio.get_running_loop())
    feed = feeds.get(session_id) if feeds else None
    if feed is None or feed.closed or not feed.at_tail or not feed.position:
        return None
    feed.keep(FEED_TAIL_SECONDS)
    return feed.position


def follow_tail(session_id: str, tail: str) -> None:
    """Have this event loop's shared reader of the session follow its Stream from ``tail``,
    the newest token an engine read gave just now, so that ``known_tail`` can answer the next
    reads: starts one (unless ``FEED_TAIL_MAX`` are running, or ``tail`` is ``""``) or tells
    the running one where the tail was, and keeps it running for ``FEED_TAIL_SECONDS``."""
    if not tail:
        return
    feeds = _feeds.setdefault(asyncio.get_running_loop(), {})
    feed = feeds.get(session_id)
    if feed is None or feed.closed:
        if len(feeds) >= FEED_TAIL_MAX:
            return
        feed = feeds[session_id] = _SessionFeed(session_id, tail, feeds)
    feed.confirm_tail(tail)
    feed.keep(FEED_TAIL_SECONDS)


def live_feed_count() -> int:
    """How many sessions the running loop's shared Stream readers read now (tests, benches);
    a reader lingers ``FEED_LINGER_SECONDS`` after its session's last reader left."""
    feeds = _feeds.get(asyncio.get_running_loop(), {})
    return sum(not feed.task.done() for feed in feeds.values())


async def read_messages(
    session_id: str, after: str
) -> AsyncGenerator[event_stream.SessionEventMessage | None, None]:
    """Yield the session's Stream messages after ``after``, in order, forever; ``None`` in
    place of a message means events were lost to the reader (send ``snapshot_required``).

    Dex resumes a trimmed token at the next newer message without saying so, so the reader
    checks retention itself: ``after`` before the first read (gone: ``None`` first, then from
    the oldest retained), then, right after a read and at most every
    ``VERIFY_INTERVAL_SECONDS``, the oldest position it read from since the last check.
    Trimming is oldest-first, so a position still retained proves that every read since was
    gap-free; one that is gone yields ``None`` before the message just read. ``after``
    ``""`` starts at the oldest retained message.

    The reads are shared by every reader of the session on this event loop (module
    docstring): this reader reads the engine itself only while it is behind the shared
    reader's recent messages, or after it let ``FEED_QUEUE_MESSAGES`` wait.

    Raises:
        event_stream.EventsTokenInvalidError: A token of the reader's own was refused (also
            raised in every reader of the session when the shared reader's was).
    """
    position = after
    if after and not await _retained(session_id, after):
        yield None
        position = ""
    subscription = _Subscription()
    feed = _feed_for(session_id, position)
    try:
        while True:
            check = _RetentionCheck(session_id)
            # Catch up on this reader's own reads until the shared reader holds its position;
            # settle its own retention check first, so a gap it read over is told before.
            while True:
                if feed.holds(position):
                    if await check.lost(idle=False, force=True):
                        yield None
                    if feed.join(subscription, position):
                        break
                    continue
                if feed.closed:
                    feed.release(subscription)
                    feed = _feed_for(session_id, position)
                    continue
                read_from = position
                read = asyncio.ensure_future(_stream_read(session_id, read_from))
                try:
                    # Keep the long poll unless the shared reader reached this position (it
                    # may be replaying older messages, each of which wakes this wait).
                    while not read.done() and not (feed.holds(position) or feed.closed):
                        moved = feed.moved_future()
                        await asyncio.wait((read, moved), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    if not read.done():
                        read.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await read
                if read.cancelled():
                    continue  # the shared reader holds this position now (or ended)
                message = read.result()
                check.read(read_from, message)
                if await check.lost(idle=message is None):
                    yield None
                if message is not None:
                    yield message
                    position = message.token
            # Joined: the shared reader's messages from here on.
            while True:
                item = await subscription.get()
                if isinstance(item, _Detached):
                    break
                if isinstance(item, _Failed):
                    raise item.error
                yield item
                if item is not None:
                    position = item.token
    finally:
        feed.release(subscription)

