"""When a schedule fires (issue 29, "Schedules"): slots, their validation and missed runs.

Pure functions over ``croniter`` and ``zoneinfo``, no database: what the schedule Flow, the
services, the selectors and the REST checks share.

- A cron expression has 5 fields (minute precision) or 6 (croniter's sixth field: seconds),
  read in the schedule's IANA time zone (``croniter`` handles the DST gaps and repeats).
- An interval of N seconds fires at the multiples of N seconds since 1970-01-01T00:00Z, so its
  slots do not move when the schedule is edited or the worker restarts (the time zone does not
  change them).
- A slot is the nominal fire time, an aware ``datetime`` in UTC.
- A fire is *missed* when it runs more than ``grace_seconds`` after its slot (the engine or the
  worker was down): the grace is the gap to the next slot, at most ``MISSED_GRACE_SECONDS``.

May import: nothing of agents_app (foundation).
"""

from __future__ import annotations

import datetime
import zoneinfo
from collections.abc import Iterator

from croniter import croniter  # type: ignore[import-untyped]

UTC = datetime.UTC

#: Shortest gap between two slots (seconds), for intervals and cron expressions alike: a
#: schedule that fires more often is refused (tests use 5 s; people rarely need less).
MIN_INTERVAL_SECONDS = 5

#: Longest interval (seconds): 366 days.
MAX_INTERVAL_SECONDS = 366 * 24 * 3600

#: The longest a fire may run after its slot and still count as on time (seconds).
MISSED_GRACE_SECONDS = 60

#: How many coming slots the cron check measures against ``MIN_INTERVAL_SECONDS``.
_GAPS_CHECKED = 12


class ScheduleTimeError(ValueError):
    """A cron expression, interval or time zone that cannot make slots.

    Attributes:
        field: The request field at fault: ``"cron"``, ``"interval_seconds"`` or
            ``"timezone"``.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def zone_get(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone ``name`` (e.g. ``"Europe/Paris"``, ``"UTC"``).

    Raises:
        ScheduleTimeError: ``field="timezone"``, for an unknown or malformed name.
    """
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, TypeError, OSError):
        raise ScheduleTimeError("timezone", f"Unknown time zone {name!r}; give an IANA name "
                                "such as 'Europe/Paris' or 'UTC'.") from None


def slots_after(
    *, cron: str, interval_seconds: int | None, timezone: str, after: datetime.datetime
) -> Iterator[datetime.datetime]:
    """The slots strictly after ``after``, in order, without end (aware UTC datetimes).

    Args:
        cron: A 5- or 6-field cron expression, or ``""`` when ``interval_seconds`` is given.
        interval_seconds: Seconds between slots (epoch-aligned), or ``None`` with ``cron``.
        timezone: The IANA zone ``cron`` is read in.
        after: An aware datetime.

    Raises:
        ScheduleTimeError: For a bad expression, interval or zone.
    """
    if after.tzinfo is None:
        raise ValueError("after must be an aware datetime")
    if interval_seconds is not None:
        if interval_seconds <= 0:
            raise ScheduleTimeError("interval_seconds", "Give a positive number of seconds.")
        epoch = int(after.timestamp())
        current = (epoch // interval_seconds + 1) * interval_seconds
        while True:
            yield datetime.datetime.fromtimestamp(current, UTC)
            current += interval_seconds
    zone = zone_get(timezone)
    _cron_check_syntax(cron)
    iterator = croniter(cron, after.astimezone(zone))
    while True:
        slot = iterator.get_next(datetime.datetime)
        yield slot.astimezone(UTC)


def _cron_check_syntax(cron: str) -> None:
    fields = cron.split()
    if len(fields) not in (5, 6):
        raise ScheduleTimeError(
            "cron",
            f"A cron expression has 5 fields (minute hour day month weekday) or 6 (a sixth "
            f"for seconds); {cron!r} has {len(fields)}.",
        )
    if not croniter.is_valid(cron):
        raise ScheduleTimeError("cron", f"{cron!r} is not a valid cron expression.")


def next_slot(
    *, cron: str, interval_seconds: int | None, timezone: str, after: datetime.datetime
) -> datetime.datetime:
    """The first slot strictly after ``after`` (UTC); raises as ``slots_after``."""
    return next(slots_after(
        cron=cron, interval_seconds=interval_seconds, timezone=timezone, after=after
    ))


def next_slots(
    *, cron: str, interval_seconds: int | None, timezone: str, after: datetime.datetime,
    count: int = 5,
) -> list[datetime.datetime]:
    """The ``count`` slots strictly after ``after``, in the schedule's zone (for people to
    read: the REST ``next_runs`` and the form's preview); raises as ``slots_after``."""
    zone = zone_get(timezone)
    slots = slots_after(cron=cron, interval_seconds=interval_seconds, timezone=timezone,
                        after=after)
    return [next(slots).astimezone(zone) for _ in range(count)]


def schedule_times_validate(*, cron: str, interval_seconds: int | None, timezone: str) -> None:
    """Check that exactly one of ``cron`` and ``interval_seconds`` is given, that it is valid,
    that no two coming slots are closer than ``MIN_INTERVAL_SECONDS``, and that ``timezone``
    is a known IANA zone.

    Raises:
        ScheduleTimeError: Naming the field at fault (``"cron"`` when both or neither are
            given).
    """
    zone_get(timezone)
    cron = cron.strip()
    if bool(cron) == (interval_seconds is not None):
        raise ScheduleTimeError(
            "cron", "Give exactly one of cron and interval_seconds."
        )
    if interval_seconds is not None:
        if not MIN_INTERVAL_SECONDS <= interval_seconds <= MAX_INTERVAL_SECONDS:
            raise ScheduleTimeError(
                "interval_seconds",
                f"Give between {MIN_INTERVAL_SECONDS} and {MAX_INTERVAL_SECONDS} seconds.",
            )
        return
    _cron_check_syntax(cron)
    try:
        slots = slots_after(cron=cron, interval_seconds=None, timezone=timezone,
                            after=datetime.datetime.now(UTC))
        previous = next(slots)
        for _ in range(_GAPS_CHECKED):
            slot = next(slots)
            if (slot - previous).total_seconds() < MIN_INTERVAL_SECONDS:
                raise ScheduleTimeError(
                    "cron",
                    f"{cron!r} fires more often than every {MIN_INTERVAL_SECONDS} seconds.",
                )
            previous = slot
    except (ValueError, KeyError, StopIteration) as error:
        if isinstance(error, ScheduleTimeError):
            raise
        raise ScheduleTimeError("cron", f"{cron!r} is not a valid cron expression.") from None


def grace_seconds(
    *, cron: str, interval_seconds: int | None, timezone: str, slot: datetime.datetime
) -> float:
    """How late a fire of ``slot`` may run and still be on time: the gap to the next slot,
    at most ``MISSED_GRACE_SECONDS`` (seconds)."""
    following = next_slot(cron=cron, interval_seconds=interval_seconds, timezone=timezone,
                          after=slot)
    return min(float(MISSED_GRACE_SECONDS), (following - slot).total_seconds())


def latest_slot_until(
    *, cron: str, interval_seconds: int | None, timezone: str, slot: datetime.datetime,
    now: datetime.datetime,
) -> datetime.datetime:
    """The last slot at or before ``now``, counting from ``slot`` (itself at or before
    ``now``): the one missed slot a late fire handles."""
    if interval_seconds is not None:
        behind = int((now - slot).total_seconds()) // interval_seconds
        return slot + datetime.timedelta(seconds=behind * interval_seconds)
    latest = slot
    for following in slots_after(
        cron=cron, interval_seconds=interval_seconds, timezone=timezone, after=slot
    ):
        if following > now:
            return latest
        latest = following
    return latest  # pragma: no cover - slots_after never ends
