"""Golden streams: provider wire shapes served over real HTTP to the runner through LiteLLM.

Each file in ``golden/`` holds, per model call, a streamed chunk sequence and the whole
(non-streamed) answer of the same content, written for this project in the shape of OpenAI
Chat Completions, OpenAI Responses, Anthropic Messages and an OpenAI-compatible local server.
Every call must give the same stored items, tool calls and usage whether it streamed or not,
and the values the file expects. A second call, where present, checks what the runner replays.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from agents_app.worker.model_input import decode_run_state
from agents_app.worker.runner import USAGE_KEY, LiteLLMRunner
from agents_app.worker.tool_calls import REJECTED_CALL_POLICY
from dex_agents import (
    AgentToolCall,
    AgentTurnOutcome,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    TurnCompleted,
)
from dex_agents.testing import wait_until
from tests.agents_app.worker.test_runner import (
    SEARCH_TOOL,
    RecordingEvents,
    _unused_resolver,
    make_turn,
    user_message,
)

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
GOLDEN_FILES = sorted(GOLDEN_DIR.glob("*.json"))
DOCS_TOOL = {
    "name": "docs__create_doc",
    "server": "docs",
    "tool": "create_doc",
    "description": "Create a document.",
    "parameters": {"type": "object", "properties": {"title": {"type": "string"}}},
    "effect": "non_idempotent_write",
    "requires_approval": None,
}
TEST_KEY = "sk-golden-test-key-0123456789"
#: What the scripted provider answers to Ollama's ``POST /api/show`` (model details).
OLLAMA_SHOW = {
    "modelfile": "",
    "parameters": "",
    "template": "",
    "details": {"family": "llama", "parameter_size": "3B"},
    "model_info": {"llama.context_length": 131072},
    "capabilities": ["completion", "tools"],
}


@dataclass
class ScriptedProvider:
    """A local HTTP provider: answers each POST with the next queued exchange.

    A queued ``None`` answers HTTP 500. A request with ``"stream": true`` gets the exchange's
    ``stream`` as server-sent events (or, with ``"stream_format": "ndjson"``, one JSON object
    per line, as Ollama's ``/api/chat`` streams), any other its ``response`` as JSON.
    """

    queue: list[dict[str, Any] | None] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    override: Callable[[Request], Awaitable[Response]] | None = None

    async def handle(self, request: Request) -> Response:
        if self.override is not None:
            return await self.override(request)
        if request.url.path == "/api/show":
            # LiteLLM's ollama_chat asks Ollama about the model before a non-streamed call.
            return JSONResponse(OLLAMA_SHOW)
        body = await request.json()
        self.requests.append(
            {"path": request.url.path, "headers": dict(request.headers), "body": body}
        )
        if not self.queue:
            return JSONResponse({"error": {"message": "nothing queued"}}, status_code=599)
        exchange = self.queue.pop(0)
        if exchange is None:
            return JSONResponse(
                {"error": {"message": "overloaded", "type": "server_error"}}, status_code=500
            )
        if not body.get("stream"):
            return JSONResponse(exchange["response"])

        if exchange.get("stream_format") == "ndjson":

            async def lines() -> AsyncIterator[str]:
                for item in exchange["stream"]:
                    yield json.dumps(item["data"]) + "\n"

            return StreamingResponse(lines(), media_type="application/x-ndjson")

        async def events() -> AsyncIterator[str]:
            for item in exchange["stream"]:
                data = item["data"]
                prefix = f"event: {item['event']}\n" if item.get("event") else ""
                text = data if isinstance(data, str) else json.dumps(data)
                yield f"{prefix}data: {text}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")


@pytest.fixture(scope="module")
def provider_server() -> Iterator[tuple[ScriptedProvider, str]]:
    provider = ScriptedProvider()
    app = Starlette(routes=[Route("/{path:path}", provider.handle, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        ready = threading.Event()
        for _ in range(500):
            if server.started:
                ready.set()
                break
            thread.join(0.01)
        assert ready.is_set(), "the scripted provider did not start"
        yield provider, f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture
def provider(
    provider_server: tuple[ScriptedProvider, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ScriptedProvider, str]]:
    scripted, _ = provider_server
    scripted.queue.clear()
    scripted.requests.clear()
    scripted.override = None
    monkeypatch.setenv("GOLDEN_PROVIDER_KEY", TEST_KEY)
    yield provider_server
    assert not scripted.queue, "an exchange was queued but never requested"


def load(path: Path) -> dict[str, Any]:
    golden: dict[str, Any] = json.loads(path.read_text())
    return golden


def config_for(golden: dict[str, Any], base_url: str, *, stream: bool) -> dict[str, Any]:
    return {
        "agent": "golden",
        "model": golden["model"],
        "api_base": base_url + golden["base_suffix"],
        "api_key_env": "GOLDEN_PROVIDER_KEY",
        "system_prompt": "You are a careful agent.",
        "tools": [SEARCH_TOOL, DOCS_TOOL],
        "api": golden["api"],
        "stream": stream,
    }


def kept_reasoning(items: list[dict[str, Any]]) -> str | None:
    """Take the stored reasoning out of every item (its ``seconds`` depend on the clock) and
    return the text the newest item keeps, or ``None``."""
    texts = []
    for item in items:
        reasoning = item.pop("reasoning", None)
        if reasoning is not None:
            assert reasoning["seconds"] >= 0
        texts.append(reasoning["text"] if reasoning else None)
    return texts[-1] if texts else None


def without_usage(items: list[dict[str, Any]], usage: dict[str, Any]) -> list[dict[str, Any]]:
    """``items`` without the usage each assistant item keeps (``USAGE_KEY``), after checking
    the last one's is this call's (pricing is tested in test_usage_records.py)."""
    kept = [dict(item) for item in items]
    assistants = [item for item in kept if item.get("role") == "assistant"]
    assert assistants and assistants[-1].get(USAGE_KEY) == usage
    for item in assistants:
        item.pop(USAGE_KEY, None)
    return kept


def summarize(outcome: AgentTurnOutcome) -> dict[str, Any]:
    """The comparable content of an outcome: items, tool calls with policies, usage (without
    its cost), and the reasoning text the call's item keeps."""
    usage = outcome.usage.as_dict()
    full_usage = dict(usage)
    usage.pop("cost_usd")
    if isinstance(outcome, ToolCallsRequested):
        items, _ = decode_run_state(outcome.framework_run_state)
        items = without_usage(items, full_usage)
        return {
            "kind": "tool_calls",
            "reasoning": kept_reasoning(items),
            "items": items,
            "tool_calls": [
                {
                    "id": call.tool_call_id,
                    "name": call.tool_name,
                    "arguments": call.arguments,
                    "effect": str(call.policy.effect),
                    "requires_approval": call.policy.is_approval_required,
                    **(
                        {"rejected_before_running": True}
                        if call.policy is REJECTED_CALL_POLICY
                        else {}
                    ),
                }
                for call in outcome.tool_calls
            ],
            "usage": usage,
        }
    assert isinstance(outcome, TurnCompleted)
    items = without_usage(
        [json.loads(json.dumps(message.framework_item)) for message in outcome.new_messages],
        full_usage,
    )
    return {
        "kind": "completed",
        "reasoning": kept_reasoning(items),
        "items": items,
        "usage": usage,
    }


def numbered_ids(summary: dict[str, Any]) -> dict[str, Any]:
    """``summary`` with its tool call IDs replaced by ``id_<n>`` in order of appearance, for
    providers whose calls get random IDs (LiteLLM gives Ollama's calls UUIDs)."""
    numbers: dict[str, str] = {}

    def number(value: str) -> str:
        return numbers.setdefault(value, f"id_{len(numbers) + 1}")

    items = json.loads(json.dumps(summary["items"]))
    for item in items:
        for call in item.get("tool_calls") or ():
            call["id"] = number(call["id"])
    numbered = {**summary, "items": items}
    if "tool_calls" in summary:
        dex_ids: dict[str, str] = {}
        numbered["tool_calls"] = [
            {**call, "id": dex_ids.setdefault(call["id"], f"id_{len(dex_ids) + 1}")}
            for call in summary["tool_calls"]
        ]
    return numbered


def check_expected(summary: dict[str, Any], expect: dict[str, Any]) -> None:
    if expect.get("random_ids"):
        summary = numbered_ids(summary)
    assert summary["kind"] == expect["kind"]
    assert summary["items"] == expect["items"]
    # The call's readable reasoning is kept with its item, as the Thinking panel showed it.
    assert summary["reasoning"] == (expect.get("reasoning_events", "").strip() or None)
    if expect["kind"] == "tool_calls":
        assert summary["tool_calls"] == expect["tool_calls"]
    expected_usage = dict(expect["usage"])
    if expected_usage.get("reasoning_tokens") == "litellm-estimate":
        # Anthropic reports no reasoning count; LiteLLM estimates one from the thinking text.
        assert summary["usage"]["reasoning_tokens"] > 0
        expected_usage["reasoning_tokens"] = summary["usage"]["reasoning_tokens"]
    assert summary["usage"] == expected_usage


def results_for(outcome: ToolCallsRequested) -> dict[str, AgentToolCall]:
    return {
        call.tool_call_id: AgentToolCall(
            tool_call_id=call.tool_call_id,
            tool_name=call.tool_name,
            arguments=call.arguments,
            effect=ToolEffect(call.policy.effect),
            requires_approval=False,
            status=ToolCallStatus.SUCCEEDED,
            deferral_order=order,
            turn_id="turn-2",
            output=f"result of {call.tool_call_id}",
        )
        for order, call in enumerate(outcome.tool_calls)
    }


def check_request(request: dict[str, Any], golden: dict[str, Any], expect: dict[str, Any]) -> None:
    assert request["path"] == golden["route"]
    body = request["body"]
    # The key reaches the provider only as a header; never the body.
    assert TEST_KEY not in json.dumps(body)
    assert TEST_KEY in " ".join(request["headers"].values())
    if "messages_tail" in expect:
        tail = expect["messages_tail"]
        assert body["messages"][-len(tail) :] == tail
    if "input_tail" in expect:
        tail = expect["input_tail"]
        assert body["input"][-len(tail) :] == tail
    for key in ("store", "include", "reasoning"):
        if key in expect:
            assert body[key] == expect[key]
    if golden["api"] == "responses":
        assert body["store"] is False


async def run_golden(
    golden: dict[str, Any], scripted: ScriptedProvider, base_url: str, *, stream: bool
) -> list[dict[str, Any]]:
    """Run every exchange of ``golden`` as consecutive model calls of one turn."""
    runner = LiteLLMRunner(_unused_resolver)
    config = config_for(golden, base_url, stream=stream)
    messages = [user_message(1, "Please search and write it down.", "turn-2")]
    run_state: str | None = None
    records: dict[str, AgentToolCall] = {}
    summaries = []
    for exchange in golden["exchanges"]:
        scripted.queue.append(exchange)
        events = RecordingEvents()
        turn = make_turn(config, messages, run_state=run_state, records=records, events=events)
        outcome = await runner.run_model_step(turn)
        summary = summarize(outcome)
        check_expected(summary, exchange["expect"])
        check_request(scripted.requests[-1], golden, exchange.get("expect_request", {}))
        assert scripted.requests[-1]["body"].get("stream", False) is stream
        if stream:
            assert "".join(events.text) == exchange["expect"]["text_events"]
            assert "".join(events.reasoning) == exchange["expect"]["reasoning_events"]
        summaries.append(numbered_ids(summary) if exchange["expect"].get("random_ids") else summary)
        if isinstance(outcome, ToolCallsRequested):
            run_state = outcome.framework_run_state
            records = {**records, **results_for(outcome)}
    return summaries


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[path.stem for path in GOLDEN_FILES])
async def test_streamed_and_whole_answers_give_the_same_turn(
    path: Path, provider: tuple[ScriptedProvider, str]
) -> None:
    scripted, base_url = provider
    golden = load(path)
    streamed = await run_golden(golden, scripted, base_url, stream=True)
    whole = await run_golden(golden, scripted, base_url, stream=False)
    assert streamed == whole


@pytest.mark.parametrize("path", GOLDEN_FILES, ids=[path.stem for path in GOLDEN_FILES])
async def test_a_500_fails_only_the_attempt_and_the_retry_succeeds(
    path: Path, provider: tuple[ScriptedProvider, str]
) -> None:
    scripted, base_url = provider
    golden = load(path)
    exchange = golden["exchanges"][0]
    runner = LiteLLMRunner(_unused_resolver)
    config = config_for(golden, base_url, stream=True)
    messages = [user_message(1, "Please search and write it down.", "turn-2")]
    scripted.queue.extend([None, exchange])
    with pytest.raises(Exception) as failed:
        await runner.run_model_step(make_turn(config, messages))
    # One HTTP request per attempt: LiteLLM's own retries are off, Dex owns retries.
    assert len(scripted.requests) == 1
    assert TEST_KEY not in str(failed.value)
    outcome = await runner.run_model_step(make_turn(config, messages))
    assert len(scripted.requests) == 2
    check_expected(summarize(outcome), exchange["expect"])


async def test_a_provider_error_that_echoes_the_key_is_redacted(
    provider: tuple[ScriptedProvider, str],
) -> None:
    scripted, base_url = provider
    golden = load(GOLDEN_DIR / "openai_chat_parallel_calls.json")
    config = config_for(golden, base_url, stream=True)
    runner = LiteLLMRunner(_unused_resolver)

    async def echo_key(request: Request) -> Response:
        # Some gateways quote the key they refused.
        scripted.requests.append({"path": request.url.path})
        return JSONResponse(
            {"error": {"message": f"Incorrect API key provided: {TEST_KEY}"}}, status_code=401
        )

    scripted.override = echo_key
    with pytest.raises(Exception) as failed:
        await runner.run_model_step(make_turn(config, [user_message(1, "hi", "turn-2")]))
    assert len(scripted.requests) == 1
    assert "[redacted]" in str(failed.value)
    assert TEST_KEY not in str(failed.value)
    assert TEST_KEY not in repr(failed.value)
    assert failed.value.__cause__ is None


async def test_text_is_flushed_within_a_second_while_the_stream_stalls(
    provider: tuple[ScriptedProvider, str],
) -> None:
    """A stalled stream still shows its text: the buffer's timer flushes after 1 s."""
    scripted, base_url = provider
    golden = load(GOLDEN_DIR / "openai_chat_parallel_calls.json")
    events = RecordingEvents()
    gate = threading.Event()
    first = golden["exchanges"][1]["stream"]

    async def stalled(request: Request) -> Response:
        scripted.requests.append({"path": request.url.path, "headers": {}, "body": {}})

        async def chunks() -> AsyncIterator[str]:
            for number, item in enumerate(first):
                if number == 2:
                    await wait_until("the test to release the stream", gate.is_set)
                data = item["data"]
                yield f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n"

        return StreamingResponse(chunks(), media_type="text/event-stream")

    scripted.override = stalled
    try:
        runner = LiteLLMRunner(_unused_resolver)
        config = config_for(golden, base_url, stream=True)
        turn = make_turn(config, [user_message(1, "hi", "turn-2")], events=events)
        step = asyncio.create_task(runner.run_model_step(turn))
        await wait_until("the first text delta", lambda: events.text, timeout=5)
        assert events.text == ["Found it and "]
        gate.set()
        outcome = await step
    finally:
        gate.set()
    assert isinstance(outcome, TurnCompleted)
    assert events.text == ["Found it and ", "saved notes."]


def test_every_case_the_issue_names_has_a_golden_file() -> None:
    names = {path.stem for path in GOLDEN_FILES}
    assert {
        "openai_chat_parallel_calls",
        "openai_chat_invalid_arguments",
        "openai_responses_reasoning_replay",
        "anthropic_thinking_tool_use",
        "local_server_shared_index",
        "local_server_id_less_parallel_calls",
        "ollama_chat_id_less_parallel_calls",
    } <= names
