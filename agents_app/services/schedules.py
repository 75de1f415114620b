"""Writes of schedules (issue 29, "Schedules"): create, edit, pause, resume, delete, and the
one Dex Flow each enabled schedule keeps running.

Every change that could make a running Flow wrong (an edit, a pause, a resume) bumps the
row's ``generation`` in the same transaction that writes it, under the row's lock; the Flow
of the old generation finds itself stale at its next Step (``services.schedule_runs``) and
is stopped here besides (best effort). A create or resume starts the Flow of the new
generation. A Flow that could not be started (the engine was down) is started by
``schedules_reconcile``, which ``manage.py dexworker`` runs at start and every minute.

May import: the Dex gateway and the foundation (``schedule_times``, the models)
(tests/test_layering.py).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import transaction

from agents_app import schedule_times
from agents_app.gateway import dex_gateway, schedule_flows
from agents_app.models import (
    AgentDefinition,
    AgentSession,
    MissedRunPolicy,
    Schedule,
    ScheduleTarget,
)

logger = logging.getLogger(__name__)

#: The placeholders a schedule's message may hold (``message_render``).
MESSAGE_PLACEHOLDERS = ("scheduled_for", "schedule_name")

#: The fields ``schedule_create`` and ``schedule_update`` take.
SCHEDULE_FIELDS = (
    "agent", "name", "message", "cron", "interval_seconds", "timezone", "target", "session",
    "enabled", "missed_run_policy",
)


class ScheduleValidationError(Exception):
    """A schedule that cannot be saved.

    Attributes:
        errors: ``{field: [message, ...]}``, the REST 400 body's shape.
    """

    def __init__(self, errors: dict[str, list[str]]) -> None:
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in errors.items()))
        self.errors = errors


class _Placeholders(dict[str, str]):
    """``str.format_map``'s mapping: an unknown placeholder is an error naming it."""

    def __missing__(self, key: str) -> str:
        raise KeyError(key)


def message_render(*, template: str, slot: datetime.datetime, schedule: Schedule) -> str:
    """The message a run of ``schedule`` at ``slot`` sends: ``template`` with
    ``{scheduled_for}`` (the slot, ISO 8601 in the schedule's zone) and ``{schedule_name}``
    filled in by ``str.format_map``; ``{{`` and ``}}`` are literal braces.

    Raises:
        ScheduleValidationError: ``{"message": [...]}`` for another placeholder, a positional
            one or a malformed brace.
    """
    try:
        zone = schedule_times.zone_get(schedule.timezone)
    except schedule_times.ScheduleTimeError:
        zone = schedule_times.zone_get("UTC")
    values = _Placeholders(
        scheduled_for=slot.astimezone(zone).isoformat(), schedule_name=schedule.name
    )
    try:
        return template.format_map(values)
    except KeyError as error:
        message = (
            f"Unknown placeholder {{{error.args[0]}}}; the message may use "
            + ", ".join(f"{{{name}}}" for name in MESSAGE_PLACEHOLDERS)
            + " (write a literal brace twice)."
        )
    except (ValueError, IndexError, AttributeError, TypeError) as error:
        message = f"The message is not a valid template ({error}); write a literal brace twice."
    raise ScheduleValidationError({"message": [message]})


def schedule_validate(*, owner: AbstractBaseUser | AnonymousUser, values: dict[str, Any]) -> None:
    """Check a schedule's fields as they would be saved for ``owner``.

    ``values`` holds every field of ``SCHEDULE_FIELDS`` (``agent`` an ``AgentDefinition``,
    ``session`` an ``AgentSession`` or ``None``).

    Raises:
        ScheduleValidationError: Field messages: a bad cron, time zone or interval (below
            ``schedule_times.MIN_INTERVAL_SECONDS``), both or neither of cron and interval, a
            disabled agent, a message with an unknown placeholder, a ``session`` that is not
            the owner's session of that agent (or given with target ``new_session``).
    """
    errors: dict[str, list[str]] = {}
    agent: AgentDefinition | None = values.get("agent")
    if agent is None or not agent.enabled:
        errors["agent"] = ["Choose an enabled agent."]
    if not str(values.get("name") or "").strip():
        errors["name"] = ["Give the schedule a name."]
    try:
        schedule_times.schedule_times_validate(
            cron=str(values.get("cron") or ""),
            interval_seconds=values.get("interval_seconds"),
            timezone=str(values.get("timezone") or ""),
        )
    except schedule_times.ScheduleTimeError as error:
        errors.setdefault(error.field, []).append(str(error))
    if not str(values.get("message") or "").strip():
        errors["message"] = ["Give the message each run sends."]
    else:
        probe = Schedule(name=str(values.get("name") or ""), timezone="UTC")
        try:
            message_render(
                template=str(values["message"]), slot=datetime.datetime.now(datetime.UTC),
                schedule=probe,
            )
        except ScheduleValidationError as error:
            errors.update(error.errors)
    session: AgentSession | None = values.get("session")
    target = values.get("target") or ScheduleTarget.NEW_SESSION
    if target not in ScheduleTarget.values:
        errors["target"] = [f"Choose one of {', '.join(ScheduleTarget.values)}."]
    if values.get("missed_run_policy", MissedRunPolicy.SKIP) not in MissedRunPolicy.values:
        errors["missed_run_policy"] = [f"Choose one of {', '.join(MissedRunPolicy.values)}."]
    if session is not None:
        if target != ScheduleTarget.SESSION:
            errors["session"] = ["Only a schedule with target 'session' takes a session."]
        elif session.owner_id != owner.pk or (agent is not None and session.agent_id != agent.pk):
            errors["session"] = ["Choose one of your own sessions of the schedule's agent."]
        elif session.deleted_at is not None or session.status == "stopped":
            errors["session"] = ["That session is stopped; choose a live one or leave it empty."]
    if errors:
        raise ScheduleValidationError(errors)


def schedule_create(
    *, owner: AbstractBaseUser | AnonymousUser, **values: Any
) -> Schedule:
    """Save a new schedule of ``owner`` and start its Flow when it is enabled.

    Args:
        values: The fields of ``SCHEDULE_FIELDS``; absent ones take the model's defaults.

    Raises:
        ScheduleValidationError: As ``schedule_validate``; nothing is saved.
    """
    defaults = {"cron": "", "interval_seconds": None, "timezone": "UTC", "session": None,
                "target": ScheduleTarget.NEW_SESSION, "enabled": True,
                "missed_run_policy": MissedRunPolicy.SKIP}
    full = {**defaults, **values}
    unknown = set(full) - set(SCHEDULE_FIELDS)
    if unknown:
        raise TypeError(f"Unknown schedule fields: {sorted(unknown)}")
    full["cron"] = str(full["cron"] or "").strip()
    schedule_validate(owner=owner, values=full)
    schedule = Schedule(**full)
    schedule.owner_id = owner.pk  # type: ignore[assignment]
    schedule.save()
    if schedule.enabled:
        _flow_start(schedule)
    return schedule


def schedule_update(
    *, schedule: Schedule, owner: AbstractBaseUser | None = None, **changes: Any
) -> Schedule:
    """Change fields of ``schedule`` (any of ``SCHEDULE_FIELDS``; ``owner`` too, for admin),
    bump its generation, stop the Flow of the old generation and start the new one's when it
    is enabled.

    Pausing (``enabled=False``) returns only after the row says so: a fire of the old
    generation that had not written its run row by then never fires
    (``schedule_runs.schedule_slot_fire`` re-checks under the row's lock).

    Raises:
        ScheduleValidationError: As ``schedule_validate``; nothing is changed.
    """
    unknown = set(changes) - set(SCHEDULE_FIELDS)
    if unknown:
        raise TypeError(f"Unknown schedule fields: {sorted(unknown)}")
    if "cron" in changes:
        changes["cron"] = str(changes["cron"] or "").strip()
    with transaction.atomic():
        locked = Schedule.objects.select_for_update().select_related("owner").get(pk=schedule.pk)
        values = {name: getattr(locked, name) for name in SCHEDULE_FIELDS}
        values.update(changes)
        if values.get("target") == ScheduleTarget.NEW_SESSION:
            values["session"] = None
        schedule_validate(owner=owner or locked.owner, values=values)
        if owner is not None:
            locked.owner = owner  # type: ignore[assignment]
        old_generation = locked.generation
        for name, value in values.items():
            setattr(locked, name, value)
        locked.generation = old_generation + 1
        locked.save()
    _flow_stop(locked.pk, old_generation, reason="schedule changed")
    if locked.enabled:
        _flow_start(locked)
    return locked


def schedule_enabled_set(*, schedule: Schedule, enabled: bool) -> Schedule:
    """Pause (``False``) or resume (``True``) ``schedule`` (``schedule_update``)."""
    return schedule_update(schedule=schedule, enabled=enabled)


def schedule_delete(*, schedule: Schedule) -> None:
    """Delete ``schedule`` and its runs (their sessions stay), and stop its Flow."""
    pk, generation = schedule.pk, schedule.generation
    with transaction.atomic():
        Schedule.objects.select_for_update().filter(pk=pk).delete()
    _flow_stop(pk, generation, reason="schedule deleted")


@dataclasses.dataclass(frozen=True)
class ReconcileResult:
    """What ``schedules_reconcile`` did: Flows started, found running, not reachable."""

    started: int = 0
    running: int = 0
    failed: int = 0


def schedules_reconcile() -> ReconcileResult:
    """Start the Flow of every enabled schedule whose Flow is missing (a save while the
    engine was down, a Flow that failed): one idempotent start per enabled schedule.

    Returns:
        ``ReconcileResult``; an engine that does not answer counts each as ``failed``.
    """
    started = running = failed = 0
    for pk, generation in Schedule.objects.filter(enabled=True).values_list("pk", "generation"):
        try:
            if dex_gateway.run(
                schedule_flows.schedule_flow_start(schedule_id=pk, generation=generation)
            ):
                started += 1
            else:
                running += 1
        except dex_gateway.EngineUnavailableError as error:
            logger.warning("Schedule %s: its Flow could not be started (%s)", pk, error)
            failed += 1
    return ReconcileResult(started=started, running=running, failed=failed)


def _flow_start(schedule: Schedule) -> None:
    """Start the schedule's Flow; an engine that does not answer leaves it to
    ``schedules_reconcile`` (the row is saved: accepted means kept)."""
    try:
        dex_gateway.run(
            schedule_flows.schedule_flow_start(
                schedule_id=schedule.pk, generation=schedule.generation
            )
        )
    except dex_gateway.EngineUnavailableError as error:
        logger.warning(
            "Schedule %s saved; its Flow starts when the engine answers (%s)", schedule.pk, error
        )


def _flow_stop(pk: int, generation: int, *, reason: str) -> None:
    """Stop a Flow of an old generation, best effort: it ends itself at its next Step."""
    try:
        dex_gateway.run(
            schedule_flows.schedule_flow_stop(schedule_id=pk, generation=generation, reason=reason)
        )
    except dex_gateway.EngineUnavailableError as error:
        logger.info("Schedule %s g%s: stop deferred to the Flow itself (%s)", pk, generation,
                    error)
