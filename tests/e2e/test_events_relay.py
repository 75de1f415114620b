"""The websocket events relay through the real ASGI server.

Real processes (``tests/e2e/relay_stack.py``): uvicorn serving ``dexagents_site.asgi``, the
embedded engine, ``manage.py dexworker`` and the demo model; the client is the ``websockets``
library. The test process itself reads and writes the session's AgentEvents Stream with the
real Dex SDK, to compare frames with the Stream and to end reads at a marker event it wrote
(a read that ends at a marker has seen everything before it, so no test waits on silence).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.typing import Origin

from dex_agents.testing import free_port
from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, dex_client, retained_tokens, running_stack

pytestmark = pytest.mark.e2e

Frame = dict[str, Any]


def slow_message(pause: float, words: int = 60) -> str:
    """A demo-model prompt answered as a stream of 3-word chunks, ``pause`` s apart."""
    return f"/slow {pause}\n" + " ".join(f"word{index}" for index in range(words))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("relay")) as platform:
        yield platform


def session_start(stack: Stack, message: str | None = None, persona: str = "owner") -> str:
    body: dict[str, str] = {"agent": "demo"}
    if message is not None:
        body["message"] = message
    with stack.api(persona) as api:
        answer = api.post("/api/v1/sessions/", json=body)
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def snapshot_when(stack: Stack, session_id: str, ready: Callable[[dict[str, Any]], bool],
                  description: str, timeout: float = 90) -> dict[str, Any]:
    with stack.api() as api:
        def probe() -> dict[str, Any] | None:
            answer = api.get(f"/api/v1/sessions/{session_id}/")
            if answer.status_code != 200:
                return None
            snapshot: dict[str, Any] = answer.json()
            assert not snapshot.get("last_turn_error"), snapshot
            return snapshot if ready(snapshot) else None

        return wait_until(description, probe, timeout=timeout)


def answered(stack: Stack, session_id: str, replies: int) -> dict[str, Any]:
    """Wait until the session has ``replies`` assistant messages and waits for the user."""
    return snapshot_when(
        stack, session_id,
        lambda snapshot: snapshot["status"] == "waiting_for_user_message"
        and sum(m["role"] == "assistant" for m in snapshot["messages"]) >= replies,
        f"{replies} assistant replies",
    )


def message_send(stack: Stack, session_id: str, text: str) -> None:
    with stack.api() as api:
        answer = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": text})
    assert answer.status_code == 202, answer.text


def is_turn_end(frame: Frame) -> bool:
    return frame["type"] == "event" and frame["event"]["type"] in {"turn_completed",
                                                                  "turn_failed"}


def is_marker(value: int) -> Callable[[Frame], bool]:
    return lambda frame: frame["type"] == "event" and frame["event"]["data"].get("marker") == value


async def receive_until(ws: ClientConnection, stop: Callable[[Frame], bool],
                        deadline: float = 60.0) -> list[Frame]:
    """Frames up to and including the first one ``stop`` accepts, within ``deadline`` s."""
    frames: list[Frame] = []
    async with asyncio.timeout(deadline):
        while True:
            frame = json.loads(await ws.recv())
            frames.append(frame)
            if stop(frame):
                return frames


async def read_all(stack: Stack, session_id: str, stop: Callable[[Frame], bool],
                   after: str | None = None, headers: dict[str, str] | None = None,
                   **options: Any) -> list[Frame]:
    """Connect (owner's Bearer token unless ``headers``), read until ``stop``, close."""
    async with connect(stack.events_url(session_id, after),
                       additional_headers=headers or stack.personas["owner"].bearer(),
                       **options) as ws:
        return await receive_until(ws, stop)


async def marker_write(stack: Stack, session_id: str, value: int, text: str = "") -> None:
    """Append one event to the session's Stream, as a Step would (``tool_log``)."""
    from dex_agents import AgentEvent, AgentEventType

    async with dex_client(stack.engine_address) as (client, flow):
        await client.write_stream(session_id, flow.agent_events, "relay-test", AgentEvent(
            AgentEventType.TOOL_LOG, None, "relay-test", 1, {"marker": value, "text": text}))


async def stream_tokens(stack: Stack, session_id: str) -> list[str]:
    """Every retained token of the session's Stream, oldest first, read with the SDK."""
    async with dex_client(stack.engine_address) as (client, flow):
        return await retained_tokens(client, flow, session_id)


def tokens_of(frames: list[Frame]) -> list[str]:
    return [frame["token"] for frame in frames if frame["type"] == "event"]


def assert_event_frames(frames: list[Frame]) -> None:
    for frame in frames:
        assert set(frame) == {"type", "token", "event"}, frame
        assert frame["type"] == "event"
        assert isinstance(frame["token"], str) and frame["token"]
        event = frame["event"]
        assert set(event) == {"type", "turn_id", "step_execution_id", "attempt", "data",
                              "created_at"}, event
        assert isinstance(event["attempt"], int) and isinstance(event["data"], dict)
        assert event["created_at"].endswith("Z")


async def refusal(url: str, **options: Any) -> int:
    """Connect, expect the server to close before sending anything; return the close code."""
    async with connect(url, **options) as ws:
        with pytest.raises(ConnectionClosed) as closed:
            async with asyncio.timeout(10):
                frame = await ws.recv()
                pytest.fail(f"the server sent {frame!r} before closing")
    assert closed.value.rcvd is not None
    return closed.value.rcvd.code


async def test_refusals_close_with_4401_4404_and_send_nothing(stack: Stack) -> None:
    session_id = session_start(stack)
    url = stack.events_url(session_id)
    owner, other = stack.personas["owner"], stack.personas["other"]
    origin = Origin(stack.base_url())

    assert await refusal(url) == 4401
    assert await refusal(url, origin=origin) == 4401
    assert await refusal(url, additional_headers={"Authorization": "Bearer not-a-key"}) == 4401
    assert await refusal(url, additional_headers={"Authorization": "Bearer"}) == 4401
    # Someone else's session closes as an unknown one does (REST answers 404 for both).
    assert await refusal(url, additional_headers=other.bearer()) == 4404
    assert await refusal(url, origin=origin,
                         additional_headers={"Cookie": f"sessionid={other.cookie}"}) == 4404
    unknown = "ses_" + "0" * 32
    assert await refusal(stack.events_url(unknown), additional_headers=owner.bearer()) == 4404
    assert await refusal(stack.events_url(unknown), additional_headers=other.bearer()) == 4404

    # A browser page on another site cannot ride the owner's cookie (origin check).
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url, origin=Origin("http://evil.example"),
                           additional_headers={"Cookie": f"sessionid={owner.cookie}"}):
            pass
    assert refused.value.response.status_code == 403


async def test_bearer_token_cookie_and_staff_all_receive_the_same_events(stack: Stack) -> None:
    session_id = session_start(stack, "hello relay")
    answered(stack, session_id, 1)
    await marker_write(stack, session_id, 1)
    owner, staff = stack.personas["owner"], stack.personas["staff"]
    reads = {
        "bearer": await read_all(stack, session_id, is_marker(1)),
        "token": await read_all(stack, session_id, is_marker(1),
                                headers={"Authorization": f"Token {owner.token}"}),
        "cookie": await read_all(stack, session_id, is_marker(1), origin=Origin(stack.base_url()),
                                 headers={"Cookie": f"sessionid={owner.cookie}"}),
        "staff": await read_all(stack, session_id, is_marker(1), headers=staff.bearer()),
    }
    frames = reads["bearer"]
    assert all(read == frames for read in reads.values())
    assert_event_frames(frames)
    types = [frame["event"]["type"] for frame in frames]
    assert types[0] == "turn_started" and types[-2] == "turn_completed", types
    assert "text_delta" in types
    assert tokens_of(frames) == await stream_tokens(stack, session_id)


async def test_resume_after_a_token_gives_exactly_the_rest(stack: Stack) -> None:
    session_id = session_start(stack, slow_message(0.1, words=45))
    async with connect(stack.events_url(session_id),
                       additional_headers=stack.personas["owner"].bearer()) as ws:
        async with asyncio.timeout(60):
            first = [json.loads(await ws.recv()) for _ in range(3)]

    # Resume after the second frame while the turn may still stream, then follow a second
    # turn on the same socket.
    async with connect(stack.events_url(session_id, after=first[1]["token"]),
                       additional_headers=stack.personas["owner"].bearer()) as ws:
        resumed = await receive_until(ws, is_turn_end)
        message_send(stack, session_id, slow_message(0.05, words=30))
        resumed += await receive_until(ws, is_turn_end)
        await marker_write(stack, session_id, 2)
        resumed += await receive_until(ws, is_marker(2))

    fresh = await read_all(stack, session_id, is_marker(2))
    assert_event_frames(fresh)
    tokens = tokens_of(fresh)
    assert len(set(tokens)) == len(tokens)
    assert tokens == await stream_tokens(stack, session_id)
    assert first == fresh[:3]
    assert resumed == fresh[2:]
    assert [f["event"]["type"] for f in fresh].count("turn_completed") == 2


async def test_events_after_then_connect_misses_nothing(stack: Stack) -> None:
    idle = session_start(stack)
    assert snapshot_when(stack, idle, lambda s: True, "a snapshot")["events_after"] == ""

    session_id = session_start(stack, slow_message(0.15))
    snapshot = snapshot_when(stack, session_id, lambda s: s["events_after"] != "",
                             "events_after to name the running turn's first events")
    events_after = snapshot["events_after"]
    live = await read_all(stack, session_id, is_turn_end, after=events_after)
    await marker_write(stack, session_id, 3)
    live += await read_all(stack, session_id, is_marker(3), after=live[-1]["token"])

    fresh = tokens_of(await read_all(stack, session_id, is_marker(3)))
    assert events_after in fresh
    assert tokens_of(live) == fresh[fresh.index(events_after) + 1:]


async def test_live_events_after_replays_the_running_turn_from_its_start(stack: Stack) -> None:
    session_id = session_start(stack, "first")
    answered(stack, session_id, 1)
    message_send(stack, session_id, slow_message(0.15))
    snapshot = snapshot_when(
        stack, session_id,
        lambda s: s["turn_id"] == "turn-2" and s["events_after"] != s["live_events_after"],
        "the second turn to stream",
    )
    live = await read_all(stack, session_id, is_turn_end, after=snapshot["live_events_after"])
    # The web side's own message_queued (no turn) lands on either side of turn_started (the
    # worker can start the turn before the web writes it); the replay holds it either way, so
    # a reloaded page lists the message before the turn it started.
    kinds = [frame["event"]["type"] for frame in live]
    assert kinds[0] in ("message_queued", "turn_started"), kinds
    assert kinds.count("message_queued") == 1, kinds
    started = live[kinds.index("turn_started")]["event"]["data"]
    queued = live[kinds.index("message_queued")]["event"]["data"]
    assert queued["message_id"] in started["client_ids"]
    step_events = [frame for frame in live if frame["event"]["type"] != "message_queued"]
    assert {frame["event"]["turn_id"] for frame in step_events} == {"turn-2"}
    streamed = "".join(frame["event"]["data"]["text"] for frame in live
                       if frame["event"]["type"] == "text_delta")
    final = answered(stack, session_id, 2)
    assert streamed == final["messages"][-1]["text"]
    assert final["turn_id"] is None
    assert final["live_events_after"] == final["events_after"]


async def test_closing_mid_stream_ends_the_relay_within_a_second_and_the_turn_runs_on(
    stack: Stack,
) -> None:
    session_id = session_start(stack, slow_message(0.2))
    ended = f"Events relay for session {session_id} ended"
    web = stack.web
    async with connect(stack.events_url(session_id),
                       additional_headers=stack.personas["owner"].bearer()) as ws:
        streamed = await receive_until(
            ws, lambda frame: frame["event"]["type"] == "text_delta")
        assert not any(ended in line for line in web.lines)
    closed_at = time.monotonic()
    wait_until("the relay task to end", lambda: any(ended in line for line in web.lines),
               timeout=1.0, interval=0.01)
    print(f"relay ended {time.monotonic() - closed_at:.3f} s after the close")

    snapshot = answered(stack, session_id, 1)
    reply = snapshot["messages"][-1]
    assert reply["role"] == "assistant" and reply["text"].startswith("You said: word0")
    assert reply["text"].endswith("word59")
    assert streamed[-1]["event"]["data"]["text"] in reply["text"]


async def test_a_client_that_stops_reading_is_closed_with_4408_and_resumes(
    stack: Stack,
) -> None:
    session_id = session_start(stack)
    port = free_port()
    web = stack.start_web(port, name="web-small-queue", env={
        "DEXAGENTS_EVENTS_SEND_QUEUE_FRAMES": "4",
        "DEXAGENTS_EVENTS_SEND_QUEUE_BYTES": "65536",
    })
    try:
        web.wait_for_line("Application startup complete")
        overflow = f"Closing a slow events client of session {session_id}"
        # A small receive buffer and a one-message client queue: once this client stops
        # calling recv(), TCP flow control stops the server's writes.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", port))
        blob = "x" * (256 * 1024)
        # No compression: the blob must really fill the socket buffers.
        async with connect(stack.events_url(session_id, port=port), sock=sock, max_queue=1,
                           ping_interval=None, max_size=2**21, compression=None,
                           additional_headers=stack.personas["owner"].bearer()) as ws, \
                dex_client(stack.engine_address) as (client, flow):
            from dex_agents import AgentEvent, AgentEventType

            written = 0
            while not any(overflow in line for line in web.lines):
                assert written < 200, "the server never found the client too slow"
                await client.write_stream(session_id, flow.agent_events, "relay-test", AgentEvent(
                    AgentEventType.TOOL_LOG, None, "relay-test", 1,
                    {"marker": written, "text": blob}))
                written += 1
            received: list[Frame] = []
            with pytest.raises(ConnectionClosed) as closed:
                async with asyncio.timeout(30):
                    while True:
                        received.append(json.loads(await ws.recv()))
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4408
        print(f"closed with 4408 after {written} writes; {len(received)} frames got through")
    finally:
        web.stop()

    markers = [frame["event"]["data"]["marker"] for frame in received]
    assert markers == list(range(len(markers)))
    assert len(markers) < written
    rest = await read_all(stack, session_id, is_marker(written - 1),
                          after=received[-1]["token"] if received else None, max_size=2**21)
    assert [frame["event"]["data"]["marker"] for frame in rest] == list(
        range(len(markers), written))


def test_engine_restart_keeps_the_socket_and_loses_nothing(tmp_path: Path) -> None:
    with running_stack(tmp_path) as platform:
        asyncio.run(_engine_restart(platform))


async def _engine_restart(stack: Stack) -> None:
    session_id = session_start(stack, "before the restart")
    async with connect(stack.events_url(session_id),
                       additional_headers=stack.personas["owner"].bearer()) as ws:
        before = await receive_until(ws, is_turn_end)
        stack.engine.signal_group(signal.SIGKILL)
        stack.engine.popen.wait()
        stack.start_engine().wait_for_line("dex_dev_server ready on")

        with stack.api() as api:
            # This stack runs no Celery worker, so a message the outbox kept while the worker
            # reconnects would wait: send once the engine and a worker are up again, and
            # require the send itself to deliver it.
            wait_until("the engine and a worker to be up",
                       lambda: api.get("/healthz").status_code == 200, timeout=60)

            def delivered() -> bool:
                answer = api.post(f"/api/v1/sessions/{session_id}/messages/",
                                  json={"text": "after the restart"})
                assert answer.status_code == 202, answer.text
                return answer.json()["delivery"] == "delivered"

            wait_until("the engine to take messages again", delivered, timeout=60)
        # The kill may have cut a Step of the first turn short: then its retry writes the
        # Step's events again (a new attempt) before the second turn's.
        after = await receive_until(
            ws, lambda frame: is_turn_end(frame) and frame["event"]["turn_id"] == "turn-2",
            deadline=90)

    frames = before + after
    assert ("turn_started", "turn-2") in [(f["event"]["type"], f["event"]["turn_id"])
                                          for f in after]
    fresh = await read_all(stack, session_id, lambda frame: frame == frames[-1])
    assert fresh == frames


def test_a_trimmed_after_token_gets_snapshot_required_then_the_oldest_retained(
    tmp_path: Path,
) -> None:
    # A tiny AgentEvents budget in the worker: a few turns trim the first one's events.
    with running_stack(tmp_path,
                       extra_env={"DEXAGENTS_EVENTS_STREAM_CAPACITY_BYTES": "4096"}) as platform:
        asyncio.run(_trimmed_after(platform))


async def _trimmed_after(stack: Stack) -> None:
    session_id = session_start(stack, "the first turn")
    first = await read_all(stack, session_id, is_turn_end)
    oldest = first[0]["token"]
    turns = 1
    while oldest in await stream_tokens(stack, session_id):
        assert turns < 20, "the Stream never trimmed"
        message_send(stack, session_id, f"turn {turns + 1}")
        turns += 1
        answered(stack, session_id, turns)
    await marker_write(stack, session_id, 9)

    resumed = await read_all(stack, session_id, is_marker(9), after=oldest)
    fresh = await read_all(stack, session_id, is_marker(9))
    assert resumed[0] == {"type": "snapshot_required"}
    assert resumed[1:] == fresh
    assert tokens_of(fresh) == await stream_tokens(stack, session_id)

    garbage = await read_all(stack, session_id, is_marker(9), after="not-a-token")
    assert garbage == [{"type": "snapshot_required"}, *fresh]
    # A retained token resumes without a snapshot_required.
    assert await read_all(stack, session_id, is_marker(9),
                          after=fresh[0]["token"]) == fresh[1:]



def engine_reads(stack: Stack) -> float:
    """The web process's ``dexagents_event_stream_reads_total`` (ReadStream calls it made)."""
    with stack.api() as api:
        answer = api.get("/metrics")
    assert answer.status_code == 200, answer.text
    for line in answer.text.splitlines():
        if line.startswith("dexagents_event_stream_reads_total "):
            return float(line.split()[1])
    raise AssertionError("no dexagents_event_stream_reads_total in /metrics")


async def sse_markers(stack: Stack, session_id: str, after: str, last: int) -> list[int]:
    """Follow ``GET .../events/`` from ``after`` until marker ``last``; the markers seen."""
    import httpx

    markers: list[int] = []
    async with httpx.AsyncClient(base_url=stack.base_url(), timeout=60,
                                 headers=stack.personas["owner"].bearer()) as client, \
            client.stream("GET", f"/api/v1/sessions/{session_id}/events/",
                          params={"after": after}) as answer:
        assert answer.status_code == 200
        async with asyncio.timeout(60):
            async for line in answer.aiter_lines():
                if not line.startswith("data: "):
                    continue
                frame = json.loads(line.removeprefix("data: "))
                markers.append(frame["event"]["data"]["marker"])
                if markers[-1] == last:
                    return markers
    raise AssertionError(f"the stream ended after {markers}")


async def test_many_readers_of_one_session_make_one_engine_read_per_message(
    stack: Stack,
) -> None:
    """30 websockets and 2 Server-Sent Events streams follow one session on one web process:
    each gets every message once, in order, and the web process reads each message from the
    engine about once (alone, each reader would long-poll once per message: 320 reads)."""
    session_id = session_start(stack)
    await marker_write(stack, session_id, 0)
    tail = (await stream_tokens(stack, session_id))[-1]
    headers = stack.personas["owner"].bearer()
    async with contextlib.AsyncExitStack() as sockets:
        watchers = [await sockets.enter_async_context(
            connect(stack.events_url(session_id, tail), additional_headers=headers))
            for _ in range(30)]
        sse = [asyncio.create_task(sse_markers(stack, session_id, tail, 10)) for _ in range(2)]
        # Every reader has joined once each has seen marker 1.
        await marker_write(stack, session_id, 1)
        for ws in watchers:
            assert [frame["event"]["data"]["marker"]
                    for frame in await receive_until(ws, is_marker(1))] == [1]
        before = engine_reads(stack)
        for marker in range(2, 11):
            await marker_write(stack, session_id, marker)
        for ws in watchers:
            frames = await receive_until(ws, is_marker(10))
            assert [frame["event"]["data"]["marker"] for frame in frames] == list(range(2, 11))
        for task in sse:
            assert await task == list(range(1, 11))
        reads = engine_reads(stack) - before
    print(f"{reads:.0f} engine reads for 32 readers of 9 messages")
    # Other tests' sessions may still be read (a turn that runs on): a generous margin.
    assert reads <= 9 + 10
