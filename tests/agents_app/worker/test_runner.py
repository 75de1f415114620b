"""LiteLLMRunner: pure logic directly, model and tool calls against the real demo processes.

The end-to-end run through the real Flow and engine lives with the coordinator's e2e tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any, cast

import pytest

from agents_app.demo.script import FAIL_STATUSES
from agents_app.gateway import session_data
from agents_app.providers import LOCAL_SERVER_KEY, count_tokens, load_litellm
from agents_app.worker.agent_config import AgentConfigError, AgentModelConfig, AgentToolEntry
from agents_app.worker.model_input import (
    build_model_input,
    cut_tool_result,
    decode_run_state,
    encode_run_state,
    measure_context,
    summary_request_messages,
)
from agents_app.worker.model_replies import (
    ModelResponseError,
    openai_chunk_stream,
    read_chat_stream,
)
from agents_app.worker.model_requests import chat_message, responses_request
from agents_app.worker.provider_errors import ProviderCallError
from agents_app.worker.reply_deltas import (
    REASONING_KEPT_CHARS,
    DeltaBuffer,
    ReasoningDeltaBuffer,
    ToolCallAccumulator,
    tool_call_delta,
)
from agents_app.worker.runner import LiteLLMRunner
from agents_app.worker.tool_calls import REJECTED_CALL_POLICY, finalize_tool_calls
from dex_agents import (
    AgentEventWriter,
    AgentMessage,
    AgentToolCall,
    AgentTurnContext,
    ContextSummary,
    ContextWindowExceededError,
    DeferredToolExecution,
    MessageRole,
    ModelRateLimitError,
    SummarizeRequest,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    ToolExecutionError,
    ToolPolicy,
    ToolPolicyResolver,
    TurnCompleted,
    TurnMode,
)
from dex_agents import ModelCallError as DexModelCallError
from dex_agents.testing import wait_until
from mcp_registry.client import McpClientPool, McpServerSpec, McpTransportError
from tests.agents_app.demo.test_demo_model import start_demo_model
from tests.agents_app.failing_mcp_server import LOG_ENV as FAILING_LOG_ENV
from tests.agents_app.failing_mcp_server import SCRIPT as FAILING_SERVER
from tests.agents_app.failing_mcp_server import calls_count

REPO_ROOT = Path(__file__).resolve().parents[3]

SEARCH_TOOL = {
    "name": "search__web_search",
    "server": "search",
    "tool": "web_search",
    "description": "Search the web.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        "required": ["query"],
    },
    "effect": "read",
    "requires_approval": False,
}
SEARCH_SPEC = McpServerSpec(
    name="search",
    transport="stdio",
    command=sys.executable,
    args=("-m", "mcp_registry.demo_servers.search"),
    cwd=str(REPO_ROOT),
)


def agent_config(api_base: str | None = None, **overrides: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "agent": "demo",
        "model": "openai/dexagents-demo",
        "api_base": api_base,
        "api_key_env": None,
        "system_prompt": "You are the demo agent.",
        "tools": [SEARCH_TOOL],
    }
    config.update(overrides)
    return config


class RecordingEvents:
    """Stands in for AgentEventWriter; keeps the text deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.events: list[tuple[str, dict[str, Any]]] = []

    def write_text_delta(self, text: str) -> None:
        self.text.append(text)

    def write_reasoning_delta(self, text: str) -> None:
        self.reasoning.append(text)

    def write_event(self, event_type: str, payload: dict[str, Any]) -> None:
        self.events.append((str(event_type), payload))


async def _no_heartbeat() -> None:
    return None


def user_message(sequence: int, text: str, turn_id: str) -> AgentMessage:
    return AgentMessage(
        sequence=sequence,
        role=MessageRole.USER,
        text=text,
        framework_item={"role": "user", "content": text},
        turn_id=turn_id,
    )


def make_turn(
    config: dict[str, Any] | None,
    messages: list[AgentMessage],
    *,
    run_state: str | None = None,
    records: Mapping[str, AgentToolCall] | None = None,
    events: RecordingEvents | None = None,
    session_policies: Mapping[str, ToolPolicy] | None = None,
    summary: ContextSummary | None = None,
) -> AgentTurnContext:
    return AgentTurnContext(
        flow_id="session-1",
        turn_id="turn-2",
        attempt=1,
        messages=messages,
        framework_run_state=run_state,
        tool_calls=dict(records or {}),
        events=cast(AgentEventWriter, events or RecordingEvents()),
        policies=ToolPolicyResolver(
            session_policies=dict(session_policies or {}),
            flow_policies={},
            default_tool_effect=ToolEffect.UNCLASSIFIED,
        ),
        heartbeat_callback=_no_heartbeat,
        agent_config=config,
        summary=summary,
    )


def record(
    tool_call_id: str, status: ToolCallStatus, *, output: str | None = None, **extra: Any
) -> AgentToolCall:
    return AgentToolCall(
        tool_call_id=tool_call_id,
        tool_name="search__web_search",
        arguments="{}",
        effect=ToolEffect.READ,
        requires_approval=False,
        status=status,
        deferral_order=int(tool_call_id.rsplit("_", 1)[-1]),
        turn_id="turn-2",
        output=output,
        **extra,
    )


def history() -> list[AgentMessage]:
    """A first turn with one tool round, then this turn's user message."""
    items: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "You said: hi"},
    ]
    stored = [
        AgentMessage(
            sequence=number,
            role=MessageRole(item["role"]),
            text=item["content"],
            framework_item=item,
            turn_id="turn-1",
        )
        for number, item in enumerate(items, start=1)
    ]
    return [*stored, user_message(3, "search please", "turn-2")]


# Pure logic -----------------------------------------------------------------------------------


def test_build_user_message_is_a_chat_message() -> None:
    runner = LiteLLMRunner(_unused_resolver)
    message = runner.build_user_message("hello")
    assert message.role is MessageRole.USER
    assert message.framework_item == {"role": "user", "content": "hello"}
    assert message.text == "hello"


def test_first_call_input_is_system_prompt_then_stored_items() -> None:
    config = AgentModelConfig.parse(agent_config())
    messages, turn_items = build_model_input(config, make_turn(agent_config(), history()))
    assert messages == [
        {"role": "system", "content": "You are the demo agent."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "You said: hi"},
        {"role": "user", "content": "search please"},
    ]
    assert turn_items == []


def test_resumed_call_restores_the_turn_and_renders_each_final_record() -> None:
    assistant_item = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "prov/1", "type": "function", "function": {"name": "x", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "x", "arguments": "{}"}},
        ],
    }
    run_state = encode_run_state([assistant_item], ["prov_1", "call_2"])
    records = {
        "prov_1": record("prov_1", ToolCallStatus.SUCCEEDED, output="three results"),
        "call_2": record("call_2", ToolCallStatus.REJECTED, rejection_message="not today"),
    }
    turn = make_turn(agent_config(), history(), run_state=run_state, records=records)
    messages, turn_items = build_model_input(AgentModelConfig.parse(agent_config()), turn)
    assert turn_items[0] == assistant_item
    # The provider's own ID pairs the result with its call; the Dex ID found the record.
    assert turn_items[1] == {"role": "tool", "tool_call_id": "prov/1", "content": "three results"}
    assert turn_items[2]["tool_call_id"] == "call_2"
    assert "not today" in turn_items[2]["content"]
    assert messages[-3:] == turn_items
    assert messages[3] == {"role": "user", "content": "search please"}


def test_version_one_run_states_still_resume() -> None:
    assistant_item = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "x"}}],
    }
    items, ids = decode_run_state(json.dumps({"version": 1, "turn_items": [assistant_item]}))
    assert items == [assistant_item]
    assert ids == ["call_1"]


def test_run_state_that_does_not_end_with_a_tool_request_is_refused() -> None:
    run_state = json.dumps({"version": 2, "turn_items": [{"role": "assistant", "content": "x"}]})
    turn = make_turn(agent_config(), history(), run_state=run_state)
    with pytest.raises(ValueError):
        build_model_input(AgentModelConfig.parse(agent_config()), turn)
    with pytest.raises(ValueError):
        decode_run_state('{"turn_items": []}')


def test_chat_message_keeps_replay_keys_and_drops_responses_items() -> None:
    item = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "x", "arguments": "{}"},
                "provider_specific_fields": {"thought_signature": "sig"},
            }
        ],
        "thinking_blocks": [{"type": "thinking", "thinking": "t", "signature": "s"}],
        "reasoning_items": [{"id": "rs_1", "type": "reasoning", "summary": []}],
    }
    message = chat_message(item)
    assert "reasoning_items" not in message
    assert message["thinking_blocks"] == item["thinking_blocks"]
    assert message["tool_calls"][0]["provider_specific_fields"] == {"thought_signature": "sig"}
    assert chat_message({"role": "user", "content": "hi", "thinking_blocks": [{}]}) == {
        "role": "user",
        "content": "hi",
    }


def test_accumulator_merges_id_less_continuation_chunks_by_index() -> None:
    accumulator = ToolCallAccumulator()
    deltas: list[dict[str, Any]] = [
        {"index": 0, "id": "call_a", "name": "search__web_search", "arguments": ""},
        {"index": 1, "id": "call_b", "name": "search__web_search", "arguments": '{"q'},
        {"index": 0, "id": None, "name": None, "arguments": '{"query": '},
        {"index": 1, "arguments": '": 1}'},
        {"index": 0, "arguments": '"a"}'},
    ]
    for delta in deltas:
        accumulator.add(delta)
    assert accumulator.calls == [
        {"id": "call_a", "name": "search__web_search", "arguments": '{"query": "a"}'},
        {"id": "call_b", "name": "search__web_search", "arguments": '{"q": 1}'},
    ]


def test_accumulator_keeps_two_calls_that_share_an_index_apart() -> None:
    accumulator = ToolCallAccumulator()
    deltas: list[dict[str, Any]] = [
        {"index": 0, "id": "call_a", "name": "t", "arguments": '{"a"'},
        {"index": 0, "arguments": ": 1}"},
        {"index": 0, "id": "call_b", "name": "u", "arguments": ""},
        {"index": 0, "arguments": '{"b": 2}'},
        {"index": 0, "id": "call_a", "arguments": ""},
    ]
    for delta in deltas:
        accumulator.add(delta)
    assert accumulator.calls == [
        {"id": "call_a", "name": "t", "arguments": '{"a": 1}'},
        {"id": "call_b", "name": "u", "arguments": '{"b": 2}'},
    ]


def accumulated(deltas: list[dict[str, Any]]) -> ToolCallAccumulator:
    """A ``ToolCallAccumulator`` fed ``deltas`` in order."""
    accumulator = ToolCallAccumulator()
    for delta in deltas:
        accumulator.add(delta)
    return accumulator


def named_arguments(accumulator: ToolCallAccumulator) -> list[tuple[str, str]]:
    return [(call["name"], call["arguments"]) for call in accumulator.calls]


def test_accumulator_splits_id_less_calls_that_share_index_zero() -> None:
    # LiteLLM's ollama_chat and some OpenAI-compatible servers (issue 25): every call at index
    # 0, no id, each delta with its name. A new name after arguments began, or the same name
    # with arguments after a whole JSON value, start the next call; a name in pieces before any
    # argument, a repeated name without arguments, whitespace after the value and nameless
    # arguments after it (not JSON then: the model reads that error) do not.
    accumulator = accumulated([
        {"index": 0, "name": "srv__tool_a", "arguments": "{}"},
        {"index": 0, "name": "srv__tool_b", "arguments": "{}"},
        {"index": 0, "name": "srv__tool_b", "arguments": "{}"},
        {"index": 0, "name": "srv__", "arguments": ""},
        {"index": 0, "name": "tool_c", "arguments": '{"a": '},
        {"index": 0, "arguments": "[1, 2]}"},
        {"index": 0, "arguments": " \n"},
        {"index": 0, "arguments": '{"b": 1}'},
        {"index": 0, "name": "srv__tool_c", "provider_specific_fields": {"k": "v"}},
    ])
    assert named_arguments(accumulator) == [
        ("srv__tool_a", "{}"),
        ("srv__tool_b", "{}"),
        ("srv__tool_b", "{}"),
        ("srv__tool_c", '{"a": [1, 2]} \n{"b": 1}'),
    ]
    assert accumulator.calls[3]["provider_specific_fields"] == {"k": "v"}


def test_accumulator_splits_the_same_tool_named_again_before_its_argument_chunks() -> None:
    # OpenAI's chunk shape without ids: a name chunk with no arguments, then argument chunks;
    # the same tool twice. A name repeated with nothing after it stays one call.
    accumulator = accumulated([
        {"index": 0, "name": "srv__read", "arguments": ""},
        {"index": 0, "arguments": '{"p": 1}'},
        {"index": 0, "name": "srv__read", "arguments": ""},
        {"index": 0, "arguments": '{"p":'},
        {"index": 0, "arguments": " 2}"},
        {"index": 0, "name": "srv__read", "provider_specific_fields": {"k": "v"}},
    ])
    assert named_arguments(accumulator) == [
        ("srv__read", '{"p": 1}'),
        ("srv__read", '{"p": 2}'),
    ]
    assert accumulator.calls[1]["provider_specific_fields"] == {"k": "v"}


def test_accumulator_falls_back_to_id_then_to_the_latest_call() -> None:
    accumulator = ToolCallAccumulator()
    deltas: list[dict[str, Any]] = [
        {"id": "call_a", "name": "t", "arguments": "{"},
        {"id": "call_b", "name": "u", "arguments": "["},
        {"id": "call_a", "arguments": "}"},
        {"arguments": "]"},
        {"name": "u", "provider_specific_fields": {"thought_signature": "s"}},
    ]
    for delta in deltas:
        accumulator.add(delta)
    assert accumulator.calls == [
        {"id": "call_a", "name": "t", "arguments": "{}"},
        {
            "id": "call_b",
            "name": "u",
            "arguments": "[]",
            "provider_specific_fields": {"thought_signature": "s"},
        },
    ]


async def test_delta_buffer_flushes_at_the_size_limit_and_on_demand() -> None:
    written: list[str] = []
    buffer = DeltaBuffer(written.append, max_seconds=3600, max_bytes=8)
    for piece in ["a", "b", "cdefgh", "ij", "é"]:
        buffer.add(piece)
    assert written == ["abcdefgh"]
    buffer.add("k")  # "ijék" is 5 bytes
    assert written == ["abcdefgh"]
    buffer.flush()
    buffer.flush()
    assert written == ["abcdefgh", "ijék"]


async def test_delta_buffer_flushes_when_its_oldest_piece_is_due() -> None:
    written: list[str] = []
    buffer = DeltaBuffer(written.append, max_seconds=0.05)
    buffer.add("one ")
    buffer.add("two")
    assert written == []
    await wait_until("the timed flush", lambda: written == ["one two"], timeout=5)
    buffer.add("three")
    buffer.flush()
    assert written == ["one two", "three"]


async def test_reasoning_buffer_keeps_the_summary_and_how_long_the_call_reasoned() -> None:
    now = [100.0]
    written: list[str] = []
    buffer = ReasoningDeltaBuffer(written.append, started=100.0, clock=lambda: now[0])
    assert buffer.summary() is None
    buffer.add("")
    now[0] = 101.25
    buffer.add("  Thinking about: ")
    now[0] = 103.44
    buffer.add("cats  ")
    buffer.flush()
    assert written == ["  Thinking about: cats  "]  # the live panel gets every piece
    assert buffer.summary() == {"text": "Thinking about: cats", "seconds": 3.4}


async def test_reasoning_buffer_keeps_only_the_start_of_a_long_summary() -> None:
    buffer = ReasoningDeltaBuffer(lambda text: None, started=0.0, clock=lambda: 2.0)
    buffer.add("a" * (REASONING_KEPT_CHARS - 1))
    buffer.add("bcd")
    summary = buffer.summary()
    assert summary is not None
    assert summary["text"] == "a" * (REASONING_KEPT_CHARS - 1) + "b"
    assert summary["cut"] is True
    buffer.flush()


def test_a_stored_reasoning_summary_is_shown_but_never_sent_back_to_the_model() -> None:
    item = {
        "role": "assistant",
        "content": "Hi",
        "reasoning": {"text": "Thinking about: hi", "seconds": 1.5},
        "reasoning_items": [{"type": "reasoning", "encrypted_content": "opaque"}],
    }
    assert chat_message(item) == {"role": "assistant", "content": "Hi"}
    message = AgentMessage(
        sequence=2, role=MessageRole.ASSISTANT, text="Hi", framework_item=item, turn_id="turn-1"
    )
    data = session_data.message_to_data(message)
    assert data["reasoning"] == {"text": "Thinking about: hi", "seconds": 1.5}
    assert "opaque" not in repr(data)


def test_default_delta_buffer_limits_are_one_second_and_16_kib() -> None:
    buffer = DeltaBuffer(lambda text: None)
    assert buffer._max_seconds == 1.0
    assert buffer._max_bytes == 16 * 1024


def test_tool_call_delta_reads_objects_and_dicts() -> None:
    raw = {"index": 2, "id": "c", "function": {"name": "n", "arguments": "{}"}}
    assert tool_call_delta(raw) == {
        "index": 2,
        "id": "c",
        "name": "n",
        "arguments": "{}",
        "provider_specific_fields": None,
    }


def test_finalize_turns_invalid_json_into_a_tool_error() -> None:
    config = AgentModelConfig.parse(agent_config())
    merged = [
        {"id": "call_1", "name": "search__web_search", "arguments": '{"query": '},
        {"id": "call_2", "name": "search__web_search", "arguments": "[1]"},
        {"id": "call_3", "name": "search__web_search", "arguments": '{"query": "ok"}'},
    ]
    calls = finalize_tool_calls(merged, config, [])
    assert calls[0].error is not None and "not valid JSON" in calls[0].error
    assert calls[1].error is not None and "not a JSON object" in calls[1].error
    assert calls[2].error is None
    # The record keeps what the model sent; the history only ever holds JSON objects.
    assert [call.arguments for call in calls] == ['{"query": ', "[1]", '{"query": "ok"}']
    assert [call.history_arguments for call in calls] == ["{}", "{}", '{"query": "ok"}']


def test_finalize_turns_unknown_tools_into_a_tool_error() -> None:
    config = AgentModelConfig.parse(agent_config())
    [call] = finalize_tool_calls(
        [{"id": "c", "name": "other__tool", "arguments": "{}"}], config, []
    )
    assert call.error is not None and "not enabled" in call.error
    with pytest.raises(ModelResponseError, match="without a name"):
        finalize_tool_calls([{"id": "c", "name": "", "arguments": "{}"}], config, [])


def test_finalize_makes_ids_usable_and_unique_within_the_turn() -> None:
    config = AgentModelConfig.parse(agent_config())
    earlier = [{"role": "assistant", "tool_calls": [{"id": "call_1"}]}]
    merged = [
        {"id": "call_1", "name": "search__web_search", "arguments": ""},
        {"id": "a/b", "name": "search__web_search", "arguments": "{}"},
        {"id": "", "name": "search__web_search", "arguments": "{}"},
        {"id": "x__thought__" + "s/+=" * 40, "name": "search__web_search", "arguments": "{}"},
    ]
    calls = finalize_tool_calls(merged, config, earlier, used_dex_ids=["call_1"])
    provider_ids = [call.provider_id for call in calls]
    dex_ids = [call.dex_id for call in calls]
    # Provider IDs are replayed verbatim unless they repeat or are missing.
    assert provider_ids[1] == "a/b"
    assert provider_ids[3] == merged[3]["id"]
    assert len(set(provider_ids) | {"call_1"}) == 5
    assert all(dex_id and "/" not in dex_id and len(dex_id) <= 64 for dex_id in dex_ids)
    assert len(set(dex_ids) | {"call_1"}) == 5
    assert calls[0].arguments == "{}"


def test_missing_agent_config_fails() -> None:
    with pytest.raises(AgentConfigError):
        AgentModelConfig.parse(None)
    with pytest.raises(AgentConfigError, match="api"):
        AgentModelConfig.parse(agent_config(api="completions"))
    with pytest.raises(AgentConfigError, match="context_window"):
        AgentModelConfig.parse(agent_config(context_window=-1))


def test_api_is_responses_only_for_openai_models_without_an_api_base() -> None:
    assert AgentModelConfig.parse(agent_config(None, model="openai/gpt-5-mini")).api == "responses"
    assert AgentModelConfig.parse(agent_config("http://x/v1")).api == "chat"
    assert AgentModelConfig.parse(agent_config(None, model="anthropic/claude")).api == "chat"
    assert AgentModelConfig.parse(agent_config("http://x/v1", api="responses")).api == "responses"


def test_api_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    config = AgentModelConfig.parse(agent_config("http://x/v1", api_key_env="PROBE_MODEL_KEY"))
    monkeypatch.delenv("PROBE_MODEL_KEY", raising=False)
    with pytest.raises(AgentConfigError, match="PROBE_MODEL_KEY"):
        config.api_key()
    monkeypatch.setenv("PROBE_MODEL_KEY", "sk-test")
    assert config.api_key() == "sk-test"
    assert AgentModelConfig.parse(agent_config("http://x/v1")).api_key() == LOCAL_SERVER_KEY


def test_context_window_and_token_count_come_from_litellm() -> None:
    messages = [{"role": "user", "content": "hello there world"}]
    known = measure_context(
        AgentModelConfig.parse(agent_config(None, model="openai/gpt-4o")), messages
    )
    assert known.context_window is not None and known.context_window >= 100_000
    assert 0 < known.input_tokens < 20
    configured = measure_context(
        AgentModelConfig.parse(agent_config(context_window=4096)), messages
    )
    assert configured.context_window == 4096
    unknown = measure_context(AgentModelConfig.parse(agent_config()), messages)
    assert unknown.context_window is None
    assert unknown.input_tokens == known.input_tokens


# Against the real demo model ----------------------------------------------------------------


async def _unused_resolver(name: str) -> McpServerSpec:
    raise AssertionError(f"no tool call expected (server {name})")


@pytest.fixture(scope="module")
def demo_api_base() -> Iterator[str]:
    with start_demo_model() as base_url:
        yield f"{base_url}/v1"


async def test_echo_turn_completes_and_streams_text(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    events = RecordingEvents()
    turn = make_turn(
        agent_config(demo_api_base), [user_message(1, "hello there", "turn-2")], events=events
    )
    outcome = await runner.run_model_step(turn)
    assert isinstance(outcome, TurnCompleted)
    # The item keeps the usage of the call that produced it (issue 27), for display.
    assert [message.framework_item for message in outcome.new_messages] == [
        {
            "role": "assistant",
            "content": "You said: hello there",
            "usage": outcome.usage.as_dict(),
        }
    ]
    assert outcome.new_messages[0].role is MessageRole.ASSISTANT
    # A fast stream fits in one buffered write (1 s / 16 KiB), flushed before the Step returns.
    assert events.text == ["You said: hello there"]
    assert outcome.usage.requests == 1
    assert outcome.usage.output_tokens > 0


async def test_an_openai_stream_is_read_from_the_provider_as_litellm_reads_it(
    demo_api_base: str,
) -> None:
    """An ``openai/`` model's stream is read from the OpenAI SDK's own chunks (no LiteLLM
    chunk conversion, cost or success logging) and gives the reply LiteLLM's wrapper gives:
    text, tool calls and usage. A stream LiteLLM made up itself (``mock_response``) keeps
    the wrapper."""
    litellm = load_litellm()
    message = "/tool search__web_search {\"query\": \"a\"}\n/tool search__web_search {}\nhi"
    request: dict[str, Any] = {
        "model": "openai/dexagents-demo",
        "api_base": demo_api_base,
        "api_key": LOCAL_SERVER_KEY,
        "messages": [{"role": "user", "content": message}],
        "tools": [AgentToolEntry.from_config(SEARCH_TOOL).as_openai_tool()],
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    replies = []
    for raw in (True, False):
        response = await litellm.acompletion(**request)
        chunks = openai_chunk_stream(response)
        assert chunks is not None
        try:
            pieces: list[str] = []
            buffer = DeltaBuffer(pieces.append)
            reply = await read_chat_stream(chunks if raw else response, buffer, buffer)
            buffer.flush()
        finally:
            await response.aclose()
        replies.append((reply, "".join(pieces)))
    (direct, direct_text), (wrapped, wrapped_text) = replies
    assert direct.tool_calls == wrapped.tool_calls and len(direct.tool_calls) == 2
    assert direct.text == wrapped.text and direct_text == wrapped_text
    assert direct.usage == wrapped.usage and direct.usage.output_tokens > 0
    mocked = await litellm.acompletion(
        model="openai/dexagents-demo", messages=[{"role": "user", "content": "x"}],
        stream=True, mock_response="ok",
    )
    assert openai_chunk_stream(mocked) is None
    await mocked.aclose()


async def test_tool_round_trip_through_the_demo_model(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base)
    script = (
        '/tool search__web_search {"query": "durable agents"}\n'
        '/tool search__web_search {"query": "dex", "limit": 1}'
    )
    messages = [user_message(1, script, "turn-2")]
    requested = await runner.run_model_step(make_turn(config, messages))
    assert isinstance(requested, ToolCallsRequested)
    assert [call.tool_call_id for call in requested.tool_calls] == ["call_1", "call_2"]
    assert [json.loads(call.arguments) for call in requested.tool_calls] == [
        {"query": "durable agents"},
        {"query": "dex", "limit": 1},
    ]
    assert all(call.policy == ToolPolicy(ToolEffect.READ) for call in requested.tool_calls)
    assert requested.usage.requests == 1 and requested.usage.input_tokens > 0

    records = {
        "call_1": record("call_1", ToolCallStatus.SUCCEEDED, output="ALPHA result text"),
        "call_2": record("call_2", ToolCallStatus.FAILED, error="quota exceeded"),
    }
    events = RecordingEvents()
    completed = await runner.run_model_step(
        make_turn(
            config,
            messages,
            run_state=requested.framework_run_state,
            records=records,
            events=events,
        )
    )
    assert isinstance(completed, TurnCompleted)
    items = [message.framework_item for message in completed.new_messages]
    assert [item["role"] for item in items] == ["assistant", "tool", "tool", "assistant"]
    assert [call["id"] for call in items[0]["tool_calls"]] == ["call_1", "call_2"]
    assert items[1] == {"role": "tool", "tool_call_id": "call_1", "content": "ALPHA result text"}
    assert "quota exceeded" in items[2]["content"]
    assert "ALPHA result text" in items[3]["content"]
    assert "quota exceeded" in items[3]["content"]
    assert "".join(events.text) == items[3]["content"]


async def test_parallel_large_results_share_the_window(demo_api_base: str) -> None:
    """Issue 25: with an 8,000-token window, four parallel 300 KB results were each cut to a
    quarter of the window; together with the rest of the input the provider refused the call
    (here the demo model's ``/context 8000``). Cut together, they fit, each shows its start
    and says how much was left out, and a short result keeps all of its text."""
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base, context_window=8000)
    script = "/context 8000\n" + "\n".join(
        f'/tool search__web_search {{"query": "q{number}"}}' for number in range(1, 6)
    )
    messages = [user_message(1, script, "turn-2")]
    requested = await runner.run_model_step(make_turn(config, messages))
    assert isinstance(requested, ToolCallsRequested) and len(requested.tool_calls) == 5
    big = " ".join(f"w{n % 10}" for n in range(100_000))  # 300 KB, a token a word
    records = {
        call.tool_call_id: record(
            call.tool_call_id, ToolCallStatus.SUCCEEDED,
            output="short result" if number == 5 else f"RESULT{number} " + big,
        )
        for number, call in enumerate(requested.tool_calls, start=1)
    }
    turn = make_turn(config, messages, run_state=requested.framework_run_state, records=records)
    model_input, _ = build_model_input(runner._config(config), turn)
    results = [item["content"] for item in model_input if item.get("role") == "tool"]
    assert results[-1] == "short result"
    for number, text in enumerate(results[:4], start=1):
        assert text.startswith(f"RESULT{number} w0 w1")
        assert "more characters of this tool result are not shown" in text
    assert len({len(text) for text in results[:4]}) == 1  # equal shares
    completed = await runner.run_model_step(turn)
    assert isinstance(completed, TurnCompleted)


async def test_a_window_a_refusal_names_is_used_until_the_agent_changes(
    demo_api_base: str,
) -> None:
    """Issue 25: the agent says 9,000 tokens but the server serves 300 (the demo model's
    ``/context 300``). Every turn used to send the full input, be refused, then compact. The
    window the refusal names is remembered for that model, server and configured window, so
    the session compacts before its next call; a changed agent definition starts afresh."""
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base, context_window=9000)
    assert runner.context_window(config) == 9000
    long_message = "/context 300\n" + "word " * 400
    with pytest.raises(ContextWindowExceededError, match="maximum context length is 300"):
        await runner.run_model_step(make_turn(config, [user_message(1, long_message, "turn-2")]))
    assert runner.context_window(config) == 300
    assert runner._config(config).tool_result_limit() == 1000  # follows the smaller window
    assert runner.context_window({**config, "context_window": 9001}) == 9001
    assert runner.context_window({**config, "model": "openai/other-model"}) == 9000
    assert runner.context_window({**config, "api_base": demo_api_base + "/other"}) == 9000


async def test_a_refusal_that_teaches_a_smaller_window_lets_the_next_attempt_fit(
    demo_api_base: str,
) -> None:
    """The agent says 9,500 tokens, the server serves 1,200: the first call with this turn's
    tool results (cut for 9,500) is refused, and the refusal's window is learned. Nothing
    earlier can be compacted in a first turn, so the error says ``retry_may_fit`` (RunModel
    retries the attempt instead of failing the turn); the retry cuts the results for 1,200 and
    is answered. A refusal that teaches nothing new does not say so."""
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base, context_window=9500)
    script = "/context 1200\n" + "\n".join(
        f'/tool search__web_search {{"query": "q{number}"}}' for number in range(1, 4)
    )
    messages = [user_message(1, script, "turn-2")]
    requested = await runner.run_model_step(make_turn(config, messages))
    assert isinstance(requested, ToolCallsRequested)
    words = " ".join(f"w{n % 10}" for n in range(3000))
    records = {
        call.tool_call_id: record(call.tool_call_id, ToolCallStatus.SUCCEEDED, output=words)
        for call in requested.tool_calls
    }
    turn = make_turn(config, messages, run_state=requested.framework_run_state, records=records)
    with pytest.raises(ContextWindowExceededError) as refused:
        await runner.run_model_step(turn)
    assert refused.value.retry_may_fit is True
    assert isinstance(await runner.run_model_step(turn), TurnCompleted)

    too_long = [user_message(1, "/context 1200\n" + "word " * 2000, "turn-2")]
    with pytest.raises(ContextWindowExceededError) as again:
        await runner.run_model_step(make_turn(config, too_long))
    assert again.value.retry_may_fit is False


async def test_session_policy_wins_over_the_tool_effect(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    strict = ToolPolicy(ToolEffect.READ, requires_approval=True)
    turn = make_turn(
        agent_config(demo_api_base),
        [user_message(1, '/tool search__web_search {"query": "x"}', "turn-2")],
        session_policies={"search__web_search": strict},
    )
    outcome = await runner.run_model_step(turn)
    assert isinstance(outcome, ToolCallsRequested)
    assert outcome.tool_calls[0].policy == strict


async def test_invalid_json_arguments_become_a_tool_error_not_a_broken_history(
    demo_api_base: str,
) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base)
    script = '/tool search__web_search {"query": \n/tool search__web_search {"query": "ok"}'
    outcome = await runner.run_model_step(make_turn(config, [user_message(1, script, "turn-2")]))
    assert isinstance(outcome, ToolCallsRequested)
    bad, good = outcome.tool_calls
    assert bad.arguments == '{"query":'
    assert bad.policy == REJECTED_CALL_POLICY
    assert good.policy == ToolPolicy(ToolEffect.READ)
    items, _ = decode_run_state(outcome.framework_run_state)
    stored_arguments = [call["function"]["arguments"] for call in items[-1]["tool_calls"]]
    assert stored_arguments == ["{}", '{"query": "ok"}']

    record_ = AgentToolCall(
        tool_call_id=bad.tool_call_id,
        tool_name=bad.tool_name,
        arguments=bad.arguments,
        effect=ToolEffect.READ,
        requires_approval=False,
        status=ToolCallStatus.PENDING,
        deferral_order=0,
        turn_id="turn-2",
    )
    with pytest.raises(ToolExecutionError, match="not valid JSON"):
        await runner.execute_deferred_tool_call(
            DeferredToolExecution(
                flow_id="session-1",
                tool_call=record_,
                idempotency_key="session-1/turn-2/call_1",
                attempt=1,
                events=cast(AgentEventWriter, RecordingEvents()),
                heartbeat_callback=_no_heartbeat,
                agent_config=config,
            )
        )


async def test_responses_api_streams_reasoning_and_replays_its_items(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base, api="responses")
    script = '/think\nfind it\n/tool search__web_search {"query": "dex"}'
    messages = [user_message(1, script, "turn-2")]
    events = RecordingEvents()
    requested = await runner.run_model_step(make_turn(config, messages, events=events))
    assert isinstance(requested, ToolCallsRequested)
    assert "".join(events.reasoning) == "Thinking about: find it"
    assert requested.usage.reasoning_tokens == 4
    items, _ = decode_run_state(requested.framework_run_state)
    [reasoning] = items[-1]["reasoning_items"]
    assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]

    records = {"call_1": record("call_1", ToolCallStatus.SUCCEEDED, output="DEX result")}
    completed = await runner.run_model_step(
        make_turn(config, messages, run_state=requested.framework_run_state, records=records)
    )
    assert isinstance(completed, TurnCompleted)
    first = completed.new_messages[0].framework_item
    assert first["reasoning_items"] == [reasoning]
    assert "DEX result" in completed.new_messages[-1].text


async def test_scripted_failures_fail_the_attempt_then_succeed(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    turn = make_turn(agent_config(demo_api_base), [user_message(1, "/fail 1\nagain", "turn-2")])
    with pytest.raises(Exception, match=r"500|scripted to fail"):
        await runner.run_model_step(turn)
    outcome = await runner.run_model_step(turn)
    assert isinstance(outcome, TurnCompleted)
    assert outcome.new_messages[0].text == "You said: again"


@pytest.mark.parametrize("api", ["chat", "responses"])
@pytest.mark.parametrize("status", [400, 401, 403, 404])
async def test_a_provider_refusal_is_a_model_call_error(
    demo_api_base: str, status: int, api: str
) -> None:
    """Issue 25: a request the provider refused (it would refuse it again) raises
    ``dex_agents.ModelCallError`` with the provider's words, which RunModel does not retry."""
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(demo_api_base, api=api)
    turn = make_turn(config, [user_message(1, f"/fail 1 {status}\nagain", "turn-2")])
    with pytest.raises(DexModelCallError) as refused:
        await runner.run_model_step(turn)
    message = refused.value.message
    assert message.startswith(f"The model provider refused the request (HTTP {status}): ")
    assert FAIL_STATUSES[status][1].split(" (")[0] in message
    assert "litellm." not in message and "Exception - " not in message  # the provider's words
    assert len(message) <= 1100


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_a_server_error_fails_only_the_attempt(demo_api_base: str, status: int) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    turn = make_turn(agent_config(demo_api_base),
                     [user_message(1, f"/fail 1 {status}\nagain", "turn-2")])
    with pytest.raises(ProviderCallError) as failed:
        await runner.run_model_step(turn)
    # Retried; after the last attempt this is the turn's last_turn_error, in plain words.
    assert str(failed.value).startswith(f"The model provider failed (HTTP {status}): ")
    assert FAIL_STATUSES[status][1].split(" (")[0] in str(failed.value)
    assert "litellm." not in str(failed.value)
    outcome = await runner.run_model_step(turn)
    assert isinstance(outcome, TurnCompleted)


async def test_a_rate_limit_with_retry_after_asks_dex_to_wait(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    turn = make_turn(agent_config(demo_api_base), [user_message(1, "/fail 1 429\nagain", "turn-2")])
    with pytest.raises(ModelRateLimitError) as limited:
        await runner.run_model_step(turn)
    assert limited.value.retry_after_seconds == 1
    assert "Rate limit reached" in str(limited.value)
    outcome = await runner.run_model_step(turn)
    assert isinstance(outcome, TurnCompleted)


# Tool execution against the real search MCP server ------------------------------------------


@pytest.fixture
async def search_runner() -> AsyncIterator[LiteLLMRunner]:
    resolved: list[str] = []

    async def resolver(name: str) -> McpServerSpec:
        resolved.append(name)
        assert name == "search"
        return SEARCH_SPEC

    runner = LiteLLMRunner(resolver, pool=McpClientPool())
    try:
        yield runner
    finally:
        await runner.aclose()


def execution(tool_name: str, arguments: str) -> DeferredToolExecution:
    return DeferredToolExecution(
        flow_id="session-1",
        tool_call=AgentToolCall(
            tool_call_id="call_1",
            tool_name=tool_name,
            arguments=arguments,
            effect=ToolEffect.READ,
            requires_approval=False,
            status=ToolCallStatus.PENDING,
            deferral_order=0,
            turn_id="turn-2",
        ),
        idempotency_key="session-1/turn-2/call_1",
        attempt=1,
        events=cast(AgentEventWriter, RecordingEvents()),
        heartbeat_callback=_no_heartbeat,
        agent_config=agent_config(),
    )


async def test_deferred_call_runs_the_mcp_tool(search_runner: LiteLLMRunner) -> None:
    result = await search_runner.execute_deferred_tool_call(
        execution("search__web_search", '{"query": "durable agents"}')
    )
    assert '"durable agents"' in result.output


async def test_mcp_tool_error_becomes_a_tool_execution_error(
    search_runner: LiteLLMRunner,
) -> None:
    with pytest.raises(ToolExecutionError) as raised:
        await search_runner.execute_deferred_tool_call(
            execution("search__web_search", '{"limit": 2}')
        )
    assert "query" in raised.value.message


async def test_unknown_tool_becomes_a_tool_execution_error(
    search_runner: LiteLLMRunner,
) -> None:
    with pytest.raises(ToolExecutionError, match="not enabled"):
        await search_runner.execute_deferred_tool_call(execution("search__delete_all", "{}"))


@pytest.mark.parametrize(
    ("value", "expected"),
    [(5, 5.0), (2.5, 2.5), (None, None), ("5", None), (True, None), (0, None), (-1, None)],
)
def test_a_tool_entry_takes_a_positive_timeout_from_the_snapshot(
    value: object, expected: float | None
) -> None:
    item = {**SEARCH_TOOL, "timeout_seconds": value}
    assert AgentToolEntry.from_config(item).timeout_seconds == expected
    assert AgentToolEntry.from_config(SEARCH_TOOL).timeout_seconds is None  # older snapshots


async def test_a_tools_timeout_bounds_its_mcp_request_not_the_servers_call_timeout(
    tmp_path: Path,
) -> None:
    """Issue 23: the snapshot's ``timeout_seconds`` reaches ``McpClientPool.call_tool``; the
    server allows 600 s, so only the tool's 1 s ends the hanging call within the deadline."""
    log = tmp_path / "calls.log"
    spec = McpServerSpec(
        name="failing",
        transport="stdio",
        command=sys.executable,
        args=(str(FAILING_SERVER),),
        env={FAILING_LOG_ENV: str(log)},
        call_timeout=600.0,
    )

    async def resolver(name: str) -> McpServerSpec:
        return spec

    hang = {
        "name": "failing__hang", "server": "failing", "tool": "hang", "effect": "read",
        "requires_approval": False, "timeout_seconds": 1,
    }
    call = dataclasses.replace(
        execution("failing__hang", "{}"), agent_config=agent_config(tools=[hang])
    )
    runner = LiteLLMRunner(resolver, pool=McpClientPool())
    try:
        with pytest.raises(McpTransportError, match="did not answer the call to tool 'hang'"):
            await asyncio.wait_for(runner.execute_deferred_tool_call(call), timeout=60)
    finally:
        await runner.aclose()
    assert calls_count(log, "hang") == 1


def test_responses_requests_are_stateless_and_ask_for_reasoning_only_where_supported() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    reasoning_model = AgentModelConfig.parse(agent_config(None, model="openai/gpt-5-mini"))
    request = responses_request(reasoning_model, messages)
    assert request["store"] is False
    assert request["instructions"] == "Be brief."
    assert request["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert request["reasoning"] == {"summary": "auto"}
    assert request["include"] == ["reasoning.encrypted_content"]
    plain_model = AgentModelConfig.parse(agent_config(None, model="openai/gpt-4.1"))
    plain = responses_request(plain_model, messages)
    assert "reasoning" not in plain and "include" not in plain


# Demo slack and docs servers: progress and logs as events, resources and prompts as built-ins --


def _demo_spec(name: str, var_dir: Path) -> McpServerSpec:
    return McpServerSpec(
        name=name,
        transport="stdio",
        command=sys.executable,
        args=("-m", f"mcp_registry.demo_servers.{name}"),
        cwd=str(REPO_ROOT),
        env_names=("DEXAGENTS_VAR_DIR",),
    )


@pytest.fixture
async def demo_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[LiteLLMRunner]:
    monkeypatch.setenv("DEXAGENTS_VAR_DIR", str(tmp_path))

    async def resolver(name: str) -> McpServerSpec:
        return _demo_spec(name, tmp_path)

    runner = LiteLLMRunner(resolver, pool=McpClientPool())
    try:
        yield runner
    finally:
        await runner.aclose()


def _demo_execution(tool_name: str, arguments: dict[str, Any]) -> DeferredToolExecution:
    slack_tool = {
        "name": "slack__post_message", "server": "slack", "tool": "post_message",
        "description": "Post a message.", "effect": "non_idempotent_write",
        "requires_approval": True,
        "parameters": {"type": "object", "properties": {"channel": {"type": "string"},
                                                        "text": {"type": "string"}}},
    }
    docs_tool = {**SEARCH_TOOL, "name": "docs__search_documents", "server": "docs",
                 "tool": "search_documents"}
    call = execution(tool_name, json.dumps(arguments))
    return dataclasses.replace(call, agent_config=agent_config(tools=[slack_tool, docs_tool]))


async def test_tool_progress_and_server_logs_become_agent_events(
    demo_runner: LiteLLMRunner,
) -> None:
    call = _demo_execution("slack__post_message", {"channel": "general", "text": "hello"})
    result = await demo_runner.execute_deferred_tool_call(call)
    # The structured content adds the time and author to "Posted p-1 to #general", so the
    # model gets it alone, once (mcp_registry.client.McpToolOutput.for_model).
    posted = json.loads(result.output)
    assert (posted["id"], posted["channel"], posted["user"]) == ("p-1", "general", "dexagents")
    events = cast(RecordingEvents, call.events).events
    progress = [payload for kind, payload in events if kind == "tool_progress"]
    assert [(item["progress"], item["total"]) for item in progress] == [(1, 2), (2, 2)]
    assert all(item["tool_name"] == "slack__post_message" for item in progress)
    logs = [payload for kind, payload in events if kind == "tool_log"]
    assert logs and logs[0]["level"] == "info" and "posted p-1" in str(logs[0]["data"])


def test_builtin_resource_and_prompt_tools_are_offered_for_the_agents_servers() -> None:
    config = AgentModelConfig.parse(_demo_execution("x", {}).agent_config)
    builtins = {entry.name: entry for entry in config.tools if entry.builtin}
    session_builtins = {"durable_wait", "request_user_input", "write_todos"}
    assert set(builtins) == {"mcp_list_resources", "mcp_read_resource",
                             "mcp_list_resource_templates", "mcp_list_prompts", "mcp_get_prompt",
                             *session_builtins}
    assert all(entry.effect == ToolEffect.READ and entry.requires_approval is False
               for entry in builtins.values())
    server_enum = builtins["mcp_list_prompts"].parameters["properties"]["server"]["enum"]
    assert server_enum == ["docs", "slack"]
    # An agent without servers is still offered the tools the session runs itself.
    without_servers = AgentModelConfig.parse(agent_config(tools=[])).tools
    assert {entry.name for entry in without_servers} == session_builtins


async def test_builtin_prompt_tools_run_through_the_pool(demo_runner: LiteLLMRunner) -> None:
    listed = await demo_runner.execute_deferred_tool_call(
        _demo_execution("mcp_list_prompts", {"server": "docs"}))
    assert "summarize_document" in listed.output
    with pytest.raises(ToolExecutionError):
        await demo_runner.execute_deferred_tool_call(
            _demo_execution("mcp_list_prompts", {"server": "search"}))


def test_the_turn_mode_decides_which_tools_a_model_call_is_offered() -> None:
    config = AgentModelConfig.parse(agent_config(tools=[SEARCH_TOOL]))
    names = {mode: {entry.name for entry in config.for_turn_mode(mode).tools} for mode in TurnMode}
    assert names[TurnMode.PLANNING] == {"write_todos"}
    assert "write_todos" in names[TurnMode.EXECUTING]
    assert SEARCH_TOOL["name"] in names[TurnMode.EXECUTING]
    assert names[TurnMode.CHAT] == names[TurnMode.EXECUTING] - {"write_todos"}


# Context compaction (dex_agents.CompactingRunner) ------------------------------------------------


def test_the_summary_follows_the_system_prompt_and_long_tool_results_are_cut() -> None:
    summary = ContextSummary(generation=1, through_sequence=4, text="The user likes tea.")
    assistant_item = {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c_1", "type": "function", "function": {"name": "x"}}],
    }
    run_state = encode_run_state([assistant_item], ["c_1"])
    records = {"c_1": record("c_1", ToolCallStatus.SUCCEEDED, output="y" * 5000)}
    config = agent_config(tool_result_max_chars=1000)
    turn = make_turn(config, history(), run_state=run_state, records=records, summary=summary)
    messages, turn_items = build_model_input(AgentModelConfig.parse(config), turn)
    assert messages[0]["content"] == "You are the demo agent."
    assert messages[1]["role"] == "system"
    assert messages[1]["content"].endswith("The user likes tea.")
    assert "messages 1 to 4" in messages[1]["content"]
    shown = messages[-1]["content"]
    assert shown.startswith("y" * 1000) and "4000 more characters" in shown
    assert turn_items[-1]["content"] == "y" * 5000  # the run state keeps the whole result
    assert cut_tool_result({"role": "user", "content": "z" * 5000}, 10)["content"] == "z" * 5000


def test_tool_result_limit_follows_the_window() -> None:
    assert AgentModelConfig.parse(agent_config()).tool_result_limit() == 100_000
    assert AgentModelConfig.parse(agent_config(context_window=4000)).tool_result_limit() == 4000
    assert AgentModelConfig.parse(agent_config(tool_result_max_chars=7)).tool_result_limit() == 7
    with pytest.raises(AgentConfigError, match="tool_result_max_chars"):
        AgentModelConfig.parse(agent_config(tool_result_max_chars=0))


def test_token_counts_cover_the_whole_input_and_each_message() -> None:
    runner = LiteLLMRunner(_unused_resolver)
    config = agent_config(context_window=4000, tool_result_max_chars=400)
    assert runner.context_window(config) == 4000
    assert runner.context_window(agent_config()) is None
    big = AgentMessage(5, MessageRole.TOOL, "", {"role": "tool", "content": "w " * 5000}, "t")
    small = AgentMessage(6, MessageRole.TOOL, "", {"role": "tool", "content": "w " * 100}, "t")
    assert runner.count_message_tokens(big, config) < runner.count_message_tokens(
        big, agent_config()
    )
    assert runner.count_message_tokens(small, config) > 50
    plain = runner.count_input_tokens(make_turn(config, history()))
    summarized = runner.count_input_tokens(
        make_turn(config, history(), summary=ContextSummary(1, 2, "a summary " * 50))
    )
    assert summarized > plain + 50


def test_summarizer_input_is_cut_to_its_budget() -> None:
    items = [{"role": "user", "content": "long " * 4000}, {"role": "assistant", "content": "ok"}]
    unbounded = summary_request_messages("openai/dexagents-demo", "", items, [1, 2], 100_000)
    assert "long " * 3000 in unbounded[1]["content"]
    bounded = summary_request_messages("openai/dexagents-demo", "", items, [1, 2], 600)
    assert count_tokens("openai/dexagents-demo", bounded) <= 600
    assert "[user #1]" in bounded[1]["content"] and "[assistant #2]\nok" in bounded[1]["content"]


async def test_summarize_and_context_window_errors_through_the_demo_model(
    demo_api_base: str,
) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    config = {
        **agent_config(demo_api_base),
        "input_price_per_mtok": "2",
        "output_price_per_mtok": "8",
    }
    request = SummarizeRequest(
        flow_id="session-1",
        previous_summary="user #1: hello",
        messages=[user_message(2, "book the table for four", "turn-1")],
        agent_config=config,
        input_budget_tokens=2000,
        summary_budget_tokens=300,
        attempt=1,
        heartbeat_callback=_no_heartbeat,
    )
    result = await runner.summarize(request)
    assert result.text == "user #1: hello\nuser #2: book the table for four"
    # The summarizer's call is priced like a turn's (issue 27): the agent's prices, its tokens.
    usage = result.usage
    assert usage is not None and usage.requests == 1
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert Decimal(usage.cost_usd) == (
        usage.input_tokens * 2 + usage.output_tokens * 8
    ) / Decimal(1_000_000)

    turn = make_turn(config, [user_message(1, "/context 3\nfar too many words here", "turn-2")])
    with pytest.raises(ContextWindowExceededError, match="maximum context length"):
        await runner.run_model_step(turn)



STUB_SERVER = Path(__file__).resolve().parents[2] / "mcp_registry" / "stub_server.py"


def test_a_stored_tool_result_is_bounded_with_a_note() -> None:
    from agents_app.worker.tool_execution import stored_text

    assert stored_text("short") == "short"
    assert stored_text("é" * 100, limit=602) == "é" * 100  # "\u00e9" x 100 and two quotes
    # 6,002 bytes of JSON: 88 are left for text besides the note, so 14 characters fit.
    cut = stored_text("é" * 1000, limit=600)
    assert cut.startswith("é" * 14 + "\n\n[dexagents] The result was cut to its first 14 of ")
    assert "1,000 characters (600 bytes of JSON) to fit the session's storage" in cut
    emoji = stored_text("😀" * 100_000, limit=64 * 1024)  # 12 bytes of JSON each
    assert len(json.dumps(emoji)) <= 64 * 1024 and emoji.startswith("😀" * 5000)


async def test_a_huge_mcp_result_is_recorded_cut_and_kept_whole_apart(tmp_path: Path) -> None:
    """A 3 MB result (and the model's echo of it) once left the session past what one Dex
    read can load: unreadable, stuck. The record keeps at most 1 MiB of it for the model, and
    the whole text goes to the session as ``full_text`` (stored in parts)."""
    from agents_app.worker.tool_execution import TOOL_RESULT_MAX_STORED_BYTES

    spec = McpServerSpec(
        name="stub", transport="stdio", command=sys.executable,
        args=(str(STUB_SERVER), "--pad", "3000000"), call_timeout=60.0,
    )

    async def resolver(name: str) -> McpServerSpec:
        return spec

    echo = {"name": "stub__echo", "server": "stub", "tool": "echo", "effect": "read",
            "requires_approval": False}
    call = dataclasses.replace(
        execution("stub__echo", '{"text": "hi"}'), agent_config=agent_config(tools=[echo])
    )
    runner = LiteLLMRunner(resolver, pool=McpClientPool())
    try:
        result = await runner.execute_deferred_tool_call(call)
    finally:
        await runner.aclose()
    assert len(result.output.encode()) < TOOL_RESULT_MAX_STORED_BYTES + 500
    assert result.output.startswith("hi...")
    kept = TOOL_RESULT_MAX_STORED_BYTES - 512 - 2  # ASCII: one byte each, and two quotes
    assert f"cut to its first {kept:,} of 3,000,002 characters" in result.output
    assert result.full_text is not None and len(result.full_text) == 3_000_002
    assert result.full_text.startswith("hi...")
    assert result.output.startswith(result.full_text[:kept])
