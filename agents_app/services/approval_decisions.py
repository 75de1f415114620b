"""Writes of approval decisions: a reviewer approves (possibly with edited arguments) or
rejects a tool call that waits, and the decision is audited and delivered to Dex.

Owns ``interrupt_resolve`` (the ``ApprovalDecision`` audit row first, then Dex's
``resolve_interrupt``, kept in the outbox when no worker answers), the check of edited
arguments against the tool's input schema (``approval_arguments_check``) and the errors a
refused decision raises.

May import: ``session_lifecycle`` (a refusal may reveal a stop), the sessions index and
outbox, the Dex gateway and the foundation (tests/test_layering.py).
"""


import contextlib
import datetime
import json
import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import IntegrityError, transaction

from agents_app.gateway import dex_gateway
from agents_app.models import (
    AgentSession,
    ApprovalDecision,
    ApprovalRequest,
    Delivery,
)
from agents_app.services.session_lifecycle import session_stopped_detect
from agents_app.sessions import approval_index

logger = logging.getLogger(__name__)


class InterruptNotFoundError(Exception):
    """The session never had an interrupt with this ID (as far as its snapshot shows)."""


class SessionIsStoppedError(Exception):
    """The session is stopped (possibly found out only now): nothing can be decided in it."""


class InterruptNotPendingError(Exception):
    """The interrupt was already decided, or its deadline passed, so Dex refused it."""


_NOT_PENDING_BECAUSE = {
    ApprovalRequest.State.APPROVED: "This tool call was already approved.",
    ApprovalRequest.State.REJECTED: "This tool call was already rejected.",
    ApprovalRequest.State.EXPIRED: "This tool call expired: its approval deadline passed.",
    ApprovalRequest.State.WITHDRAWN: (
        "This tool call no longer waits for a decision: its turn ended or the session stopped."
    ),
}


def _pending_from_snapshot(*, session: AgentSession, interrupt_id: str) -> dict[str, Any]:
    """The pending interrupt ``interrupt_id`` as the session's snapshot lists it (for an
    interrupt the index does not hold yet).

    Raises:
        InterruptNotFoundError, InterruptNotPendingError: See ``interrupt_resolve``.
    """
    snapshot = dex_gateway.run(dex_gateway.session_snapshot(session_id=session.id))
    pending = next(
        (
            item
            for item in snapshot["pending_interrupts"]
            if item.get("interrupt_id") == interrupt_id
        ),
        None,
    )
    if pending is not None:
        return dict(pending)
    # Interrupt IDs are "<turn_id>.<tool_call_id>" (seed "Persistence").
    past = any(
        f"{call.get('turn_id')}.{call.get('tool_call_id')}" == interrupt_id
        for call in snapshot["tool_calls"]
    )
    if past:
        raise InterruptNotPendingError("This tool call no longer waits for a decision.")
    raise InterruptNotFoundError(interrupt_id)


class InterruptAlreadyDecidedError(InterruptNotPendingError):
    """Someone already decided this tool call; ``decision`` is the recorded decision.

    The message names the verdict, the decider and the time (UTC), e.g. ``"Already approved
    by alice at 2026-12-05 08:40:12 UTC."``: the reviewer who lost the race reads it.
    """

    def __init__(self, decision: ApprovalDecision) -> None:
        verdict = "approved" if decision.approved else "rejected"
        when = decision.decided_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        super().__init__(
            f"Already {verdict} by {decision.decided_by.get_username()} at {when}."
        )
        self.decision = decision


class ApprovalArgumentsInvalidError(Exception):
    """Edited arguments that the tool's JSON input schema refuses.

    ``messages`` lists one sentence per problem, each prefixed with the JSON path of the
    offending value (``"count: 'x' is not of type 'integer'"``); an empty path names the
    arguments object itself.
    """

    def __init__(self, messages: list[str]) -> None:
        super().__init__("; ".join(messages))
        self.messages = messages


# At most this many schema problems are reported for one edit; the rest add nothing a
# reviewer can act on before fixing the first ones.
ARGUMENT_PROBLEMS_MAX = 20


#: Keywords by which an object schema says what it does with properties it does not name.
_OTHER_PROPERTIES_KEYWORDS = ("additionalProperties", "patternProperties", "unevaluatedProperties")


def unnamed_properties(schema: Any, arguments: dict[str, Any]) -> list[str]:
    """The top-level keys of ``arguments`` that the object ``schema`` does not name in its
    ``properties``, sorted, when the schema says nothing about other properties (none of
    ``additionalProperties``, ``patternProperties``, ``unevaluatedProperties``).

    JSON Schema allows such keys, but a reviewer who adds one has most likely misspelt a
    property the tool would then never see; LangChain's Agent Inbox likewise edits only the
    fields the tool declares. A schema that names no ``properties`` at all is left alone, and
    so is one that says what other properties may be (``additionalProperties: true`` too)."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return []
    if any(keyword in schema for keyword in _OTHER_PROPERTIES_KEYWORDS):
        return []
    return sorted(name for name in arguments if name not in schema["properties"])


def approval_arguments_check(
    *, session: AgentSession, tool_name: str, arguments: Any
) -> str:
    """Check a reviewer's edited ``arguments`` (a decoded JSON value) for the tool call
    ``tool_name`` of ``session`` and return them as the JSON text the call will run with.

    The schema is the MCP tool's ``inputSchema`` as discovered (``McpTool.input_schema``),
    found among the tools the session's agent exposes by the model-facing name; validation
    follows the schema's own ``$schema`` draft (``jsonschema.validators.validator_for``, draft
    2020-12 when it names none), as MCP servers validate their input; a property the schema
    does not name is refused too unless the schema says what other properties may be
    (``unnamed_properties``).

    Raises:
        ApprovalArgumentsInvalidError: Not a JSON object, the tool is no longer exposed by the
            agent (its schema is unknown), or the schema refuses the value.
    """
    import jsonschema

    if not isinstance(arguments, dict):
        raise ApprovalArgumentsInvalidError(["The arguments must be a JSON object."])
    tool = next(
        (item for item in session.agent.exposed_tools() if item.exposed_name == tool_name), None
    )
    if tool is None:
        raise ApprovalArgumentsInvalidError(
            [f"The agent no longer offers {tool_name}, so its arguments cannot be checked."]
        )
    schema = tool.input_schema or {"type": "object"}
    try:
        validator_class = jsonschema.validators.validator_for(
            schema, default=jsonschema.Draft202012Validator
        )
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as error:
        raise ApprovalArgumentsInvalidError(
            [f"The tool's input schema is invalid, so no edit can be checked: {error.message}"]
        ) from None
    problems = sorted(
        validator_class(schema).iter_errors(arguments),
        key=lambda error: (list(map(str, error.absolute_path)), error.message),
    )
    messages = [
        (
            f"{'.'.join(map(str, error.absolute_path))}: {error.message}"
            if error.absolute_path
            else error.message
        )
        for error in problems
    ]
    messages.extend(
        f"{name}: the tool's input schema has no such property"
        for name in unnamed_properties(schema, arguments)
    )
    if messages:
        raise ApprovalArgumentsInvalidError(messages[:ARGUMENT_PROBLEMS_MAX])
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"))


def interrupt_resolve(
    *,
    session: AgentSession,
    interrupt_id: str,
    approved: bool,
    rejection_message: str = "",
    decided_by: AbstractBaseUser | AnonymousUser,
    edited_arguments: Any = None,
) -> ApprovalDecision:
    """Approve or reject the pending tool call ``interrupt_id`` of ``session`` and audit it.

    ``edited_arguments`` (approve with edits): a decoded JSON object the approved call runs
    with instead of the model's arguments, checked by ``approval_arguments_check``; the audit
    row keeps both. ``None`` runs the call as the model asked; ignored on rejection.

    The tool call's details come from the approvals index (or, for an interrupt it does not
    hold yet, the session's snapshot). The ``ApprovalDecision`` row (who, when, the verdict)
    is written first, with ``delivery`` ``pending``; then Dex's ``resolve_interrupt`` RPC
    decides (seed "RPCs"). When the engine or every worker does not answer, the decision
    stays pending and a Celery task delivers it (ARCHITECTURE.md "Accepted means kept"). An
    approval drops ``rejection_message``, as Dex does. Permissions are the caller's business
    (only staff approve).

    When Dex does not hold an interrupt that the index lists as pending (its worker died
    between indexing it and committing its Step; another worker records it again), the
    decision is kept pending too and delivered once Dex holds the interrupt
    (``outbox.InterruptNotRecordedDeferred``).

    Returns:
        The decision; its ``delivery`` is ``delivered`` or ``pending``.

    Raises:
        InterruptAlreadyDecidedError: A decision was recorded already (``.decision``).
        ApprovalArgumentsInvalidError: ``edited_arguments`` do not fit the tool's schema.
        InterruptNotFoundError: Neither the index nor the snapshot knows the interrupt.
        InterruptNotPendingError: Past its deadline, withdrawn, or Dex answered that it no
            longer waits; no decision is kept.
        SessionIsStoppedError: Dex refused because the session's Flow was stopped (the
            index is marked stopped now); no decision is kept.
        dex_gateway.EngineUnavailableError: The index does not hold the interrupt and the
            snapshot that would describe it could not be read.
        dex_gateway.SessionNotFoundError: Dex has no such session.
    """
    from agents_app import task_queue
    from agents_app.sessions import outbox

    decider_pk = decided_by.pk
    if decider_pk is None:
        raise ValueError("Decisions are made by a saved user.")
    existing = _decision_get(session=session, interrupt_id=interrupt_id)
    if existing is not None:
        raise InterruptAlreadyDecidedError(existing)
    indexed = ApprovalRequest.objects.filter(session=session, interrupt_id=interrupt_id).first()
    if indexed is not None and indexed.state != ApprovalRequest.State.PENDING:
        raise InterruptNotPendingError(_NOT_PENDING_BECAUSE[ApprovalRequest.State(indexed.state)])
    if indexed is not None:
        # The index has the call's details: no snapshot read, which also keeps a session too
        # large for a snapshot decidable (resolve_interrupt loads only PendingInterrupts).
        pending: dict[str, Any] = {
            "tool_call_id": indexed.tool_call_id,
            "tool_name": indexed.tool_name,
            "arguments": indexed.arguments,
        }
    else:
        pending = _pending_from_snapshot(session=session, interrupt_id=interrupt_id)
    message = "" if approved else rejection_message
    edited = ""
    if approved and edited_arguments is not None:
        edited = approval_arguments_check(
            session=session, tool_name=str(pending.get("tool_name", "")), arguments=edited_arguments
        )
        with contextlib.suppress(ValueError):
            if json.loads(str(pending.get("arguments", ""))) == edited_arguments:
                # The same value (a form sends the arguments back untouched): not an edit, so
                # the model reads no note.
                edited = ""
    try:
        with transaction.atomic():
            decision = ApprovalDecision.objects.create(
                session=session,
                interrupt_id=interrupt_id,
                tool_call_id=str(pending.get("tool_call_id", "")),
                tool_name=str(pending.get("tool_name", "")),
                arguments=str(pending.get("arguments", "")),
                edited_arguments=edited,
                approved=approved,
                rejection_message=message,
                decided_by_id=decider_pk,
                delivery=Delivery.PENDING,
            )
    except IntegrityError:
        # A concurrent request recorded its decision first.
        existing = _decision_get(session=session, interrupt_id=interrupt_id)
        if existing is None:
            raise
        raise InterruptAlreadyDecidedError(existing) from None
    approval_index.approvals_changed_notify()
    try:
        state = outbox.approval_decision_deliver(decision=decision)
    except outbox.InterruptNotRecordedDeferred as error:
        # Either a Step is being run again (keep the decision) or the Flow was stopped
        # behind the index's back (say so now rather than after the window).
        stopped = False
        with contextlib.suppress(
            dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError
        ):
            stopped = session_stopped_detect(session=session)
        if stopped:
            decision.delete()
            raise SessionIsStoppedError() from None
        logger.info("Decision on %s kept in the outbox: %s", interrupt_id, error)
        task_queue.outbox_delivery_schedule(decision_id=decision.pk)
        return decision
    except outbox.DeliveryDeferred as error:
        logger.info("Decision on %s kept in the outbox: %s", interrupt_id, error)
        task_queue.outbox_delivery_schedule(decision_id=decision.pk)
        return decision
    if state == Delivery.REFUSED:
        decision.delete()
        # Refused because the Flow was stopped behind the index's back: say that, and make
        # the stop final in the index too.
        stopped = False
        with contextlib.suppress(
            dex_gateway.EngineUnavailableError, dex_gateway.SessionNotFoundError
        ):
            stopped = session_stopped_detect(session=session)
        if stopped:
            raise SessionIsStoppedError()
        raise InterruptNotPendingError(
            "This tool call no longer waits for a decision (decided, or past its deadline)."
        )
    return decision


def _decision_get(*, session: AgentSession, interrupt_id: str) -> ApprovalDecision | None:
    return (
        ApprovalDecision.objects.select_related("decided_by")
        .filter(session=session, interrupt_id=interrupt_id)
        .first()
    )
