"""The LiteLLM calls of the runner: one per RunModel Step, one per summary, and the warm-up.

Each is exactly one call (``acompletion`` or ``aresponses``) with LiteLLM's own retries off,
so Dex owns retries (seed "run_model_step(turn)"); a failure is sorted by
``agents_app.worker.provider_errors.provider_failure``. A streamed reply's text and reasoning
deltas go to the caller's buffers as they arrive (``agents_app.worker.model_replies``).

May import: ``agents_app.worker.agent_config``, ``model_requests``, ``model_replies``,
``provider_errors``, ``reply_deltas``, ``agents_app.providers`` and ``dex_agents``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from agents_app.providers import (
    litellm_warm,
    load_litellm,
    remember_served_window,
    unpriced_model_pricing,
)
from agents_app.worker.agent_config import AgentModelConfig
from agents_app.worker.model_replies import (
    ModelReply,
    ModelResponseError,
    chat_response_reasoning,
    openai_chunk_stream,
    read_chat_response,
    read_chat_stream,
    read_responses_response,
    read_responses_stream,
)
from agents_app.worker.model_requests import DEFAULT_MODEL_TIMEOUT, chat_request, responses_request
from agents_app.worker.provider_errors import provider_failure
from agents_app.worker.reply_deltas import DeltaBuffer
from dex_agents import ContextWindowExceededError

__all__ = ["model_call", "model_calls_warm", "summary_call"]

_litellm = load_litellm
"""Import LiteLLM lazily (see ``agents_app.providers.load_litellm``)."""


async def model_calls_warm() -> None:
    """Do before a worker serves what its first model Step would do on the event loop.

    LiteLLM's import and tokenizer (:func:`agents_app.providers.litellm_warm`, in a thread),
    then one streamed Chat Completions call answered by LiteLLM's ``mock_response`` (no
    network) and read with :func:`read_chat_stream`, which imports what a first real call
    imports lazily (anyio's asyncio backend, LiteLLM's stream wrapper and logging, OpenAI
    response types): ~1.5 s of a loaded 2-core machine. Every one of them ran synchronously in
    the first RunModel Step, blocking every RPC the worker was serving meanwhile.

    Raises:
        Whatever LiteLLM raises: the worker would fail its model calls the same way.
    """
    await asyncio.to_thread(litellm_warm)
    stream = await _litellm().acompletion(
        model="openai/dexagents-warm-up",
        messages=[{"role": "user", "content": "warm up"}],
        stream=True,
        stream_options={"include_usage": True},
        mock_response="ok",
    )
    await read_chat_stream(stream, DeltaBuffer(lambda _text: None),
                           DeltaBuffer(lambda _text: None))


async def model_call(
    config: AgentModelConfig,
    messages: Sequence[Mapping[str, Any]],
    text: DeltaBuffer,
    reasoning: DeltaBuffer,
    usage_seen: list[Any] | None = None,
) -> ModelReply:
    """Make the one LiteLLM call of a RunModel Step for ``messages`` (as
    ``build_model_input`` returns them) and read its reply: streamed deltas go to the buffers,
    a streamed Chat Completions usage to ``usage_seen`` as it arrives; a whole answer's text
    and reasoning go to the buffers at once. The buffers are not flushed here.

    Raises:
        AgentConfigError: The key variable is not set.
        ModelResponseError: A failed or unreadable reply.
        ContextWindowExceededError: The provider refused the input as too long; its
            ``retry_may_fit`` says whether the provider named a smaller window than the one
            the input was cut for (``agents_app.providers.remember_served_window``).
        dex_agents.ModelCallError, dex_agents.ModelRateLimitError, ProviderCallError,
            RedactedProviderError, Exception: As :func:`provider_failure` sorts them.
    """
    litellm = _litellm()
    api_key = config.api_key()
    if config.api == "responses":
        request = responses_request(config, messages)
    else:
        request = chat_request(config, messages)
    request.update(timeout=DEFAULT_MODEL_TIMEOUT, max_retries=0, num_retries=0)
    if config.api_base:
        request["api_base"] = config.api_base
    if api_key is not None:
        request["api_key"] = api_key
    try:
        if config.api == "responses":
            response = await litellm.aresponses(**request)
            if config.stream:
                return await read_responses_stream(response, text, reasoning)
            reply = read_responses_response(response)
            for item in reply.reasoning_items:
                for part in item.get("summary") or ():
                    reasoning.add(str(part.get("text") or ""))
        else:
            response = await litellm.acompletion(**request, drop_params=True)
            if config.stream:
                chunks = openai_chunk_stream(response)
                if chunks is None:
                    return await read_chat_stream(response, text, reasoning, usage_seen)
                try:
                    return await read_chat_stream(chunks, text, reasoning, usage_seen)
                finally:
                    # Ends the HTTP response however the read ended.
                    await response.aclose()
            reply = read_chat_response(response)
            reasoning.add(chat_response_reasoning(response))
        text.add(reply.text)
        return reply
    except ModelResponseError:
        raise
    except Exception as error:
        failure = provider_failure(error, api_key)
        if isinstance(failure, ContextWindowExceededError):
            # A smaller window learned now: the next attempt cuts this turn's tool results
            # for it (fit_tool_results), so it may fit without any compaction.
            failure.retry_may_fit = remember_served_window(
                config.model, config.context_window, config.api_base, str(failure)
            )
        if failure is error:
            raise
        raise failure from None


async def summary_call(
    config: AgentModelConfig, model: str, messages: list[dict[str, str]], max_tokens: int
) -> ModelReply:
    """Make the summarizer's one non-streamed Chat Completions call (``model``: the agent's
    ``compaction_model``, else its model; the agent's ``api_base`` and key) for ``messages``
    (``summary_request_messages``), its answer asked for with ``max_tokens``, and read it.

    Raises:
        AgentConfigError: The key variable is not set.
        ContextWindowExceededError, ProviderCallError, RedactedProviderError, Exception: As
            :func:`provider_failure` sorts them without ``refusals`` (a refusal is retried:
            CompactContext has its own attempts).
    """
    litellm = _litellm()
    api_key = config.api_key()
    call: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "stream": False,
        "max_tokens": max_tokens,
        "timeout": DEFAULT_MODEL_TIMEOUT,
        "max_retries": 0,
        "num_retries": 0,
        **unpriced_model_pricing(model),
    }
    if config.api_base:
        call["api_base"] = config.api_base
    if api_key is not None:
        call["api_key"] = api_key
    try:
        response = await litellm.acompletion(**call, drop_params=True)
    except Exception as error:
        failure = provider_failure(error, api_key, refusals=False)
        if failure is error:
            raise
        raise failure from None
    return read_chat_response(response)
