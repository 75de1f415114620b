"""What the web side makes of the values Dex answers with: JSON-ready data for the API and pages.

Owns: the conversions of ``dex_agents`` values into plain data: a session's snapshot
(``snapshot_to_data`` and the parts it is made of), a stored message (``message_to_data``), a
queued message (``queued_message_to_data``), and ``plain_data`` for dataclasses, enums and
datetimes. Pure functions: no engine, no database. ``agents_app/api/session_schema.py``
declares the OpenAPI shapes of what they build.

May import: ``dex_agents`` and ``mcp_registry.content``; nothing else of the gateway.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from dex_agents import AgentUsage
from mcp_registry.content import tool_result_text


def snapshot_to_data(snapshot: Any) -> dict[str, Any]:
    """Convert an ``AgentSnapshot`` to the API's JSON-ready shape (see
    ``dex_gateway.session_snapshot``)."""
    state = getattr(snapshot, "state", None)
    status = plain_data(getattr(state, "status", None)) if state is not None else None
    last_turn_error = getattr(snapshot, "last_turn_error", None)
    if last_turn_error is None and state is not None:
        last_turn_error = getattr(state, "last_turn_error", None)
    tool_calls = getattr(snapshot, "tool_calls", None) or []
    if isinstance(tool_calls, Mapping):
        tool_calls = list(tool_calls.values())
    pending = plain_data(list(getattr(snapshot, "pending_interrupts", None) or []))
    messages = [message_to_data(message) for message in getattr(snapshot, "messages", None) or []]
    summary = getattr(snapshot, "summary", None)
    oldest = getattr(summary, "first_retained_sequence", 1) if summary is not None else 1
    return {
        "status": status or "starting",
        "turn_id": getattr(state, "turn_id", None) if state is not None else None,
        "messages": messages,
        "pending_interrupts": pending,
        "awaiting_approval": bool(pending),
        "tool_calls": [tool_call_to_data(call) for call in tool_calls],
        "usage": plain_data(getattr(snapshot, "usage", None) or AgentUsage()),
        "queued_message_count": int(getattr(snapshot, "queued_message_count", 0) or 0),
        "queued_messages": [
            queued_message_to_data(item)
            for item in getattr(snapshot, "queued_messages", None) or []
        ],
        "steered_messages": [
            queued_message_to_data(item)
            for item in getattr(snapshot, "steered_messages", None) or []
        ],
        "last_turn_error": plain_data(last_turn_error),
        "has_older_messages": bool(messages) and messages[0]["sequence"] > oldest,
        "pending_input": pending_input_to_data(getattr(snapshot, "pending_input", None)),
        "pending_timer": pending_timer_to_data(getattr(snapshot, "pending_timer", None)),
        "plan": plan_to_data(getattr(snapshot, "plan", None)),
        "plan_execution_requested": bool(getattr(snapshot, "plan_execution_requested", False)),
        "turn_mode": (plain_data(getattr(state, "turn_mode", None)) if state else None) or "chat",
        "summary": summary_to_data(summary),
        "pending_elicitations": [
            elicitation_to_data(item)
            for item in getattr(snapshot, "pending_elicitations", None) or []
        ],
    }


def elicitation_to_data(item: Any) -> dict[str, Any]:
    """A question an MCP server asks during a running tool call (``AgentElicitation``) as
    ``{"kind": "elicitation", "elicitation_id", "call_id" (the tool call), "tool_name",
    "server", "mode" ("form" | "url"), "message", "requested_schema" (the form's restricted JSON
    Schema, its properties in the server's order, or None in URL mode), "field_order" (the
    property names in that order: JSON readers may reorder keys), "url" (the page to open in
    URL mode, or None), "requested_at", "deadline" (ISO 8601 UTC)}``."""
    schema = plain_data(item.requested_schema) if item.mode == "form" else None
    order = [name for name in getattr(item, "field_order", None) or [] if name in
             ((schema or {}).get("properties") or {})]
    if schema is not None and isinstance(schema.get("properties"), dict):
        properties = schema["properties"]
        order += [name for name in properties if name not in order]
        schema = {**schema, "properties": {name: properties[name] for name in order}}
    return {
        "kind": "elicitation",
        "elicitation_id": item.elicitation_id,
        "call_id": item.tool_call_id,
        "tool_name": item.tool_name,
        "server": item.server_name,
        "mode": item.mode,
        "message": item.message,
        "requested_schema": schema,
        "field_order": order,
        "url": item.url if item.mode == "url" else None,
        "requested_at": plain_data(item.requested_at),
        "deadline": plain_data(item.deadline),
    }


def tool_call_to_data(record: Any) -> Any:
    """One tool call record as plain data, its ``output`` reduced to the text people read
    (``tool_result_text``: an attached image is its label, not its base64). Where the session
    stored a longer result whole (``output_parts``) is left out: the turn's tool message
    carries it (``text_length``) once the turn completes."""
    data = plain_data(record)
    if isinstance(data, dict):
        data.pop("output_parts", None)
        if isinstance(data.get("output"), str):
            data["output"] = tool_result_text(data["output"])
    return data


def pending_input_to_data(pending: Any) -> dict[str, Any] | None:
    """The open ``request_user_input`` question (``PendingUserInput``) as ``{"call_id",
    "prompt", "choices"}`` (``choices`` empty for a free-text answer), or None."""
    if pending is None:
        return None
    return {
        "call_id": pending.tool_call_id,
        "prompt": pending.prompt,
        "choices": list(pending.choices or []),
    }


def pending_timer_to_data(timer: Any) -> dict[str, Any] | None:
    """The running ``durable_wait`` (``PendingTimer``) as ``{"call_id", "fires_at" (ISO 8601
    UTC), "duration_seconds", "reason"}``, or None."""
    if timer is None:
        return None
    return {
        "call_id": timer.tool_call_id,
        "fires_at": plain_data(timer.fires_at),
        "duration_seconds": int(timer.duration_seconds),
        "reason": timer.reason,
    }


def plan_to_data(plan: Any) -> dict[str, Any] | None:
    """The session's plan (``AgentPlan``) as ``{"revision", "status" (draft | active |
    completed), "tasks": [{"content", "status" (pending | in_progress | completed)}]}``, or
    None before the first ``write_todos`` and once the plan was cleared."""
    if plan is None:
        return None
    return {
        "revision": int(plan.revision),
        "status": plain_data(plan.status),
        "tasks": [
            {"content": task.content, "status": plain_data(task.status)} for task in plan.tasks
        ],
    }


def summary_to_data(summary: Any) -> dict[str, Any] | None:
    """A ``ContextSummary`` as ``{"through_sequence", "text", "generation",
    "first_retained_sequence"}``, or None (no compaction ran yet)."""
    if summary is None:
        return None
    return {
        "through_sequence": summary.through_sequence,
        "text": summary.text,
        "generation": summary.generation,
        "first_retained_sequence": summary.first_retained_sequence,
    }


def queued_message_to_data(message: Any) -> dict[str, Any]:
    """One ``AgentQueuedMessage`` as ``{"id", "text", "plan_mode", "created_at" (ISO 8601 or
    None)}``.

    ``id`` is the sender's ``client_id`` when it has one (every message the API accepted: its
    ``OutboxMessage`` ID), else the Channel message ID: so a message keeps the ID its POST
    answered from the outbox to the queue and the turn, and the queue RPCs take either.
    """
    return {
        "id": getattr(message, "client_id", "") or message.message_id,
        "text": message.text,
        "plan_mode": bool(getattr(message, "plan_mode", False)),
        "created_at": plain_data(getattr(message, "created_at", None)),
    }


#: The keys of ``AgentUsage.as_dict()``.
_USAGE_FIELDS = frozenset(AgentUsage().as_dict())


def message_to_data(message: Any) -> dict[str, Any]:
    """One stored message as ``{"sequence", "role", "text", "turn_id", "created_at"}``
    (``created_at`` ISO 8601 UTC, ``None`` for a message stored before it was kept), plus what
    links tool results to their calls: ``tool_calls`` (``[{"id", "name", "arguments"}]``) on an
    assistant message that asked for tools and ``tool_call_id`` on a tool result, read from its Chat
    Completions item. A message too large for one answer arrives cut (``dex_agents._views``):
    then ``text_length`` is the stored text's length in characters, and ``text`` its start
    with a last line saying how much was left out. ``interrupted`` (true, present only then):
    an answer the user cancelled while it streamed; ``text`` is what had arrived.
    ``notice`` (``turn_failed`` or ``turn_cancelled``, present only then): a note the session
    stored when a turn ended early; its ``role`` is ``system`` (the model reads it as a user
    item, but no user wrote it).
    ``reasoning`` (``{"text", "seconds", "cut"?}``) on an assistant message whose model call
    reasoned: its readable summary as the Thinking panel showed it and how long the call
    reasoned. ``usage`` (``AgentUsage.as_dict()``: tokens, requests and ``cost_usd``) on an
    assistant message: the model call that produced it (messages stored before it was kept
    have none). Provider-specific replay data (encrypted reasoning items, thinking blocks and
    their signatures) is left out.
    """
    data: dict[str, Any] = {
        "sequence": message.sequence,
        "role": plain_data(message.role),
        "text": message.text,
        "turn_id": message.turn_id,
        "created_at": plain_data(getattr(message, "created_at", None)),
    }
    if getattr(message, "interrupted", False):
        data["interrupted"] = True
    notice = getattr(message, "notice", None)
    if notice is not None:
        # The model reads the note as a user item, but nobody typed it.
        data["role"] = "system"
        data["notice"] = plain_data(notice)
    item = getattr(message, "framework_item", None)
    if not isinstance(item, Mapping):
        return data
    calls = item.get("tool_calls")
    if isinstance(calls, list) and calls:
        data["tool_calls"] = [
            {
                "id": call.get("id"),
                "name": (call.get("function") or {}).get("name"),
                "arguments": (call.get("function") or {}).get("arguments"),
            }
            for call in calls
            if isinstance(call, Mapping)
        ]
    if item.get("tool_call_id"):
        data["tool_call_id"] = item["tool_call_id"]
    reasoning = item.get("reasoning")
    if (
        isinstance(reasoning, Mapping)
        and isinstance(reasoning.get("text"), str)
        and isinstance(reasoning.get("seconds"), int | float)
    ):
        data["reasoning"] = {"text": reasoning["text"], "seconds": reasoning["seconds"]}
        if reasoning.get("cut") is True:
            data["reasoning"]["cut"] = True
    usage = item.get("usage")  # agents_app.worker.runner.USAGE_KEY: the call that produced it
    if isinstance(usage, Mapping) and data["role"] == "assistant":
        data["usage"] = {
            **AgentUsage().as_dict(),
            **{key: value for key, value in usage.items() if key in _USAGE_FIELDS},
        }
    cut = item.get("cut")
    if isinstance(cut, Mapping) and isinstance(cut.get("text_length"), int):
        data["text_length"] = cut["text_length"]
    parts = getattr(message, "text_parts", None)
    if parts is not None and isinstance(getattr(parts, "length", None), int):
        data["text_length"] = parts.length
    return data


def plain_data(value: Any) -> Any:
    """Turn dataclasses, enums, datetimes and containers into JSON-ready values."""
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            field.name: plain_data(getattr(value, field.name))
            for field in dataclasses.fields(value)
            if field.name != "framework_item"
        }
    if isinstance(value, Mapping):
        return {str(key): plain_data(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain_data(item) for item in value]
    if isinstance(value, (datetime.datetime, datetime.date)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value

