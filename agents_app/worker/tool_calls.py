"""The tool calls of one model reply, checked and given IDs before anything is stored (issue 6).

Tool call ``id`` values are the provider's own; the Dex tool call ID is derived from them
(non-empty, no ``/``, unique within the turn) and the turn's run state keeps the mapping
(``agents_app.worker.model_input.encode_run_state``). A call whose arguments are not a JSON
object, or that names a tool the agent does not offer, is still deferred under
:data:`REJECTED_CALL_POLICY`; its Step records the error for the model to read.

May import: ``agents_app.worker.agent_config``, ``agents_app.worker.model_replies`` and
``dex_agents``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents_app.worker.agent_config import AgentModelConfig
from agents_app.worker.model_replies import ModelResponseError
from dex_agents import ToolEffect, ToolPolicy

__all__ = [
    "REJECTED_CALL_POLICY",
    "PreparedToolCall",
    "finalize_tool_calls",
    "parse_tool_arguments",
]

REJECTED_CALL_POLICY = ToolPolicy(ToolEffect.READ, requires_approval=False)
"""The policy of a call refused before it runs (invalid arguments, unknown tool): nothing runs,
so it needs no approval; its Step records the error for the model."""

_DEX_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_.:-]")
_DEX_ID_MAX = 64
_RAW_ARGUMENTS_SHOWN = 500


def parse_tool_arguments(tool_name: str, arguments: str) -> dict[str, Any]:
    """Check a call's arguments: JSON text of an object (empty text counts as ``{}``).

    Raises:
        ModelResponseError: If the text is not JSON or not an object; the message quotes the
            start of the text so the model can correct it.
    """
    if not arguments.strip():
        return {}
    shown = arguments[:_RAW_ARGUMENTS_SHOWN]
    try:
        value = json.loads(arguments)
    except ValueError as error:
        raise ModelResponseError(
            f"the arguments for tool {tool_name!r} are not valid JSON ({error}): {shown}"
        ) from error
    if not isinstance(value, dict):
        raise ModelResponseError(
            f"the arguments for tool {tool_name!r} are not a JSON object: {shown}"
        )
    return value


@dataclass(frozen=True)
class PreparedToolCall:
    """One tool call of a model reply, checked and ready to store and defer.

    Attributes:
        provider_id: The provider's call ID (generated when the provider sent none); replayed.
        dex_id: The Dex tool call ID: non-empty, no ``/``, unique within the turn.
        name: The exposed tool name.
        arguments: The raw argument text, as the Dex record keeps it.
        history_arguments: What the stored assistant item carries: the arguments, or ``"{}"``
            when they are not a JSON object, so the history stays valid for every provider.
        error: Why the call cannot run (invalid arguments, unknown tool), or ``None``.
        provider_specific_fields: Provider data to replay with the call, or ``None``.
    """

    provider_id: str
    dex_id: str
    name: str
    arguments: str
    history_arguments: str
    error: str | None = None
    provider_specific_fields: dict[str, Any] | None = None

    def history_item(self) -> dict[str, Any]:
        """The ``tool_calls`` entry of the stored assistant item."""
        item: dict[str, Any] = {
            "id": self.provider_id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.history_arguments},
        }
        if self.provider_specific_fields:
            item["provider_specific_fields"] = dict(self.provider_specific_fields)
        return item


def _dex_id(provider_id: str, used: set[str]) -> str:
    base = _DEX_ID_UNSAFE.sub("_", provider_id)[:_DEX_ID_MAX] or "call"
    candidate, suffix = base, 1
    while candidate in used:
        suffix += 1
        candidate = f"{base}_{suffix}"
    used.add(candidate)
    return candidate


def finalize_tool_calls(
    merged: Sequence[Mapping[str, Any]],
    config: AgentModelConfig,
    turn_items: Iterable[Mapping[str, Any]],
    used_dex_ids: Iterable[str] = (),
) -> list[PreparedToolCall]:
    """Check a reply's tool calls and give each usable IDs, in model order.

    Arguments are checked as JSON before anything is stored (issue 6): a call whose arguments
    are not a JSON object, or that names a tool the agent does not offer, gets an ``error`` and
    ``"{}"`` as its history arguments; it is still deferred, and its Step records the error as
    a failed tool call the model sees. A missing provider ID becomes ``call_<n>``.

    Args:
        merged: ``{"id", "name", "arguments", "provider_specific_fields"?}`` per call.
        config: The agent config (its tools).
        turn_items: This turn's earlier items (their provider IDs stay unique).
        used_dex_ids: Dex IDs this turn already used (its records).

    Raises:
        ModelResponseError: If a call has no name (nothing can replay it).
    """
    used_provider = {
        str(call.get("id")) for item in turn_items for call in item.get("tool_calls") or ()
    }
    used_dex = set(used_dex_ids) | used_provider
    prepared: list[PreparedToolCall] = []
    for call in merged:
        name = str(call.get("name") or "")
        if not name:
            raise ModelResponseError("the model requested a tool call without a name")
        provider_id = str(call.get("id") or "")
        if not provider_id or provider_id in used_provider:
            number = len(used_provider) + 1
            while f"call_{number}" in used_provider:
                number += 1
            provider_id = f"call_{number}"
        used_provider.add(provider_id)
        arguments = str(call.get("arguments") or "")
        history_arguments = arguments if arguments.strip() else "{}"
        error: str | None = None
        try:
            parse_tool_arguments(name, arguments)
        except ModelResponseError as invalid:
            error = str(invalid)
            history_arguments = "{}"
        if error is None and config.tool(name) is None:
            error = f"Tool {name!r} is not enabled for this session."
        extra = call.get("provider_specific_fields")
        prepared.append(
            PreparedToolCall(
                provider_id=provider_id,
                dex_id=_dex_id(provider_id, used_dex),
                name=name,
                arguments=arguments if arguments.strip() else "{}",
                history_arguments=history_arguments,
                error=error,
                provider_specific_fields=dict(extra) if isinstance(extra, Mapping) else None,
            )
        )
    return prepared
