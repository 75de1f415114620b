"""The web side's Dex calls for schedules' Flows (issue 29, "Schedules").

Starts and stops the ``AgentSchedule`` Flow of one schedule at one generation
(``agents_app.worker.schedule_flow``). Both are idempotent: a start that finds its Flow
running is done, a stop of a Flow that is gone is done.

Errors: ``EngineUnavailableError`` (``engine_errors``) when the engine did not answer.

May import: the rest of the gateway, the worker's schedule Flow and the Dex SDK.
"""

from __future__ import annotations

from agents_app.gateway.engine_connection import connection, flow_stop
from agents_app.gateway.engine_errors import SessionAlreadyStartedError, translate
from agents_app.worker.schedule_flow import ScheduleSlotRef, schedule_flow_id


async def schedule_flow_start(*, schedule_id: int, generation: int) -> bool:
    """Start the Flow of ``schedule_id`` at ``generation`` unless it runs.

    Returns:
        True when this call started it, False when it was running already (or had completed:
        a completed Flow of a generation found itself stale). A Flow of that ID that failed
        is started again (``IdReusePolicy.ALLOW_IF_PREVIOUS_FAILED``).

    Raises:
        EngineUnavailableError: The engine did not answer.
    """
    from dex import IdReusePolicy, StartFlowOptions

    flow_id = schedule_flow_id(schedule_id=schedule_id, generation=generation)
    link = connection()
    try:
        await link.client.start_flow(
            link.schedule_flow,
            flow_id,
            ScheduleSlotRef(schedule_id=schedule_id, generation=generation),
            StartFlowOptions(id_reuse_policy=IdReusePolicy.ALLOW_IF_PREVIOUS_FAILED),
        )
    except Exception as error:
        translated = translate(error, flow_id)
        if isinstance(translated, SessionAlreadyStartedError):
            return False
        raise translated from error
    return True


async def schedule_flow_stop(*, schedule_id: int, generation: int, reason: str) -> None:
    """Stop the Flow of ``schedule_id`` at ``generation``; one that is gone is not an error.

    Raises:
        EngineUnavailableError: The engine did not answer.
    """
    await flow_stop(schedule_flow_id(schedule_id=schedule_id, generation=generation), reason=reason)
