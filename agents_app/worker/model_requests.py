"""What LiteLLM is sent for one model call: stored items in each API's wire form, the request.

Every ``framework_item`` the runner stores is an OpenAI Chat Completions message dict (``role``,
``content``, ``tool_calls``, ``tool_call_id``), plus what a provider needs replayed verbatim on
later calls: ``thinking_blocks`` (Anthropic thinking, signatures included), ``reasoning_items``
(OpenAI Responses reasoning items with ``encrypted_content``) and, per tool call,
``provider_specific_fields`` (Gemini thought signatures). :func:`chat_message` gives such an
item as Chat Completions takes it, :func:`responses_input` the Responses API's ``instructions`` and
``input`` items; :func:`chat_request` and :func:`responses_request` are the keyword arguments of
``litellm.acompletion`` and ``litellm.aresponses`` for one call (without the timeout, retries,
``api_base`` and key, which the caller adds).

May import: ``agents_app.worker.agent_config`` and ``agents_app.providers``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from agents_app.providers import load_litellm, unpriced_model_pricing
from agents_app.worker.agent_config import AgentModelConfig

__all__ = [
    "DEFAULT_MODEL_TIMEOUT",
    "chat_message",
    "chat_request",
    "responses_content_parts",
    "responses_input",
    "responses_request",
]

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


def responses_input(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Convert Chat Completions messages to Responses ``(instructions, input)``.

    System messages become ``instructions`` (joined by blank lines). Per message: a tool result
    becomes ``function_call_output`` (its ``output`` the text, or for content parts with images
    a list of ``input_text`` and ``input_image`` items); an assistant message gives its stored
    ``reasoning_items`` first (replayed verbatim, stateless), then its text as a ``message``,
    then one ``function_call`` per tool call; a user message becomes a ``message``.

    Raises:
        ValueError: A tool message without ``tool_call_id``.
    """
    instructions: list[str] = []
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else _content_text(content)
        if role == "system":
            if text:
                instructions.append(text)
        elif role == "tool":
            call_id = message.get("tool_call_id")
            if not call_id:
                raise ValueError("a tool message has no tool_call_id")
            output: str | list[dict[str, Any]] = text
            if isinstance(content, list) and any(
                isinstance(part, Mapping) and part.get("type") == "image_url" for part in content
            ):
                output = responses_content_parts(content)
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
        elif role == "assistant":
            items.extend(dict(item) for item in message.get("reasoning_items") or ())
            if text:
                items.append({"type": "message", "role": "assistant", "content": text})
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": call.get("id"),
                        "name": function.get("name"),
                        "arguments": function.get("arguments") or "{}",
                    }
                )
        else:
            items.append({"type": "message", "role": "user", "content": text})
    return "\n\n".join(instructions), items


def responses_content_parts(parts: Sequence[Any]) -> list[dict[str, Any]]:
    """Chat Completions content parts as Responses input items: ``text`` becomes
    ``input_text``, ``image_url`` becomes ``input_image`` with the URL as ``image_url`` and
    ``detail`` ``auto`` (OpenAI Responses API, "Function calling / function_call_output");
    other parts are dropped."""
    items: list[dict[str, Any]] = []
    for part in parts:
        if not isinstance(part, Mapping):
            continue
        if part.get("type") == "text":
            items.append({"type": "input_text", "text": str(part.get("text") or "")})
        elif part.get("type") == "image_url":
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, Mapping) else image
            if isinstance(url, str) and url:
                items.append({"type": "input_image", "image_url": url, "detail": "auto"})
    return items


def _content_text(content: Any) -> str:
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, Mapping) and part.get("type") in ("text", "input_text")
        )
    return "" if content is None else json.dumps(content)
