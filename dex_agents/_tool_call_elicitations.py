"""The waiting side of an MCP server's question: a tool Step's runner asks the session's user
through the session's own RPCs, from the Worker, with a Dex client of its own
(``ToolCallElicitations``; the protocol is in ``dex_agents._elicitation``).

Above the session client (``dex_agents._client``), which the Flow's own modules never import.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from dex_agents._client import AgentSessionClient
from dex_agents._contract import DeferredToolExecution
from dex_agents._elicitation import (
    WITHDRAWN_CALL_ENDED,
    WITHDRAWN_NOT_RUNNING,
    WITHDRAWN_STEERED,
    WITHDRAWN_SUPERSEDED,
    WITHDRAWN_TURN_CANCELLED,
    _now,
)
from dex_agents._elicitation_records import AgentElicitation, ElicitationRequest, ElicitationStatus
from dex_agents._elicitation_schema import ElicitationSchemaError, elicitation_form
from dex_agents._events import AgentEventType
from dex_agents._wire_types import resolve_annotations

#: Default time a user has to answer a server's question (the platform sets its own).
DEFAULT_ELICITATION_TIMEOUT = timedelta(minutes=10)
#: The longest single long poll of a waiting Step; the deadline is checked between polls.
WAIT_POLL_CAP = timedelta(seconds=30)
#: How long past a question's deadline a Step keeps trying to reach the engine before it
#: gives up on the question.
GIVE_UP_AFTER_DEADLINE = timedelta(minutes=1)
#: Pause before waiting again after the engine did not answer a long poll.
_RETRY_PAUSE_SECONDS = 1.0

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
