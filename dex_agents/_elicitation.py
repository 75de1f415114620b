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

import asyncio
import hashlib
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from dex import Context

from dex_agents._contract import DeferredToolExecution
from dex_agents._elicitation_schema import (
    ElicitationSchemaError,
    elicitation_content_check,
    elicitation_form,
)
from dex_agents._events import AgentEventType
from dex_agents._persistence import ELICITATION_VERSION, ELICITATIONS
from dex_agents._records import (
    ELICITATION_ACTIONS,
    AgentElicitation,
    AgentToolCall,
    ElicitationAnswer,
    ElicitationAnswerResult,
    ElicitationRequest,
    ElicitationState,
    ElicitationStatus,
)
from dex_agents._wire_types import resolve_annotations

if TYPE_CHECKING:
    from dex_agents._client import AgentSessionClient

#: Default time a user has to answer a server's question (the platform sets its own).
DEFAULT_ELICITATION_TIMEOUT = timedelta(minutes=10)
#: The longest single long poll of a waiting Step; the deadline is checked between polls.
WAIT_POLL_CAP = timedelta(seconds=30)
#: How long past a question's deadline a Step keeps trying to reach the engine before it
#: gives up on the question.
GIVE_UP_AFTER_DEADLINE = timedelta(minutes=1)
#: Pause before waiting again after the engine did not answer a long poll.
_RETRY_PAUSE_SECONDS = 1.0
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


# --- the waiting side: a tool Step's runner --------------------------------------------------


@dataclass(frozen=True)
class ElicitationOutcome:
    """How a question ended, for the server and the model.

    Attributes:
        action: The MCP ``ElicitResult.action``: ``accept``, ``decline`` or ``cancel``.
        content: The accepted form's values, else ``None``.
        elicitation: The question as the session recorded it; ``None`` when it was never put
            to the user (an unusable schema or URL).
        reused: The answer was given to an earlier attempt of the same call.
        note: For the model, when the user did not answer (expired, withdrawn, unusable,
            the session stopped); empty when the user answered.
    """

    action: str
    content: dict[str, Any] | None = None
    elicitation: AgentElicitation | None = None
    reused: bool = False
    note: str = ""


def _seconds(delta: timedelta) -> str:
    return f"{delta.total_seconds():g} s"


def _note(item: AgentElicitation) -> str:
    """The model-readable note on a question the user did not answer, or ``""``."""
    what = f"The MCP server's question {item.message!r}"
    if item.status is ElicitationStatus.EXPIRED:
        waited = _seconds(item.deadline - item.requested_at)
        return (
            f"{what} expired: the user did not answer within {waited}, so the "
            "server was told the question was cancelled."
        )
    if item.status is ElicitationStatus.WITHDRAWN:
        why = {
            WITHDRAWN_STEERED: "a steered user message superseded it",
            WITHDRAWN_CALL_ENDED: "the tool call ended",
            WITHDRAWN_SUPERSEDED: "the server asked something else",
            WITHDRAWN_NOT_RUNNING: "the tool call was no longer running",
            WITHDRAWN_TURN_CANCELLED: "the user cancelled the turn",
        }.get(item.reason, item.reason or "the session took it back")
        return f"{what} was withdrawn ({why}), so the server was told it was cancelled."
    return ""


def url_problem(url: str) -> str | None:
    """Why a URL-mode request's ``url`` is not shown to the user (only absolute ``http`` and
    ``https`` URLs are), or ``None``."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "its URL is not an absolute http or https URL"
    return None


class ToolCallElicitations:
    """Asks the user the questions an MCP server sends during one attempt of a tool call.

    Create one per attempt (``execute_deferred_tool_call``) and call ``ask`` from the MCP
    client's elicitation callback; it returns when the question is answered, expired or
    withdrawn, or the session stopped. It counts repeats of the same question within the
    attempt, so the n-th asking of a question meets the n-th answer of an earlier attempt.

    Args:
        sessions: A client of the same Flow on the same engine, usable on the Worker's loop.
        call: The running call (session, record, events).
        server_name: The MCP server, shown to the user.
        timeout: How long the user may take, in all, to answer the questions of this attempt:
            each question gets what is left when it is asked (the tool Step's time limit
            makes room for this much). A question asked once it is used up is declined
            without asking, with a note for the model.
        wait_cap: The longest single long poll.
    """

    def __init__(
        self,
        sessions: AgentSessionClient,
        call: DeferredToolExecution,
        *,
        server_name: str,
        timeout: timedelta = DEFAULT_ELICITATION_TIMEOUT,
        wait_cap: timedelta = WAIT_POLL_CAP,
    ) -> None:
        self._sessions = sessions
        self._call = call
        self._server_name = server_name
        self._timeout = timeout
        self._left = timeout.total_seconds()
        self._wait_cap = wait_cap
        self._asked: dict[str, int] = {}
        self.notes: list[str] = []

    async def ask(
        self,
        *,
        mode: str,
        message: str,
        requested_schema: dict[str, Any] | None = None,
        url: str = "",
        server_elicitation_id: str = "",
    ) -> ElicitationOutcome:
        """Put one question to the user and wait for the outcome.

        A form whose schema is not the restricted elicitation schema, and a URL that is not
        absolute ``http(s)``, are declined without asking (with a note for the model).

        Raises:
            dex.DexServiceError: The session's RPCs failed (the MCP client then answers
                ``cancel``).
        """
        record = self._call.tool_call
        if mode == "form":
            try:
                elicitation_form(requested_schema)
            except ElicitationSchemaError as error:
                return self._unusable(message, f"its form cannot be shown: {error}")
        elif mode == "url":
            problem = url_problem(url)
            if problem is not None:
                return self._unusable(message, problem)
        else:
            return self._unusable(message, f"its mode {mode!r} is unknown")
        if self._left <= 0:
            return self._unusable(
                message,
                f"the call's time for questions ({self._timeout.total_seconds():g} s in all) "
                "is used up",
            )
        key = json.dumps([mode, message, requested_schema, url, server_elicitation_id],
                         sort_keys=True)
        self._asked[key] = self._asked.get(key, 0) + 1
        request = ElicitationRequest(
            tool_call_id=record.tool_call_id,
            mode=mode,
            message=message,
            requested_schema=requested_schema,
            url=url,
            server_elicitation_id=server_elicitation_id,
            server_name=self._server_name,
            occurrence=self._asked[key],
            timeout_seconds=self._left,
            field_order=[str(name) for name in (requested_schema or {}).get("properties", {})],
        )
        flow_id = self._call.flow_id
        state = await self._sessions.open_elicitation(flow_id, request)
        item = state.elicitation
        assert item is not None
        # Answered before this attempt asked: an earlier attempt's user gave it.
        reused = not state.created and item.status is not ElicitationStatus.PENDING
        if item.status is ElicitationStatus.PENDING:
            self._write(AgentEventType.ELICITATION_REQUESTED, item)
        waiting_since = time.monotonic()
        try:
            final = await self._wait(flow_id, item, state.version)
        finally:
            self._left -= time.monotonic() - waiting_since
        if final is None:  # the session stopped
            note = f"The MCP server's question {message!r} ended unanswered: the session stopped."
            self.notes.append(note)
            return ElicitationOutcome("cancel", elicitation=item, note=note)
        self._write(AgentEventType.ELICITATION_CLOSED, final, reused=reused)
        note = _note(final)
        if note:
            self.notes.append(note)
        return ElicitationOutcome(
            final.status.action,
            content=final.content if final.status is ElicitationStatus.ACCEPTED else None,
            elicitation=final,
            reused=reused,
            note=note,
        )

    def _unusable(self, message: str, problem: str) -> ElicitationOutcome:
        note = (
            f"The MCP server asked {message!r}, but {problem}; the question was declined "
            "without asking the user."
        )
        self.notes.append(note)
        return ElicitationOutcome("decline", note=note)

    def _write(self, event: AgentEventType, item: AgentElicitation, **extra: Any) -> None:
        payload: dict[str, Any] = {
            "tool_call_id": item.tool_call_id,
            "tool_name": item.tool_name,
            "elicitation_id": item.elicitation_id,
            "server": item.server_name,
        }
        if event is AgentEventType.ELICITATION_REQUESTED:
            payload.update(
                {"mode": item.mode, "message": item.message,
                 "deadline": item.deadline.isoformat()}
            )
        else:
            payload.update({"status": str(item.status), "reason": item.reason, **extra})
        self._call.events.write_event(event, payload)

    async def _wait(
        self, flow_id: str, item: AgentElicitation, seen: int
    ) -> AgentElicitation | None:
        """Wait until ``item`` is final (expiring it at its deadline); ``None`` once the
        session stopped."""
        from dex import DexServiceError, FlowNotActiveOrNotFoundError

        give_up_at = item.deadline + GIVE_UP_AFTER_DEADLINE
        while item.status is ElicitationStatus.PENDING:
            left = (item.deadline - _now()).total_seconds()
            try:
                if left <= 0:
                    state = await self._sessions.close_elicitation(flow_id, item.elicitation_id)
                    if state.elicitation is not None and (
                        state.elicitation.status is ElicitationStatus.PENDING
                    ):
                        # The RPC's Worker clock is behind this one: try again shortly.
                        await asyncio.sleep(_RETRY_PAUSE_SECONDS)
                else:
                    cap = min(left, self._wait_cap.total_seconds())
                    await self._sessions.wait_for_elicitation_change(
                        flow_id, seen, timeout=timedelta(seconds=max(1, math.ceil(cap)))
                    )
                    state = await self._sessions.get_elicitation(flow_id, item.elicitation_id)
            except FlowNotActiveOrNotFoundError:
                return None
            except DexServiceError:
                # The engine restarted or did not answer: wait a moment and ask again, but
                # not for ever (the MCP client answers cancel when this raises).
                if _now() >= give_up_at:
                    raise
                await asyncio.sleep(_RETRY_PAUSE_SECONDS)
                continue
            if state.elicitation is None:  # the turn ended and took its questions along
                return replace(item, status=ElicitationStatus.WITHDRAWN,
                               reason=WITHDRAWN_CALL_ENDED, closed_at=_now())
            item, seen = state.elicitation, state.version
        return item


resolve_annotations(globals())
