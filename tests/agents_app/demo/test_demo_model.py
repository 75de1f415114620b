"""The demo model as a real process on a free port, called over HTTP through LiteLLM."""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")

import base64
import hashlib
import json
import selectors
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import litellm
import pytest

from agents_app.demo.model_server import READY_LINE_PREFIX
from agents_app.demo.openai_wire import responses_messages, split_text
from agents_app.demo.script import SUMMARY_REQUEST_PREFIX, big_text, plan_reply
from agents_app.worker.model_input import SUMMARY_INSTRUCTIONS, summary_request_messages

REPO_ROOT = Path(__file__).resolve().parents[3]
STARTUP_DEADLINE_SECONDS = 30.0
MODEL = "openai/dexagents-demo"

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search__web_search",
        "description": "Search the web.",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}},
            "required": ["query"],
        },
    },
}
TWO_CALL_SCRIPT = (
    'Please look these up.\n/tool search__web_search {"query": "durable agents"}\n'
    '/tool search__web_search {"query": "dex engine", "limit": 2}'
)


def _read_ready_line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + STARTUP_DEADLINE_SECONDS
    try:
        while (remaining := deadline - time.monotonic()) > 0:
            if not selector.select(remaining):
                continue
            line = process.stdout.readline()
            if not line:
                raise AssertionError(f"demo model exited early with code {process.wait()}")
            if line.startswith(READY_LINE_PREFIX):
                return line.strip()
    finally:
        selector.close()
    raise AssertionError("demo model printed no ready line before the deadline")


@contextmanager
def start_demo_model() -> Iterator[str]:
    """Run ``python -m agents_app.demo.model_server --port 0``; yield ``http://127.0.0.1:<port>``."""
    process = subprocess.Popen(
        [
            *(sys.executable, "-m", "agents_app.demo.model_server"),
            *("--host", "127.0.0.1", "--port", "0"),
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = _read_ready_line(process)
        base_url = line.removeprefix(READY_LINE_PREFIX)
        assert base_url.startswith("http://127.0.0.1:")
        assert not base_url.endswith(":0")
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def demo_base_url() -> Iterator[str]:
    with start_demo_model() as base_url:
        yield base_url


def _completion_kwargs(base_url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": MODEL,
        "api_base": f"{base_url}/v1",
        "api_key": "demo",
        "messages": messages,
        "tools": [SEARCH_TOOL],
    }


async def _stream(base_url: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    """Stream one completion; return text chunks, tool calls merged by index, usage, finish."""
    response = await litellm.acompletion(
        **_completion_kwargs(base_url, messages),
        stream=True,
        stream_options={"include_usage": True},
    )
    text_chunks: list[str] = []
    calls: dict[int, dict[str, str]] = {}
    usage = None
    finish_reason = None
    async for chunk in response:
        if getattr(chunk, "usage", None) is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            finish_reason = choice.finish_reason or finish_reason
            if choice.delta.content:
                text_chunks.append(choice.delta.content)
            for call in choice.delta.tool_calls or ():
                slot = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] = slot["id"] or (call.id or "")
                slot["name"] = slot["name"] or (call.function.name or "")
                slot["arguments"] += call.function.arguments or ""
    return {
        "text_chunks": text_chunks,
        "tool_calls": [calls[index] for index in sorted(calls)],
        "usage": usage,
        "finish_reason": finish_reason,
    }


async def test_echo_without_streaming(demo_base_url: str) -> None:
    response = await litellm.acompletion(
        **_completion_kwargs(demo_base_url, [{"role": "user", "content": "hello demo model"}])
    )
    assert response.choices[0].message.content == "You said: hello demo model"
    assert response.choices[0].finish_reason == "stop"
    assert response.usage.prompt_tokens == 3
    assert response.usage.completion_tokens == 5
    assert response.usage.total_tokens == 8


async def test_echo_streams_text_in_several_chunks_with_usage(demo_base_url: str) -> None:
    result = await _stream(
        demo_base_url, [{"role": "user", "content": "tell me about durable execution please"}]
    )
    assert len(result["text_chunks"]) > 1
    assert "".join(result["text_chunks"]) == "You said: tell me about durable execution please"
    assert result["tool_calls"] == []
    assert result["finish_reason"] == "stop"
    assert result["usage"] is not None
    assert result["usage"].completion_tokens == 8
    assert result["usage"].total_tokens == result["usage"].prompt_tokens + 8


async def test_tool_script_streams_two_parallel_calls(demo_base_url: str) -> None:
    result = await _stream(demo_base_url, [{"role": "user", "content": TWO_CALL_SCRIPT}])
    assert result["finish_reason"] == "tool_calls"
    assert "".join(result["text_chunks"]) == ""
    assert [(call["id"], call["name"]) for call in result["tool_calls"]] == [
        ("call_1", "search__web_search"),
        ("call_2", "search__web_search"),
    ]
    assert [json.loads(call["arguments"]) for call in result["tool_calls"]] == [
        {"query": "durable agents"},
        {"query": "dex engine", "limit": 2},
    ]
    assert result["usage"] is not None and result["usage"].completion_tokens > 0


async def test_tool_script_without_streaming(demo_base_url: str) -> None:
    response = await litellm.acompletion(
        **_completion_kwargs(demo_base_url, [{"role": "user", "content": TWO_CALL_SCRIPT}])
    )
    message = response.choices[0].message
    assert response.choices[0].finish_reason == "tool_calls"
    assert [call.id for call in message.tool_calls] == ["call_1", "call_2"]
    assert json.loads(message.tool_calls[1].function.arguments) == {
        "query": "dex engine",
        "limit": 2,
    }
    assert response.usage.total_tokens > 0


async def test_answer_after_tool_results_quotes_each_result(demo_base_url: str) -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": TWO_CALL_SCRIPT},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {
                        "name": "search__web_search",
                        "arguments": '{"query": "durable agents"}',
                    },
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {
                        "name": "search__web_search",
                        "arguments": '{"query": "dex engine", "limit": 2}',
                    },
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "First result about durable agents"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Second result about the dex engine"},
    ]
    streamed = await _stream(demo_base_url, messages)
    text = "".join(streamed["text_chunks"])
    assert streamed["tool_calls"] == []
    assert streamed["finish_reason"] == "stop"
    assert "First result about durable agents" in text
    assert "Second result about the dex engine" in text
    assert text.index("First result") < text.index("Second result")
    assert streamed["usage"] is not None

    response = await litellm.acompletion(**_completion_kwargs(demo_base_url, messages))
    assert response.choices[0].message.content == text


async def test_models_endpoint_lists_the_demo_model(demo_base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.get(f"{demo_base_url}/v1/models")
    assert response.status_code == 200
    assert [model["id"] for model in response.json()["data"]] == ["dexagents-demo"]


async def test_invalid_body_is_a_400(demo_base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{demo_base_url}/v1/chat/completions", json={"model": "x", "messages": "hi"}
        )
    assert response.status_code == 400
    assert "messages" in response.json()["error"]["message"]


def test_call_ids_continue_after_earlier_calls_and_arguments_pass_verbatim() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "/tool a__b {}"},
        {
            "role": "assistant",
            "tool_calls": [{"id": "call_1", "function": {"name": "a__b", "arguments": "{}"}}],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "/tool a__b {not json\n/tool c__d"},
    ]
    reply = plan_reply(messages)
    assert [(call.id, call.name, call.arguments) for call in reply.tool_calls] == [
        ("call_2", "a__b", "{not json"),
        ("call_3", "c__d", "{}"),
    ]


def test_wait_and_ask_call_the_session_built_in_tools() -> None:
    reply = plan_reply(
        [{"role": "user", "content": "/wait 30 cooling off\n/ask Which? | red | blue\n/ask Name?"}]
    )
    assert [(call.name, json.loads(call.arguments)) for call in reply.tool_calls] == [
        ("durable_wait", {"duration_seconds": 30, "reason": "cooling off"}),
        ("request_user_input", {"prompt": "Which?", "choices": ["red", "blue"]}),
        ("request_user_input", {"prompt": "Name?"}),
    ]
    # A negative duration is passed on, so the session's own validation can be tried.
    bad = plan_reply([{"role": "user", "content": "/wait -5"}])
    assert json.loads(bad.tool_calls[0].arguments) == {
        "duration_seconds": -5,
        "reason": "Requested wait",
    }


def test_split_text_keeps_every_character() -> None:
    text = "You said:  spaced   words\nand lines "
    assert "".join(split_text(text)) == text
    assert len(split_text(text)) > 1


# Directives and the Responses API -----------------------------------------------------------


def test_directives_are_parsed_and_left_out_of_the_echo() -> None:
    reply = plan_reply([{"role": "user", "content": "/think\n/fail 2\n/slow 0.25\nhello there"}])
    assert reply.text == "You said: hello there"
    assert reply.reasoning == "Thinking about: hello there"
    assert (reply.fail_count, reply.slow_seconds) == (2, 0.25)
    plain = plan_reply([{"role": "user", "content": "hello"}])
    assert (plain.reasoning, plain.fail_count, plain.slow_seconds) == (None, 0, 0.0)


def test_directives_also_apply_to_the_answer_after_tool_results() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "/think\n/tool a__b {}"},
        {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {"name": "a__b"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "ok"},
    ]
    reply = plan_reply(messages)
    assert reply.text == "Here is what the tools returned:\n- ok"
    assert reply.reasoning is not None


_PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 24
_PNG_URL = "data:image/png;base64," + base64.b64encode(_PNG).decode()
_PNG_SEEN = (
    f"[received image image/png, {len(_PNG)} bytes, sha256 {hashlib.sha256(_PNG).hexdigest()[:12]}]"
)


def test_images_of_tool_results_are_reported_wherever_the_client_put_them() -> None:
    call = {"id": "call_1", "function": {"name": "a__b"}}
    asked: list[dict[str, Any]] = [{"role": "user", "content": "/think\n/tool a__b {}"},
                                   {"role": "assistant", "tool_calls": [call]}]
    in_tool_message = plan_reply([*asked, {
        "role": "tool", "tool_call_id": "call_1",
        "content": [{"type": "text", "text": "a logo"},
                    {"type": "image_url", "image_url": {"url": _PNG_URL}}],
    }])
    assert in_tool_message.text == f"Here is what the tools returned:\n- a logo\n- {_PNG_SEEN}"
    # LiteLLM's form for OpenAI: the images move to a user message after the tool messages,
    # which is part of the results, not the latest user message (its directives still apply).
    hoisted = plan_reply([
        *asked,
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "a logo"}]},
        {"role": "user", "content": [{"type": "text", "text": "[images follow]"},
                                     {"type": "image_url", "image_url": {"url": _PNG_URL}}]},
    ])
    assert hoisted.text == in_tool_message.text
    assert hoisted.reasoning is not None
    converted = responses_messages({"input": [
        {"type": "function_call", "call_id": "call_1", "name": "a__b", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": [
            {"type": "input_text", "text": "a logo"},
            {"type": "input_image", "image_url": _PNG_URL, "detail": "auto"}]},
    ]})
    assert plan_reply(converted).text == in_tool_message.text


async def test_fail_answers_500_n_times_then_the_same_request_succeeds(
    demo_base_url: str,
) -> None:
    body = {"model": "x", "messages": [{"role": "user", "content": "/fail 2\nretry me"}]}
    async with httpx.AsyncClient(base_url=demo_base_url) as client:
        statuses = [
            (await client.post("/v1/chat/completions", json=body)).status_code for _ in range(3)
        ]
        other = await client.post(
            "/v1/chat/completions",
            json={"model": "x", "messages": [{"role": "user", "content": "/fail 2\nanother"}]},
        )
        responses = [
            (
                await client.post(
                    "/v1/responses", json={"model": "x", "input": "/fail 1\nresponses"}
                )
            ).status_code
            for _ in range(2)
        ]
    assert statuses == [500, 500, 200]
    assert other.status_code == 500
    assert responses == [500, 200]


async def test_slow_spaces_the_streamed_chunks(demo_base_url: str) -> None:
    body = {
        "model": "x",
        "stream": True,
        "messages": [{"role": "user", "content": "/slow 0.2\none two three four"}],
    }
    arrivals: list[float] = []
    async with (
        httpx.AsyncClient(base_url=demo_base_url) as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                arrivals.append(time.monotonic())
    # role, two text chunks, finish, [DONE]: four pauses of at least 0.2 s before [DONE].
    assert len(arrivals) == 5
    # The server sleeps 0.2 s three times between them; a first chunk that reached the client
    # late (a loaded machine) shortens the measured span by that delay, hence the margin.
    assert arrivals[-2] - arrivals[0] >= 3 * 0.2 - 0.1


async def test_responses_without_streaming_with_reasoning_and_usage(demo_base_url: str) -> None:
    response: Any = await litellm.aresponses(
        model=MODEL,
        api_base=f"{demo_base_url}/v1",
        api_key="demo",
        input=[{"type": "message", "role": "user", "content": "/think\nhello responses"}],
        instructions="Be brief.",
        store=False,
    )
    kinds = [item.type for item in response.output]
    assert kinds == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.summary[0].text == "Thinking about: hello responses"
    assert reasoning.encrypted_content
    assert response.output[1].content[0].text == "You said: hello responses"
    assert response.usage.input_tokens == 5  # "Be brief." and the three words sent
    assert response.usage.output_tokens == 4 + 4  # the answer and the summary
    assert response.usage.output_tokens_details.reasoning_tokens == 4


async def test_responses_stream_parallel_calls_then_quote_the_outputs(demo_base_url: str) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "api_base": f"{demo_base_url}/v1",
        "api_key": "demo",
        "store": False,
    }
    stream: Any = await litellm.aresponses(
        input=[{"type": "message", "role": "user", "content": TWO_CALL_SCRIPT}],
        stream=True,
        **request,
    )
    kinds: list[str] = []
    done_items: list[Any] = []
    completed: Any = None
    async for event in stream:
        kind = str(getattr(event.type, "value", event.type))
        kinds.append(kind)
        if kind == "response.output_item.done":
            done_items.append(event.item)
        if kind == "response.completed":
            completed = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert kinds.count("response.function_call_arguments.delta") > 2
    assert [(item.call_id, item.name) for item in done_items] == [
        ("call_1", "search__web_search"),
        ("call_2", "search__web_search"),
    ]
    assert json.loads(done_items[1].arguments) == {"query": "dex engine", "limit": 2}
    assert completed is not None and completed.usage is not None

    follow_up: Any = await litellm.aresponses(
        input=[
            {"type": "message", "role": "user", "content": TWO_CALL_SCRIPT},
            *[
                {
                    "type": "function_call",
                    "call_id": item.call_id,
                    "name": item.name,
                    "arguments": item.arguments,
                }
                for item in done_items
            ],
            {"type": "function_call_output", "call_id": "call_1", "output": "first output"},
            {"type": "function_call_output", "call_id": "call_2", "output": "second output"},
        ],
        **request,
    )
    text = follow_up.output[0].content[0].text
    assert text == "Here is what the tools returned:\n- first output\n- second output"


async def test_chat_think_streams_reasoning_content(demo_base_url: str) -> None:
    response = await litellm.acompletion(
        **_completion_kwargs(demo_base_url, [{"role": "user", "content": "/think\nhi"}]),
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning: list[str] = []
    usage = None
    async for chunk in response:
        usage = chunk.usage if getattr(chunk, "usage", None) is not None else usage
        for choice in chunk.choices:
            if getattr(choice.delta, "reasoning_content", None):
                reasoning.append(choice.delta.reasoning_content)
    assert "".join(reasoning) == "Thinking about: hi"
    assert usage is not None and usage.completion_tokens_details.reasoning_tokens == 3


async def test_responses_invalid_input_is_a_400(demo_base_url: str) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            f"{demo_base_url}/v1/responses", json={"model": "x", "input": 3}
        )
    assert response.status_code == 400
    assert "input" in response.json()["error"]["message"]


# Plans ---------------------------------------------------------------------------------------


def test_plan_mode_writes_one_task_per_line_then_reports_the_plan() -> None:
    from agents_app.worker.plan_prompts import planning_prompt

    system = {"role": "system", "content": planning_prompt(None)}
    user = {"role": "user", "content": "research\n\nwrite /tool docs__search {\"q\": 1}"}
    reply = plan_reply([system, user])
    assert [call.name for call in reply.tool_calls] == ["write_todos"]
    assert json.loads(reply.tool_calls[0].arguments) == {
        "todos": [
            {"content": "research", "status": "pending"},
            {"content": 'write /tool docs__search {"q": 1}', "status": "pending"},
        ]
    }
    answered = plan_reply(
        [
            system,
            user,
            {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
        ]
    )
    assert answered.text == "Plan ready for review: 2 task(s). Execute it when you are ready."


def test_plan_execution_completes_one_task_per_reply_with_its_tool() -> None:
    from agents_app.worker.plan_prompts import executing_prompt
    from dex_agents import AgentPlan, PlanStatus, PlanTask, PlanTaskStatus

    def reply_for(plan: AgentPlan) -> Any:
        system = {"role": "system", "content": executing_prompt(plan)}
        return plan_reply([system, {"role": "user", "content": "x"}])

    first = PlanTask("research", PlanTaskStatus.COMPLETED)
    second = PlanTask('write /tool docs__search {"q": 1}')
    reply = reply_for(AgentPlan(2, PlanStatus.ACTIVE, [first, second]))
    assert [(call.name, call.arguments) for call in reply.tool_calls][1] == (
        "docs__search",
        '{"q": 1}',
    )
    todos = json.loads(reply.tool_calls[0].arguments)["todos"]
    assert [todo["status"] for todo in todos] == ["completed", "completed"]
    done = reply_for(
        AgentPlan(3, PlanStatus.COMPLETED, [first, PlanTask("b", PlanTaskStatus.COMPLETED)])
    )
    assert done.text == "Plan complete: all 2 task(s) are done."


def test_a_stop_task_pauses_the_execution_and_the_next_one_completes_it() -> None:
    from agents_app.worker.plan_prompts import executing_prompt
    from dex_agents import AgentPlan, PlanStatus, PlanTask, PlanTaskStatus

    def reply_for(plan: AgentPlan, *, after_results: bool) -> Any:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": executing_prompt(plan)},
            {"role": "user", "content": "x"},
        ]
        if after_results:
            messages += [
                {"role": "assistant", "tool_calls": [{"id": "call_1", "function": {}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{}"},
            ]
        return plan_reply(messages)

    done = PlanTask("research", PlanTaskStatus.COMPLETED)
    paused = AgentPlan(2, PlanStatus.ACTIVE, [done, PlanTask("check /stop"), PlanTask("ship")])
    started = reply_for(paused, after_results=True)
    todos = json.loads(started.tool_calls[0].arguments)["todos"]
    assert [call.name for call in started.tool_calls] == ["write_todos"]
    assert [todo["status"] for todo in todos] == ["completed", "in_progress", "pending"]

    marked = AgentPlan(
        3,
        PlanStatus.ACTIVE,
        [done, PlanTask("check /stop", PlanTaskStatus.IN_PROGRESS), PlanTask("ship")],
    )
    assert reply_for(marked, after_results=True).text == "Stopped at: check /stop"
    # Continue: a new execution turn starts without tool results and completes it.
    resumed = reply_for(marked, after_results=False)
    todos = json.loads(resumed.tool_calls[0].arguments)["todos"]
    assert [todo["status"] for todo in todos] == ["completed", "completed", "pending"]


# --- context compaction: /big, /context and summaries -------------------------------------------


def test_big_answers_n_kilobytes() -> None:
    reply = plan_reply([{"role": "user", "content": "/big 2"}])
    assert reply.text is not None and len(reply.text) == 2048
    assert reply.text == big_text(2)
    assert len(plan_reply([{"role": "user", "content": "/big 0.5"}]).text or "") == 512


async def test_context_refuses_a_longer_input_as_litellm_context_window_error(
    demo_base_url: str,
) -> None:
    short = [{"role": "user", "content": "/context 50\nhello"}]
    response = await litellm.acompletion(**_completion_kwargs(demo_base_url, short))
    assert response.choices[0].message.content == "You said: hello"
    long = [{"role": "user", "content": "/context 5\n" + "word " * 20}]
    with pytest.raises(litellm.ContextWindowExceededError):
        await litellm.acompletion(**_completion_kwargs(demo_base_url, long), max_retries=0)


def test_the_runner_summary_request_gets_a_deterministic_summary() -> None:
    assert SUMMARY_INSTRUCTIONS.startswith(SUMMARY_REQUEST_PREFIX)
    items = [
        {"role": "user", "content": "Plan a trip to Lisbon\nin May"},
        {"role": "assistant", "content": "Flights are booked."},
    ]
    messages = summary_request_messages(MODEL, "user #1: earlier", items, [4, 5], 10_000)
    reply = plan_reply(messages)
    assert reply.text == (
        "user #1: earlier\nuser #4: Plan a trip to Lisbon\nassistant #5: Flights are booked."
    )
    assert plan_reply(messages, max_tokens=3).text == "user #1: earlier\nuser"


async def test_summary_over_http_honours_max_tokens(demo_base_url: str) -> None:
    items = [{"role": "user", "content": "/slow 0.1\nremember the code 4711"}]
    messages = summary_request_messages(MODEL, "", items, [1], 10_000)
    response = await litellm.acompletion(
        model=MODEL,
        api_base=f"{demo_base_url}/v1",
        api_key="demo",
        messages=messages,
        max_tokens=50,
    )
    assert response.choices[0].message.content == "user #1: remember the code 4711"
