"""The events relay consumer in-process, with Channels' WebsocketCommunicator.

The application is the real ``dexagents_site.asgi`` stack (auth middleware, origin check,
routing); where events flow, the engine is the real embedded one (``engine`` fixture). The
protocol through the real server (uvicorn) is covered in ``tests/e2e/test_events_relay.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from channels.testing import WebsocketCommunicator

from agents_app.gateway import event_stream
from agents_app.live import consumers, session_feed
from agents_app.models import AgentSession
from dex_agents import AgentEvent, AgentEventType
from tests.conftest import api_token_key
from tests.e2e.relay_stack import dex_client
from tests.factories import AgentDefinitionFactory

pytestmark = pytest.mark.django_db(transaction=True)

SESSION_ID = "ses_" + "a" * 32
OTHER_SESSION_ID = "ses_" + "b" * 32


def application() -> Any:
    from dexagents_site.asgi import application

    return application


def token_headers(user: Any, scheme: str = "Bearer") -> list[tuple[bytes, bytes]]:
    key = api_token_key(user)
    return [(b"authorization", f"{scheme} {key}".encode())]


def session_of(owner: Any) -> AgentSession:
    return AgentSession.objects.create(
        id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo"))


async def refusal_code(path: str, headers: list[tuple[bytes, bytes]]) -> int:
    communicator = WebsocketCommunicator(application(), path, headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    closing = await communicator.receive_output(timeout=5)
    assert closing["type"] == "websocket.close", closing
    # Answer the close as a browser does (the server then sends websocket.disconnect): the
    # consumer stops at once and any error it raises surfaces here; ``wait()`` alone would sit
    # out its 1 s timeout and then cancel the consumer.
    await communicator.disconnect(code=int(closing["code"]))
    return int(closing["code"])


async def wait_for(description: str, probe: Callable[[], bool], deadline: float = 5.0) -> None:
    limit = time.monotonic() + deadline
    while not probe():
        assert time.monotonic() < limit, f"timed out waiting for {description}"
        await asyncio.sleep(0.01)


def test_send_queue_bounds_frames_and_bytes() -> None:
    queue = consumers.SendQueue(max_frames=3, max_bytes=10)
    queue.put("x" * 25)  # an empty queue takes one frame of any size
    with pytest.raises(consumers.SendQueueFullError):
        queue.put("y")
    queue.clear()
    for frame in ("aaa", "bbb", "ccc"):
        queue.put(frame)
    with pytest.raises(consumers.SendQueueFullError):
        queue.put("d")  # the fourth frame
    queue.clear()
    queue.put("aaaaa")
    queue.put("bbbbb")
    with pytest.raises(consumers.SendQueueFullError):
        queue.put("c")  # the eleventh byte


async def test_refusals_close_with_the_protocol_codes(
    owner: Any, other_user: Any, staff: Any
) -> None:
    session = await asyncio.to_thread(session_of, owner)
    path = f"/ws/sessions/{session.id}/events/"
    other_headers = await asyncio.to_thread(token_headers, other_user)
    owner_headers = await asyncio.to_thread(token_headers, owner)
    assert await refusal_code(path, []) == consumers.CLOSE_NOT_AUTHENTICATED
    assert await refusal_code(path, [(b"authorization", b"Token nope")]) == 4401
    # Someone else's session closes as an unknown one does: REST answers 404 for both.
    assert await refusal_code(path, other_headers) == consumers.CLOSE_UNKNOWN_SESSION
    unknown = f"/ws/sessions/{OTHER_SESSION_ID}/events/"
    assert await refusal_code(unknown, owner_headers) == consumers.CLOSE_UNKNOWN_SESSION
    assert await refusal_code(unknown, other_headers) == consumers.CLOSE_UNKNOWN_SESSION
    # 4403 stays for what REST answers 403: the approvals feed for someone who is not staff.
    assert await refusal_code("/ws/approvals/", other_headers) == consumers.CLOSE_FORBIDDEN


async def test_disconnect_cancels_the_relay_while_the_engine_is_down(
    owner: Any, staff: Any, engine_down: str
) -> None:
    """No engine: the socket stays open (the relay retries), and closing it ends the relay."""
    session = await asyncio.to_thread(session_of, owner)
    before = consumers.live_relay_count()
    for user in (owner, staff):  # staff may read another user's session
        headers = await asyncio.to_thread(token_headers, user, "Token")
        communicator = WebsocketCommunicator(
            application(), f"/ws/sessions/{session.id}/events/", headers=headers)
        connected, _ = await communicator.connect()
        assert connected
        await wait_for("the relay task", lambda: consumers.live_relay_count() == before + 1)
        assert await communicator.receive_nothing(timeout=1.0)
        await communicator.disconnect()
        assert consumers.live_relay_count() == before


async def test_a_gap_the_relay_could_not_read_becomes_snapshot_required(
    owner: Any, engine: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Dex trims the relay's position between two reads: the client is told, once, before
    the next frame, and the relay goes on after the newest message (no restart)."""
    session = await asyncio.to_thread(session_of, owner)
    headers = await asyncio.to_thread(token_headers, owner)
    # Check every read at once, so the check follows the read it covers.
    monkeypatch.setattr(session_feed, "VERIFY_INTERVAL_SECONDS", 0.0)

    def event(marker: int, text: str = "") -> AgentEvent:
        return AgentEvent(AgentEventType.TOOL_LOG, None, "relay-test", 1,
                          {"marker": marker, "text": text})

    async with dex_client(engine) as (client, flow):
        for marker in range(1, 6):
            await client.write_stream(session.id, flow.agent_events, "relay-test",
                                      event(marker, "x" * 2000))
        first_two = (await client.list_stream_messages(session.id, flow.agent_events, 5))
        second_token = first_two.messages[-2].resume_token

    real_read: Callable[..., Awaitable[Any]] = event_stream.session_events_read

    async def trimming_read(*, session_id: str, after: str, wait_seconds: float) -> Any:
        if after == second_token:
            # A 1500-byte budget keeps only this small message: markers 1-5 are trimmed.
            async with dex_client(engine, capacity_bytes=1500) as (tiny, tiny_flow):
                await tiny.write_stream(OTHER_SESSION_ID, tiny_flow.agent_events, "relay-test",
                                        event(0))
            async with dex_client(engine) as (writer, writer_flow):
                await writer.write_stream(session_id, writer_flow.agent_events, "relay-test",
                                          event(6))
        return await real_read(session_id=session_id, after=after, wait_seconds=wait_seconds)

    monkeypatch.setattr(event_stream, "session_events_read", trimming_read)
    communicator = WebsocketCommunicator(
        application(), f"/ws/sessions/{session.id}/events/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    # Generous: the relay's first read also sets up the web side's Dex connection, which can
    # take many seconds on a loaded 2-core CI machine (the frames' order is what is checked).
    frames = [json.loads(await communicator.receive_from(timeout=60)) for _ in range(4)]
    await communicator.disconnect()
    assert [frame.get("event", {}).get("data", {}).get("marker") for frame in frames] == [
        1, 2, None, 6]
    assert frames[2] == {"type": "snapshot_required"}


# --- /ws/approvals/ ------------------------------------------------------------------------------


async def test_approvals_socket_is_for_staff_only(owner: Any, staff: Any) -> None:
    owner_headers = await asyncio.to_thread(token_headers, owner)
    assert await refusal_code("/ws/approvals/", []) == consumers.CLOSE_NOT_AUTHENTICATED
    assert await refusal_code("/ws/approvals/", owner_headers) == consumers.CLOSE_FORBIDDEN


async def test_approvals_socket_hears_notices_and_polls_for_lost_ones(
    owner: Any, staff: Any
) -> None:
    from django.utils import timezone

    from agents_app.models import ApprovalRequest
    from agents_app.sessions.approval_index import approvals_changed_anotify

    session = await asyncio.to_thread(session_of, owner)
    headers = await asyncio.to_thread(token_headers, staff)
    communicator = WebsocketCommunicator(application(), "/ws/approvals/", headers=headers)
    connected, _ = await communicator.connect()
    assert connected
    try:
        changed = {"type": "approvals_changed"}
        assert await communicator.receive_json_from(timeout=5) == changed
        assert await communicator.receive_nothing(timeout=1.5)
        # A notice on the channel layer (the web process's own writes) arrives without a poll:
        # nothing changed in the database, so the poll alone would never send this frame.
        await approvals_changed_anotify()
        assert await communicator.receive_json_from(timeout=5) == changed
        # A write whose notice was lost (another process, no Redis) is found by the poll.
        await ApprovalRequest.objects.acreate(
            session=session, interrupt_id="turn-1.call_1", tool_call_id="call_1",
            tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
        )
        assert await communicator.receive_json_from(timeout=5) == changed
        assert await communicator.receive_nothing(timeout=1.5)
    finally:
        await communicator.disconnect()


async def test_an_unknown_websocket_path_closes_with_4404(owner: Any) -> None:
    headers = await asyncio.to_thread(token_headers, owner)
    assert await refusal_code("/ws/nothing/", headers) == consumers.CLOSE_UNKNOWN_SESSION
    assert await refusal_code("/ws/sessions/x/other/", []) == consumers.CLOSE_UNKNOWN_SESSION
