"""One durable agent turn end to end: real engine, worker, web, demo model and MCP server."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Ports, Processes, wait_for_reply, wait_until

pytestmark = pytest.mark.e2e


def _read_agent_events(address: str, session_id: str, cache_dir: Path) -> list[Any]:
    """The session's AgentEvents Stream, oldest first, read with the real Dex SDK client."""
    from dex import AsyncClient, BlobCacheConfig, ClientOptions, Registry, open_blob_cache

    from agents_app.worker.flow import build_flow

    async def read() -> list[Any]:
        flow = build_flow()
        cache = open_blob_cache(BlobCacheConfig(str(cache_dir), 8 * 1024 * 1024))
        client = AsyncClient(Registry([flow], allow_async_handlers=True), cache,
                             ClientOptions(server_address=address))
        try:
            page = await client.list_stream_messages(session_id, flow.agent_events, 500)
        finally:
            await client.close()
        return [message.value for message in reversed(page.messages)]

    return asyncio.run(read())


def test_a_turn_with_a_tool_call_survives_an_engine_restart(
    processes: Processes, ports: Ports, tmp_path: Path
) -> None:
    engine = processes.start_platform(ports).engine
    token = processes.create_token("e2e-user")

    api = httpx.Client(base_url=f"http://127.0.0.1:{ports.web}",
                       headers={"Authorization": f"Token {token}"}, timeout=30)
    wait_until("healthz to report every part up",
               lambda: api.get("/healthz").status_code == 200, timeout=60)

    query = "durable agents on Django"
    message = "/tool search__web_search " + json.dumps({"query": query})
    created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]

    snapshot = wait_for_reply(api, session_id, message_count=2, timeout=90)
    final = snapshot["messages"][-1]
    assert final["role"] == "assistant"
    assert query in final["text"]
    assert snapshot["messages"][0]["sequence"] == 1
    assert snapshot["messages"][0]["text"] == message

    history = api.get(f"/api/v1/sessions/{session_id}/history/")
    assert history.status_code == 200, history.text
    completed = Counter(entry["step_type"] for entry in history.json()
                        if entry["event_type"] == "step_execute_completed")
    assert completed["RunModel"] == 2, history.json()
    assert completed["CallTool"] == 1, history.json()
    assert completed["ResumeTurn"] == 1, history.json()

    # The runner streamed the answer as text_delta events of the second RunModel Step.
    events = _read_agent_events(f"127.0.0.1:{ports.engine}", session_id, tmp_path / "cache")
    assert events[0].type == "turn_started"
    assert events[-1].type == "turn_completed"
    streamed: dict[str, str] = defaultdict(str)
    for event in events:
        assert event.turn_id == "turn-1"
        if event.type == "text_delta":
            streamed[event.step_execution_id] += event.payload["text"]
    assert final["text"] in streamed.values(), streamed

    # A message that reaches the session while it waits is consumed at once; the engine must
    # not deliver it again after a restart.
    assert api.post(f"/api/v1/sessions/{session_id}/messages/",
                    json={"text": "before the crash"}).status_code == 202
    snapshot = wait_for_reply(api, session_id, message_count=len(snapshot["messages"]) + 2,
                              timeout=90)

    # The engine dies without warning and comes back on the same database.
    engine.signal_group(signal.SIGKILL)
    engine.popen.wait()
    processes.start_engine(ports.engine)

    def accepted() -> bool:
        answer = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "thanks"})
        return answer.status_code == 202

    wait_until("the second message to be accepted", accepted, timeout=60)
    before = len(snapshot["messages"])
    snapshot = wait_for_reply(api, session_id, message_count=before + 2, timeout=90)
    assert snapshot["messages"][before]["text"] == "thanks"
    assert snapshot["messages"][-1]["role"] == "assistant"
    assert "thanks" in snapshot["messages"][-1]["text"]
    user_texts = [item["text"] for item in snapshot["messages"] if item["role"] == "user"]
    assert user_texts == [message, "before the crash", "thanks"], user_texts
