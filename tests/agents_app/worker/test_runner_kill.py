"""A Worker killed in the middle of a slow model stream: the retry replaces the partial text.

Real engine (``dex_dev_server``), real Worker children
(``tests.agents_app.worker.demo_worker``), the demo model as a
subprocess reached over HTTP through LiteLLM.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dex_agents import AgentEvent, AgentEventType, MessageRole
from dex_agents.testing import (
    EXECUTE_COMPLETED_EVENT,
    AgentTestStack,
    wait_for_agent_snapshot,
    wait_until,
)
from tests.agents_app.demo.test_demo_model import start_demo_model
from tests.agents_app.worker.demo_worker import build_flow

REPO_ROOT = Path(__file__).resolve().parents[3]
# The answer streams as about nine chunks 0.5 s apart: each attempt streams for ~4 s.
SPOKEN = "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen"
SCRIPT = f"/slow 0.5\n{SPOKEN}"


@pytest.fixture(scope="module")
def demo_api_base() -> Iterator[str]:
    with start_demo_model() as base_url:
        yield f"{base_url}/v1"


def agent_config(api_base: str) -> dict[str, Any]:
    return {
        "agent": "demo",
        "model": "openai/dexagents-demo",
        "api_base": api_base,
        "api_key_env": None,
        "system_prompt": "",
        "tools": [],
    }


async def test_killed_worker_mid_stream_retries_and_stores_one_answer(
    tmp_path: Path, demo_api_base: str
) -> None:
    flow = build_flow()
    async with AgentTestStack(
        tmp_path, [flow], "tests.agents_app.worker.demo_worker", worker_cwd=REPO_ROOT
    ) as stack:
        sessions = stack.sessions(flow)
        worker = await stack.start_worker()
        await sessions.start_session(
            "session-kill", SCRIPT, agent_config=agent_config(demo_api_base)
        )

        async def events() -> list[AgentEvent]:
            page = await stack.client.list_stream_messages("session-kill", flow.agent_events, 500)
            return [message.value for message in reversed(page.messages)]

        async def first_partial_text() -> AgentEvent | None:
            return next(
                (
                    event
                    for event in await events()
                    if event.type is AgentEventType.TEXT_DELTA and event.attempt == 1
                ),
                None,
            )

        probe: Callable[[], Any] = first_partial_text
        partial: AgentEvent = await wait_until("a text delta of attempt 1", probe, timeout=30)
        worker.kill()
        await stack.start_worker()

        def one_answer(snapshot: Any) -> list[Any] | None:
            answers = [m for m in snapshot.messages if m.role is MessageRole.ASSISTANT]
            done = snapshot.state is not None and not snapshot.state.turn_id
            return answers if answers and done else None

        answers = await wait_for_agent_snapshot(
            sessions, "session-kill", one_answer, description="the stored answer", timeout=60
        )
        expected = f"You said: {SPOKEN}"
        assert [message.text for message in answers] == [expected]

        all_events = await events()
        deltas = [
            event
            for event in all_events
            if event.type is AgentEventType.TEXT_DELTA
            and event.step_execution_id == partial.step_execution_id
        ]
        first_attempt = "".join(e.payload["text"] for e in deltas if e.attempt == 1)
        later = [e for e in deltas if e.attempt > 1]
        assert later, f"no text delta of a later attempt: {deltas}"
        highest = max(e.attempt for e in later)
        # What a UI keeps: the highest attempt's text, which is the whole stored answer.
        assert "".join(e.payload["text"] for e in deltas if e.attempt == highest) == expected
        assert first_attempt and expected.startswith(first_attempt) and first_attempt != expected
        assert [e.type for e in all_events].count(AgentEventType.TURN_COMPLETED) == 1

        history = await stack.read_step_history("session-kill")
        run_model = [
            entry
            for entry in history
            if entry.event_type == EXECUTE_COMPLETED_EVENT and entry.step_type == "RunModel"
        ]
        assert [entry.final_attempt for entry in run_model] == [highest]
