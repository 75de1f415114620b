"""The snapshot read's short path (``agents_app.api.snapshot_asgi``) on real uvicorn, engine and
worker (``tests/e2e/relay_stack.py``): it answers as the DRF view does, keeps every reader's
rights and every writer's next read fresh, and counts against the same read budget.

The view itself answers ``GET /api/v1/sessions/<id>/?wait=0`` (a query string is never the
short path's), which gives each test the Django path's answer to compare with.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator

import httpx
import pytest

from dex_agents.testing import free_port
from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_events_relay import answered
from tests.e2e.test_no_polling import idle_session

pytestmark = pytest.mark.e2e

#: Headers that differ between any two answers.
PER_ANSWER = {"date", "x-request-id"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("short-path")) as platform:
        yield platform


def headers_of(answer: httpx.Response) -> dict[str, str]:
    return {name: value for name, value in answer.headers.items() if name not in PER_ANSWER}


def test_an_unchanged_session_reads_as_the_view_answers_it(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        # The first read fills the cache; the next ones are the short path's.
        api.get(f"/api/v1/sessions/{session_id}/")
        short = api.get(f"/api/v1/sessions/{session_id}/", headers={"X-Request-ID": "read-1"})
        view = api.get(f"/api/v1/sessions/{session_id}/?wait=0")
    assert short.status_code == view.status_code == 200, (short.text, view.text)
    assert short.content == view.content
    assert headers_of(short) == headers_of(view)
    assert short.headers["x-request-id"] == "read-1"


def test_the_short_path_answers_without_a_worker(stack: Stack) -> None:
    """With the worker frozen, an unchanged session still reads (no worker RPC); the owner's
    write makes the next read go to Dex (503: no worker)."""
    session_id = idle_session(stack)
    worker = next(proc for proc in stack.processes.started if proc.name == "worker")
    with stack.api() as api:
        first = api.get(f"/api/v1/sessions/{session_id}/")
        worker.signal_group(signal.SIGSTOP)
        try:
            for _ in range(3):
                again = api.get(f"/api/v1/sessions/{session_id}/")
                assert again.status_code == 200, again.text
                assert again.content == first.content
            sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "later"})
            assert sent.status_code == 202, sent.text
            fresh = api.get(f"/api/v1/sessions/{session_id}/")
            assert fresh.status_code == 503, fresh.text
        finally:
            worker.signal_group(signal.SIGCONT)
    answered(stack, session_id, 2)


def test_an_unchanged_session_reads_without_an_engine_read(stack: Stack) -> None:
    """After one read, the web process knows the session's newest event token from its own
    reader of the session's Stream: with the engine frozen, reads still answer (each would
    otherwise wait for the engine's tail read and end 503)."""
    session_id = idle_session(stack)
    with stack.api() as api:
        first = api.get(f"/api/v1/sessions/{session_id}/")
        api.get(f"/api/v1/sessions/{session_id}/")
        stack.engine.signal_group(signal.SIGSTOP)
        try:
            for _ in range(3):
                again = api.get(f"/api/v1/sessions/{session_id}/", timeout=3)
                assert again.status_code == 200, again.text
                assert again.content == first.content
        finally:
            stack.engine.signal_group(signal.SIGCONT)


def test_an_event_another_process_writes_shows_on_the_next_reads(stack: Stack) -> None:
    """A Stream message written by another process (here the Dex SDK, as a worker's Step
    would) moves the answer's ``events_after`` to it, with nothing written through this web
    process."""
    import asyncio

    from dex_agents import AgentEvent, AgentEventType
    from tests.e2e.relay_stack import dex_client, retained_tokens

    session_id = idle_session(stack)
    url = f"/api/v1/sessions/{session_id}/"

    async def write() -> str:
        async with dex_client(stack.engine_address) as (client, flow):
            await client.write_stream(session_id, flow.agent_events, "short-path-test",
                                      AgentEvent(AgentEventType.TOOL_LOG, None,
                                                 "short-path-test", 1, {"marker": 1}))
            return (await retained_tokens(client, flow, session_id))[-1]

    with stack.api() as api:
        for _ in range(2):
            before = api.get(url).json()["events_after"]
        newest = asyncio.run(write())
        assert newest != before
        deadline = time.monotonic() + 10
        while (seen := api.get(url).json()["events_after"]) != newest:
            assert time.monotonic() < deadline, f"events_after stayed {seen!r}"
        assert api.get(url).json()["events_after"] == newest


def test_a_writer_reads_its_message_and_the_turn_it_ran(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        for _ in range(2):
            api.get(f"/api/v1/sessions/{session_id}/")
        sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "again"})
        assert sent.status_code == 202, sent.text
        snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
        texts = [m["text"] for m in snapshot["messages"] if m["role"] == "user"]
        queued = [entry["text"] for entry in snapshot["queued_messages"]]
        assert "again" in texts + queued
    # The turn's events reach the reader (answered polls the plain read).
    done = answered(stack, session_id, 2)
    assert [m["text"] for m in done["messages"] if m["role"] == "user"][-1] == "again"


def test_a_stop_shows_on_the_next_read(stack: Stack) -> None:
    session_id = idle_session(stack)
    with stack.api() as api:
        for _ in range(2):
            assert api.get(f"/api/v1/sessions/{session_id}/").json()["status"] != "stopped"
        stopped = api.post(f"/api/v1/sessions/{session_id}/stop/")
        assert stopped.status_code in (200, 202, 204), stopped.text
        after = api.get(f"/api/v1/sessions/{session_id}/").json()
        assert after["status"] == "stopped" and after["can_send"] is False
        again = api.get(f"/api/v1/sessions/{session_id}/")
        assert again.json() == after


def test_each_persona_reads_what_it_may(stack: Stack) -> None:
    session_id = idle_session(stack)
    url = f"/api/v1/sessions/{session_id}/"
    with stack.api() as owner:
        for _ in range(2):
            assert owner.get(url).json()["can_send"] is True
    for _ in range(2):
        with stack.api("staff") as staff:
            seen = staff.get(url)
        assert seen.status_code == 200
        assert seen.json()["can_approve"] is True and seen.json()["can_send"] is False
        with stack.api("other") as other:
            assert other.get(url).status_code == 404
        with httpx.Client(base_url=stack.base_url()) as anonymous:
            assert anonymous.get(url).status_code == 401
            wrong = anonymous.get(url, headers={"Authorization": "Bearer dxa_" + "0" * 64})
            assert wrong.status_code == 401
            assert wrong.headers["www-authenticate"].startswith("Bearer")


def test_a_revoked_token_reads_nothing_at_once(stack: Stack) -> None:
    session_id = idle_session(stack)
    url = f"/api/v1/sessions/{session_id}/"
    token = stack.django_shell(
        "import json\n"
        "from django.contrib.auth import get_user_model\n"
        "from agents_app.services.api_tokens import api_token_create\n"
        "made, key = api_token_create(user=get_user_model().objects.get(username='owner'),"
        " name='short-lived')\n"
        "print(json.dumps({'id': made.pk, 'key': key}))\n"
    )
    with httpx.Client(base_url=stack.base_url(),
                      headers={"Authorization": f"Bearer {token['key']}"}) as client:
        for _ in range(2):
            assert client.get(url).status_code == 200
        with stack.api() as owner:
            assert owner.delete(f"/api/v1/tokens/{token['id']}/").status_code == 204
        assert client.get(url).status_code == 401


def test_short_path_reads_count_against_the_read_budget(stack: Stack) -> None:
    """A web process with a budget of 4 reads a minute: the reads the short path answers and
    the one it hands to Django (the first, a cache miss) count once each; the fifth is 429."""
    session_id = idle_session(stack)
    port = free_port()
    web = stack.start_web(port, env={"DEXAGENTS_THROTTLE_READS": "4/min"},
                          name="web-throttled")
    try:
        web.wait_for_line("Application startup complete", timeout=120)
        with httpx.Client(base_url=stack.base_url(port),
                          headers=stack.personas["other"].bearer()) as other:
            # Another user's budget is its own.
            assert other.get(f"/api/v1/sessions/{session_id}/").status_code == 404
        with httpx.Client(base_url=stack.base_url(port),
                          headers=stack.personas["owner"].bearer()) as client:
            codes = [client.get(f"/api/v1/sessions/{session_id}/").status_code
                     for _ in range(5)]
            assert codes == [200, 200, 200, 200, 429], codes
            refused = client.get(f"/api/v1/sessions/{session_id}/")
            assert refused.status_code == 429
            assert int(refused.headers["retry-after"]) > 0
    finally:
        web.popen.send_signal(signal.SIGTERM)
        web.popen.wait(30)
