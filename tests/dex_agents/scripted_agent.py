"""A scripted runner that follows the runner contract with no model and no network.

The user message is the script:

- ``"tools: a, b"`` asks for tools ``a`` and ``b`` in one model response, then answers with
  every outcome the model sees;
- ``"tools-then-fail: a"`` asks for ``a``, then every resumed model call raises;
- ``"fail-model"`` makes every model call write a text delta, then raise;
- ``"refuse-model: reason"`` makes every model call write a text delta, then raise
  ``ModelCallError(reason)`` (a provider refusal no retry can fix);
- ``"overflow-once"`` makes a turn's first model call attempt raise
  ``ContextWindowExceededError(retry_may_fit=True)``; the next attempt echoes;
- ``"rate-limited: n"`` makes a turn's first model call attempt raise
  ``ModelRateLimitError`` asking to wait ``n`` seconds; the next attempt echoes;
- ``"many: n"`` answers with ``n`` assistant messages;
- ``"bad-id"`` asks for a tool call whose ID contains ``/``;
- ``"config"`` answers with the session's agent config as JSON;
- ``"threaded"`` writes a text delta from another thread, and another one from a thread that
  waits for the ``late_write`` gate, long after the call returned;
- ``"wait: n"`` calls the built-in ``durable_wait`` for ``n`` seconds;
- ``"ask: prompt | choice | choice"`` calls ``request_user_input`` (choices optional) and, in the
  same response, ``lookup``;
- ``"big: n"`` answers with ``n`` KB of text;
- ``"stream"`` writes the text delta ``STREAMED_PART``, waits at the ``model_stream`` FileGate,
  then answers ``STREAMED_PART + " and the rest"`` (a model call a test can cancel mid-answer;
  ``"tools: a"`` followed by ``"stream"`` in the same message is not supported);
- ``"hold"`` waits at the ``model_hold`` FileGate before it streams anything, then answers
  ``"held"`` (a model call a test can cancel before any text);
- ``"tools: whole"`` calls ``whole``, which returns ``WHOLE_SHOWN`` characters for the model and
  ``WHOLE_RESULT`` whole (stored in parts);
- ``"plan: a, b"`` (plan mode) writes a plan of pending tasks ``a`` and ``b``;
  ``"plan+lookup: a"`` also calls ``lookup``; ``"todo: a"`` calls ``write_todos`` outside plan
  mode;
- ``"sub: task"`` calls the subagent ``agent__helper`` (a child session of the same Flow
  type, on ``SUBAGENT_FLOW_TYPE``) with ``{"task": task}``; ``"subs: a, b"`` calls it once per
  task in one response; ``"sub-missing: task"`` calls ``agent__missing``, which the directory
  refuses;
- anything else is echoed back.

An ``executing`` turn (``execute_plan``) completes the next unfinished task with one
``write_todos`` call per model call and answers "plan complete" when none is left; a task whose
content starts with ``stop`` ends the turn unfinished the first time it comes up, and one that
starts with ``ask`` also asks the user (``request_user_input``) in the same response.

It is also a ``CompactingRunner`` (context compaction): a token is four characters, a tool
result counts (and is shown) cut to ``tool_result_max_chars`` of the agent config (default
2,000), and the summarizer folds each message into one short line. Agent config keys for tests:
``context_window``; ``provider_window`` (the "provider" refuses a larger input with
``ContextWindowExceededError``); ``summarize_gate`` (the summarizer waits at the ``summarize``
FileGate); ``record_inputs`` (every model call appends what it "sent" to ``inputs.jsonl``).

Steered messages (``turn.steered_messages``) are appended after the tool results and named in
the answer as ``steered=[...]``.

Tools record each real run in the ``InvocationLog`` of ``SCRIPTED_STATE_DIR`` and some wait at a
``FileGate`` named after the tool, so a test can kill the Worker mid-call; ``crash_read`` and
``crash_write`` raise on every attempt, and ``hang_read`` sleeps for ``HANG_SECONDS``.

``ask_form`` (a read), ``ask_form_gated`` (a read that waits at its FileGate after the answer),
``ask_form_twice`` (a read that asks a second question after the first) and ``ask_form_once``
(a single-attempt write) put ``ASK_FORM_SCHEMA``
to the user the way an MCP server's ``elicitation/create`` does
(``dex_agents.ToolCallElicitations``, through a Dex client of the Worker's own), waiting
``elicitation_timeout`` seconds of the agent config (default 600), and return the outcome:
``"<action> <content as JSON>"`` and the note for the model, if any.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from dex import (
    AsyncClient,
    BlobCacheConfig,
    ClientOptions,
    Context,
    Registry,
    RPCResult,
    open_blob_cache,
    rpc,
)

from dex_agents import (
    DURABLE_WAIT_TOOL,
    PENDING_INTERRUPTS,
    REQUEST_USER_INPUT_TOOL,
    WRITE_TODOS_TOOL,
    AgentCodecRegistry,
    AgentMessage,
    AgentSessionChange,
    AgentSessionClient,
    AgentSessionFlow,
    AgentSessionOptions,
    AgentSessionStartInput,
    AgentTurnContext,
    AgentTurnOutcome,
    AgentUsage,
    CompactionOptions,
    ContextWindowExceededError,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    MessageRole,
    ModelCallError,
    ModelRateLimitError,
    PlanTaskStatus,
    ResolveInterruptRequest,
    SubagentOptions,
    SubagentRefusedError,
    SubagentRequest,
    SubagentResult,
    SummarizeRequest,
    SummaryResult,
    ToolCallElicitations,
    ToolCallsRequested,
    ToolEffect,
    ToolExecutionError,
    ToolExecutionResult,
    ToolPolicy,
    TurnCompleted,
    TurnGuardCheck,
    TurnMode,
    describe_tool_call_outcome,
    render_summary,
)
from dex_agents.testing import FileGate, InvocationLog

STATE_DIR_ENV = "SCRIPTED_STATE_DIR"
FLOW_TYPE = "ScriptedAgent"
DEADLINE_FLOW_TYPE = "ScriptedDeadlineAgent"
LONG_DEADLINE_FLOW_TYPE = "ScriptedLongDeadlineAgent"
GATED_RESOLVE_FLOW_TYPE = "ScriptedGatedResolveAgent"
#: A Flow with the platform additions ``steering``, ``durable_waits`` and ``user_input``.
STEERING_FLOW_TYPE = "ScriptedSteeringAgent"
#: A Flow with every platform addition, ``compaction`` included (default options; agents
#: override them), as the platform's Flow has.
COMPACTING_FLOW_TYPE = "ScriptedCompactingAgent"
#: A Flow with every platform addition and subagents (``ScriptedSubagents``): at most
#: ``SUBAGENT_MAX_DEPTH`` deep and ``SUBAGENT_MAX_CHILDREN`` calls per turn.
SUBAGENT_FLOW_TYPE = "ScriptedSubagentAgent"
SUBAGENT_MAX_DEPTH = 2
SUBAGENT_MAX_CHILDREN = 2
#: The Flows with ``steering``, ``durable_waits``, ``user_input`` and ``plans``.
PLATFORM_LIKE_FLOW_TYPES = frozenset(
    {STEERING_FLOW_TYPE, COMPACTING_FLOW_TYPE, SUBAGENT_FLOW_TYPE}
)
#: The FileGate the summarizer waits at when the agent config sets ``summarize_gate``.
SUMMARIZE_GATE = "summarize"
#: Characters of a tool result the scripted "model" sees, unless the agent config says.
TOOL_RESULT_MAX_CHARS = 2000
#: What the ``huge`` tool returns: 300 KB.
HUGE_RESULT = "x" * 300_000
#: The whole result of the ``whole`` tool: about 3 MB of one- to four-byte characters, which
#: the session stores in parts (``ToolExecutionResult.full_text``); its record keeps
#: ``WHOLE_SHOWN`` characters.
WHOLE_RESULT = "".join(f"line {n:06d} é漢😀\n" for n in range(150_000))
WHOLE_SHOWN = 2000
#: The FileGate ``resolve_interrupt`` of ``GATED_RESOLVE_FLOW_TYPE`` waits at, holding its lock.
RESOLVE_GATE = "resolve_hold"
INTERRUPT_DEADLINE = timedelta(seconds=3)
LONG_INTERRUPT_DEADLINE = timedelta(minutes=10)
#: Worker task slots (``run_agent_worker(max_concurrent_tasks=...)``); 2 leaves one Step slot.
WORKER_SLOTS_ENV = "SCRIPTED_WORKER_SLOTS"
#: Comma-separated Flow types the Worker child serves (all of ``build_flows`` when unset). A
#: benchmark sets the one it measures, as the platform's worker serves its one shared Flow: each
#: Flow type is a pull queue with its own idle task streams, which the SDK walks per task.
WORKER_FLOW_TYPES_ENV = "SCRIPTED_WORKER_FLOW_TYPES"
MODEL_USAGE = AgentUsage(input_tokens=10, output_tokens=5, requests=1)
#: What each summarizer call reports (``SummaryResult.usage``).
SUMMARY_USAGE = AgentUsage(input_tokens=7, output_tokens=3, requests=1, cost_usd="0.0002")
#: What the ``stream`` script streams before it waits at the ``model_stream`` FileGate.
STREAMED_PART = "Here is the first half of an answer"

#: Tools that wait at a FileGate named after themselves.
GATED_TOOLS = frozenset({"gated_read", "idem_write", "charge", "parallel_a", "parallel_b"})
TOOL_POLICIES = {
    "lookup": ToolPolicy(ToolEffect.READ),
    "gated_read": ToolPolicy(ToolEffect.READ),
    "parallel_a": ToolPolicy(ToolEffect.READ),
    "parallel_b": ToolPolicy(ToolEffect.READ),
    "idem_write": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE),
    "charge": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE, requires_approval=False),
    "refund": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE),
    # Platform addition: its approvals expire after two seconds on a Flow with no deadline.
    "quick_refund": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE, approval_deadline_seconds=2),
    "broken": ToolPolicy(ToolEffect.READ),
    "crash_read": ToolPolicy(ToolEffect.READ),
    "crash_write": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE),
    "huge": ToolPolicy(ToolEffect.READ),
    "whole": ToolPolicy(ToolEffect.READ),
    "hang_read": ToolPolicy(ToolEffect.READ),
    "ask_form": ToolPolicy(ToolEffect.READ),
    "ask_form_gated": ToolPolicy(ToolEffect.READ),
    "ask_form_twice": ToolPolicy(ToolEffect.READ),
    "ask_form_once": ToolPolicy(ToolEffect.NON_IDEMPOTENT_WRITE, requires_approval=False),
}
#: The form the ``ask_form`` tools ask for.
ASK_FORM_MESSAGE = "Who are you?"
ASK_FORM_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "title": "Name"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
    },
    "required": ["name"],
}
ELICITING_TOOLS = frozenset({"ask_form", "ask_form_gated", "ask_form_once", "ask_form_twice"})

#: Tools that raise an exception other than ToolExecutionError on every attempt.
CRASHING_TOOLS = frozenset({"crash_read", "crash_write"})
#: How long ``hang_read`` sleeps: longer than any test waits, so only a timeout ends its call.
HANG_SECONDS = 600


def state_dir() -> Path:
    return Path(os.environ[STATE_DIR_ENV])


def invocation_log(directory: Path | None = None) -> InvocationLog:
    return InvocationLog((directory or state_dir()) / "invocations.log")


def tokens(text: str) -> int:
    """The scripted runner's token count: four characters a token, at least one."""
    return len(text) // 4 + 1


def _tool_result_limit(agent_config: dict[str, object] | None) -> int:
    value = (agent_config or {}).get("tool_result_max_chars")
    return value if isinstance(value, int) and value > 0 else TOOL_RESULT_MAX_CHARS


def shown_text(message: AgentMessage, agent_config: dict[str, object] | None) -> str:
    """What the scripted "model" sees of a stored message: its text (a tool result cut to the
    limit), or its item as JSON when it has no text (a tool request)."""
    text = message.text or json.dumps(message.framework_item, sort_keys=True)
    if message.role == MessageRole.TOOL:
        return text[: _tool_result_limit(agent_config)]
    return text


def inputs_path(directory: Path | None = None) -> Path:
    """Where ``record_inputs`` sessions append one JSON line per model call."""
    return (directory or state_dir()) / "inputs.jsonl"


_SESSION_CLIENTS: dict[tuple[int, str], AgentSessionClient] = {}


def session_client(flow_type: str) -> AgentSessionClient:
    """A client of the Flow ``flow_type`` on the Worker's engine (``DEX_SERVER_ADDRESS``), one
    per event loop: what a tool Step asks the session's own RPCs through."""
    key = (id(asyncio.get_running_loop()), flow_type)
    if key not in _SESSION_CLIENTS:
        flow = build_flow(flow_type)
        cache = open_blob_cache(BlobCacheConfig(str(state_dir() / "tool-client-cache"), 1 << 24))
        client = AsyncClient(
            Registry([flow], AgentCodecRegistry(), allow_async_handlers=True),
            cache,
            ClientOptions(server_address=os.environ["DEX_SERVER_ADDRESS"]),
        )
        _SESSION_CLIENTS[key] = AgentSessionClient(client, flow)
    return _SESSION_CLIENTS[key]


class ScriptedRunner:
    """Stateless: everything comes from the turn's messages, run state and records."""

    def __init__(self, flow_type: str = FLOW_TYPE) -> None:
        self.flow_type = flow_type

    # --- CompactingRunner (context compaction) -------------------------------------------

    def context_window(self, agent_config: dict[str, object] | None) -> int | None:
        value = (agent_config or {}).get("context_window")
        return value if isinstance(value, int) else None

    def count_message_tokens(
        self, message: AgentMessage, agent_config: dict[str, object] | None
    ) -> int:
        return tokens(shown_text(message, agent_config))

    def count_input_tokens(self, turn: AgentTurnContext) -> int:
        total = tokens(render_summary(turn.summary)) if turn.summary is not None else 0
        total += sum(self.count_message_tokens(m, turn.agent_config) for m in turn.messages)
        limit = _tool_result_limit(turn.agent_config)
        for record in turn.tool_calls.values():
            total += tokens(record.arguments)
            if record.status.is_final:
                total += tokens(describe_tool_call_outcome(record)[:limit])
        total += sum(tokens(item.text) for item in turn.steered_messages)
        return total

    async def summarize(self, request: SummarizeRequest) -> SummaryResult:
        sequences = [message.sequence for message in request.messages]
        invocation_log().record("summarize", f"{sequences[0]}-{sequences[-1]}")
        if (request.agent_config or {}).get("summarize_gate"):
            gate = FileGate(state_dir(), SUMMARIZE_GATE)
            gate.reach()
            await gate.wait_for_release()
        lines = [request.previous_summary] if request.previous_summary else []
        lines.extend(
            f"{message.role}#{message.sequence}: "
            f"{shown_text(message, request.agent_config)[:40]}"
            for message in request.messages
        )
        return SummaryResult("\n".join(lines)[-request.summary_budget_tokens * 4 :], SUMMARY_USAGE)

    def _record_input(self, turn: AgentTurnContext) -> None:
        """Append what this model call "sends" (``record_inputs``) to ``inputs.jsonl``."""
        limit = _tool_result_limit(turn.agent_config)
        results = [
            {
                "tool_call_id": record.tool_call_id,
                "text": describe_tool_call_outcome(record)[:limit],
            }
            for record in sorted(turn.tool_calls.values(), key=lambda r: r.deferral_order)
            if record.status.is_final
        ]
        line = {
            "turn_id": turn.turn_id,
            "attempt": turn.attempt,
            "summary_through": turn.summary.through_sequence if turn.summary else 0,
            "messages": [
                {
                    "sequence": message.sequence,
                    "role": str(message.role),
                    "item": message.framework_item,
                    "chars": len(shown_text(message, turn.agent_config)),
                }
                for message in turn.messages
            ],
            "turn_results": results,
            "tokens": self.count_input_tokens(turn),
        }
        with inputs_path().open("a") as log:
            log.write(json.dumps(line) + "\n")

    def build_user_message(self, text: str) -> FrameworkMessage:
        return FrameworkMessage(MessageRole.USER, {"role": "user", "content": text}, text)

    def build_assistant_message(
        self, text: str, usage: AgentUsage | None = None
    ) -> FrameworkMessage:
        item: dict[str, Any] = {"content": text}
        if usage is not None:
            item["usage"] = usage.as_dict()
        return FrameworkMessage(MessageRole.ASSISTANT, item, text)

    def abandoned_call_usage(self, turn: AgentTurnContext, streamed_text: str) -> AgentUsage:
        """A cancelled call's usage: the input as ``MODEL_USAGE`` counts it, one output token
        per streamed word."""
        return AgentUsage(
            input_tokens=MODEL_USAGE.input_tokens,
            output_tokens=len(streamed_text.split()),
            requests=1,
            cost_usd="0.0001",
        )

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        invocation_log().record("model", turn.turn_id)
        config = turn.agent_config or {}
        if config.get("record_inputs"):
            self._record_input(turn)
        provider_window = config.get("provider_window")
        if isinstance(provider_window, int) and self.count_input_tokens(turn) > provider_window:
            invocation_log().record("overflow", turn.turn_id)
            raise ContextWindowExceededError(f"the input exceeds {provider_window} tokens")
        if turn.turn_mode is TurnMode.EXECUTING:
            return execute_plan_step(turn)
        script = next(message.text for message in reversed(turn.messages) if message.role == "user")
        command, _, argument = script.partition(":")
        tool_names = [name.strip() for name in argument.split(",") if name.strip()]
        if command == "fail-model":
            turn.events.write_text_delta(f"partial attempt {turn.attempt}")
            raise RuntimeError("scripted model failure")
        if command == "refuse-model":
            turn.events.write_text_delta(f"partial attempt {turn.attempt}")
            raise ModelCallError(argument.strip())
        if command == "overflow-once" and turn.attempt == 1:
            raise ContextWindowExceededError("refused; a smaller window learned",
                                             retry_may_fit=True)
        if command == "rate-limited" and turn.attempt == 1:
            raise ModelRateLimitError("scripted rate limit", int(argument))
        if command == "many":
            count = int(argument)
            return TurnCompleted(
                [
                    FrameworkMessage(MessageRole.ASSISTANT, {"content": str(index)}, str(index))
                    for index in range(1, count + 1)
                ],
                MODEL_USAGE,
            )
        if command == "big" and turn.framework_run_state is None:
            answer = "big " + "lorem ipsum " * int(float(argument) * 1024 // 12)
            return TurnCompleted(
                [FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)], MODEL_USAGE
            )
        if command == "stream":
            turn.events.write_text_delta(STREAMED_PART)
            gate = FileGate(state_dir(), "model_stream")
            gate.reach()
            await gate.wait_for_release()
            answer = STREAMED_PART + " and the rest"
            return TurnCompleted(
                [FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)], MODEL_USAGE
            )
        if command == "hold":
            gate = FileGate(state_dir(), "model_hold")
            gate.reach()
            await gate.wait_for_release()
            return TurnCompleted(
                [FrameworkMessage(MessageRole.ASSISTANT, {"content": "held"}, "held")], MODEL_USAGE
            )
        if command == "config":
            answer = json.dumps(turn.agent_config, sort_keys=True)
            return TurnCompleted(
                [FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)], MODEL_USAGE
            )
        if command == "threaded":
            await asyncio.to_thread(turn.events.write_text_delta, "from a thread")
            threading.Thread(target=write_after_return, args=(turn,), daemon=True).start()
            answer = "threaded done"
            return TurnCompleted(
                [FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)], MODEL_USAGE
            )
        if command == "bad-id":
            call = DeferredToolCall("call/1", "lookup", "{}", turn.resolve_tool_policy("lookup"))
            return ToolCallsRequested(json.dumps({"calls": []}), [call], MODEL_USAGE)
        if command in ("plan", "plan+lookup", "todo") and turn.framework_run_state is None:
            todos = [{"content": name, "status": "pending"} for name in tool_names]
            calls = [
                DeferredToolCall(
                    "plan-1",
                    WRITE_TODOS_TOOL,
                    json.dumps({"todos": todos}),
                    turn.resolve_tool_policy(WRITE_TODOS_TOOL),
                )
            ]
            if command == "plan+lookup":
                calls.append(
                    DeferredToolCall("lookup-1", "lookup", "{}", turn.resolve_tool_policy("lookup"))
                )
            state = {"calls": [call.tool_call_id for call in calls]}
            return ToolCallsRequested(json.dumps(state), calls, MODEL_USAGE)
        if command == "wait" and turn.framework_run_state is None:
            arguments = json.dumps({"duration_seconds": int(argument), "reason": "scripted wait"})
            calls = [
                DeferredToolCall(
                    "call-1", DURABLE_WAIT_TOOL, arguments, turn.resolve_tool_policy("durable_wait")
                )
            ]
            return ToolCallsRequested(json.dumps({"calls": ["call-1"]}), calls, MODEL_USAGE)
        if command == "ask" and turn.framework_run_state is None:
            prompt, *choices = [part.strip() for part in argument.split("|")]
            question: dict[str, object] = {"prompt": prompt}
            if choices:
                question["choices"] = choices
            calls = [
                DeferredToolCall(
                    "call-1",
                    REQUEST_USER_INPUT_TOOL,
                    json.dumps(question),
                    turn.resolve_tool_policy(REQUEST_USER_INPUT_TOOL),
                ),
                DeferredToolCall("call-2", "lookup", "{}", turn.resolve_tool_policy("lookup")),
            ]
            state = {"calls": ["call-1", "call-2"]}
            return ToolCallsRequested(json.dumps(state), calls, MODEL_USAGE)
        if command in ("sub", "subs", "sub-missing") and turn.framework_run_state is None:
            tasks = [argument.strip()] if command != "subs" else tool_names
            name = "agent__missing" if command == "sub-missing" else "agent__helper"
            calls = [
                DeferredToolCall(
                    f"sub-{index}",
                    name,
                    json.dumps({"task": task}),
                    turn.resolve_tool_policy(name),
                )
                for index, task in enumerate(tasks, start=1)
            ]
            state = {"calls": [call.tool_call_id for call in calls]}
            return ToolCallsRequested(json.dumps(state), calls, MODEL_USAGE)
        if command in ("tools", "tools-then-fail") and turn.framework_run_state is None:
            calls = [
                DeferredToolCall(
                    f"call-{index}",
                    name,
                    json.dumps({"n": index}),
                    turn.resolve_tool_policy(name),
                )
                for index, name in enumerate(tool_names, start=1)
            ]
            turn.events.write_text_delta("calling tools")
            state = {"calls": [call.tool_call_id for call in calls]}
            return ToolCallsRequested(json.dumps(state), calls, MODEL_USAGE)
        if command == "tools-then-fail":
            raise RuntimeError("scripted model failure after tools")
        steered = list(turn.steered_messages)
        steered_note = f" steered={[item.text for item in steered]}" if steered else ""
        if turn.framework_run_state is not None:
            call_ids = json.loads(turn.framework_run_state)["calls"]
            records = [turn.recorded_tool_call(call_id) for call_id in call_ids]
            results = [
                FrameworkMessage(
                    MessageRole.TOOL,
                    {"tool_call_id": record.tool_call_id, "status": record.status},
                    describe_tool_call_outcome(record),
                    tool_call_id=record.tool_call_id,
                )
                for record in records
            ]
            answer = "; ".join(
                f"{record.tool_name}={record.status}: {describe_tool_call_outcome(record)}"
                for record in records
            )
            answer += steered_note
            request = FrameworkMessage(MessageRole.ASSISTANT, {"tool_calls": call_ids}, "")
            final = FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)
            turn.events.write_text_delta(answer)
            return TurnCompleted([request, *results, *steered, final], MODEL_USAGE)
        answer = f"echo: {script}{steered_note}"
        turn.events.write_text_delta(answer)
        return TurnCompleted(
            [*steered, FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)],
            MODEL_USAGE,
        )

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        name = call.tool_call.tool_name
        log = invocation_log()
        log.record("tool", name)
        log.record("key", f"{name} {call.idempotency_key} attempt={call.attempt}")
        log.record("arguments", f"{name} {call.tool_call.arguments}")
        if name in GATED_TOOLS:
            gate = FileGate(state_dir(), name)
            gate.reach()
            await gate.wait_for_release()
        if name in CRASHING_TOOLS:
            raise RuntimeError(f"{name} crashed on attempt {call.attempt}")
        if name == "broken":
            raise ToolExecutionError("the broken tool always fails")
        if name == "huge":
            return ToolExecutionResult(HUGE_RESULT)
        if name == "whole":
            return ToolExecutionResult(WHOLE_RESULT[:WHOLE_SHOWN], full_text=WHOLE_RESULT)
        if name == "hang_read":
            await asyncio.sleep(HANG_SECONDS)
        if name in ELICITING_TOOLS:
            return await self._ask_form(call)
        return ToolExecutionResult(f"{name} ok")

    async def _ask_form(self, call: DeferredToolExecution) -> ToolExecutionResult:
        seconds = (call.agent_config or {}).get("elicitation_timeout", 600)
        asker = ToolCallElicitations(
            session_client(self.flow_type),
            call,
            server_name="scripted",
            timeout=timedelta(seconds=float(seconds)),
        )
        outcome = await asker.ask(
            mode="form", message=ASK_FORM_MESSAGE, requested_schema=ASK_FORM_SCHEMA
        )
        invocation_log().record("asked", f"{outcome.action} attempt={call.attempt}")
        if call.tool_call.tool_name == "ask_form_gated":
            gate = FileGate(state_dir(), "ask_form_gated")
            gate.reach()
            await gate.wait_for_release()
        text = f"{outcome.action} {json.dumps(outcome.content, sort_keys=True)}"
        if call.tool_call.tool_name == "ask_form_twice":
            again = await asker.ask(
                mode="form", message="And once more?", requested_schema=ASK_FORM_SCHEMA
            )
            text += f" | {again.action} {json.dumps(again.content, sort_keys=True)}"
        return ToolExecutionResult(f"{text} {' '.join(asker.notes)}".strip())


def execute_plan_step(turn: AgentTurnContext) -> AgentTurnOutcome:
    """One model call of an ``executing`` turn (see the module docstring)."""
    items: list[FrameworkMessage] = []
    if turn.framework_run_state is not None:
        state = json.loads(turn.framework_run_state)
        items = [
            FrameworkMessage(MessageRole(role), item, text) for role, item, text in state["items"]
        ]
        for call_id in state["calls"]:
            record = turn.recorded_tool_call(call_id)
            items.append(
                FrameworkMessage(
                    MessageRole.TOOL,
                    {"tool_call_id": call_id, "status": record.status},
                    describe_tool_call_outcome(record),
                )
            )
    items.extend(turn.steered_messages)
    plan = turn.plan
    assert plan is not None, "an executing turn always has a plan"
    unfinished = [task for task in plan.tasks if task.status is not PlanTaskStatus.COMPLETED]
    answer = None
    if not unfinished:
        answer = "plan complete"
    elif unfinished[0].content.startswith("stop") and not any(
        message.text == f"stopped at {unfinished[0].content}" for message in turn.messages
    ):
        answer = f"stopped at {unfinished[0].content}"
    if answer is not None:
        final = FrameworkMessage(MessageRole.ASSISTANT, {"content": answer}, answer)
        return TurnCompleted([*items, final], MODEL_USAGE)
    done = unfinished[0]
    todos = [
        {"content": task.content, "status": "completed" if task is done else str(task.status)}
        for task in plan.tasks
    ]
    calls = [
        DeferredToolCall(
            f"write-{plan.revision}",
            WRITE_TODOS_TOOL,
            json.dumps({"todos": todos}),
            turn.resolve_tool_policy(WRITE_TODOS_TOOL),
        )
    ]
    if done.content.startswith("ask"):
        calls.append(
            DeferredToolCall(
                f"ask-{plan.revision}",
                REQUEST_USER_INPUT_TOOL,
                json.dumps({"prompt": done.content}),
                turn.resolve_tool_policy(REQUEST_USER_INPUT_TOOL),
            )
        )
    call_ids = [call.tool_call_id for call in calls]
    items.append(FrameworkMessage(MessageRole.ASSISTANT, {"tool_calls": call_ids}, ""))
    state = {
        "calls": call_ids,
        "items": [[str(item.role), item.framework_item, item.text] for item in items],
    }
    return ToolCallsRequested(json.dumps(state), calls, MODEL_USAGE)


def write_after_return(turn: AgentTurnContext) -> None:
    """Once the test releases ``late_write``, write a delta the session must drop."""
    gate = FileGate(state_dir(), "late_write")
    give_up_at = time.monotonic() + 60
    while not gate.is_released() and time.monotonic() < give_up_at:
        time.sleep(0.02)
    turn.events.write_text_delta("too late")
    invocation_log().record("late", "written")


class GatedResolveFlow(AgentSessionFlow):
    """``resolve_interrupt`` waits at the ``RESOLVE_GATE`` while it holds PendingInterrupts, so
    a test can fire the deadline Timer while the answer is being committed."""

    @rpc(lock_attributes=(PENDING_INTERRUPTS.lock(),))
    def resolve_interrupt(
        self, context: Context, request: ResolveInterruptRequest
    ) -> RPCResult[bool]:
        gate = FileGate(state_dir(), RESOLVE_GATE)
        gate.reach()
        give_up_at = time.monotonic() + 60
        while not gate.is_released() and time.monotonic() < give_up_at:
            time.sleep(0.02)
        return super().resolve_interrupt(context, request)


def changes_path(directory: Path | None = None) -> Path:
    """Where the Worker's observer appends one JSON line per ``AgentSessionChange``."""
    return (directory or state_dir()) / "changes.jsonl"


async def record_change(change: AgentSessionChange) -> None:
    """The scripted Flows' observer (platform addition): log every change the Steps report."""
    line = json.dumps(
        {
            "flow_id": change.flow_id,
            "observed_at": change.observed_at.isoformat(),
            "status": None if change.status is None else str(change.status),
            "turn_id": change.turn_id,
            "raised": [
                [item.interrupt_id, item.deadline.isoformat() if item.deadline else None]
                for item in change.raised
            ],
            "closed": [[item.interrupt_id, str(item.outcome)] for item in change.closed],
            "usage": None if change.usage is None else change.usage.as_dict(),
            "model_call_id": change.model_call_id,
        }
    )
    with changes_path().open("a") as log:
        log.write(line + "\n")


async def scripted_turn_guard(check: TurnGuardCheck) -> str | None:
    """The compacting Flow's ``turn_guard``: ``stop_after_calls`` of the agent config against
    the model calls the observer logged for the session (so the call just made counts)."""
    limit = (check.agent_config or {}).get("stop_after_calls")
    invocation_log().record("guard", check.turn_id)
    if not isinstance(limit, int):
        return None
    path = changes_path()
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
    calls = {
        line["model_call_id"]
        for line in lines
        if line["flow_id"] == check.flow_id and line["usage"] is not None
    }
    return f"Budget reached: {limit} calls" if len(calls) >= limit else None


class ScriptedSubagents:
    """The subagent Flow's ``SubagentDirectory``: ``agent__helper`` starts a child with the
    parent's agent config and policies; ``agent__missing`` is refused. Each start, stop and
    result is logged in the ``InvocationLog``."""

    def __init__(self, flow_type: str) -> None:
        self.flow_type = flow_type

    def is_subagent_tool(self, agent_config: dict[str, Any] | None, tool_name: str) -> bool:
        return tool_name in ("agent__helper", "agent__missing")

    async def child_start(self, request: SubagentRequest) -> AgentSessionStartInput:
        invocation_log().record("child_start", request.child_session_id)
        if request.tool_name == "agent__missing":
            raise SubagentRefusedError("no agent named 'missing' is available")
        return AgentSessionStartInput(agent_config=request.agent_config)

    async def child_cancel(self, child_session_id: str, reason: str) -> None:
        invocation_log().record("child_cancel", child_session_id)
        with contextlib.suppress(Exception):
            await session_client(self.flow_type).stop_session(child_session_id)

    async def child_finished(self, child_session_id: str, result: SubagentResult) -> None:
        invocation_log().record("child_finished", f"{child_session_id} {result.outcome}")


def build_flow(flow_type: str = FLOW_TYPE) -> AgentSessionFlow:
    deadline = {
        DEADLINE_FLOW_TYPE: INTERRUPT_DEADLINE,
        LONG_DEADLINE_FLOW_TYPE: LONG_INTERRUPT_DEADLINE,
        GATED_RESOLVE_FLOW_TYPE: LONG_INTERRUPT_DEADLINE,
    }.get(flow_type)
    flow_class = GatedResolveFlow if flow_type == GATED_RESOLVE_FLOW_TYPE else AgentSessionFlow
    return flow_class(
        ScriptedRunner(flow_type),
        flow_type=flow_type,
        options=AgentSessionOptions(
            tool_policies=TOOL_POLICIES,
            interrupt_deadline=deadline,
            observer=record_change,
            steering=flow_type in PLATFORM_LIKE_FLOW_TYPES,
            durable_waits=flow_type in PLATFORM_LIKE_FLOW_TYPES,
            user_input=flow_type in PLATFORM_LIKE_FLOW_TYPES,
            plans=flow_type in PLATFORM_LIKE_FLOW_TYPES,
            compaction=CompactionOptions() if flow_type == COMPACTING_FLOW_TYPE else None,
            turn_guard=scripted_turn_guard if flow_type == COMPACTING_FLOW_TYPE else None,
            subagents=(
                SubagentOptions(
                    ScriptedSubagents(flow_type),
                    max_depth=SUBAGENT_MAX_DEPTH,
                    max_children_per_turn=SUBAGENT_MAX_CHILDREN,
                )
                if flow_type == SUBAGENT_FLOW_TYPE
                else None
            ),
        ),
    )


def build_flows() -> list[AgentSessionFlow]:
    return [
        build_flow(FLOW_TYPE),
        build_flow(DEADLINE_FLOW_TYPE),
        build_flow(LONG_DEADLINE_FLOW_TYPE),
        build_flow(GATED_RESOLVE_FLOW_TYPE),
        build_flow(STEERING_FLOW_TYPE),
        build_flow(COMPACTING_FLOW_TYPE),
        build_flow(SUBAGENT_FLOW_TYPE),
    ]
