"""LiteLLMRunner: pure logic directly, model and tool calls against the real demo processes.

The end-to-end run through the real Flow and engine lives with the coordinator's e2e tests.
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from agents_app.runner import (
    AgentConfigError,
    AgentModelConfig,
    LiteLLMRunner,
    ModelResponseError,
    TextDeltaBatcher,
    ToolCallAccumulator,
    build_model_input,
    decode_run_state,
    finalize_tool_calls,
    tool_call_delta,
)
from dex_agents import (
    AgentEventWriter,
    AgentMessage,
    AgentToolCall,
    AgentTurnContext,
    DeferredToolExecution,
    MessageRole,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    ToolExecutionError,
    ToolPolicy,
    ToolPolicyResolver,
    TurnCompleted,
)
from mcp_registry.client import McpClientPool, McpServerSpec
from tests.agents_app.test_demo_model import start_demo_model

REPO_ROOT = Path(__file__).resolve().parents[2]

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

    def write_text_delta(self, text: str) -> None:
        self.text.append(text)

    def write_reasoning_delta(self, text: str) -> None:
        self.reasoning.append(text)


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
            {"id": "call_1", "type": "function", "function": {"name": "x", "arguments": "{}"}},
            {"id": "call_2", "type": "function", "function": {"name": "x", "arguments": "{}"}},
        ],
    }
    run_state = json.dumps({"version": 1, "turn_items": [assistant_item]})
    records = {
        "call_1": record("call_1", ToolCallStatus.SUCCEEDED, output="three results"),
        "call_2": record("call_2", ToolCallStatus.REJECTED, rejection_message="not today"),
    }
    turn = make_turn(agent_config(), history(), run_state=run_state, records=records)
    messages, turn_items = build_model_input(AgentModelConfig.parse(agent_config()), turn)
    assert turn_items[0] == assistant_item
    assert turn_items[1] == {"role": "tool", "tool_call_id": "call_1", "content": "three results"}
    assert turn_items[2]["tool_call_id"] == "call_2"
    assert "not today" in turn_items[2]["content"]
    assert messages[-3:] == turn_items
    assert messages[3] == {"role": "user", "content": "search please"}


def test_run_state_that_does_not_end_with_a_tool_request_is_refused() -> None:
    run_state = json.dumps({"version": 1, "turn_items": [{"role": "assistant", "content": "x"}]})
    turn = make_turn(agent_config(), history(), run_state=run_state)
    with pytest.raises(ValueError):
        build_model_input(AgentModelConfig.parse(agent_config()), turn)
    with pytest.raises(ValueError):
        decode_run_state('{"turn_items": []}')


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


def test_accumulator_falls_back_to_id_then_to_the_latest_call() -> None:
    accumulator = ToolCallAccumulator()
    deltas: list[dict[str, str]] = [
        {"id": "call_a", "name": "t", "arguments": "{"},
        {"id": "call_b", "name": "u", "arguments": "["},
        {"id": "call_a", "arguments": "}"},
        {"arguments": "]"},
        {"name": "u"},
    ]
    for delta in deltas:
        accumulator.add(delta)
    assert accumulator.calls == [
        {"id": "call_a", "name": "t", "arguments": "{}"},
        {"id": "call_b", "name": "u", "arguments": "[]"},
    ]


def test_text_batcher_groups_tiny_chunks_and_flushes_the_rest() -> None:
    written: list[str] = []
    batcher = TextDeltaBatcher(written.append, min_chars=8, max_delay=3600)
    for piece in ["a", "b", "cdefgh", "ij", "k\n", "tail"]:
        batcher.add(piece)
    assert written == ["abcdefgh", "ijk\n"]
    batcher.flush()
    batcher.flush()
    assert written == ["abcdefgh", "ijk\n", "tail"]


def test_tool_call_delta_reads_objects_and_dicts() -> None:
    raw = {"index": 2, "id": "c", "function": {"name": "n", "arguments": "{}"}}
    assert tool_call_delta(raw) == {"index": 2, "id": "c", "name": "n", "arguments": "{}"}


def test_finalize_rejects_invalid_json_arguments() -> None:
    config = AgentModelConfig.parse(agent_config())
    merged = [{"id": "call_1", "name": "search__web_search", "arguments": '{"query": '}]
    with pytest.raises(ModelResponseError, match="invalid JSON"):
        finalize_tool_calls(merged, config, [])
    with pytest.raises(ModelResponseError, match="not a JSON object"):
        finalize_tool_calls([{**merged[0], "arguments": "[1]"}], config, [])


def test_finalize_rejects_unknown_tools() -> None:
    config = AgentModelConfig.parse(agent_config())
    with pytest.raises(ModelResponseError, match="unknown tool"):
        finalize_tool_calls([{"id": "c", "name": "other__tool", "arguments": "{}"}], config, [])


def test_finalize_makes_ids_usable_and_unique_within_the_turn() -> None:
    config = AgentModelConfig.parse(agent_config())
    earlier = [{"role": "assistant", "tool_calls": [{"id": "call_1"}]}]
    merged = [
        {"id": "call_1", "name": "search__web_search", "arguments": ""},
        {"id": "a/b", "name": "search__web_search", "arguments": "{}"},
        {"id": "", "name": "search__web_search", "arguments": "{}"},
    ]
    calls = finalize_tool_calls(merged, config, earlier)
    ids = [call["id"] for call in calls]
    assert ids[0] == "call_1_2"
    assert ids[1] == "a_b"
    assert ids[2] and "/" not in ids[2]
    assert len(set(ids) | {"call_1"}) == 4
    assert calls[0]["arguments"] == "{}"


def test_missing_agent_config_fails() -> None:
    with pytest.raises(AgentConfigError):
        AgentModelConfig.parse(None)


def test_api_key_comes_from_the_named_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    config = AgentModelConfig.parse(agent_config("http://x/v1", api_key_env="PROBE_MODEL_KEY"))
    monkeypatch.delenv("PROBE_MODEL_KEY", raising=False)
    with pytest.raises(AgentConfigError, match="PROBE_MODEL_KEY"):
        config.api_key()
    monkeypatch.setenv("PROBE_MODEL_KEY", "sk-test")
    assert config.api_key() == "sk-test"
    assert AgentModelConfig.parse(agent_config("http://x/v1")).api_key()


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
    assert [message.framework_item for message in outcome.new_messages] == [
        {"role": "assistant", "content": "You said: hello there"}
    ]
    assert outcome.new_messages[0].role is MessageRole.ASSISTANT
    assert len(events.text) > 1
    assert "".join(events.text) == "You said: hello there"
    assert outcome.usage.requests == 1
    assert outcome.usage.output_tokens > 0


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


async def test_invalid_json_arguments_fail_the_model_step(demo_api_base: str) -> None:
    runner = LiteLLMRunner(_unused_resolver)
    turn = make_turn(
        agent_config(demo_api_base),
        [user_message(1, '/tool search__web_search {"query": ', "turn-2")],
    )
    with pytest.raises(ModelResponseError, match="invalid JSON"):
        await runner.run_model_step(turn)


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
