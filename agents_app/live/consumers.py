"""Websocket consumers (Channels), routed in ``agents_app.live.routing``.

``SessionEventsConsumer`` serves ``/ws/sessions/<id>/events/[?after=<token>]``: it relays the
session's AgentEvents Dex Stream (ARCHITECTURE.md "Live events"; issue 9, section 1).

Protocol:

- Auth (``agents_app.auth``): ``Authorization: Bearer <key>`` or ``Token <key>``, else the
  Django session cookie. The owner or staff may read. Refusals accept the socket and close it
  at once with 4401 (not authenticated) or 4404 (no such ``AgentSession`` index row, or
  someone else's session: as the REST API's 404, a socket does not reveal that a foreign
  session exists); nothing else is sent. The handshake's database lookups run on
  threads of their own (``agents_app.websocket_db``): one that the database does not answer
  within ``DEXAGENTS["WEBSOCKET_DB_TIMEOUT"]`` seconds (10) closes that socket with 4503, and
  no other request of the process waits for it; the client retries. A socket whose session
  is deleted closes with 4404 too (the ``session.deleted`` notice on the channel layer).
- Text frames, JSON, in Stream order, each Stream message at most once per connection:
  ``{"type": "event", "token", "event": {"type", "turn_id", "step_execution_id", "attempt",
  "data", "created_at"}}`` (``event_stream.SessionEventMessage``), and
  ``{"type": "snapshot_required"}``: events were lost to the client, so it must reload the
  snapshot (``GET /api/v1/sessions/<id>/``). It comes first when ``after`` is no longer
  retained (or was never a token of this Stream), and the relay then starts at the oldest
  retained message. It also comes mid-stream in the rare case that Dex trimmed messages
  before the relay read them (a client that resumed far behind on a busy engine); the relay
  then goes on after the last message it sent.
- ``after`` resumes right after that message; without it the relay starts at the oldest
  retained message. The client resumes with the token of the last frame it processed.
- Slow clients: frames wait in a per-socket queue bounded by
  ``DEXAGENTS["EVENTS_SEND_QUEUE_FRAMES"]`` frames (1000) and
  ``DEXAGENTS["EVENTS_SEND_QUEUE_BYTES"]`` bytes of JSON (1 MiB), behind the ASGI server's
  own write buffer (uvicorn stops taking frames past 64 KiB unsent); past either bound the
  queue is dropped and the socket closes with 4408, a close frame the client reads after
  the frames already buffered for it. It then resumes with its last token.
- Engine unavailable: the socket stays open and silent while the relay retries with
  exponential backoff (0.25 s doubling to 5 s, jittered); it then resumes after the last
  message it sent, so a restart of Dex loses and repeats nothing.
- Anything unexpected (an undecodable message, a refused token of the relay's own) closes
  with 1011; the client reconnects with its last token.
- Clients send nothing; whatever they send is ignored.

Each socket has one relay task, created in ``connect`` and cancelled in ``disconnect``; it
runs a Stream reader and a socket writer joined by the bounded queue. The reader is
``session_feed.read_messages``, which subscribes to the process's one shared reader of the
session's Stream (many sockets of a session cost one engine long poll, not one each) and
reads on its own only while it catches up from an old ``after``. Closing the socket ends the
relay at once (or within the time it takes to cancel one gRPC long poll while it catches up);
the agent turn is not affected.
The consumer does no agent work, and the ORM only through ``agents_app.websocket_db``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import logging
from typing import Any
from urllib.parse import parse_qs

from channels.generic.websocket import AsyncJsonWebsocketConsumer

# The Flow import pulls in LiteLLM and the MCP SDK (seconds). Importing it with the ASGI
# application keeps that off the event loop of the first websocket (the gateway builds the
# Flow for its client on first use).
import agents_app.worker.flow  # noqa: F401
from agents_app.auth import DATABASE_TIMEOUT_KEY
from agents_app.conf import dexagents_setting
from agents_app.gateway import event_stream
from agents_app.live import session_feed
from agents_app.live.session_events import SNAPSHOT_REQUIRED_FRAME, event_frame
from agents_app.log_context import bind_websocket
from agents_app.metrics import EVENT_RELAY_LAG
from agents_app.models import AgentSession
from agents_app.selectors import session_reads
from agents_app.sessions.approval_index import APPROVALS_GROUP
from agents_app.sessions.session_index import approval_index_version, session_group
from agents_app.websocket_db import WebsocketDatabaseTimeout, websocket_db

logger = logging.getLogger(__name__)


CLOSE_NOT_AUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_UNKNOWN_SESSION = 4404
CLOSE_SLOW_CLIENT = 4408
#: The database did not answer this socket's handshake lookup in time
#: (``DEXAGENTS["WEBSOCKET_DB_TIMEOUT"]``, ``agents_app.websocket_db``); retry later.
CLOSE_DATABASE_BUSY = 4503
CLOSE_INTERNAL_ERROR = 1011


# Relay tasks of this process that have not finished (``live_relay_count``).
_live_relays: set[asyncio.Task[None]] = set()


def live_relay_count() -> int:
    """How many websocket relay tasks of this process are still running (tests, benches)."""
    return len(_live_relays)


class SendQueueFullError(Exception):
    """The client fell further behind than the send queue allows."""


class _ConnectionGoneError(Exception):
    """The ASGI server refused a send: the client is gone."""


class SendQueue:
    """Frames waiting for the socket, bounded by count and by bytes.

    Frames are ASCII JSON text (``json.dumps`` escapes the rest), so ``len`` is their size.
    One frame larger than ``max_bytes`` is still accepted into an empty queue.
    """

    def __init__(self, *, max_frames: int, max_bytes: int) -> None:
        self.max_frames = max_frames
        self.max_bytes = max_bytes
        self._frames: collections.deque[str] = collections.deque()
        self._bytes = 0
        self._ready = asyncio.Event()

    def put(self, frame: str) -> None:
        """Queue ``frame``; raise ``SendQueueFullError`` when it would pass a bound."""
        if self._frames and (
            len(self._frames) >= self.max_frames or self._bytes + len(frame) > self.max_bytes
        ):
            raise SendQueueFullError(
                f"{len(self._frames)} frames ({self._bytes} bytes) wait for the client"
            )
        self._frames.append(frame)
        self._bytes += len(frame)
        self._ready.set()

    async def get(self) -> str:
        """Wait for and remove the oldest frame."""
        while not self._frames:
            self._ready.clear()
            await self._ready.wait()
        frame = self._frames.popleft()
        self._bytes -= len(frame)
        return frame

    def clear(self) -> None:
        """Drop every queued frame."""
        self._frames.clear()
        self._bytes = 0


def _observe_relay_lag(message: event_stream.SessionEventMessage) -> None:
    """Record seconds from the event's Stream write to now (``dexagents_event_relay_lag_seconds``);
    an event without a readable ``created_at`` is skipped."""
    created = message.event.get("created_at")
    if not isinstance(created, str):
        return
    try:
        written = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return
    lag = (datetime.datetime.now(datetime.UTC) - written).total_seconds()
    EVENT_RELAY_LAG.observe(max(0.0, lag))


async def accept_authenticated(consumer: AsyncJsonWebsocketConsumer) -> Any | None:
    """Accept the socket and return its authenticated user, or close it with 4401 (or 4503
    when the authentication lookup missed its deadline) and return None. Close codes above
    4000 need an accepted socket; before accept a refusal would be a plain HTTP 403 that
    clients cannot tell apart."""
    await consumer.accept()
    if consumer.scope.get(DATABASE_TIMEOUT_KEY):
        await consumer.close(code=CLOSE_DATABASE_BUSY)
        return None
    user = consumer.scope.get("user")
    if user is None or not user.is_authenticated:
        await consumer.close(code=CLOSE_NOT_AUTHENTICATED)
        return None
    return user


class SessionEventsConsumer(AsyncJsonWebsocketConsumer):
    """Relays one session's AgentEvents to one websocket (protocol: module docstring)."""

    relay_task: asyncio.Task[None] | None = None
    group: str = ""

    async def connect(self) -> None:
        user = await accept_authenticated(self)
        if user is None:
            return
        session_id = str(self.scope["url_route"]["kwargs"]["session_id"])
        # The consumer's task keeps these for its log lines; the relay task copies them.
        bind_websocket(self.scope, session_id=session_id)
        try:
            await websocket_db(
                session_reads.session_get_for_owner_or_staff, user=user, session_id=session_id
            )
        except WebsocketDatabaseTimeout:
            await self.close(code=CLOSE_DATABASE_BUSY)
            return
        except AgentSession.DoesNotExist:
            await self.close(code=CLOSE_UNKNOWN_SESSION)
            return
        if self.channel_layer is not None:
            # Hears "session.deleted" (session_lifecycle.session_delete) and closes.
            self.group = session_group(session_id)
            with contextlib.suppress(Exception):
                await self.channel_layer.group_add(self.group, self.channel_name)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        after = query.get("after", [""])[0]
        task = asyncio.create_task(self.relay(session_id, after), name=f"events {session_id}")
        _live_relays.add(task)
        task.add_done_callback(_live_relays.discard)
        self.relay_task = task

    async def disconnect(self, code: int) -> None:
        if self.group and self.channel_layer is not None:
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(self.group, self.channel_name)
        task = self.relay_task
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """The protocol has no client messages; ignore them rather than fail on bad JSON."""

    async def session_deleted(self, event: dict[str, Any]) -> None:
        """The session was deleted: stop relaying and close with 4404 (no such session)."""
        task = self.relay_task
        self.relay_task = None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self._close_quietly(CLOSE_UNKNOWN_SESSION)

    async def relay(self, session_id: str, after: str) -> None:
        """Run the Stream reader and the socket writer until one of them ends."""
        queue = SendQueue(
            max_frames=int(dexagents_setting("EVENTS_SEND_QUEUE_FRAMES")),
            max_bytes=int(dexagents_setting("EVENTS_SEND_QUEUE_BYTES")),
        )
        counts = {"sent": 0}
        outcome = "cancelled by disconnect"
        logger.info("Events relay for session %s started (resume: %s).", session_id, bool(after))
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._read(session_id, after, queue))
                group.create_task(self._write(queue, counts))
        except* SendQueueFullError as overflow:
            outcome = f"slow client, closed with {CLOSE_SLOW_CLIENT}"
            logger.info("Closing a slow events client of session %s: %s", session_id,
                        overflow.exceptions[0])
            queue.clear()
            await self._close_quietly(CLOSE_SLOW_CLIENT)
        except* _ConnectionGoneError:
            outcome = "connection gone"
        except* Exception as failure:
            outcome = f"error, closed with {CLOSE_INTERNAL_ERROR}"
            logger.error("Events relay for session %s failed.", session_id,
                         exc_info=failure.exceptions[0])
            await self._close_quietly(CLOSE_INTERNAL_ERROR)
        finally:
            logger.info("Events relay for session %s ended (%s) after %d frames.",
                        session_id, outcome, counts["sent"])

    async def _close_quietly(self, code: int) -> None:
        """Send a close frame, however the connection fares.

        The frame waits behind the frames already in the ASGI server's buffer, so a paused
        client reads it when it reads again. The wait is bounded by the server: uvicorn
        drops a peer that leaves its keepalive ping unanswered (20 s + 20 s by default),
        which also ends this wait. Only the queue was freed before it.
        """
        with contextlib.suppress(Exception):
            await self.close(code=code)

    async def _write(self, queue: SendQueue, counts: dict[str, int]) -> None:
        """Hand queued frames to the ASGI server, which waits while its buffer is full."""
        while True:
            frame = await queue.get()
            try:
                await self.send(text_data=frame)
            except Exception as error:
                raise _ConnectionGoneError(str(error)) from error
            counts["sent"] += 1

    async def _read(self, session_id: str, after: str, queue: SendQueue) -> None:
        """Queue one frame per Stream message after ``after``, forever
        (``session_feed.read_messages``: lost events become ``snapshot_required``)."""
        async for message in session_feed.read_messages(session_id, after):
            if message is None:
                queue.put(SNAPSHOT_REQUIRED_FRAME)
                continue
            queue.put(event_frame(message))
            _observe_relay_lag(message)


#: Seconds between two reads of the approvals index version (the fallback for lost notices).
APPROVALS_POLL_SECONDS = 1.0
APPROVALS_CHANGED_FRAME = {"type": "approvals_changed"}


class ApprovalsConsumer(AsyncJsonWebsocketConsumer):
    """``/ws/approvals/`` (staff only): says when the pending approvals changed.

    Sends ``{"type": "approvals_changed"}`` once after connect and whenever the approvals index
    changes; the dashboard then re-reads ``GET /api/v1/approvals/``. Changes are heard two
    ways (ARCHITECTURE.md "Live events"): a notice on the channel layer group
    ``approval_index.APPROVALS_GROUP`` (instant, but lossy, and per process without Redis) and
    a poll of ``session_index.approval_index_version`` every ``APPROVALS_POLL_SECONDS``, so a
    lost notice delays the dashboard by at most that long. Refusals: 4401 (not authenticated),
    4403 (not staff), nothing else sent. Clients send nothing.
    """

    poll_task: asyncio.Task[None] | None = None
    version: str | None = None

    async def connect(self) -> None:
        bind_websocket(self.scope, session_id=None)
        user = await accept_authenticated(self)
        if user is None:
            return
        if not user.is_staff:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        if self.channel_layer is not None:
            await self.channel_layer.group_add(APPROVALS_GROUP, self.channel_name)
        # Read before the first frame: a change after it moves the version the poll compares.
        try:
            self.version = await websocket_db(approval_index_version)
        except WebsocketDatabaseTimeout:
            await self.close(code=CLOSE_DATABASE_BUSY)
            return
        await self.send_json(APPROVALS_CHANGED_FRAME)
        self.poll_task = asyncio.create_task(self._poll(), name="approvals poll")

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            with contextlib.suppress(Exception):
                await self.channel_layer.group_discard(APPROVALS_GROUP, self.channel_name)
        if self.poll_task is not None:
            self.poll_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.poll_task

    async def receive(
        self, text_data: str | None = None, bytes_data: bytes | None = None, **kwargs: Any
    ) -> None:
        """The protocol has no client messages; ignore them."""

    async def approvals_changed(self, event: dict[str, Any]) -> None:
        """Channel layer notice (``approval_index.APPROVALS_CHANGED``)."""
        await self._check(force=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(APPROVALS_POLL_SECONDS)
            try:
                await self._check(force=False)
            except Exception as error:
                logger.info("Approvals poll failed: %s", error)

    async def _check(self, *, force: bool) -> None:
        """Tell the client when the index version moved (or a notice says it did); a read the
        database does not answer in time is left to the next poll."""
        try:
            version = await websocket_db(approval_index_version)
        except WebsocketDatabaseTimeout:
            return
        if force or version != self.version:
            self.version = version
            await self.send_json(APPROVALS_CHANGED_FRAME)


class UnknownPathConsumer(AsyncJsonWebsocketConsumer):
    """Every websocket path no route serves: accept, then close with 4404 (no such resource),
    instead of failing the handshake with a server error."""

    async def connect(self) -> None:
        await self.accept()
        await self.close(code=CLOSE_UNKNOWN_SESSION)
