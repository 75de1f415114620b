"""Reading a session's Step history through FlowService ``GetHistoryEvents``.

The SDK 1.23.0 clients have no history call, so this reads the protocol directly
(Dex engine spec 4.6): one event per completed or failed Step method, oldest first.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc

from dex_agents._wire_types import resolve_annotations

#: ``StepHistoryEntry.event_type`` values (the ``FlowHistoryEvent`` payload names).
EXECUTE_COMPLETED_EVENT = "step_execute_completed"
EXECUTE_FAILED_EVENT = "step_execute_failed"
WAIT_FOR_COMPLETED_EVENT = "step_wait_for_completed"
WAIT_FOR_FAILED_EVENT = "step_wait_for_failed"
STEP_EVENTS = frozenset(
    {EXECUTE_COMPLETED_EVENT, EXECUTE_FAILED_EVENT, WAIT_FOR_COMPLETED_EVENT, WAIT_FOR_FAILED_EVENT}
)
#: Names of the application events (Dex ``record_event``) a Step method records for the
#: history (platform addition): what the Step's ending meant when its status alone hides it,
#: that meaning's detail, and the tool a tool Step's call belongs to.
OUTCOME_RECORD = "outcome"
OUTCOME_DETAIL_RECORD = "outcome_detail"
TOOL_NAME_RECORD = "tool_name"
#: ``StepHistoryEntry.outcome`` values: a model call the provider refused (``failed``) or the
#: user cancelled; an approval answered, withdrawn (its turn ended, or a steered message
#: superseded it) or expired at its deadline.
STEP_OUTCOMES = frozenset({"failed", "cancelled", "approved", "rejected", "withdrawn", "expired"})
_PAGE_SIZE = 500
#: The longest failure text an entry keeps (a worker's error detail is cut to it).
FAILURE_MAX_CHARS = 1000


@dataclass(frozen=True)
class StepHistoryEntry:
    """One Step method event of a Flow's history.

    Attributes:
        event_type: One of ``EXECUTE_COMPLETED_EVENT``, ``EXECUTE_FAILED_EVENT``,
            ``WAIT_FOR_COMPLETED_EVENT``, ``WAIT_FOR_FAILED_EVENT``.
        step_type: The Step name.
        step_execution_id: ``"<StepType>-<n>"``, shared by every attempt of one execution.
        final_attempt: The one-based attempt that produced the event.
        started_at: When the method's first attempt was handed to a worker (UTC), or None when
            the engine did not say.
        duration_seconds: Seconds from ``started_at`` to the event, backoff between attempts
            included.
        failed_attempt: The attempt ``failure`` belongs to: the last failed attempt before a
            completed event, the failing one of a failed event; None when none failed.
        failure: That attempt's error (the worker's detail, else its error type, else the
            engine's reason), at most ``FAILURE_MAX_CHARS`` characters.
        input_text: The Step's input when it is a string (the tool call ID of a tool Step),
            else None.
        outcome: What a completed method's ending meant (one of ``STEP_OUTCOMES``), when the
            Step recorded it; None otherwise.
        outcome_detail: That outcome's detail (the provider's refusal, the rejection message),
            at most ``FAILURE_MAX_CHARS`` characters, or None.
        tool_name: The tool of the call a tool Step belongs to, when the method recorded it.
    """

    event_type: str
    step_type: str
    step_execution_id: str
    final_attempt: int
    started_at: datetime | None = None
    duration_seconds: float = 0.0
    failed_attempt: int | None = None
    failure: str | None = None
    input_text: str | None = None
    outcome: str | None = None
    outcome_detail: str | None = None
    tool_name: str | None = None


async def read_flow_step_history(
    service: dex_pb2_grpc.FlowServiceStub,
    flow_id: str,
    *,
    page_timeout: float,
    event_types: frozenset[str] = STEP_EVENTS,
    max_events: int = 100_000,
) -> list[StepHistoryEntry]:
    """List the Step events of ``flow_id``'s current run, oldest first.

    Args:
        service: A FlowService stub on an open ``grpc.aio`` channel.
        flow_id: The Flow (session) ID.
        page_timeout: Seconds allowed for each page request.
        event_types: Which Step events to keep (all four by default).
        max_events: Stop after reading this many history events (of any kind).

    Raises:
        grpc.aio.AioRpcError: If the engine rejects or does not answer a page request
            (``NOT_FOUND`` sub-status for an unknown Flow).
    """
    entries: list[StepHistoryEntry] = []
    token = b""
    read = 0
    while read < max_events:
        response: pb.GetHistoryEventsResponse = await service.GetHistoryEvents(
            pb.GetHistoryEventsRequest(
                flow_id=flow_id, estimate_page_size=_PAGE_SIZE, next_page_token=token
            ),
            timeout=page_timeout,
        )
        for event in response.events:
            read += 1
            kind = event.WhichOneof("payload")
            if kind not in event_types:
                continue
            payload = getattr(event, kind)
            context = payload.context
            recorded: dict[str, str] = {}
            if kind in (EXECUTE_FAILED_EVENT, WAIT_FOR_FAILED_EVENT):
                failure: pb.StepMethodFailure | None = payload.output.failure
            else:
                failure = (
                    context.last_failure_info if context.HasField("last_failure_info") else None
                )
                recorded = _recorded_texts(payload.output.record_events)
            step_input = payload.input.step_input
            entries.append(
                StepHistoryEntry(
                    event_type=kind,
                    step_type=context.step_type,
                    step_execution_id=context.step_execution_id,
                    final_attempt=context.final_attempt,
                    started_at=(
                        context.started_time.ToDatetime(tzinfo=UTC)
                        if context.HasField("started_time")
                        else None
                    ),
                    duration_seconds=context.duration.ToTimedelta().total_seconds(),
                    failed_attempt=(failure.attempt or None) if failure is not None else None,
                    failure=_failure_text(failure),
                    input_text=(
                        step_input.string_value
                        if step_input.WhichOneof("kind") == "string_value"
                        else None
                    ),
                    outcome=(
                        recorded.get(OUTCOME_RECORD)
                        if recorded.get(OUTCOME_RECORD) in STEP_OUTCOMES
                        else None
                    ),
                    outcome_detail=(
                        recorded[OUTCOME_DETAIL_RECORD][:FAILURE_MAX_CHARS]
                        if recorded.get(OUTCOME_DETAIL_RECORD)
                        else None
                    ),
                    tool_name=recorded.get(TOOL_NAME_RECORD) or None,
                )
            )
        if not response.next_page_token or not response.events:
            break
        token = response.next_page_token
    return entries


def _recorded_texts(records: Iterable[pb.KV]) -> dict[str, str]:
    """A method's recorded application events whose values are strings, by name."""
    return {
        record.key: record.value.string_value
        for record in records
        if record.value.WhichOneof("kind") == "string_value"
    }


def _failure_text(failure: pb.StepMethodFailure | None) -> str | None:
    """A failed attempt's error as one line of text, or None without one."""
    if failure is None:
        return None
    details = failure.details
    text = (
        details.original_worker_error_detail
        or details.original_worker_error_type
        or details.detail
        or failure.backend_error
    )
    return text[:FAILURE_MAX_CHARS] if text else None


resolve_annotations(globals())
