"""The model input of one call, rebuilt from Dex state (seed "run_model_step(turn)").

A call sends the system prompt, the plan prompt of a planning or executing turn
(``agents_app.worker.plan_prompts``), the session's summary (a system message, once a
compaction ran), every stored message the turn holds, then the turn's own items: those its run
state kept (:func:`encode_run_state`) while it waited for tools, one tool message per requested
call rendered from the call's final record, and the turn's steered messages. A tool result
longer than the agent's limit is cut, and this turn's results share what the window leaves
(:func:`fit_tool_results`). Nothing is stored on the provider's side.

Images (issue 23 point 11; ``mcp_registry.content``): for a model that accepts images
(``supports_images``, else ``litellm.supports_vision``) a tool Step attaches the result's
images within the runner's ``MediaLimits`` and stores them with the text as one string in the
tool call record (``ToolResultContent.encode``). Every model call of that turn sends them as
``image_url`` content parts of the tool message (LiteLLM moves them where each provider wants
them); the turn's stored messages keep the text with its image labels only, so images leave
Dex state when the turn's records do. Other models read a placeholder naming the MIME type
and size.

The summarizer's input (:func:`summary_request_messages`) and the count of an input against the
window (:func:`measure_context`) are built here too.

May import: ``agents_app.worker.agent_config``, ``agents_app.worker.model_requests``,
``agents_app.worker.plan_prompts``, ``agents_app.providers``, ``dex_agents`` and
``mcp_registry.content``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents_app.providers import context_window, count_tokens
from agents_app.worker.agent_config import AgentModelConfig
from agents_app.worker.model_requests import chat_message
from agents_app.worker.plan_prompts import executing_prompt, planning_prompt
from dex_agents import (
    AgentMessage,
    AgentTurnContext,
    ToolCallStatus,
    TurnMode,
    describe_tool_call_outcome,
    render_summary,
    tool_call_edit_note,
)
from mcp_registry.content import ToolResultContent

__all__ = [
    "DEX_TOOL_CALL_KEY",
    "INPUT_WINDOW_SHARE",
    "SUMMARY_INSTRUCTIONS",
    "TOOL_RESULT_MIN_CHARS",
    "ContextMeasure",
    "attach_tool_images",
    "build_model_input",
    "cut_tool_result",
    "decode_run_state",
    "encode_run_state",
    "fit_tool_results",
    "measure_context",
    "stored_message_item",
    "summary_request_messages",
    "tool_result_items",
]

RUN_STATE_VERSION = 2
INPUT_WINDOW_SHARE = 0.8
"""The share of the model's window this turn's tool results may bring the input to; the rest
is the answer's, and the margin of a token count that is not the provider's
(``fit_tool_results``)."""
TOOL_RESULT_MIN_CHARS = 500
"""However many results share the window, each shows at least this many characters."""
SUMMARY_INSTRUCTIONS = (
    "Summarize the conversation for context compaction. Merge the previous summary and the "
    "new messages into one faithful, self-contained summary that a model can continue the "
    "conversation from: keep the user's goals, decisions and preferences, unresolved work, "
    "tool calls with their outcomes, identifiers, numbers and facts that may be needed later. "
    "Write plain text, no preamble."
)
"""The summarizer's system message (the demo model recognises its first words)."""
_SUMMARY_MIN_MESSAGE_CHARS = 200
DEX_TOOL_CALL_KEY = "dex_tool_call_id"
"""Key of a tool message item naming the Dex record whose images the turn's model calls
attach (set only on results with images; providers never see it, ``chat_message`` drops it)."""


def stored_message_item(message: AgentMessage) -> dict[str, Any]:
    """The message dict for a stored ``AgentMessage``.

    Uses its ``framework_item`` when that is a message dict; otherwise falls back to
    ``{"role": <role>, "content": <text>}`` (a system role becomes ``user`` text).
    """
    item = message.framework_item
    if isinstance(item, Mapping) and isinstance(item.get("role"), str):
        return dict(item)
    role = str(message.role)
    return {"role": role if role in ("user", "assistant") else "user", "content": message.text}


def tool_result_items(
    assistant_item: Mapping[str, Any], dex_ids: Sequence[str], turn: AgentTurnContext
) -> list[dict[str, Any]]:
    """One ``role="tool"`` message per call of ``assistant_item``, from the turn's final records.

    ``dex_ids[i]`` is the Dex tool call ID of the ``i``-th call; the message carries the
    provider's ``id`` so the provider can pair them. Its ``content`` is the text of the outcome
    (``describe_tool_call_outcome``; a result with images gives its text, image labels
    included, and the item names its record under ``DEX_TOOL_CALL_KEY`` so
    :func:`attach_tool_images` can add the images to the turn's model calls).

    Raises:
        KeyError: If the turn has no record for one of the calls.
        ValueError: If a record is not final, or the ID list does not match the calls.
    """
    calls = list(assistant_item.get("tool_calls") or ())
    if len(calls) != len(dex_ids):
        raise ValueError("framework run state does not match its tool request")
    items: list[dict[str, Any]] = []
    for call, dex_id in zip(calls, dex_ids, strict=True):
        record = turn.recorded_tool_call(dex_id)
        outcome = describe_tool_call_outcome(record)
        item: dict[str, Any] = {"role": "tool", "tool_call_id": call["id"], "content": outcome}
        if record.status is ToolCallStatus.SUCCEEDED:
            content = ToolResultContent.decode(outcome)
            item["content"] = content.text
            if content.images:
                item[DEX_TOOL_CALL_KEY] = dex_id
        note = tool_call_edit_note(record)
        if note is not None:
            item["content"] = f"{note}\n\n{item['content']}"
        items.append(item)
    return items


def encode_run_state(turn_items: Sequence[Mapping[str, Any]], tool_call_ids: Sequence[str]) -> str:
    """Serialize the turn's items after its user message and the Dex IDs of the last item's
    tool calls, in order (non-empty JSON text)."""
    return json.dumps(
        {
            "version": RUN_STATE_VERSION,
            "turn_items": list(turn_items),
            "tool_call_ids": list(tool_call_ids),
        }
    )


def decode_run_state(run_state: str) -> tuple[list[dict[str, Any]], list[str]]:
    """The ``(turn_items, tool_call_ids)`` stored by :func:`encode_run_state`.

    A version-1 state (no ID list) maps each call to its own ``id``.

    Raises:
        ValueError: If the text is not a run state of this runner, or does not end with a
            tool request.
    """
    data = json.loads(run_state)
    if not isinstance(data, dict) or data.get("version") not in (1, RUN_STATE_VERSION):
        raise ValueError("unrecognised framework run state")
    items = data.get("turn_items")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("framework run state has no turn items")
    last = items[-1] if items else None
    if last is None or last.get("role") != "assistant" or not last.get("tool_calls"):
        raise ValueError("framework run state does not end with a tool request")
    ids = data.get("tool_call_ids")
    if ids is None:
        ids = [call.get("id") for call in last["tool_calls"]]
    if not isinstance(ids, list) or not all(isinstance(value, str) and value for value in ids):
        raise ValueError("framework run state has unusable tool call IDs")
    return items, ids


def build_model_input(
    config: AgentModelConfig, turn: AgentTurnContext
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rebuild the model input for one call of ``turn`` from committed state.

    Returns ``(messages, turn_items)``: ``messages`` is the system prompt, the session's summary
    (a system message, once a compaction ran), every stored message ``turn.messages`` holds,
    then ``turn_items``, each as stored (provider keys included; see :func:`chat_message` and
    ``responses_input`` for the wire forms) except that a tool result longer than
    ``config.tool_result_limit()`` is cut in ``messages`` and, for a model that accepts images,
    a tool result of this turn whose record holds images carries them there as ``image_url``
    parts (:func:`attach_tool_images`); ``turn_items`` are the items this
    turn produced after its user message (empty on the first call; restored from the run state
    plus one tool result per requested call, rendered with ``describe_tool_call_outcome``, when
    resuming), followed by the turn's steered user messages (``turn.steered_messages``, Steer),
    so they stay in the run state and the turn's stored messages.

    Raises:
        ValueError: If the run state is unusable or a tool call record is missing or not final.
    """
    messages: list[dict[str, Any]] = []
    if config.system_prompt:
        messages.append({"role": "system", "content": config.system_prompt})
    if turn.turn_mode is TurnMode.PLANNING:
        messages.append({"role": "system", "content": planning_prompt(turn.plan)})
    elif turn.turn_mode is TurnMode.EXECUTING and turn.plan is not None:
        messages.append({"role": "system", "content": executing_prompt(turn.plan)})
    if turn.summary is not None:
        messages.append({"role": "system", "content": render_summary(turn.summary)})
    messages.extend(stored_message_item(message) for message in turn.messages)
    turn_items: list[dict[str, Any]] = []
    if turn.framework_run_state is not None:
        turn_items, dex_ids = decode_run_state(turn.framework_run_state)
        turn_items.extend(tool_result_items(turn_items[-1], dex_ids, turn))
    turn_items.extend(
        dict(item.framework_item)
        if isinstance(item.framework_item, Mapping)
        else {"role": "user", "content": item.text}
        for item in turn.steered_messages
    )
    messages.extend(turn_items)
    limit = config.tool_result_limit()
    cut = [cut_tool_result(item, limit) for item in messages]
    batch = [
        index for index in range(len(cut) - len(turn_items), len(cut))
        if cut[index].get("role") == "tool" and isinstance(cut[index].get("content"), str)
    ]
    if batch:
        cut = fit_tool_results(config, messages, cut, batch, limit)
    if turn_items and config.accepts_images():
        first = len(cut) - len(turn_items)
        cut[first:] = [attach_tool_images(item, turn) for item in cut[first:]]
    return cut, turn_items


def attach_tool_images(item: dict[str, Any], turn: AgentTurnContext) -> dict[str, Any]:
    """``item``, or for a tool message of this turn whose record holds images, a copy whose
    ``content`` is its text followed by one ``image_url`` part per image
    (``ToolResultContent.chat_content``). The item itself is never changed; a record that is
    gone (an earlier turn) leaves the text alone."""
    dex_id = item.get(DEX_TOOL_CALL_KEY)
    text = item.get("content")
    if item.get("role") != "tool" or not isinstance(dex_id, str) or not isinstance(text, str):
        return item
    record = turn.tool_calls.get(dex_id)
    if (
        record is None
        or record.turn_id != turn.turn_id
        or record.status is not ToolCallStatus.SUCCEEDED
        or not record.output
    ):
        return item
    content = ToolResultContent.decode(record.output)
    if not content.images:
        return item
    return {**item, "content": content.chat_content(text)}


def fit_tool_results(
    config: AgentModelConfig,
    messages: Sequence[Mapping[str, Any]],
    cut: list[dict[str, Any]],
    batch: Sequence[int],
    limit: int,
) -> list[dict[str, Any]]:
    """``cut`` with this turn's tool results (``batch``: their indexes) cut further, together,
    when the whole input would not fit :data:`INPUT_WINDOW_SHARE` of the model's window.

    Each result alone is cut to ``limit`` (a quarter of the window by default); four parallel
    large results at that size filled the window, the provider refused the call and the turn
    failed (issue 25). The room left by everything else the call carries (system prompt,
    history, tools) is shared among the batch: a result shorter than its share keeps its whole
    text and leaves the rest to the others. Counted with LiteLLM's counter, checked again after
    the cut (at most four times); each result keeps at least :data:`TOOL_RESULT_MIN_CHARS`. If
    the history alone leaves no room, the results keep that minimum and the session's
    compaction (or the provider's refusal, which compacts) decides. Without a known window,
    ``cut`` as it is.
    """
    window = config.window()
    if window is None:
        return cut
    target = int(window * INPUT_WINDOW_SHARE)
    tools = [entry.as_openai_tool() for entry in config.tools]

    def tokens(items: Sequence[Mapping[str, Any]]) -> int:
        return count_tokens(config.model, [chat_message(item) for item in items], tools)

    if sum(len(json.dumps(item, default=str)) for item in cut) + len(json.dumps(tools)) <= target:
        # Fewer characters than the target's tokens cannot come to more tokens: most calls
        # stop here without a count (it runs on the worker's event loop).
        return cut
    total = tokens(cut)
    if total <= target:
        return cut
    texts = [str(messages[index].get("content") or "") for index in batch]
    emptied = list(cut)
    for index in batch:
        emptied[index] = {**cut[index], "content": ""}
    other = tokens(emptied)
    room = target - other
    shown = sum(len(str(cut[index]["content"])) for index in batch)
    chars_per_token = max(1.0, shown / max(1, total - other))
    budget = int(max(0, room) * chars_per_token)
    fitted = cut
    for _ in range(4):
        shares = _water_fill([min(len(text), limit) for text in texts], budget)
        fitted = list(cut)
        for index, share in zip(batch, shares, strict=True):
            fitted[index] = cut_tool_result(messages[index], max(TOOL_RESULT_MIN_CHARS, share))
        if room <= 0 or tokens(fitted) <= target:
            return fitted
        budget = int(budget * 0.8)
    return fitted


def _water_fill(lengths: Sequence[int], budget: int) -> list[int]:
    """Shares of ``budget`` characters for texts of ``lengths``: equal, except that a text
    shorter than its share keeps its length and the rest goes to the others."""
    shares = [0] * len(lengths)
    left = budget
    order = sorted(range(len(lengths)), key=lambda index: lengths[index])
    for position, index in enumerate(order):
        fair = left // (len(order) - position)
        shares[index] = min(lengths[index], fair)
        left -= shares[index]
    return shares


def cut_tool_result(item: Mapping[str, Any], limit: int) -> dict[str, Any]:
    """``item``, or a copy whose tool result text is cut to ``limit`` characters plus a note
    saying how much was left out (the stored item is never changed)."""
    content = item.get("content")
    if item.get("role") != "tool" or not isinstance(content, str) or len(content) <= limit:
        return item if isinstance(item, dict) else dict(item)
    omitted = len(content) - limit
    note = f"\n[... {omitted} more characters of this tool result are not shown]"
    return {**item, "content": content[:limit] + note}


def _transcript_text(item: Mapping[str, Any]) -> str:
    """One stored item as the summarizer reads it: its text, plus its tool calls."""
    content = item.get("content")
    text = content if isinstance(content, str) else ""
    functions = [
        call.get("function") or {}
        for call in item.get("tool_calls") or ()
        if isinstance(call, Mapping)
    ]
    calls = [f"{function.get('name')}({function.get('arguments')})" for function in functions]
    if calls:
        text = (text + "\n" if text else "") + "called " + ", ".join(calls)
    return text


def summary_request_messages(
    model: str,
    previous_summary: str,
    items: Sequence[Mapping[str, Any]],
    sequences: Sequence[int],
    budget_tokens: int,
) -> list[dict[str, str]]:
    """The summarizer's input: ``SUMMARY_INSTRUCTIONS`` and one user message with the previous
    summary and the transcript, one ``[<role> #<sequence>]`` header per message followed by its
    text. Each text is cut (halving, down to 200 characters) until the whole input fits
    ``budget_tokens`` by LiteLLM's count, so compaction never overflows itself."""
    texts = [_transcript_text(item) for item in items]
    cap = max((len(text) for text in texts), default=0)
    while True:
        transcript = "\n\n".join(
            f"[{item.get('role')} #{sequence}]\n{text[:cap]}"
            + (" [...]" if len(text) > cap else "")
            for item, sequence, text in zip(items, sequences, texts, strict=True)
        )
        messages = [
            {"role": "system", "content": SUMMARY_INSTRUCTIONS},
            {
                "role": "user",
                "content": f"Previous summary:\n{previous_summary or '(none)'}\n\n"
                f"New messages:\n{transcript}",
            },
        ]
        if cap <= _SUMMARY_MIN_MESSAGE_CHARS or count_tokens(model, messages) <= budget_tokens:
            return messages
        cap = max(_SUMMARY_MIN_MESSAGE_CHARS, cap // 2)


@dataclass(frozen=True)
class ContextMeasure:
    """How full the model's context is for one call.

    Attributes:
        context_window: The window in tokens (agent definition, else LiteLLM's model
            information), or ``None`` when unknown.
        input_tokens: LiteLLM's count of the rebuilt input.
    """

    context_window: int | None
    input_tokens: int


def measure_context(
    config: AgentModelConfig, messages: Sequence[Mapping[str, Any]]
) -> ContextMeasure:
    """Count the tokens of ``messages`` (as :func:`build_model_input` returns them) against
    the model's context window. Imports LiteLLM."""
    return ContextMeasure(
        context_window=context_window(config.model, config.context_window),
        input_tokens=count_tokens(config.model, [chat_message(item) for item in messages]),
    )
