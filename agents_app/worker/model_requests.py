"""What LiteLLM is sent for one model call: stored items in each API's wire form, the request.

Every ``framework_item`` the runner stores is an OpenAI Chat Completions message dict (``role``,
``content``, ``tool_calls``, ``tool_call_id``), plus what a provider needs replayed verbatim on
later calls: ``thinking_blocks`` (Anthropic thinking, signatures included), ``reasoning_items``
(OpenAI Responses reasoning items with ``encrypted_content``) and, per tool call,
``provider_specific_fields`` (Gemini thought signatures). :func:`chat_message` gives such an
item as Chat Completions takes it, ``responses_input`` the Responses API's ``instructions`` and
``input`` items; :func:`chat_request` and :func:`responses_request` are the keyword arguments of
``litellm.acompletion`` and ``litellm.aresponses`` for one call (without the timeout, retries,
``api_base`` and key, which the caller adds).

May import: ``agents_app.worker.agent_config``, ``agents_app.worker.model_replies`` and
``agents_app.providers``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agents_app.providers import load_litellm, unpriced_model_pricing
from agents_app.worker.agent_config import AgentModelConfig
from agents_app.worker.model_replies import responses_input

__all__ = ["DEFAULT_MODEL_TIMEOUT", "chat_message", "chat_request", "responses_request"]

DEFAULT_MODEL_TIMEOUT = 600.0
"""Seconds one model call may take (the RunModel Step allows 15 minutes)."""

_CHAT_MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")

_litellm = load_litellm
"""Import LiteLLM lazily (see ``agents_app.providers.load_litellm``)."""


def chat_message(item: Mapping[str, Any]) -> dict[str, Any]:
    """The Chat Completions message LiteLLM receives for a stored or turn item.

    Keeps ``role``, ``content``, ``tool_calls`` (``id``, ``type``, ``function``,
    ``provider_specific_fields``), ``tool_call_id``, ``name`` and an assistant's
    ``thinking_blocks``; drops Responses-only ``reasoning_items``.
    """
    message = {key: item[key] for key in _CHAT_MESSAGE_KEYS if key in item}
    if message.get("tool_calls") is not None:
        message["tool_calls"] = [
            {
                key: value
                for key, value in call.items()
                if key in ("id", "type", "function", "provider_specific_fields")
            }
            for call in message["tool_calls"]
        ]
    if item.get("role") == "assistant" and item.get("thinking_blocks"):
        message["thinking_blocks"] = [dict(block) for block in item["thinking_blocks"]]
    return message


def chat_request(config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The Chat Completions request for ``messages`` (as ``build_model_input`` returns them):
    the model, the messages in wire form (:func:`chat_message`), streaming with its usage when
    ``config.stream``, the tools, the reasoning effort, and a zero price for a model LiteLLM
    cannot price (``agents_app.providers.unpriced_model_pricing``)."""
    request: dict[str, Any] = {
        "model": config.model,
        "messages": [chat_message(item) for item in messages],
        "stream": config.stream,
    }
    if config.stream:
        request["stream_options"] = {"include_usage": True}
    if config.tools:
        request["tools"] = [entry.as_openai_tool() for entry in config.tools]
    if config.reasoning_effort:
        request["reasoning_effort"] = config.reasoning_effort
    request.update(unpriced_model_pricing(config.model))
    return request


def responses_request(
    config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """The Responses request for ``messages``: ``instructions`` and ``input`` from
    ``responses_input``, ``store=False`` (the input is rebuilt from Dex state for every call),
    the tools, and for a model that reasons (:func:`_wants_reasoning`) a reasoning summary and
    its encrypted reasoning items, with the reasoning effort. Imports LiteLLM."""
    instructions, items = responses_input(messages)
    request: dict[str, Any] = {
        "model": config.model,
        "input": items,
        "stream": config.stream,
        "store": False,
    }
    if instructions:
        request["instructions"] = instructions
    if config.tools:
        request["tools"] = [entry.as_responses_tool() for entry in config.tools]
    if _wants_reasoning(config.model):
        reasoning: dict[str, Any] = {"summary": "auto"}
        if config.reasoning_effort:
            reasoning["effort"] = config.reasoning_effort
        request["reasoning"] = reasoning
        request["include"] = ["reasoning.encrypted_content"]
    return request


def _wants_reasoning(model: str) -> bool:
    """Whether a Responses call asks for reasoning summaries and encrypted reasoning: yes for
    reasoning models and for models LiteLLM does not know (new OpenAI models reason); no for
    known models without reasoning, which reject the parameter."""
    try:
        info = _litellm().get_model_info(model)
    except Exception:  # unknown to LiteLLM's map
        return True
    return bool(info.get("supports_reasoning"))
