"""REST clients that need no polling, on real uvicorn (``tests/e2e/relay_stack.py``: the
embedded engine, ``manage.py dexworker``, the demo model over HTTP, Celery):

- send and wait: ``POST /api/v1/sessions/<id>/messages/?wait=<s>``;
- Server-Sent Events: ``GET /api/v1/sessions/<id>/events/`` (resumed by ``Last-Event-ID``
  and by ``?after=``) and ``POST .../messages/`` with ``Accept: text/event-stream``;
- the snapshot's long-poll: ``GET /api/v1/sessions/<id>/?wait=<s>&events_after=<token>``;
- a client that goes away mid-wait loses nothing it sent;
- a provider's refusal ends the turn at once, a server error is retried (issue 25).
"""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_events_relay import answered, session_start, slow_message

pytestmark = pytest.mark.e2e

SSE = {"Accept": "text/event-stream"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("no-polling")) as platform:
        yield platform


def idle_session(stack: Stack) -> str:
    session_id = session_start(stack, "hello")
    answered(stack, session_id, 1)
    return session_id


def sse_messages(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """Parse Server-Sent Events: yields ``{"id"?, "data": decoded JSON}`` per message and
    ``{"comment": text}`` per comment line."""
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            yield {"comment": line[1:].strip()}
            continue
        if not line:
            if "data" in fields:
                message: dict[str, Any] = {"data": json.loads(fields["data"])}
                if "id" in fields:
                    message["id"] = fields["id"]
                yield message
            fields = {}
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")


def read_until_turn_end(lines: Iterator[str]) -> list[dict[str, Any]]:
    messages = []
    for message in sse_messages(lines):
        if "data" not in message:
            continue
        messages.append(message)
        event = message["data"].get("event") or {}
        if event.get("type") in {"turn_completed", "turn_failed"}:
            return messages
    raise AssertionError(f"the stream ended before the turn did: {messages}")


def test_send_and_wait_answers_when_the_turn_ends_with_the_snapshot(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        answer = api.post(f"/api/v1/sessions/{session_id}/messages/?wait=60",
                          json={"text": "tell me a fact"}, timeout=90)
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["queued"] is True and body["delivery"] == "delivered"
    assert body["turn"] == {"finished": True, "turn_id": "turn-2", "status": "completed"}
    snapshot = body["session"]
    assert snapshot["status"] == "waiting_for_user_message"
    assert snapshot["turn_id"] is None
    assert [m["role"] for m in snapshot["messages"]][-2:] == ["user", "assistant"]
    assert snapshot["messages"][-2]["text"] == "tell me a fact"


def test_send_and_wait_that_runs_out_says_the_turn_runs(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        answer = api.post(f"/api/v1/sessions/{session_id}/messages/?wait=1",
                          json={"text": slow_message(0.6, words=15)}, timeout=30)
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert body["turn"]["finished"] is False and body["turn"]["status"] is None
        # The turn had started (the first chunk comes at once) or not yet: never another turn.
        assert body["turn"]["turn_id"] in (None, "turn-2")
        assert body["session"]["id"] == session_id
        bad = api.post(f"/api/v1/sessions/{session_id}/messages/?wait=nope",
                       json={"text": "x"})
        assert bad.status_code == 400 and "wait" in bad.json(), bad.text
        too_long = api.post(f"/api/v1/sessions/{session_id}/messages/?wait=100000",
                            json={"text": "x"})
        assert too_long.status_code == 400 and "wait" in too_long.json(), too_long.text
    # Neither refused request queued anything: one more user message only.
    snapshot = answered(stack, session_id, 2)
    assert [m["role"] for m in snapshot["messages"]].count("user") == 2


def test_server_sent_events_follow_a_turn_and_resume_from_last_event_id(
    stack: Stack,
) -> None:
    session_id = idle_session(stack)
    base = stack.base_url()
    headers = {**stack.personas["owner"].bearer(), **SSE}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as client:
        with client.stream("GET", f"/api/v1/sessions/{session_id}/events/") as stream:
            assert stream.status_code == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            lines = stream.iter_lines()
            first_turn = read_until_turn_end(lines)  # turn-1, already written
            with stack.api() as api:
                sent = api.post(f"/api/v1/sessions/{session_id}/messages/",
                                json={"text": "and another"})
            assert sent.status_code == 202
            second_turn = read_until_turn_end(lines)
        frames = first_turn + second_turn
        for message in frames:
            assert message["data"]["type"] == "event"
            assert message["id"] == message["data"]["token"]
        # The web's own notices (message_queued, queue_changed) name no turn and may come
        # before or between the turn's events.
        started = next(index for index, m in enumerate(second_turn)
                       if m["data"]["event"]["type"] == "turn_started")
        assert {m["data"]["event"]["turn_id"] for m in second_turn[started:]} <= {"turn-2", None}
        assert {m["data"]["event"]["turn_id"] for m in second_turn[:started]} <= {None}
        assert second_turn[started]["data"]["event"]["data"]["client_ids"] == [sent.json()["id"]]

        # Resume: Last-Event-ID wins over ?after=, and the next frame is the one after it.
        middle = len(frames) // 2
        resumed_headers = {"Last-Event-ID": frames[middle]["id"]}
        with client.stream("GET", f"/api/v1/sessions/{session_id}/events/?after=",
                           headers=resumed_headers) as stream:
            resumed = next(m for m in sse_messages(stream.iter_lines()) if "data" in m)
        assert resumed["id"] == frames[middle + 1]["id"]
        with client.stream(
            "GET", f"/api/v1/sessions/{session_id}/events/?after={frames[-2]['id']}"
        ) as stream:
            resumed = next(m for m in sse_messages(stream.iter_lines()) if "data" in m)
        assert resumed["id"] == frames[-1]["id"]
        # A token the Stream does not hold: snapshot_required first, then from the oldest.
        with client.stream("GET", f"/api/v1/sessions/{session_id}/events/",
                           headers={"Last-Event-ID": "not-a-token"}) as stream:
            found = [m for m in _take(sse_messages(stream.iter_lines()), 2) if "data" in m]
        assert found[0]["data"] == {"type": "snapshot_required"} and "id" not in found[0]
        assert found[1]["id"] == frames[0]["id"]


def _take(messages: Iterator[dict[str, Any]], count: int) -> list[dict[str, Any]]:
    taken = []
    for message in messages:
        if "data" in message:
            taken.append(message)
        if len(taken) == count:
            break
    return taken


def test_a_message_posted_for_server_sent_events_streams_its_turn(stack: Stack) -> None:
    session_id = idle_session(stack)
    headers = {**stack.personas["owner"].bearer(), **SSE}
    with (httpx.Client(base_url=stack.base_url(), headers=headers, timeout=60) as client,
          client.stream("POST", f"/api/v1/sessions/{session_id}/messages/",
                        json={"text": "stream this"}) as stream):
        assert stream.status_code == 200
        lines = list(stream.iter_lines())  # the server ends the stream after the turn
    messages = [m for m in sse_messages(iter(lines)) if "data" in m]
    opening = messages[0]["data"]
    assert opening["type"] == "message_accepted" and opening["delivery"] == "delivered"
    events = [m["data"]["event"] for m in messages[1:]]
    assert events[0]["type"] == "turn_started"
    assert events[0]["data"]["client_ids"] == [opening["id"]]
    assert events[-1]["type"] == "turn_completed"
    assert {event["turn_id"] for event in events} == {"turn-2"}
    assert any(event["type"] == "text_delta" for event in events)


def test_the_snapshot_long_poll_answers_when_the_session_changes(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        before = api.get(f"/api/v1/sessions/{session_id}/").json()
        # Nothing happens: the wait runs out and the same position comes back.
        idle = api.get(f"/api/v1/sessions/{session_id}/",
                       params={"wait": 1, "events_after": before["events_after"]})
        assert idle.status_code == 200
        assert idle.json()["events_after"] == before["events_after"]
        bad = api.get(f"/api/v1/sessions/{session_id}/", params={"wait": -1})
        assert bad.status_code == 400 and "wait" in bad.json()

        results: dict[str, Any] = {}

        def long_poll() -> None:
            with stack.api() as poller:
                results["answer"] = poller.get(
                    f"/api/v1/sessions/{session_id}/",
                    params={"wait": 120, "events_after": before["events_after"]},
                    timeout=150,
                )

        poller = threading.Thread(target=long_poll)
        poller.start()
        sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "wake up"})
        assert sent.status_code == 202
        poller.join(timeout=150)
        assert not poller.is_alive()
    changed = results["answer"]
    assert changed.status_code == 200
    # It answered on the session's first new event, not at the end of the 120 s wait.
    assert changed.json()["events_after"] != before["events_after"]
    assert changed.elapsed.total_seconds() < 100


def test_a_client_that_leaves_mid_wait_loses_nothing(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api, pytest.raises(httpx.ReadTimeout):
        api.post(f"/api/v1/sessions/{session_id}/messages/?wait=60",
                 json={"text": slow_message(0.3, words=15)}, timeout=1.0)
    snapshot = answered(stack, session_id, 2)
    users = [m["text"] for m in snapshot["messages"] if m["role"] == "user"]
    assert users[-1] == slow_message(0.3, words=15)


def test_an_unchanged_session_is_read_without_a_worker_and_a_write_is_read_back(
    stack: Stack,
) -> None:
    """The snapshot cache (``agents_app.gateway.snapshot_cache``): with the Dex worker frozen
    (SIGSTOP), a session that has not changed is still read (no worker RPC), and after the
    owner's own write the next read goes to Dex again (here: 503, the worker cannot answer)."""
    session_id = idle_session(stack)
    worker = next(proc for proc in stack.processes.started if proc.name == "worker")
    with stack.api() as api:
        first = api.get(f"/api/v1/sessions/{session_id}/")
        assert first.status_code == 200
        worker.signal_group(signal.SIGSTOP)
        try:
            again = api.get(f"/api/v1/sessions/{session_id}/")
            assert again.status_code == 200, again.text
            assert again.json()["messages"] == first.json()["messages"]
            assert again.json()["events_after"] == first.json()["events_after"]
            # A write forgets the cached read (the message waits in the outbox meanwhile).
            sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "later"})
            assert sent.status_code == 202 and sent.json()["delivery"] == "pending"
            fresh = api.get(f"/api/v1/sessions/{session_id}/")
            assert fresh.status_code == 503, fresh.text
            assert fresh.json()["unavailable"] == "worker"
        finally:
            worker.signal_group(signal.SIGCONT)
    # Nothing was lost: the kept message runs once the worker is back.
    snapshot = answered(stack, session_id, 2)
    assert [m["text"] for m in snapshot["messages"] if m["role"] == "user"][-1] == "later"


def test_a_session_started_with_wait_answers_with_its_first_turn(stack: Stack) -> None:
    with stack.api() as api:
        answer = api.post("/api/v1/sessions/?wait=60",
                          json={"agent": "demo", "message": "hello there"}, timeout=90)
        assert answer.status_code == 201, answer.text
        body = answer.json()
        assert body["turn"] == {"finished": True, "turn_id": "turn-1", "status": "completed"}
        assert body["session"]["id"] == body["id"]
        assert body["session"]["status"] == "waiting_for_user_message"
        assert [m["role"] for m in body["session"]["messages"]] == ["user", "assistant"]
        # The index row as it is after the turn (as the list shows it), not as it was created.
        row = next(item for item in api.get("/api/v1/sessions/").json()["results"]
                   if item["id"] == body["id"])
        assert {key: body[key] for key in row} == row
        # Without a message there is no turn to wait for: the answer comes at once.
        idle = api.post("/api/v1/sessions/?wait=60", json={"agent": "demo"})
        assert idle.status_code == 201 and "turn" not in idle.json()
        listed = api.get("/api/v1/sessions/")
        assert listed.status_code == 200
        assert body["id"] in {item["id"] for item in listed.json()["results"]}


def test_a_provider_refusal_fails_the_turn_at_once_and_a_server_error_is_retried(
    stack: Stack,
) -> None:
    """Issue 25: the demo model refuses a request once (HTTP 400); sent again it would be
    answered, so a retry used to complete the turn. The turn now fails after that one attempt,
    with the provider's words as ``last_turn_error``. A 503 is still retried."""
    with stack.api() as api:
        refused = api.post("/api/v1/sessions/?wait=60",
                           json={"agent": "demo", "message": "/fail 1 400\nhello"}, timeout=90)
        assert refused.status_code == 201, refused.text
        body = refused.json()
        assert body["turn"]["status"] == "failed", body["turn"]
        error = body["session"]["last_turn_error"]
        assert error.startswith("The model provider refused the request (HTTP 400): "), error
        assert "scripted to refuse" in error
        assert [m["role"] for m in body["session"]["messages"]] == ["user"]

        retried = api.post("/api/v1/sessions/?wait=60",
                           json={"agent": "demo", "message": "/fail 1 503\nhello"}, timeout=90)
        assert retried.status_code == 201, retried.text
        answer = retried.json()
        assert answer["turn"]["status"] == "completed", answer["turn"]
        assert answer["session"]["messages"][-1]["text"] == "You said: hello"
        assert answer["session"]["last_turn_error"] is None


def test_a_wait_ends_when_its_queued_message_is_deleted_or_edited(stack: Stack) -> None:
    """A message waiting behind a running turn, then deleted (send-and-wait) or edited (its
    Server-Sent Events): each wait ends at once with the removal, naming no turn."""
    session_id = idle_session(stack)
    results: dict[str, Any] = {}
    with stack.api() as api:
        running = api.post(f"/api/v1/sessions/{session_id}/messages/",
                           json={"text": slow_message(0.3, words=90)})
        assert running.status_code == 202

        def send_and_wait() -> None:
            with stack.api() as waiter:
                results["answer"] = waiter.post(
                    f"/api/v1/sessions/{session_id}/messages/?wait=120",
                    json={"text": "delete me"}, timeout=150,
                )

        waiter = threading.Thread(target=send_and_wait)
        waiter.start()
        queued = _queued_id(stack, session_id, "delete me")
        deleted = api.delete(f"/api/v1/sessions/{session_id}/queue/{queued}/")
        assert deleted.status_code == 204, deleted.text
        waiter.join(timeout=60)
        assert not waiter.is_alive(), "the wait went on after its message was deleted"
        answer = results["answer"]
        assert answer.status_code == 200, answer.text
        assert answer.json()["turn"] == {"finished": True, "turn_id": None, "status": "deleted"}

        headers = {**stack.personas["owner"].bearer(), **SSE}
        with (httpx.Client(base_url=stack.base_url(), headers=headers, timeout=60) as client,
              client.stream("POST", f"/api/v1/sessions/{session_id}/messages/",
                            json={"text": "edit me"}) as stream):
            assert stream.status_code == 200
            lines = stream.iter_lines()
            opening = next(m for m in sse_messages(lines) if "data" in m)["data"]
            edited = api.put(f"/api/v1/sessions/{session_id}/queue/{opening['id']}/",
                             json={"text": "edited"})
            assert edited.status_code == 201, edited.text
            rest = [m["data"]["event"] for m in sse_messages(lines) if "data" in m]
        # The stream ended with the edit: no turn took the old message.
        assert rest[-1]["type"] == "queue_changed"
        assert rest[-1]["data"] == {"change": "edited", "message_id": opening["id"]}
        assert all(event["type"] != "turn_started" for event in rest)
    # Nothing else was lost: the edited text runs after the slow turn.
    snapshot = answered(stack, session_id, 3)
    users = [m["text"] for m in snapshot["messages"] if m["role"] == "user"]
    assert users[-1] == "edited" and "delete me" not in users


def test_a_wait_ends_when_the_session_is_stopped(stack: Stack) -> None:
    session_id = idle_session(stack)
    results: dict[str, Any] = {}

    def send_and_wait() -> None:
        with stack.api() as waiter:
            results["answer"] = waiter.post(
                f"/api/v1/sessions/{session_id}/messages/?wait=120",
                json={"text": slow_message(0.5, words=90)}, timeout=150,
            )

    waiter = threading.Thread(target=send_and_wait)
    waiter.start()
    snapshot_when_running(stack, session_id)
    with stack.api() as api:
        stopped = api.post(f"/api/v1/sessions/{session_id}/stop/", json={})
        assert stopped.status_code in (200, 202), stopped.text
    waiter.join(timeout=60)
    assert not waiter.is_alive(), "the wait went on after the session was stopped"
    answer = results["answer"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["turn"] == {"finished": True, "turn_id": "turn-2", "status": "stopped"}
    assert answer.json()["session"]["status"] == "stopped"


def test_the_events_stream_refuses_a_json_accept(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        refused = api.get(f"/api/v1/sessions/{session_id}/events/",
                          headers={"Accept": "application/json"})
    assert refused.status_code == 406, refused.text
    assert "text/event-stream" in refused.json()["detail"]


def snapshot_when_running(stack: Stack, session_id: str) -> None:
    from tests.e2e.test_events_relay import snapshot_when

    snapshot_when(stack, session_id, lambda s: s["status"] == "running_model", "a running turn")


def _queued_id(stack: Stack, session_id: str, text: str) -> str:
    """The queue ID of the queued message ``text``, polled with a deadline."""
    import time

    deadline = time.monotonic() + 30
    with stack.api() as api:
        while time.monotonic() < deadline:
            queue = api.get(f"/api/v1/sessions/{session_id}/queue/").json()
            for entry in queue.get("queued", []):
                if entry["text"] == text:
                    return str(entry["id"])
            time.sleep(0.05)
    raise AssertionError(f"{text!r} never showed in the queue")
