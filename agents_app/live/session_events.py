"""What clients get from a session's AgentEvents Dex Stream: frames, turn outcomes, SSE.

Every way a client follows a session without polling the snapshot reads the Stream through the
process's shared reader of the session (``session_feed.read_messages``): the websocket relay
(``consumers.SessionEventsConsumer``, with the frames here: ``event_frame``,
``SNAPSHOT_REQUIRED_FRAME``), Server-Sent Events (``GET /api/v1/sessions/<id>/events/``,
``sse_frames``) and the requests that wait for a turn (``POST .../messages/?wait=``,
``turn_wait``) or for any change (``GET .../?wait=``, ``change_wait``).

May import: ``session_feed`` and the gateway's ``event_stream`` (the message type).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

from agents_app.gateway import event_stream
from agents_app.live import session_feed

#: Seconds between two SSE heartbeat comments while no event comes.
SSE_HEARTBEAT_SECONDS = 15.0

SNAPSHOT_REQUIRED_FRAME = json.dumps({"type": "snapshot_required"})
#: Event types that end a turn.
TURN_END_TYPES = frozenset({"turn_completed", "turn_failed", "turn_cancelled"})
#: ``queue_changed`` changes that take a queued message away before any turn takes it: a
#: wait for that message ends with this status.
QUEUE_REMOVALS = {"deleted": "deleted", "edited": "replaced"}


def event_frame(message: event_stream.SessionEventMessage) -> str:
    """The ``{"type": "event", "token", "event"}`` text frame of one Stream message (built
    once per message, shared by every reader: ``SessionEventMessage.frame``)."""
    return message.frame


@dataclasses.dataclass(frozen=True)
class TurnOutcome:
    """The turn that took a message, and how it ended (``turn_wait``).

    Attributes:
        turn_id: The turn (``turn-<n>``); ``""`` when no turn took the message.
        status: ``completed``, ``failed`` or ``cancelled`` (the ``turn_completed`` /
            ``turn_failed`` / ``turn_cancelled`` event);
            ``stopped`` (``session_stopped``: the session was stopped before or during the
            turn); ``deleted`` or ``replaced`` (``queue_changed`` naming the message: it was
            deleted or edited before a turn took it); ``running`` when the wait ran out first.
        token: The resume token of the last event of the turn read.
        event: That event (``SessionEventMessage.event``).
    """

    turn_id: str
    status: str
    token: str
    event: dict[str, Any]

    @property
    def finished(self) -> bool:
        """Whether the wait has its final answer: the turn ended, the session was stopped,
        or the message was deleted or replaced before a turn took it."""
        return self.status != "running"


def removes_message(event: dict[str, Any], client_id: str) -> bool:
    """Whether ``event`` says the queued message sent under ``client_id`` was deleted or
    replaced (``queue_changed`` with ``change`` ``deleted`` / ``edited`` and its
    ``message_id``) before any turn took it."""
    if not client_id or event.get("type") != "queue_changed":
        return False
    data = event.get("data") or {}
    return data.get("change") in QUEUE_REMOVALS and data.get("message_id") == client_id


def outcome_status(event: dict[str, Any]) -> str:
    """The ``TurnOutcome.status`` that ``event`` (the last one ``turn_events`` yields) gives."""
    kind = str(event.get("type"))
    if kind in TURN_END_TYPES:
        return kind.removeprefix("turn_")
    if kind == "session_stopped":
        return "stopped"
    if kind == "queue_changed":
        return QUEUE_REMOVALS.get(str((event.get("data") or {}).get("change")), "running")
    return "running"


def takes_message(event: dict[str, Any], client_id: str) -> bool:
    """Whether ``event`` says its turn took the message sent under ``client_id``:
    ``turn_started`` or ``steer_applied`` naming it in ``client_ids``; with ``client_id``
    ``""``, any ``turn_started`` (a session's first turn, started with the session)."""
    kind = event.get("type")
    if kind not in ("turn_started", "steer_applied"):
        return False
    if not client_id:
        return kind == "turn_started"
    return client_id in ((event.get("data") or {}).get("client_ids") or [])


async def turn_events(
    session_id: str, after: str, client_id: str
) -> AsyncIterator[event_stream.SessionEventMessage | None]:
    """The Stream messages of the turn that takes the message sent under ``client_id``
    (``takes_message``), read from ``after`` (a token read before the message was sent):
    nothing until that turn starts, then every message of the turn, ending with its
    ``turn_completed`` / ``turn_failed``. It also ends, with that message, at a
    ``session_stopped`` (before or during the turn) and at a ``queue_changed`` that deletes or
    replaces the message before a turn takes it (``removes_message``). ``None`` as in
    ``session_feed.read_messages`` (events lost: the caller should reload the snapshot). Runs
    until that end; bound it with a timeout.

    A steered message joins the running turn: its messages start at ``steer_applied``.

    Raises:
        event_stream.EventsTokenInvalidError: ``after`` is not a token of this Stream.
    """
    turn_id = ""
    async for message in session_feed.read_messages(session_id, after):
        if message is None:
            yield None
            continue
        event = message.event
        if event.get("type") == "session_stopped" or (
            not turn_id and removes_message(event, client_id)
        ):
            yield message
            return
        if not turn_id:
            if not takes_message(event, client_id):
                continue
            turn_id = str(event.get("turn_id") or "")
        if event.get("turn_id") != turn_id:
            continue
        yield message
        if event.get("type") in TURN_END_TYPES:
            return


async def turn_wait(
    *, session_id: str, after: str, client_id: str, seconds: float
) -> TurnOutcome | None:
    """Wait up to ``seconds`` for the end of the turn that takes the message sent under
    ``client_id`` (``turn_events``).

    Returns:
        The outcome (``status`` ``running`` when the turn started but did not end in time;
        ``stopped``, ``deleted`` or ``replaced`` as ``TurnOutcome`` says), or None when
        nothing of the message happened in time.

    Raises:
        event_stream.EventsTokenInvalidError: ``after`` is not a token of this Stream.
    """
    latest: TurnOutcome | None = None
    try:
        async with asyncio.timeout(seconds):
            async for message in turn_events(session_id, after, client_id):
                if message is None:
                    continue
                # session_stopped has no turn_id: keep the turn it stopped, if one started.
                known = latest.turn_id if latest is not None else ""
                latest = TurnOutcome(
                    turn_id=str(message.event.get("turn_id") or known),
                    status=outcome_status(message.event),
                    token=message.token,
                    event=message.event,
                )
                if latest.finished:
                    return latest
    except TimeoutError:
        pass
    return latest


#: Events that only a live view shows (streamed text, progress, logs): the snapshot does not
#: change with them, so the snapshot's long-poll (``change_wait``) does not answer on them.
LIVE_ONLY_TYPES = frozenset({"text_delta", "reasoning_delta", "tool_progress", "tool_log"})


async def change_wait(*, session_id: str, after: str, seconds: float) -> bool:
    """Wait up to ``seconds`` for the first Stream message after ``after`` that can change
    the snapshot (any type but ``LIVE_ONLY_TYPES``).

    Returns:
        True when one came (or events after ``after`` were lost: the session changed), False
        when the wait ran out.

    Raises:
        event_stream.EventsTokenInvalidError: ``after`` is not a token of this Stream.
    """
    try:
        async with asyncio.timeout(seconds):
            async for message in session_feed.read_messages(session_id, after):
                if message is None or message.event.get("type") not in LIVE_ONLY_TYPES:
                    return True
    except TimeoutError:
        return False
    return False


def sse_event(frame: str, token: str = "") -> bytes:
    """One Server-Sent Events message carrying ``frame`` (one line of JSON) as its ``data``,
    with ``id: <token>`` when given (the ``Last-Event-ID`` a client resumes from)."""
    head = f"id: {token}\n" if token else ""
    return f"{head}data: {frame}\n\n".encode()


SSE_HEARTBEAT = b": heartbeat\n\n"
SSE_RECONNECT = b": reconnect\n\n"


async def sse_frames(
    messages: AsyncIterator[event_stream.SessionEventMessage | None],
    *,
    first: bytes = b"",
    heartbeat_seconds: float = SSE_HEARTBEAT_SECONDS,
    max_seconds: float | None = None,
) -> AsyncIterator[bytes]:
    """Server-Sent Events for ``messages`` (``session_feed.read_messages`` or
    ``turn_events``): each message as ``sse_event(event_frame, token)``, ``None`` as
    ``snapshot_required`` (no id), a ``: heartbeat`` comment after ``heartbeat_seconds``
    without one. ``first`` goes out before anything else (an ``retry:`` hint or an opening
    frame). Ends when ``messages`` ends, or after ``max_seconds`` (then with a ``: reconnect``
    comment: the client resumes with ``Last-Event-ID``, as ``EventSource`` does by itself); a
    client that goes away cancels it, which cancels the engine read."""
    if first:
        yield first
    loop = asyncio.get_running_loop()
    deadline = None if max_seconds is None else loop.time() + max_seconds
    pending: asyncio.Task[Any] | None = None
    iterator = aiter(messages)
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(iterator))
            timeout = heartbeat_seconds
            if deadline is not None:
                timeout = min(timeout, deadline - loop.time())
                if timeout <= 0:
                    yield SSE_RECONNECT
                    return
            done, _ = await asyncio.wait({pending}, timeout=timeout)
            if not done:
                if deadline is None or loop.time() < deadline:
                    yield SSE_HEARTBEAT
                continue
            try:
                message = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None
            if message is None:
                yield sse_event(SNAPSHOT_REQUIRED_FRAME)
            else:
                yield sse_event(event_frame(message), message.token)
    finally:
        if pending is not None:
            pending.cancel()
            with contextlib.suppress(BaseException):
                await pending
        closer = getattr(iterator, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
