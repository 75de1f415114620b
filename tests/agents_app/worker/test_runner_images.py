"""LiteLLMRunner and tool results with images and blobs (issue 23 point 11).

Real components: ``@modelcontextprotocol/server-everything`` as a subprocess (its tiny PNG,
text and gzip blob resources), the demo model over HTTP through LiteLLM (it reports every
image part it received with its size and SHA-256), and, for a whole session, the embedded
engine and a Worker child (``tests.agents_app.worker.images_worker``).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import pytest
from mcp.types import ImageContent

from agents_app.gateway.session_data import snapshot_to_data
from agents_app.worker.agent_config import AgentConfigError, AgentModelConfig
from agents_app.worker.model_input import DEX_TOOL_CALL_KEY, build_model_input, encode_run_state
from agents_app.worker.runner import LiteLLMRunner
from dex_agents import (
    AgentEventWriter,
    AgentMessage,
    AgentToolCall,
    DeferredToolExecution,
    MessageRole,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    TurnCompleted,
    build_turn_failure_note,
)
from dex_agents.testing import AgentTestStack, wait_for_agent_snapshot
from mcp_registry.client import McpClientPool, McpServerSpec
from mcp_registry.content import (
    ENCODED_PREFIX,
    McpImage,
    MediaLimits,
    ToolResultContent,
    format_size,
    render_blocks,
)
from tests.agents_app.demo.test_demo_model import start_demo_model
from tests.agents_app.worker.images_worker import (
    IMAGE_TOOL,
    WRITE_TOOL,
    build_flow,
    everything_spec,
)
from tests.agents_app.worker.test_runner import (
    RecordingEvents,
    _no_heartbeat,
    agent_config,
    make_turn,
    user_message,
)
from tests.mcp_registry.conftest import everything_command

REPO_ROOT = Path(__file__).resolve().parents[3]
TOOLS = [
    IMAGE_TOOL,
    {**IMAGE_TOOL, "name": "everything__get-resource-reference",
     "tool": "get-resource-reference"},
    {**IMAGE_TOOL, "name": "everything__gzip-file-as-resource", "tool": "gzip-file-as-resource"},
]
SCRIPT = "/tool everything__get-tiny-image {}"


@pytest.fixture(scope="module")
def demo_api_base() -> Iterator[str]:
    with start_demo_model() as base_url:
        yield f"{base_url}/v1"


@pytest.fixture(scope="module")
def spec() -> McpServerSpec:
    everything_command()  # fails with the fix when server-everything is not installed
    return everything_spec()


@pytest.fixture
async def tiny_png(spec: McpServerSpec) -> bytes:
    """The PNG server-everything's get-tiny-image returns, read straight from the server."""
    async with McpClientPool() as pool:
        output = await pool.call_tool(spec, "get-tiny-image", {}, idempotency_key=None,
                                      timeout=None)
    [image] = [block for block in output.content if isinstance(block, ImageContent)]
    return base64.b64decode(image.data)


def received(png: bytes) -> str:
    """The demo model's line for one image part it received."""
    digest = hashlib.sha256(png).hexdigest()[:12]
    return f"[received image image/png, {len(png)} bytes, sha256 {digest}]"


def runner_for(spec: McpServerSpec, limits: MediaLimits | None = None) -> LiteLLMRunner:
    async def resolve(name: str) -> McpServerSpec:
        assert name == spec.name
        return spec

    return LiteLLMRunner(resolve, pool=McpClientPool(), media_limits=limits)


@pytest.fixture
async def runner(spec: McpServerSpec) -> AsyncIterator[LiteLLMRunner]:
    runner = runner_for(spec)
    try:
        yield runner
    finally:
        await runner.aclose()


def execution(config: dict[str, Any], tool_name: str, arguments: dict[str, Any],
              tool_call_id: str = "call_1") -> DeferredToolExecution:
    return DeferredToolExecution(
        flow_id="session-1",
        tool_call=AgentToolCall(
            tool_call_id=tool_call_id, tool_name=tool_name, arguments=json.dumps(arguments),
            effect=ToolEffect.READ, requires_approval=False, status=ToolCallStatus.PENDING,
            deferral_order=0, turn_id="turn-2",
        ),
        idempotency_key=f"session-1/turn-2/{tool_call_id}",
        attempt=1,
        events=cast(AgentEventWriter, RecordingEvents()),
        heartbeat_callback=_no_heartbeat,
        agent_config=config,
    )


async def one_tool_turn(
    runner: LiteLLMRunner, config: dict[str, Any], script: str = SCRIPT
) -> tuple[str, TurnCompleted]:
    """Ask the demo model for the scripted call, run it for real, answer with its result:
    ``(the stored tool output, the completed turn)``."""
    messages = [user_message(1, script, "turn-2")]
    requested = await runner.run_model_step(make_turn(config, messages))
    assert isinstance(requested, ToolCallsRequested)
    [call] = requested.tool_calls
    result = await runner.execute_deferred_tool_call(
        execution(config, call.tool_name, json.loads(call.arguments), call.tool_call_id))
    record = dataclasses.replace(
        execution(config, call.tool_name, {}, call.tool_call_id).tool_call,
        status=ToolCallStatus.SUCCEEDED, output=result.output,
    )
    completed = await runner.run_model_step(make_turn(
        config, messages, run_state=requested.framework_run_state,
        records={call.tool_call_id: record},
    ))
    assert isinstance(completed, TurnCompleted)
    return result.output, completed


# Which models get images --------------------------------------------------------------------


def test_litellm_says_which_models_accept_images_and_the_agent_may_override() -> None:
    def accepts(**overrides: Any) -> bool:
        return AgentModelConfig.parse(agent_config(**overrides)).accepts_images()

    assert accepts(model="openai/gpt-4o") is True
    assert accepts(model="anthropic/claude-sonnet-4-5") is True
    assert accepts(model="openai/gpt-3.5-turbo") is False
    assert accepts() is False  # openai/dexagents-demo: LiteLLM does not know it
    assert accepts(supports_images=True) is True
    assert accepts(model="openai/gpt-4o", supports_images=False) is False
    with pytest.raises(AgentConfigError, match="supports_images"):
        AgentModelConfig.parse(agent_config(supports_images="yes"))


def test_the_platform_flow_takes_its_image_bounds_from_the_settings() -> None:
    from django.test import override_settings

    from agents_app.worker.flow import build_flow as build_platform_flow

    knobs = {"TOOL_IMAGE_MAX_BYTES": 1234, "TOOL_RESULT_IMAGES_MAX_BYTES": 5678}
    with override_settings(DEXAGENTS=knobs):
        runner = cast(LiteLLMRunner, build_platform_flow().runner)
    assert runner.media_limits == MediaLimits(image_max_bytes=1234, result_images_max_bytes=5678)


# Through the demo model over HTTP -------------------------------------------------------------


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_an_image_reaches_a_model_that_accepts_images(
    runner: LiteLLMRunner, demo_api_base: str, tiny_png: bytes, api: str
) -> None:
    config = agent_config(demo_api_base, tools=TOOLS, supports_images=True, api=api)
    output, completed = await one_tool_turn(runner, config)
    assert output.startswith(ENCODED_PREFIX)
    [image] = ToolResultContent.decode(output).images
    assert base64.b64decode(image.data) == tiny_png

    answer = completed.new_messages[-1].text
    label = f"[image 1: image/png, {format_size(len(tiny_png))}, attached]"
    assert "Here's the image you requested:" in answer and label in answer
    # The demo model decoded an image content part with exactly the server's bytes.
    assert received(tiny_png) in answer

    # The stored tool message keeps the text and the label; its image left with the record.
    tool_message = completed.new_messages[1]
    assert tool_message.framework_item["content"] == tool_message.text
    assert label in tool_message.text
    assert tool_message.framework_item[DEX_TOOL_CALL_KEY] == "call_1"
    stored = json.dumps([message.framework_item for message in completed.new_messages])
    assert image.data not in stored


async def test_a_model_without_images_reads_a_placeholder(
    runner: LiteLLMRunner, demo_api_base: str, tiny_png: bytes
) -> None:
    config = agent_config(demo_api_base, tools=TOOLS)  # LiteLLM does not know the demo model
    output, completed = await one_tool_turn(runner, config)
    placeholder = f"[image: image/png, {format_size(len(tiny_png))}]"
    assert output == f"Here's the image you requested:\n{placeholder}\n" \
        "The image above is the MCP logo."
    answer = completed.new_messages[-1].text
    assert placeholder in answer
    assert "[received image" not in answer
    assert DEX_TOOL_CALL_KEY not in completed.new_messages[1].framework_item


async def test_an_image_past_the_bound_is_not_sent(
    spec: McpServerSpec, demo_api_base: str, tiny_png: bytes
) -> None:
    runner = runner_for(spec, MediaLimits(image_max_bytes=len(tiny_png) - 1))
    try:
        config = agent_config(demo_api_base, tools=TOOLS, supports_images=True)
        output, completed = await one_tool_turn(runner, config)
    finally:
        await runner.aclose()
    limit = format_size(len(tiny_png) - 1)
    assert not output.startswith(ENCODED_PREFIX)
    assert f"not attached: larger than the {limit} limit" in output
    assert "[received image" not in completed.new_messages[-1].text


async def test_text_blobs_are_decoded_and_binary_ones_are_placeholders(
    runner: LiteLLMRunner, demo_api_base: str
) -> None:
    config = agent_config(demo_api_base, tools=TOOLS, supports_images=True)
    reference = '{"resourceType": "Blob", "resourceId": 4}'
    _, completed = await one_tool_turn(
        runner, config, f"/tool everything__get-resource-reference {reference}")
    assert "Resource 4: This is a base64 blob created at" in completed.new_messages[-1].text

    hello = base64.b64encode(b"hello").decode()
    gzip = json.dumps({"name": "h.gz", "data": f"data:text/plain;base64,{hello}",
                       "outputType": "resource"})
    output, completed = await one_tool_turn(
        runner, config, f"/tool everything__gzip-file-as-resource {gzip}")
    assert output.startswith("[binary resource demo://resource/session/h.gz: application/gzip, ")
    assert output in completed.new_messages[-1].text

    read = await runner.execute_deferred_tool_call(execution(
        config, "mcp_read_resource",
        {"server": "everything", "uri": "demo://resource/dynamic/blob/5"}))
    assert read.output.startswith("Resource 5: This is a base64 blob created at")


# Model input and notes ------------------------------------------------------------------------


def _images_of(png: bytes) -> tuple[McpImage, ...]:
    data = base64.b64encode(png).decode()
    blocks = [ImageContent(type="image", data=data, mime_type="image/png")]
    return render_blocks(blocks, MediaLimits(accept_images=True)).images


def test_images_go_only_to_the_turn_that_holds_their_record(tiny_png: bytes) -> None:
    content = ToolResultContent("[image 1: image/png, 3.9 KiB, attached] " + "x" * 3000,
                                _images_of(tiny_png))
    assistant = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7", "type": "function", "function": {"name": "x", "arguments": "{}"}}]}
    record = dataclasses.replace(
        execution(agent_config(), "x", {}, "call_7").tool_call,
        status=ToolCallStatus.SUCCEEDED, output=content.encode(),
    )
    run_state = encode_run_state([assistant], ["call_7"])
    config = agent_config(supports_images=True, tool_result_max_chars=1000)
    turn = make_turn(config, [user_message(1, "look", "turn-2")], run_state=run_state,
                     records={"call_7": record})
    messages, turn_items = build_model_input(AgentModelConfig.parse(config), turn)
    text_part, image_part = messages[-1]["content"]
    assert text_part["type"] == "text" and "more characters" in text_part["text"]  # still cut
    data = base64.b64encode(tiny_png).decode()
    assert image_part == {"type": "image_url",
                          "image_url": {"url": f"data:image/png;base64,{data}"}}
    assert turn_items[-1]["content"] == content.text  # the run state keeps text only
    assert turn_items[-1][DEX_TOOL_CALL_KEY] == "call_7"

    # A model without images gets the text alone.
    blind, _ = build_model_input(AgentModelConfig.parse(agent_config()), turn)
    assert isinstance(blind[-1]["content"], str)
    # Stored in the history, the item is text for every later turn, even one that has a
    # record of the same ID (IDs are unique within a turn only).
    stored = AgentMessage(3, MessageRole.TOOL, content.text, turn_items[-1], "turn-2")
    later = dataclasses.replace(
        make_turn(config, [stored], records={"call_7": record}), turn_id="turn-3")
    shown = build_model_input(AgentModelConfig.parse(config), later)[0][-1]["content"]
    assert isinstance(shown, str) and shown.startswith("[image 1: image/png")


def test_the_note_of_a_failed_turn_quotes_the_text_not_the_image(tiny_png: bytes) -> None:
    content = ToolResultContent("Here it is:\n[image 1: image/png, 3.9 KiB, attached]",
                                _images_of(tiny_png))
    record = dataclasses.replace(
        execution(agent_config(), "everything__get-tiny-image", {}).tool_call,
        status=ToolCallStatus.SUCCEEDED, output=content.encode(),
    )
    data = content.images[0].data
    runner = LiteLLMRunner(_no_resolver)
    # RecordTurnFailure renders outcomes with the runner's describe_outcome_for_note, which
    # decodes the stored result before the note cuts it: no image data, even in part.
    note = build_turn_failure_note([record], runner.describe_outcome_for_note)
    assert data[:16] not in note
    message = runner.build_user_message(note)
    assert data[:16] not in message.text
    assert "-> succeeded: Here it is:\n[image 1: image/png, 3.9 KiB, attached]" in message.text
    assert message.framework_item == {"role": "user", "content": message.text}
    typed = runner.build_user_message(content.encode())
    assert typed.text == content.encode()  # a user's own text is never rewritten


async def _no_resolver(name: str) -> McpServerSpec:
    raise AssertionError(f"no tool call expected (server {name})")


# A whole session: real engine, Worker child, server-everything, demo model over HTTP ---------


async def test_a_session_shows_the_model_the_image_and_people_its_label(
    tmp_path: Path, demo_api_base: str, tiny_png: bytes
) -> None:
    flow = build_flow()
    config = agent_config(demo_api_base, tools=[IMAGE_TOOL, WRITE_TOOL], supports_images=True)
    # The image call runs; the write call waits for approval, holding the turn open with the
    # image call's record final.
    script = f"{SCRIPT}\n/tool everything__echo {{\"message\": \"hi\"}}"
    data = base64.b64encode(tiny_png).decode()
    label = f"[image 1: image/png, {format_size(len(tiny_png))}, attached]"
    async with AgentTestStack(
        tmp_path, [flow], "tests.agents_app.worker.images_worker", worker_cwd=REPO_ROOT
    ) as stack:
        sessions = stack.sessions(flow)
        await stack.start_worker()
        await sessions.start_session("session-images", script, agent_config=config)

        def image_call_done(snapshot: Any) -> Any:
            calls = {call.tool_name: call for call in snapshot.tool_calls}
            image_call = calls.get(IMAGE_TOOL["name"])
            if image_call is None or image_call.status is not ToolCallStatus.SUCCEEDED:
                return None
            return snapshot if snapshot.pending_interrupts else None

        waiting = await wait_for_agent_snapshot(
            sessions, "session-images", image_call_done, timeout=60,
            description="the image call to finish while the write call waits for approval")
        [record] = [call for call in waiting.tool_calls if call.tool_name == IMAGE_TOOL["name"]]
        assert record.output.startswith(ENCODED_PREFIX)  # the record holds the image...
        shown = snapshot_to_data(waiting)  # ...readers get its label
        [image_call] = [call for call in shown["tool_calls"]
                        if call["tool_name"] == IMAGE_TOOL["name"]]
        assert label in image_call["output"]
        assert data not in json.dumps(shown)

        [interrupt] = waiting.pending_interrupts
        assert await sessions.resolve_interrupt(
            "session-images", interrupt.interrupt_id, approved=True)

        def answered(snapshot: Any) -> Any:
            status = getattr(snapshot.state, "status", None)
            done = str(getattr(status, "value", status)) == "waiting_for_user_message"
            return snapshot if done and len(snapshot.messages) >= 5 else None

        final = await wait_for_agent_snapshot(
            sessions, "session-images", answered, timeout=60,
            description="the turn to end with the model's answer")
        shown = snapshot_to_data(final)
        answer = shown["messages"][-1]["text"]
        assert received(tiny_png) in answer  # the model got the image over HTTP
        assert "hi" in answer  # and the approved echo's result
        assert data not in json.dumps(shown)
        tool_texts = [message["text"] for message in shown["messages"]
                      if message["role"] == "tool"]
        assert any(label in text for text in tool_texts)
