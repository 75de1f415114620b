"""Questions an MCP server asks during a running tool call, as durable state of the session
(platform addition; MCP specification 2025-11-25, "Client features/Elicitation").

A tool Step cannot commit while it runs, and the Worker that runs it holds the MCP connection,
so the question waits inside the running Step. The Step's runner asks through the session's own
RPCs, from the Worker, with a Dex client of its own (``ToolCallElicitations``):

1. ``open_elicitation`` records the question in ``ELICITATIONS`` (or finds the same question a
   previous attempt of the call asked: same mode, message, schema, URL and occurrence) and
   bumps ``ELICITATION_VERSION``; the snapshot lists it under ``pending_elicitations``; the
   Step writes ``elicitation_requested``.
2. The Step waits for ``ELICITATION_VERSION`` to pass the value it saw
   (``wait_for_attribute_match``, a long poll the engine answers without a Worker) and reads
   the question again (``get_elicitation``), until it is final or its deadline passes; then
   ``close_elicitation`` expires it.
3. ``answer_elicitation`` (the user, through an application) checks the answer against the
   server's schema, stores it and bumps the version, in one locked commit; a second answer is
   refused. ResumeTurn of a steering session withdraws the turn's pending questions when it
   takes a steered message; the tool failure routes withdraw their call's.
4. The Step writes ``elicitation_closed`` and answers the server: ``accept`` with the content,
   ``decline``, or ``cancel`` (cancelled, expired, withdrawn, or the session stopped).

Every writer of ``ELICITATIONS`` holds its lock; the Steps that end a turn delete it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dex import Context

from dex_agents._elicitation_records import (
    ELICITATION_ACTIONS,
    AgentElicitation,
    ElicitationAnswer,
    ElicitationAnswerResult,
    ElicitationRequest,
    ElicitationState,
    ElicitationStatus,
)
from dex_agents._elicitation_schema import (
    ElicitationSchemaError,
    elicitation_content_check,
    elicitation_form,
)
from dex_agents._persistence import ELICITATION_VERSION, ELICITATIONS
from dex_agents._records import AgentToolCall
from dex_agents._wire_types import resolve_annotations

#: Why a question was withdrawn (``AgentElicitation.reason``).
WITHDRAWN_STEERED = "steered"
WITHDRAWN_CALL_ENDED = "call_ended"
WITHDRAWN_SUPERSEDED = "superseded"
WITHDRAWN_NOT_RUNNING = "not_running"
#: Platform addition (``cancel_turn``): the user cancelled the turn.
WITHDRAWN_TURN_CANCELLED = "turn_cancelled"


def _now() -> datetime:
    return datetime.now(UTC)


def elicitation_id_for(turn_id: str, tool_call_id: str, request: ElicitationRequest) -> str:
    """``"<turn_id>.<tool_call_id>.<16 hex digits>"``: the same for the same question of the
    same call (mode, message, schema, URL, server ID and occurrence), on every attempt."""
    question = json.dumps(
        [
            request.mode,
            request.message,
            request.requested_schema,
            request.url,
            request.server_elicitation_id,
            request.occurrence,
        ],
        sort_keys=True,
        separators=(",", ":"),
    )
    digest = hashlib.sha256(question.encode("utf-8")).hexdigest()[:16]
    return f"{turn_id}.{tool_call_id}.{digest}"


# --- state changes (the RPCs of AgentSessionFlow and its Steps) ----------------------------------


def questions(context: Context) -> list[AgentElicitation]:
    """Every question in ``ELICITATIONS``, oldest first."""
    return list(ELICITATIONS.get(context) or [])


def version(context: Context) -> int:
    """``ELICITATION_VERSION`` (0 before the first question)."""
    return ELICITATION_VERSION.get(context) or 0


def store_questions(context: Context, items: Sequence[AgentElicitation]) -> int:
    """Replace ``ELICITATIONS`` and bump ``ELICITATION_VERSION``; return the new version."""
    ELICITATIONS.set(context, list(items))
    bumped = version(context) + 1
    ELICITATION_VERSION.set(context, bumped)
    return bumped


def state_of(context: Context, elicitation_id: str) -> ElicitationState:
    """The question ``elicitation_id`` (or ``None``) and the current version."""
    found = next(
        (item for item in questions(context) if item.elicitation_id == elicitation_id), None
    )
    return ElicitationState(found, version(context))


def _closed(item: AgentElicitation, status: ElicitationStatus, now: datetime,
            *, reason: str = "", content: dict[str, Any] | None = None) -> AgentElicitation:
    return replace(item, status=status, closed_at=now, reason=reason, content=content)


def open_question(
    context: Context,
    request: ElicitationRequest,
    record: AgentToolCall | None,
    *,
    turn_id: str | None,
    steer_pending: bool,
) -> ElicitationState:
    """Record ``request`` for the running call ``record`` (``open_elicitation``).

    The same question asked before by this call (any attempt) is returned as it is, answered
    or not. A new one becomes pending with its deadline; other pending questions of the same
    call are withdrawn (``superseded``: the server moved on). A call that is not running (no
    open record in the running turn ``turn_id``) gets a ``withdrawn`` question that is not
    stored; while a steered message waits, a new question is stored ``withdrawn``
    (``steered``) at once.
    """
    now = _now()
    if record is None or record.status.is_final or record.turn_id != turn_id:
        ghost = _question(request, record, turn_id or "", now)
        return ElicitationState(
            _closed(ghost, ElicitationStatus.WITHDRAWN, now, reason=WITHDRAWN_NOT_RUNNING),
            version(context),
            created=True,
        )
    question = _question(request, record, record.turn_id, now)
    items = [item for item in questions(context) if item.turn_id == record.turn_id]
    known = next(
        (item for item in items if item.elicitation_id == question.elicitation_id), None
    )
    if known is not None:
        return ElicitationState(known, version(context))
    items = [
        _closed(item, ElicitationStatus.WITHDRAWN, now, reason=WITHDRAWN_SUPERSEDED)
        if item.tool_call_id == record.tool_call_id and item.status is ElicitationStatus.PENDING
        else item
        for item in items
    ]
    if steer_pending:
        question = _closed(question, ElicitationStatus.WITHDRAWN, now, reason=WITHDRAWN_STEERED)
    items.append(question)
    return ElicitationState(question, store_questions(context, items), created=True)


def _question(
    request: ElicitationRequest, record: AgentToolCall | None, turn_id: str, now: datetime
) -> AgentElicitation:
    tool_call_id = record.tool_call_id if record is not None else request.tool_call_id
    seconds = request.timeout_seconds if request.timeout_seconds > 0 else 0.0
    return AgentElicitation(
        elicitation_id=elicitation_id_for(turn_id, tool_call_id, request),
        tool_call_id=tool_call_id,
        tool_name=record.tool_name if record is not None else "",
        turn_id=turn_id,
        server_name=request.server_name,
        mode=request.mode,
        message=request.message,
        requested_schema=request.requested_schema if request.mode == "form" else None,
        url=request.url if request.mode == "url" else "",
        server_elicitation_id=request.server_elicitation_id,
        requested_at=now,
        deadline=now + timedelta(seconds=seconds),
        field_order=list(request.field_order) if request.mode == "form" else [],
    )


def answer_question(
    context: Context, answer: ElicitationAnswer, *, turn_id: str | None
) -> ElicitationAnswerResult:
    """Apply the user's answer (``answer_elicitation``); see ``ElicitationAnswerResult``.

    A question past its deadline is expired here (the waiting Step would expire it too).
    """
    status = ELICITATION_ACTIONS.get(answer.action)
    if status is None:
        return ElicitationAnswerResult(False, "bad_action")
    now = _now()
    items = questions(context)
    index = next(
        (i for i, item in enumerate(items) if item.elicitation_id == answer.elicitation_id), None
    )
    if index is None:
        return ElicitationAnswerResult(False, "not_pending")
    item = items[index]
    if item.status is not ElicitationStatus.PENDING or item.turn_id != turn_id:
        return ElicitationAnswerResult(False, "not_pending")
    if now >= item.deadline:
        items[index] = _closed(item, ElicitationStatus.EXPIRED, now)
        store_questions(context, items)
        return ElicitationAnswerResult(False, "expired")
    content: dict[str, Any] | None = None
    if status is ElicitationStatus.ACCEPTED and item.mode == "form":
        try:
            form = elicitation_form(item.requested_schema)
        except ElicitationSchemaError as error:
            return ElicitationAnswerResult(False, "invalid", {"": [str(error)]})
        content, errors = elicitation_content_check(form, answer.content)
        if errors:
            return ElicitationAnswerResult(False, "invalid", errors)
    elif answer.content is not None:
        return ElicitationAnswerResult(
            False,
            "invalid",
            {"": ["Content goes with accept on a form only; leave it out here."]},
        )
    items[index] = _closed(item, status, now, content=content)
    store_questions(context, items)
    return ElicitationAnswerResult(True)


def expire_question(context: Context, elicitation_id: str) -> ElicitationState:
    """Expire ``elicitation_id`` when it is pending past its deadline (``close_elicitation``);
    return it as it then stands."""
    now = _now()
    items = questions(context)
    for index, item in enumerate(items):
        if item.elicitation_id != elicitation_id:
            continue
        if item.status is ElicitationStatus.PENDING and now >= item.deadline:
            items[index] = _closed(item, ElicitationStatus.EXPIRED, now)
            return ElicitationState(items[index], store_questions(context, items))
        return ElicitationState(item, version(context))
    return ElicitationState(None, version(context))


def withdraw_questions(
    context: Context, matches: Callable[[AgentElicitation], bool], reason: str
) -> list[AgentElicitation]:
    """Withdraw every pending question ``matches`` accepts (a Step's commit: a steered message,
    a call's failure route); return them. The caller holds the ``ELICITATIONS`` lock."""
    now = _now()
    items = questions(context)
    withdrawn = [
        item for item in items if item.status is ElicitationStatus.PENDING and matches(item)
    ]
    if withdrawn:
        ids = {item.elicitation_id for item in withdrawn}
        store_questions(
            context,
            [
                _closed(item, ElicitationStatus.WITHDRAWN, now, reason=reason)
                if item.elicitation_id in ids
                else item
                for item in items
            ],
        )
    return withdrawn


def pending_questions(
    context: Context, turn_id: str | None, records: dict[str, AgentToolCall]
) -> list[AgentElicitation]:
    """The questions that wait for the user: pending, of the running turn, of a call whose
    record is still open (a call a killed Worker left is not shown once it ended)."""
    if turn_id is None:
        return []
    return [
        item
        for item in questions(context)
        if item.status is ElicitationStatus.PENDING
        and item.turn_id == turn_id
        and (record := records.get(item.tool_call_id)) is not None
        and not record.status.is_final
    ]


def clear_questions(context: Context) -> None:
    """Forget the turn's questions and answers (the Steps that end a turn)."""
    if ELICITATIONS.get(context) is not None:
        ELICITATIONS.delete(context)


resolve_annotations(globals())
