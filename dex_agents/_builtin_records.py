"""Value types of the built-in tools' state (platform additions, seed "Persistence").

This module owns what plans, durable waits and questions to the user keep in Dex state and
exchange over their RPCs: the plan with its tasks and statuses (``AGENT_PLAN``), an execution
request and its answer (``execute_plan``), the running durable wait (``PENDING_TIMER``), the
open question (``PENDING_USER_INPUT``) and its answer (``answer_user_input``). Frozen
dataclasses and ``StrEnum`` values, as in ``_records``; it imports only ``_wire_types``, and
the persistence definitions, the built-in tools and their Steps, and the snapshot
(``_rpc_records``) import it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from dex_agents._wire_types import coerce, coerce_datetime, resolve_annotations


class PlanStatus(StrEnum):
    """``AgentPlan.status``: ``draft`` (written in plan mode, not executed), ``active``
    (executing, or stopped with unfinished tasks) or ``completed`` (every task completed)."""

    DRAFT = "draft"
    ACTIVE = "active"
    COMPLETED = "completed"


class PlanTaskStatus(StrEnum):
    """``PlanTask.status``."""

    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    COMPLETED = "completed"


@dataclass(frozen=True)
class PlanTask:
    """One task of a plan: ``content`` (non-blank text) and its ``status``."""

    content: str
    status: PlanTaskStatus = PlanTaskStatus.PENDING


@dataclass(frozen=True)
class AgentPlan:
    """``AGENT_PLAN`` (platform addition): the session's plan, replaced whole by each
    ``write_todos`` and untouched by compaction.

    Attributes:
        revision: Increases by one with every ``write_todos`` (also across a cleared plan).
        status: See ``PlanStatus``.
        tasks: The ordered tasks; empty once the model cleared the plan.
    """

    revision: int
    status: PlanStatus
    tasks: list[PlanTask] = field(default_factory=list)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tasks", [coerce(item, PlanTask) for item in self.tasks])

    @property
    def is_executable(self) -> bool:
        """True for a draft, or an active plan with a task not completed."""
        if not self.tasks:
            return False
        if self.status is PlanStatus.DRAFT:
            return True
        return self.status is PlanStatus.ACTIVE and any(
            task.status is not PlanTaskStatus.COMPLETED for task in self.tasks
        )


@dataclass(frozen=True)
class PlanExecutionRequest:
    """Input of ``execute_plan`` and value of ``PLAN_EXECUTIONS`` (platform addition).

    Attributes:
        revision: The plan revision the user reviewed.
    """

    revision: int


@dataclass(frozen=True)
class PlanExecutionResult:
    """Output of ``execute_plan``: ``accepted``, or the ``reason`` it was not (one of
    ``no_session``, ``stale_revision``, ``not_executable``, ``busy``, ``queued``,
    ``already_requested``, ``no_plans``)."""

    accepted: bool
    reason: str = ""


@dataclass(frozen=True)
class PendingTimer:
    """``PENDING_TIMER`` (platform addition, ``durable_wait``): the turn's running durable wait.

    Attributes:
        tool_call_id: The ``durable_wait`` call.
        fires_at: When the wait ends (UTC; Worker clock when the call was deferred).
        duration_seconds: The requested duration in whole seconds.
        reason: Why the agent waits, as it said.
        turn_id: The turn it belongs to.
    """

    tool_call_id: str
    fires_at: datetime
    duration_seconds: int
    reason: str
    turn_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "fires_at", coerce_datetime(self.fires_at))


@dataclass(frozen=True)
class PendingUserInput:
    """``PENDING_USER_INPUT`` (platform addition, ``request_user_input``): the open question.

    Attributes:
        tool_call_id: The ``request_user_input`` call; ``answer_user_input`` names it.
        prompt: The question.
        choices: Suggested answers (2 to 8 distinct strings), or empty for free text.
        turn_id: The turn it belongs to.
    """

    tool_call_id: str
    prompt: str
    choices: list[str]
    turn_id: str


@dataclass(frozen=True)
class UserInputAnswer:
    """Input of ``answer_user_input`` and value of ``USER_INPUT_ANSWERS`` (platform addition).

    Attributes:
        tool_call_id: The pending question's call ID.
        answer: The user's answer (non-blank).
    """

    tool_call_id: str
    answer: str


resolve_annotations(globals())
