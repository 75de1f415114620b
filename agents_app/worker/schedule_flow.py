# mypy: disable-error-code="override"
# (dex-python-sdk 1.23.0 types Step handlers as synchronous; async handlers are valid with
# Registry(allow_async_handlers=True) but do not match those stubs.)
"""The schedule Flow (issue 29, "Schedules"): one Dex Flow per schedule and generation.

Flow type ``AgentSchedule``, flow ID ``schedule-<pk>-g<generation>`` (``schedule_flow_id``).
Its loop, one Step each:

1. ``ScheduleNextSlot`` asks the database for the next slot after the last one (after now,
   first) and ends the Flow when the schedule is gone, paused or at another generation;
2. ``ScheduleAwaitSlot`` waits on a Dex Timer until that slot (the engine's Timer: it survives
   worker and engine restarts), then decides whether the fire is on time or missed (late past
   the grace: the latest missed slot, skipped or run once per the schedule's policy);
3. ``ScheduleFire`` records and fires that one slot, idempotently (a repeat after a crash finds
   the slot's run row and starts nothing new), then goes back to 1.

The database work is not here: the worker passes it in as ``ScheduleWork`` (three plain
functions of ``agents_app.services.schedule_runs``, run in threads), as ``build_flow`` takes
the session client, so this layer imports no service. The web side builds the Flow without
work, only to start Flows of it (``agents_app.gateway.schedule_flows``).

May import: the Dex SDK and the foundation (tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable
from typing import Any

from dex import (
    AsyncContext,
    Flow,
    PersistenceSchema,
    Step,
    StepDecision,
    StepList,
    Timer,
    Wait,
    go_to,
    graceful_complete,
)

FLOW_TYPE = "AgentSchedule"
SLOT_TIMER_ID = "slot"


def schedule_flow_id(*, schedule_id: int, generation: int) -> str:
    """The Flow ID of ``schedule_id`` at ``generation``: ``schedule-<pk>-g<generation>``."""
    return f"schedule-{schedule_id}-g{generation}"


@dataclasses.dataclass(frozen=True)
class ScheduleSlotRef:
    """What each Step of the loop is given.

    Attributes:
        schedule_id: The ``Schedule`` row's pk.
        generation: The schedule's generation this Flow serves.
        slot: A slot, ISO 8601 in UTC: the last one handled (``ScheduleNextSlot``; ``""`` at
            the start), the one to wait for (``ScheduleAwaitSlot``) or to fire
            (``ScheduleFire``).
        skip: ``ScheduleFire`` records the slot as missed and starts nothing.
    """

    schedule_id: int
    generation: int
    slot: str = ""
    skip: bool = False


#: ``(slot to handle, skip)`` from ``ScheduleWork.arrive``, or ``None``: the Flow is stale.
Arrival = tuple[datetime.datetime, bool] | None


@dataclasses.dataclass(frozen=True)
class ScheduleWork:
    """The database work of the loop, three blocking functions run in worker threads.

    Attributes:
        plan: ``(schedule_id=, generation=, after=)`` -> the first slot after ``after``
            (``None``: after now), or ``None`` when the Flow is stale.
        arrive: ``(schedule_id=, generation=, slot=, now=)`` -> the slot to fire and whether
            to skip it (a missed fire), or ``None`` when the Flow is stale.
        fire: ``(schedule_id=, generation=, slot=, skip=)`` -> ``False`` when the Flow is
            stale (nothing was fired), else ``True``; idempotent per slot.
    """

    plan: Callable[..., datetime.datetime | None]
    arrive: Callable[..., Arrival]
    fire: Callable[..., bool]


def _utc_now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def slot_timer_seconds(slot: datetime.datetime, now: datetime.datetime) -> int:
    """The Timer's duration until ``slot`` from ``now``: whole seconds (Dex Timers take no
    fractions), rounded up so the Timer never ends before the slot; 0 for a past slot."""
    return max(0, math.ceil((slot - now).total_seconds()))


def _slot(ref: ScheduleSlotRef) -> datetime.datetime:
    return datetime.datetime.fromisoformat(ref.slot)


class _ScheduleStep:
    """What the three Steps share: the work they call."""

    def __init__(self, work: ScheduleWork | None) -> None:
        self._work = work

    async def _run(self, name: str, **kwargs: Any) -> Any:
        from asgiref.sync import sync_to_async

        if self._work is None:
            raise RuntimeError("This schedule Flow was built without its work (a client's).")
        function = getattr(self._work, name)
        return await sync_to_async(function, thread_sensitive=False)(**kwargs)


class ScheduleNextSlot(_ScheduleStep, Step[ScheduleSlotRef]):
    """Plans the next slot after ``input.slot`` (after now at the start); ends the Flow when
    the schedule is gone, paused or edited (another generation)."""

    async def execute(self, context: AsyncContext, input: ScheduleSlotRef) -> StepDecision:
        after = _slot(input) if input.slot else None
        slot = await self._run(
            "plan", schedule_id=input.schedule_id, generation=input.generation, after=after
        )
        if slot is None:
            return graceful_complete("stale")
        return go_to(ScheduleAwaitSlot, dataclasses.replace(input, slot=slot.isoformat()))


class ScheduleAwaitSlot(_ScheduleStep, Step[ScheduleSlotRef]):
    """Waits on a Dex Timer until ``input.slot``, then decides what to fire: that slot when
    on time, else the latest missed slot, skipped or run once (``ScheduleWork.arrive``).

    The Timer's duration is computed from the slot each time ``wait_for`` runs, so a
    ``wait_for`` repeated after a restart still ends at the slot (a slot already past: at once).
    """

    async def wait_for(self, context: AsyncContext, input: ScheduleSlotRef) -> Wait:
        seconds = slot_timer_seconds(_slot(input), _utc_now())
        return Wait.until(
            Timer.by_duration(datetime.timedelta(seconds=seconds), condition_id=SLOT_TIMER_ID)
        )

    async def execute(self, context: AsyncContext, input: ScheduleSlotRef) -> StepDecision:
        arrival = await self._run(
            "arrive", schedule_id=input.schedule_id, generation=input.generation,
            slot=_slot(input), now=_utc_now(),
        )
        if arrival is None:
            return graceful_complete("stale")
        slot, skip = arrival
        return go_to(ScheduleFire, dataclasses.replace(input, slot=slot.isoformat(), skip=skip))


class ScheduleFire(_ScheduleStep, Step[ScheduleSlotRef]):
    """Fires (or records as skipped) ``input.slot`` once, however often it runs
    (``ScheduleWork.fire``), then plans the next slot."""

    async def execute(self, context: AsyncContext, input: ScheduleSlotRef) -> StepDecision:
        fired = await self._run(
            "fire", schedule_id=input.schedule_id, generation=input.generation,
            slot=_slot(input), skip=input.skip,
        )
        if not fired:
            return graceful_complete("stale")
        return go_to(ScheduleNextSlot, dataclasses.replace(input, skip=False))


class AgentScheduleFlow(Flow[ScheduleSlotRef]):
    """The Flow of one schedule at one generation (flow type ``AgentSchedule``); its start
    input is ``ScheduleSlotRef(schedule_id, generation)``."""

    def __init__(self, work: ScheduleWork | None = None) -> None:
        self._work = work

    def get_flow_type(self) -> str:
        return FLOW_TYPE

    def get_steps(self) -> StepList[ScheduleSlotRef]:
        return StepList.start_step(ScheduleNextSlot(self._work)).other_steps(
            ScheduleAwaitSlot(self._work), ScheduleFire(self._work)
        )

    def get_persistence_schema(self) -> PersistenceSchema:
        return PersistenceSchema.of()


def build_schedule_flow(*, work: ScheduleWork | None = None) -> AgentScheduleFlow:
    """The schedule Flow: with ``work`` for the Dex worker (``manage.py dexworker`` passes
    ``services.schedule_runs.SCHEDULE_WORK``), without it for clients that only start Flows."""
    return AgentScheduleFlow(work)
