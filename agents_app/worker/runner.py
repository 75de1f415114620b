"""The LiteLLM runner: the platform's ``AgentFrameworkRunner`` (seed "The runner contract").

``LiteLLMRunner`` is the one runner of the shared Flow (``agents_app.worker.flow``). The agent
comes from each session's ``agent_config``, a snapshot of its agent definition (its shape:
``agents_app.worker.agent_config``). This module holds the runner and what it stores; the
rest of its work lives beside it, one responsibility a module:

- ``agent_config``: the parsed agent definition (model, key variable, tools, limits, prices);
- ``model_input``: the model input rebuilt from Dex state (stored messages, the turn's run
  state and tool results, cuts to the window, images), the summarizer's input;
- ``model_requests``: stored items in each API's wire form, and the LiteLLM request;
- ``model_calls``: the LiteLLM calls and the reading of their replies (``model_replies``;
  streamed deltas buffered and merged in ``reply_deltas``);
- ``provider_errors``: which provider failures another attempt may fix (issue 25);
- ``tool_calls``: a reply's tool calls, checked and given Dex IDs;
- ``tool_execution``: one approved tool call on its MCP server, its progress, logs and the
  server's questions to the user.

Every ``framework_item`` is an OpenAI Chat Completions message dict (``role``, ``content``,
``tool_calls``, ``tool_call_id``), plus what a provider needs replayed verbatim on later calls:
``thinking_blocks`` (Anthropic thinking, signatures included), ``reasoning_items`` (OpenAI
Responses reasoning items with ``encrypted_content``) and, per tool call,
``provider_specific_fields`` (Gemini thought signatures). Tool call ``id`` values are the
provider's own; the Dex tool call ID is derived from them (non-empty, no ``/``, unique within the
turn) and the run state keeps the mapping.

``run_model_step`` rebuilds the model input from the stored messages (plus, while a turn waits
for tools, the turn's own items from the run state and each tool call's final record), makes
exactly one LiteLLM call (``acompletion`` or ``aresponses``, ``store=False``, LiteLLM retries
off so Dex owns retries) and returns ``ToolCallsRequested`` or ``TurnCompleted``.
``execute_deferred_tool_call`` runs one tool through the MCP client pool (``tool_execution``).
A question the server asks during the call (``elicitation/create``) becomes a question of the
session (``dex_agents.ToolCallElicitations``): the user answers it in the browser or the API
while the call waits, and the server gets ``accept`` with the form's values, ``decline`` or
``cancel``. Images a tool result carries reach the models that accept them (``model_input``).

The runner is also a ``dex_agents.CompactingRunner``: it counts the input it would send with
LiteLLM's token counter against the window (agent definition, else LiteLLM's model
information), puts the session's summary (``turn.summary``) into the input as a system message
after the system prompt, and summarizes with one non-streamed Chat Completions call per chunk
(``summarize``). A provider's context-window error becomes ``ContextWindowExceededError``.

Keys come from the worker's environment at call time (``agents_app.providers``); they are never
stored, logged, or left in an error message.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from agents_app.log_context import bind_session
from agents_app.metrics import TOOL_CALLS, TURNS_COMPLETED, TURNS_FAILED, TURNS_STARTED
from agents_app.providers import count_text_tokens, count_tokens
from agents_app.usage.pricing import usage_priced
from agents_app.worker.agent_config import CHARS_PER_TOKEN, AgentModelConfig
from agents_app.worker.model_calls import model_call, summary_call
from agents_app.worker.model_input import (
    build_model_input,
    cut_tool_result,
    encode_run_state,
    stored_message_item,
    summary_request_messages,
)
from agents_app.worker.model_replies import ModelReply, ModelResponseError, usage_from
from agents_app.worker.model_requests import chat_message
from agents_app.worker.reply_deltas import DeltaBuffer, ReasoningDeltaBuffer
from agents_app.worker.tool_calls import (
    REJECTED_CALL_POLICY,
    PreparedToolCall,
    finalize_tool_calls,
)
from agents_app.worker.tool_execution import (
    ServerResolver,
    SessionClientFactory,
    tool_call_execute,
)
from dex_agents import (
    TURN_CANCELLED_NOTE_HEADER,
    AgentMessage,
    AgentToolCall,
    AgentTurnContext,
    AgentTurnOutcome,
    AgentUsage,
    DeferredToolCall,
    DeferredToolExecution,
    FrameworkMessage,
    MessageRole,
    ModelCallError,
    SummarizeRequest,
    SummaryResult,
    ToolCallsRequested,
    ToolExecutionError,
    ToolExecutionResult,
    TurnCompleted,
    describe_tool_call_outcome,
)
from mcp_registry.client import McpClientPool
from mcp_registry.content import MediaLimits, replace_encoded_results

__all__ = ["TURN_FAILURE_NOTE_HEADER", "USAGE_KEY", "BudgetCheck", "LiteLLMRunner"]

USAGE_KEY = "usage"
"""Key of an assistant message item holding the priced usage of the call that produced it
(``AgentUsage.as_dict()``); providers never see it, ``chat_message`` drops it."""
TURN_FAILURE_NOTE_HEADER = "[Dex] The previous turn failed after these tool calls ran:"
"""First line of ``dex_agents.build_turn_failure_note`` (seed "RecordTurnFailure")."""


#: ``LiteLLMRunner(budget_check=...)``: ``async (owner_id or None, agent slug) -> why a model
#: call may not be made now, or None``.
BudgetCheck = Callable[[str | None, str], Awaitable[str | None]]


def _assistant_item(
    reply: ModelReply,
    calls: Sequence[PreparedToolCall],
    usage: AgentUsage,
    reasoning: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The stored Chat Completions item of one reply; ``usage`` (``USAGE_KEY``) is the priced
    usage of the call that produced it and ``reasoning`` (``ReasoningDeltaBuffer.summary``)
    its readable reasoning, both kept for people (:func:`chat_message` never sends them
    back to a provider)."""
    item: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if calls:
        item["tool_calls"] = [call.history_item() for call in calls]
    if reply.thinking_blocks:
        item["thinking_blocks"] = [dict(block) for block in reply.thinking_blocks]
    if reply.reasoning_items:
        item["reasoning_items"] = [dict(entry) for entry in reply.reasoning_items]
    if reasoning:
        item["reasoning"] = dict(reasoning)
    item[USAGE_KEY] = usage.as_dict()
    return item


def _framework_message(item: Mapping[str, Any]) -> FrameworkMessage:
    role = MessageRole(item["role"])
    content = item.get("content")
    answered = item.get("tool_call_id") if role is MessageRole.TOOL else None
    return FrameworkMessage(
        role=role,
        framework_item=dict(item),
        text=content if isinstance(content, str) else "",
        tool_call_id=answered if isinstance(answered, str) else None,
    )


#: RunModel's attempts (seed "run_model_step": 3 attempts within 30 minutes); the last one
#: failing fails the turn.
_RUN_MODEL_ATTEMPTS = 3


_LOG = logging.getLogger(__name__)
#: How many abandoned calls' reported usage ``LiteLLMRunner`` keeps for the Step to read.
_ABANDONED_KEPT = 64


class LiteLLMRunner:
    """``AgentFrameworkRunner`` over LiteLLM (model calls) and MCP (tools).

    Stateless between calls apart from the MCP session pool. One instance serves every session
    of the shared Flow; the agent comes from each session's ``agent_config`` (``default_config``
    is used when a session has none).

    Args:
        server_resolver: ``async (server_name) -> McpServerSpec`` for tool calls. An exception
            it raises fails the tool Step (raise ``ToolExecutionError`` for a failure the model
            should see, e.g. a server that was disabled).
        pool: The MCP session pool; a new one by default. ``aclose()`` closes it.
        default_config: An ``agent_config`` dict for sessions that carry none.
        media_limits: The bounds of the images a tool result attaches for a model that
            accepts them (``accept_images`` is decided per agent); the defaults of
            ``mcp_registry.content`` when omitted.
        session_client: Gives a client of the session Flow for the running loop; a server's
            questions during a call wait for the user's answer through it. ``None``: every
            question is declined (the MCP client's default).
        budget_check: ``async (owner_id, agent_slug) -> refusal or None``, asked before each
            model call (issue 27 "Budgets", ``agents_app.usage.budgets``); a refusal fails the turn
            at once with it as the note. The call that crossed a budget already stops its own
            turn before its tool calls run (the Flow's ``turn_guard``); this catches a budget
            that another session spent meanwhile.
    """

    def __init__(
        self,
        server_resolver: ServerResolver,
        *,
        pool: McpClientPool | None = None,
        default_config: Mapping[str, Any] | None = None,
        media_limits: MediaLimits | None = None,
        session_client: SessionClientFactory | None = None,
        budget_check: BudgetCheck | None = None,
    ) -> None:
        self._server_resolver = server_resolver
        self._pool = pool if pool is not None else McpClientPool()
        self._default_config = dict(default_config) if default_config is not None else None
        self._media_limits = media_limits or MediaLimits()
        self._session_client = session_client
        self._budget_check = budget_check
        #: Usage the provider had reported when a call was abandoned, by (flow, turn, attempt).
        self._abandoned: dict[tuple[str, str, int], Any] = {}

    @property
    def media_limits(self) -> MediaLimits:
        """The bounds of the images a tool result attaches (``accept_images`` is per agent)."""
        return self._media_limits

    def _remember_abandoned(self, turn: AgentTurnContext, raw_usage: Any) -> None:
        """Keep what a cancelled call's provider reported until ``abandoned_call_usage``
        reads it (at most ``_ABANDONED_KEPT`` calls: one the Step never asks for is dropped)."""
        while len(self._abandoned) >= _ABANDONED_KEPT:
            del self._abandoned[next(iter(self._abandoned))]
        self._abandoned[(turn.flow_id, turn.turn_id, turn.attempt)] = raw_usage

    def abandoned_call_usage(self, turn: AgentTurnContext, streamed_text: str) -> AgentUsage:
        """The usage of ``turn``'s model call that ``cancel_turn`` abandoned (``dex_agents``
        calls it once the call's task was cancelled), priced as every call is.

        What the provider reported, when its usage arrived before the call was abandoned (a
        Chat Completions stream sends it in its last chunk, so this is rare). Otherwise an
        estimate made the way LiteLLM builds the usage of a stream that sent none (its
        ``token_counter``): the input as ``count_input_tokens(turn)`` counts it, and the
        output as the tokens of ``streamed_text``, what had arrived. A provider that goes on
        generating until it notices the closed connection bills a few tokens more; reasoning
        the call streamed is not in the estimate. Never raises: a count that fails leaves
        the request counted with no tokens (``requests=1``).
        """
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        raw = self._abandoned.pop((turn.flow_id, turn.turn_id, turn.attempt), None)
        if raw is not None:
            usage = usage_from(raw)
        else:
            usage = AgentUsage(requests=1)
            try:
                usage = AgentUsage(
                    input_tokens=self.count_input_tokens(turn),
                    output_tokens=count_text_tokens(config.model, streamed_text),
                    requests=1,
                )
            except Exception:
                _LOG.warning("Could not estimate the usage of a cancelled model call",
                             exc_info=True)
        try:
            return usage_priced(
                usage,
                model=config.model,
                input_price_per_mtok=config.input_price_per_mtok,
                output_price_per_mtok=config.output_price_per_mtok,
            )
        except Exception:
            _LOG.warning("Could not price a cancelled model call", exc_info=True)
            return usage

    def _config(self, agent_config: Mapping[str, Any] | None) -> AgentModelConfig:
        return AgentModelConfig.parse(
            agent_config if agent_config is not None else self._default_config
        )

    def describe_outcome_for_note(self, record: AgentToolCall) -> str:
        """A record's outcome as the note of a failed turn quotes it (before the note cuts it,
        ``dex_agents.build_turn_failure_note``): its text, an encoded result with images
        replaced by its text, so no image data reaches the note even in part."""
        return replace_encoded_results(describe_tool_call_outcome(record))

    def build_user_message(self, text: str) -> FrameworkMessage:
        """A user message: ``framework_item={"role": "user", "content": text}``.

        The note of a failed or cancelled turn (``TURN_FAILURE_NOTE_HEADER``,
        ``dex_agents.TURN_CANCELLED_NOTE_HEADER``) quotes each record's output;
        a result with images is replaced by its text there, so no image data is stored in a
        message or shown to people."""
        if text.startswith((TURN_FAILURE_NOTE_HEADER, TURN_CANCELLED_NOTE_HEADER)):
            text = replace_encoded_results(text)
        return FrameworkMessage(
            role=MessageRole.USER, framework_item={"role": "user", "content": text}, text=text
        )

    def build_assistant_message(
        self, text: str, usage: AgentUsage | None = None
    ) -> FrameworkMessage:
        """The text a cancelled model call had streamed (``dex_agents`` ``cancel_turn``):
        ``framework_item={"role": "assistant", "content": text}``, replayed to the model as
        its own earlier words, with the abandoned call's priced ``usage``
        (``abandoned_call_usage``) under ``USAGE_KEY`` when it is known, as every answered
        call's (:func:`chat_message` never sends it back to a provider)."""
        item: dict[str, Any] = {"role": "assistant", "content": text}
        if usage is not None:
            item[USAGE_KEY] = usage.as_dict()
        return FrameworkMessage(role=MessageRole.ASSISTANT, framework_item=item, text=text)

    # --- dex_agents.CompactingRunner (context compaction) -------------------------------------

    def context_window(self, agent_config: dict[str, Any] | None) -> int | None:
        """The session's context window: the agent definition's, else LiteLLM's model
        information, else ``None``."""
        return self._config(agent_config).window()

    def count_input_tokens(self, turn: AgentTurnContext) -> int:
        """LiteLLM's token count of the input ``run_model_step(turn)`` would send, the tools
        offered with it included."""
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        messages, _ = build_model_input(config, turn)
        tools = [entry.as_openai_tool() for entry in config.tools]
        return count_tokens(config.model, [chat_message(item) for item in messages], tools)

    def count_message_tokens(
        self, message: AgentMessage, agent_config: dict[str, Any] | None
    ) -> int:
        """LiteLLM's token count of one stored message as the model sees it (tool results
        cut)."""
        config = self._config(agent_config)
        item = cut_tool_result(stored_message_item(message), config.tool_result_limit())
        return count_tokens(config.model, [chat_message(item)])

    async def summarize(self, request: SummarizeRequest) -> SummaryResult:
        """``_summarize`` with the session ID on its log lines."""
        with bind_session(request.flow_id, request_id=f"{request.flow_id}/compaction"):
            return await self._summarize(request)

    async def _summarize(self, request: SummarizeRequest) -> SummaryResult:
        """Fold ``request.messages`` into the previous summary with one non-streamed Chat
        Completions call (``compaction_model``, else the agent's model); the call's usage is
        priced like a turn's model call (the agent's prices when the summarizer is its
        model) and the session counts it (``SummaryResult``).

        The input stays within ``request.input_budget_tokens``: each message is cut (to no
        less than 200 characters) until it fits; the answer is asked for with ``max_tokens``
        and cut to the summary budget.

        Raises:
            ModelResponseError: An empty summary.
            AgentConfigError, RedactedProviderError, Exception: As ``run_model_step`` (a
                refusal is retried here: CompactContext has its own attempts).
        """
        config = self._config(request.agent_config)
        model = config.compaction_model or config.model
        messages = summary_request_messages(
            model,
            request.previous_summary,
            [stored_message_item(message) for message in request.messages],
            [message.sequence for message in request.messages],
            request.input_budget_tokens,
        )
        reply = await summary_call(config, model, messages, request.summary_budget_tokens)
        text = reply.text.strip()
        if not text:
            raise ModelResponseError("the summarizer returned an empty summary")
        # The agent's own prices are for its model; another summarizer model is priced from
        # LiteLLM's cost map.
        own_prices = model == config.model
        usage = usage_priced(
            reply.usage,
            model=model,
            input_price_per_mtok=config.input_price_per_mtok if own_prices else None,
            output_price_per_mtok=config.output_price_per_mtok if own_prices else None,
        )
        return SummaryResult(text[: request.summary_budget_tokens * CHARS_PER_TOKEN], usage)

    async def run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """``_run_model_step`` with the session ID on its log lines and the turn counters
        (``agents_app.metrics``): started on a turn's first model call (first attempt),
        completed when the call ends the turn, failed when the last of RunModel's
        ``_RUN_MODEL_ATTEMPTS`` attempts raises."""
        with bind_session(turn.flow_id, request_id=f"{turn.flow_id}/{turn.turn_id}"):
            if turn.framework_run_state is None and turn.attempt == 1:
                TURNS_STARTED.inc()
            try:
                outcome = await self._run_model_step(turn)
            except ModelCallError:
                TURNS_FAILED.inc()  # RunModel does not retry it
                raise
            except Exception:
                if turn.attempt >= _RUN_MODEL_ATTEMPTS:
                    TURNS_FAILED.inc()
                raise
            if isinstance(outcome, TurnCompleted):
                TURNS_COMPLETED.inc()
            return outcome

    async def _run_model_step(self, turn: AgentTurnContext) -> AgentTurnOutcome:
        """Make one model call for ``turn`` (seed "run_model_step(turn)").

        Text and reasoning deltas go to ``turn.events`` through 1 s / 16 KiB buffers, flushed
        before this returns or raises. Returns ``ToolCallsRequested`` (run state: the turn's
        items so far and the Dex IDs of the requested calls) or ``TurnCompleted`` (every item
        after the user message), with this call's usage.

        Raises:
            AgentConfigError: The agent config is missing or its key variable is unset.
            ModelResponseError: Empty response, a tool call without a name, or a failed
                Responses stream.
            dex_agents.ModelCallError: The provider refused the request itself (HTTP 400,
                401, 402, 403, 404 or 422 other than a context-window error), or a budget is
                spent (``budget_check``): RunModel does not retry it, the turn fails with this
                message (issues 25, 27).
            ContextWindowExceededError: The input is longer than the model's window (the
                session compacts, or fails the turn at once).
            dex_agents.ModelRateLimitError: HTTP 429 with ``Retry-After``: retried after that
                many seconds (at most 600).
            RedactedProviderError: A provider error whose text held the key (redacted).
            ValueError: Unusable run state or missing tool call records.
            Exception: Any other LiteLLM/provider error (timeouts, connection errors, 429
                without ``Retry-After``, 5xx). All but the first three fail the attempt
                (retried).
        """
        config = self._config(turn.agent_config).for_turn_mode(turn.turn_mode)
        if self._budget_check is not None:
            refusal = await self._budget_check(
                config.owner_id, str((turn.agent_config or {}).get("agent") or "")
            )
            if refusal:
                raise ModelCallError(refusal)
        messages, turn_items = build_model_input(config, turn)
        text_events = DeltaBuffer(turn.events.write_text_delta)
        reasoning_events = ReasoningDeltaBuffer(
            turn.events.write_reasoning_delta, started=time.monotonic()
        )
        usage_seen: list[Any] = []
        try:
            reply = await model_call(config, messages, text_events, reasoning_events, usage_seen)
        except asyncio.CancelledError:
            # cancel_turn abandoned the call: abandoned_call_usage reads what it reported.
            self._remember_abandoned(turn, usage_seen[-1] if usage_seen else None)
            raise
        finally:
            reasoning_events.flush()
            text_events.flush()
        usage = usage_priced(
            reply.usage,
            model=config.model,
            input_price_per_mtok=config.input_price_per_mtok,
            output_price_per_mtok=config.output_price_per_mtok,
        )

        if reply.tool_calls:
            calls = finalize_tool_calls(reply.tool_calls, config, turn_items, turn.tool_calls)
            turn_items.append(_assistant_item(reply, calls, usage, reasoning_events.summary()))
            deferred = []
            for call in calls:
                if call.error is not None:
                    policy = REJECTED_CALL_POLICY
                else:
                    entry = config.tool(call.name)
                    policy = turn.resolve_tool_policy(
                        call.name, entry.effect if entry is not None else None
                    )
                deferred.append(
                    DeferredToolCall(
                        tool_call_id=call.dex_id,
                        tool_name=call.name,
                        arguments=call.arguments,
                        policy=policy,
                    )
                )
            return ToolCallsRequested(
                framework_run_state=encode_run_state(turn_items, [c.dex_id for c in calls]),
                tool_calls=deferred,
                usage=usage,
            )
        if not reply.text.strip():
            raise ModelResponseError("the model returned an empty response")
        turn_items.append(_assistant_item(reply, (), usage, reasoning_events.summary()))
        return TurnCompleted(
            new_messages=[_framework_message(item) for item in turn_items], usage=usage
        )

    async def execute_deferred_tool_call(self, call: DeferredToolExecution) -> ToolExecutionResult:
        """Run one approved tool call (``tool_execution.tool_call_execute``, whose docstring
        says what it returns and raises) with the session ID on its log lines, counted in
        ``dexagents_tool_calls_total`` by effect and status (``succeeded``; ``failed``: a
        ``ToolExecutionError`` the model sees; ``error``: anything else, a failed attempt).

        Raises:
            AgentConfigError: The session has no agent config.
        """
        record = call.tool_call
        effect = str(getattr(record.effect, "value", record.effect))
        with bind_session(call.flow_id, request_id=call.idempotency_key):
            try:
                result = await tool_call_execute(
                    call,
                    self._config(call.agent_config),
                    pool=self._pool,
                    server_resolver=self._server_resolver,
                    media_limits=self._media_limits,
                    session_client=self._session_client,
                )
            except ToolExecutionError:
                TOOL_CALLS.labels(effect=effect, status="failed").inc()
                raise
            except Exception:
                TOOL_CALLS.labels(effect=effect, status="error").inc()
                raise
            TOOL_CALLS.labels(effect=effect, status="succeeded").inc()
            return result

    async def aclose(self) -> None:
        """Close the MCP sessions this runner opened."""
        await self._pool.aclose()


