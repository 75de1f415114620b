"""A session whose stored state outgrows what the embedded engine can hand a worker in one
message (4 MiB) fails on its own, with a clear answer, while every other session goes on."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.conftest import wait_until
from tests.e2e.relay_stack import Stack, start_stack

pytestmark = pytest.mark.e2e

LONG = "y" * 99_000  # under the API's 100,000-character limit per message


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    platform = start_stack(tmp_path_factory.mktemp("large"))
    try:
        yield platform
    finally:
        platform.processes.stop_all()


def test_an_oversized_session_fails_alone_and_says_why(stack: Stack) -> None:
    owner = stack.api("owner")
    big = owner.post("/api/v1/sessions/", json={"agent": "demo"}).json()["id"]
    for _ in range(45):  # about 4.5 MB of queued and then stored text
        answer = owner.post(f"/api/v1/sessions/{big}/messages/", json={"text": LONG})
        assert answer.status_code == 202, answer.text

    def too_large() -> dict[str, Any] | None:
        answer = owner.get(f"/api/v1/sessions/{big}/")
        return answer.json() if answer.status_code == 503 else None

    refused = wait_until("the snapshot to be refused", too_large, timeout=60)
    assert refused == {"detail": "This session's stored conversation is too large for the "
                       "engine to load at once (more than 4 MiB); start a new session."}

    # Every other session is served as usual, the first turn included.
    small = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "still here?"})
    assert small.status_code == 201, small.text
    small_id = small.json()["id"]

    def answered() -> dict[str, Any] | None:
        snapshot: dict[str, Any] = owner.get(f"/api/v1/sessions/{small_id}/").json()
        messages = snapshot.get("messages", [])
        return snapshot if messages and messages[-1]["role"] == "assistant" else None

    snapshot = wait_until("another session to answer", answered, timeout=60)
    assert snapshot["messages"][-1]["text"] == "You said: still here?"
    health = owner.get("/healthz")
    assert health.status_code == 200, health.text
