"""A session's AgentEvents Dex Stream, as the web side reads and writes it.

Owns: the long-poll read of the next event (``session_events_read``), the Stream's newest token
(``session_events_tail_token``), whether a token is still retained
(``session_events_after_retained``), where a live view of a running turn starts
(``session_events_turn_start_token``), the shape of one Stream message for the relay
(``SessionEventMessage``), and the web's own announcements (``session_event_announce``:
``message_queued``, ``queue_changed``, ``session_stopped``). The relay that serves clients from
these reads is ``agents_app.live``. Run the coroutines with ``dex_gateway.run`` / ``call`` from
code off the event loop, or await them on a loop of one's own.

May import: ``engine_connection``, ``engine_errors``, ``session_data`` and the settings.

Errors raised: ``EventsTokenInvalidError`` (a refused resume token) and those of
``engine_errors``, as each function says.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import functools
import json
import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from agents_app.conf import dexagents_setting
from agents_app.gateway import engine_connection
from agents_app.gateway.engine_errors import translate
from agents_app.gateway.session_data import plain_data

logger = logging.getLogger(__name__)


#: The Stream ``source`` of events the web side writes (Steps write ``#<step execution>``).
WEB_EVENT_SOURCE = "dexagents-web"


async def session_event_announce(
    *, session_id: str, event_type: str, payload: Mapping[str, Any] | None = None
) -> None:
    """Write a platform event that no Step writes (``message_queued``, ``session_stopped``,
    ``queue_changed``; see ``dex_agents.AgentEventType``) to the session's AgentEvents Stream.

    Best effort, like every Stream write: a failure is logged and swallowed, because the
    change it announces already happened and pages also refresh on their own.
    """
    from dex_agents import AgentEvent, AgentEventType

    connection = engine_connection.connection()
    event = AgentEvent(AgentEventType(event_type), None, "", 0, dict(payload or {}))
    try:
        await connection.client.write_stream(
            session_id, connection.flow.agent_events, WEB_EVENT_SOURCE, event
        )
    except Exception as error:
        logger.info("Could not announce %s for %s: %s", event_type, session_id, error)


@dataclasses.dataclass(frozen=True)
class SessionEventMessage:
    """One message of a session's AgentEvents Stream, shaped for the websocket relay.

    Attributes:
        token: The message's opaque Dex resume token (``read_stream`` continues after it).
        event: ``{"type", "turn_id", "step_execution_id", "attempt", "data", "created_at"}``:
            the ``dex_agents.AgentEvent`` fields, its payload as ``data``, and the Stream
            message's creation time as ISO 8601 UTC (``...Z``).
    """

    token: str
    event: dict[str, Any]

    @functools.cached_property
    def frame(self) -> str:
        """The message's ``{"type": "event", "token", "event"}`` JSON text frame (compact,
        ASCII), built once: every reader of the session in the process shares the message."""
        return json.dumps(
            {"type": "event", "token": self.token, "event": self.event},
            separators=(",", ":"),
        )


class EventsTokenInvalidError(Exception):
    """Dex refused a resume token: malformed, or minted for another Stream or session."""


# Newest-first page sizes used to look for a token: the first page is small because a relay
# that keeps up finds its own position among the newest few messages; later pages are large
# to bound the number of calls (the embedded engine caps pages at 1000).
_EVENTS_FIRST_PAGE = 20
_EVENTS_PAGE = 1000


def _event_message(message: Any) -> SessionEventMessage:
    """Shape an SDK ``StreamMessage[AgentEvent]`` (see ``SessionEventMessage``)."""
    value = message.value
    created = message.created_time.astimezone(datetime.UTC)
    return SessionEventMessage(
        token=message.resume_token,
        event={
            "type": plain_data(value.type),
            "turn_id": value.turn_id,
            "step_execution_id": value.step_execution_id,
            "attempt": value.attempt,
            "data": plain_data(value.payload),
            "created_at": created.isoformat().replace("+00:00", "Z"),
        },
    )


def _is_invalid_argument(error: BaseException) -> bool:
    from dex import DexServiceError

    return isinstance(error, DexServiceError) and error.code == grpc.StatusCode.INVALID_ARGUMENT


async def session_events_read(
    *, session_id: str, after: str, wait_seconds: float
) -> SessionEventMessage | None:
    """Long-poll the next AgentEvents Stream message after ``after`` (Dex ``ReadStream``).

    Args:
        session_id: The session (Flow ID); Dex Streams need no running Flow.
        after: A resume token, or ``""`` for the oldest retained message. Dex resumes a
            token whose message was trimmed at the next newer message without saying so
            (reference/dex-engine-spec.md 3.3); ``session_events_after_retained`` detects it.
        wait_seconds: How long the engine may hold the call open waiting for a write.

    Returns:
        The message, or None when nothing was written within ``wait_seconds``.

    Raises:
        EventsTokenInvalidError: ``after`` is malformed or belongs to another Stream.
        EngineUnavailableError: Dex did not answer (also when it stays silent for
            ``wait_seconds`` plus ``DEXAGENTS["ENGINE_TIMEOUT"]``: a lost connection).
    """
    from dex import LongPollTimeoutError

    connection = engine_connection.connection()
    limit = wait_seconds + float(dexagents_setting("ENGINE_TIMEOUT"))
    try:
        async with asyncio.timeout(limit):
            message = await connection.client.read_stream(
                session_id,
                connection.flow.agent_events,
                after,
                datetime.timedelta(seconds=wait_seconds),
            )
    except LongPollTimeoutError:
        return None
    except Exception as error:
        if _is_invalid_argument(error):
            raise EventsTokenInvalidError(str(error)) from error
        raise translate(error, session_id) from error
    return _event_message(message)


async def session_events_tail_token(*, session_id: str) -> str:
    """Return the newest retained AgentEvents token of the session, ``""`` when none is.

    The session snapshot's ``events_after``: read before the snapshot, so a client that
    relays from it after loading the snapshot misses no event (it may see some twice).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    connection = engine_connection.connection()
    try:
        page = await connection.client.list_stream_messages(
            session_id, connection.flow.agent_events, 1
        )
    except Exception as error:
        raise translate(error, session_id) from error
    return page.messages[0].resume_token if page.messages else ""


async def _events_newest_first(session_id: str, first_page: int = _EVENTS_FIRST_PAGE
                               ) -> AsyncIterator[Any]:
    """Yield the session's retained AgentEvents Stream messages, newest first (SDK
    ``StreamMessage`` values), paging ``ListStreamMessages`` as the caller reads on:
    ``first_page`` messages first (at most ``_EVENTS_PAGE``), then ``_EVENTS_PAGE`` at a time.

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    from dex import DexServiceError

    connection = engine_connection.connection()
    page_token = ""
    page_size = max(1, min(first_page, _EVENTS_PAGE))
    shrunk = False
    while True:
        try:
            page = await connection.client.list_stream_messages(
                session_id, connection.flow.agent_events, page_size, page_token
            )
        except DexServiceError as error:
            # A page of large messages (up to 1 MiB each) can pass gRPC's 4 MiB limit;
            # smaller pages of the same position always fit (one message does).
            if error.code == grpc.StatusCode.RESOURCE_EXHAUSTED and page_size > 1:
                page_size = max(1, page_size // 4)
                shrunk = True
                continue
            raise translate(error, session_id) from error
        except Exception as error:
            raise translate(error, session_id) from error
        for message in page.messages:
            yield message
        if not page.next_page_token:
            return
        page_token = page.next_page_token
        if not shrunk:
            page_size = _EVENTS_PAGE


async def session_events_after_retained(*, session_id: str, after: str, newer: int = 0) -> bool:
    """Whether the Stream still holds the message whose token is ``after``.

    Pages ``ListStreamMessages`` newest-first until the token appears, so the cost grows
    with the number of messages newer than ``after``; ``newer``, the caller's count of
    messages it knows are newer, sizes the first page to reach it in one call (each message
    listed is decoded, so a first page of the same 1,000 messages for every check cost a
    feed more than its reads did). Tokens are compared as opaque strings,
    never decoded (a real Dex server mints them). Since Dex trims oldest-first, a retained
    ``after`` means every newer message is retained too: reading on from it loses nothing.

    Returns:
        True when found; False when it was trimmed, or never was a token of this Stream
        (``after`` itself is not sent to Dex, so a malformed one is simply not found).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    async for message in _events_newest_first(session_id, newer + _EVENTS_FIRST_PAGE):
        if message.resume_token == after:
            return True
    return False


async def session_events_turn_start_token(*, session_id: str, turn_id: str) -> str | None:
    """Where a live view of the running turn ``turn_id`` starts: the token of the message just
    before the turn's ``turn_started`` event, or before the ``message_queued`` of a message the
    turn took (its ``client_ids``) when the web wrote that announcement first.

    A page that opens while a turn runs relays from here, so the text the turn already
    streamed (which no stored message holds yet) shows too, and the Activity row of the
    message that started the turn comes before the turn's start, as on a page open since.
    The web announces a message after the engine took it, so its ``message_queued`` lands on
    either side of the worker's ``turn_started``; only web announcements (no turn) between the
    two are passed over, at most ``_TURN_START_LOOKBACK`` of them, so an earlier turn's events
    are never replayed.

    Returns:
        The token; ``""`` when the relay starts at the oldest retained message; ``None`` when
        ``turn_started`` is not retained (trimmed, or not written yet).

    Raises:
        EngineUnavailableError: Dex did not answer.
    """
    found = False
    wanted: set[str] = set()
    older: list[Any] = []  # web announcements older than turn_started, newest first
    exhausted = True
    async for message in _events_newest_first(session_id):
        value = message.value
        if not found:
            if value.turn_id == turn_id and plain_data(value.type) == "turn_started":
                found = True
                client_ids = (value.payload or {}).get("client_ids") or []
                wanted = {str(item) for item in client_ids if item}
            continue
        older.append(message)
        if value.turn_id or not wanted or len(older) > _TURN_START_LOOKBACK:
            exhausted = False
            break
    if not found:
        return None
    taken = [
        index
        for index, message in enumerate(older)
        if not message.value.turn_id
        and plain_data(message.value.type) == "message_queued"
        and (message.value.payload or {}).get("message_id") in wanted
    ]
    start = taken[-1] + 1 if taken else 0
    if start < len(older):
        return str(older[start].resume_token)
    return "" if exhausted else str(older[-1].resume_token)


#: How many web announcements (queue changes, other queued messages) before a turn's
#: ``turn_started`` ``session_events_turn_start_token`` passes over to find the turn's message.
_TURN_START_LOOKBACK = 20
