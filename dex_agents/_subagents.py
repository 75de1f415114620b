"""Subagents: other agents offered to a session's model as tools (platform addition, issue 29).

An agent may list other agents as function tools named ``agent__<slug>``. A call of one starts
a child session of that agent as a Dex sub-flow of the calling Step (Dex spec section 2.11,
``dex.SubFlow``): the engine starts it exactly once, at the commit of the Step's ``wait_for``,
under the deterministic Flow ID ``SubFlow:<parent flow ID>-<step execution ID>-0``, and
delivers its ``FlowResult`` to the waiting Step. The child runs its first turn on the task and
completes its Flow with a ``SubagentResult``; its final answer is the call's result.

This module owns what the session and its application agree on: the ``SubagentDirectory`` the
application implements (which tool names are subagents, the child's start input, what to do
when a child is cancelled or finishes), ``SubagentOptions`` (the directory and the limits),
the calls' arguments and schema, the child's result, and the errors the model reads. The Steps
are in ``_subagent_steps``. It imports only the records.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from dex_agents._records import AgentSessionStartInput
from dex_agents._wire_types import resolve_annotations

#: What every subagent tool's name starts with: ``agent__<slug>``.
SUBAGENT_TOOL_PREFIX = "agent__"
#: Default ``SubagentOptions.max_depth``.
DEFAULT_MAX_DEPTH = 3
#: Default ``SubagentOptions.max_children_per_turn``.
DEFAULT_MAX_CHILDREN_PER_TURN = 5
#: Characters of a child's final answer a ``SubagentResult`` keeps.
ANSWER_MAX_CHARS = 100_000


def subagent_tool_name(slug: str) -> str:
    """The tool name a model sees for agent ``slug``: ``agent__<slug>``."""
    return f"{SUBAGENT_TOOL_PREFIX}{slug}"


def subagent_tool_parameters() -> dict[str, Any]:
    """The JSON Schema of a subagent call's arguments: ``task`` (required text) and
    ``context`` (optional text the child reads after the task)."""
    return {
        "type": "object",
        "properties": {
            "task": {
                "type": "string",
                "description": "What the agent should do, as a complete instruction.",
            },
            "context": {
                "type": "string",
                "description": "Optional background the agent needs (facts, earlier results).",
            },
        },
        "required": ["task"],
    }


class SubagentArgumentError(ValueError):
    """A subagent call's arguments are unusable; the message is what the model reads."""


@dataclass(frozen=True)
class SubagentTask:
    """A subagent call's parsed arguments."""

    task: str
    context: str = ""

    def message(self) -> str:
        """The child's first user message: the task, then the context under a heading."""
        if not self.context.strip():
            return self.task
        return f"{self.task}\n\nContext:\n{self.context}"


def parse_subagent_arguments(arguments: str) -> SubagentTask:
    """Parse a call's JSON arguments.

    Raises:
        SubagentArgumentError: Not a JSON object, ``task`` missing or blank, or ``task`` or
            ``context`` not a string.
    """
    try:
        value = json.loads(arguments or "{}")
    except ValueError as error:
        raise SubagentArgumentError(f"the arguments are not valid JSON ({error})") from error
    if not isinstance(value, dict):
        raise SubagentArgumentError("the arguments must be a JSON object with a 'task'")
    task = value.get("task")
    if not isinstance(task, str) or not task.strip():
        raise SubagentArgumentError("'task' is required: the instruction for the agent")
    context = value.get("context", "")
    if context is None:
        context = ""
    if not isinstance(context, str):
        raise SubagentArgumentError("'context' must be text")
    return SubagentTask(task=task, context=context)


class SubagentOutcome(StrEnum):
    """How a child session's turn ended (``SubagentResult.outcome``)."""

    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


@dataclass(frozen=True)
class SubagentResult:
    """The child session's Flow output, written by its ``FinishSubagentSession`` Step.

    Attributes:
        outcome: How its turn ended.
        answer: The turn's last assistant text (at most ``ANSWER_MAX_CHARS`` characters);
            empty when the turn failed or was cancelled before an answer.
        error: Why the turn failed (its ``last_turn_error``), else empty.
    """

    outcome: SubagentOutcome
    answer: str = ""
    error: str = ""


@dataclass(frozen=True)
class SubagentRequest:
    """What ``SubagentDirectory.child_start`` is asked to start.

    Attributes:
        parent_session_id: The calling session (its Flow ID).
        child_session_id: The child's ID, fixed before it starts (its Dex Flow ID,
            ``SubFlow:<parent>-<step execution ID>-0``); the same on every attempt.
        tool_call_id: The parent's call.
        turn_id: The parent's turn.
        tool_name: ``agent__<slug>``.
        task: The parsed arguments.
        agent_config: The parent's agent config snapshot (``AgentSessionStartInput``).
        depth: The child's depth: 1 below a top-level session.
    """

    parent_session_id: str
    child_session_id: str
    tool_call_id: str
    turn_id: str
    tool_name: str
    task: SubagentTask
    agent_config: dict[str, Any] | None
    depth: int


class SubagentRefusedError(Exception):
    """``SubagentDirectory.child_start`` will not start the child (an unknown or disabled
    agent); ``message`` is what the model reads."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SubagentDirectory(Protocol):
    """The application's side of subagents: which agents exist and how a child starts."""

    def is_subagent_tool(self, agent_config: dict[str, Any] | None, tool_name: str) -> bool:
        """Whether ``tool_name`` is one of the session's subagent tools (its agent config
        lists it); only then does the session run the call as a child session."""

    async def child_start(self, request: SubagentRequest) -> AgentSessionStartInput:
        """The child's start input (agent config and tool policies; the session sets its
        first message and ``subagent_of``). Called from the calling Step's ``wait_for``, so
        perhaps more than once for one call before the child starts: it must be idempotent
        (the platform upserts the child's index row keyed by ``child_session_id``).

        Raises:
            SubagentRefusedError: The child must not start; the call fails with the message.
        """

    async def child_cancel(self, child_session_id: str, reason: str) -> None:
        """Stop a running child whose parent call was cancelled or steered. Idempotent: the
        child may have ended already."""

    async def child_finished(self, child_session_id: str, result: SubagentResult) -> None:
        """The child's result reached its parent (at least once per child; idempotent)."""


@dataclass(frozen=True)
class SubagentOptions:
    """``AgentSessionOptions.subagents``.

    Attributes:
        directory: The application's ``SubagentDirectory``.
        max_depth: The deepest child allowed: a session at this depth gets a tool error
            instead of a child (a top-level session has depth 0).
        max_children_per_turn: Subagent calls one turn may start; later ones in the turn get
            a tool error and start nothing.
    """

    directory: SubagentDirectory
    max_depth: int = DEFAULT_MAX_DEPTH
    max_children_per_turn: int = DEFAULT_MAX_CHILDREN_PER_TURN


def depth_limit_error(max_depth: int) -> str:
    """The tool error of a call past ``max_depth``."""
    return (
        f"subagent_depth_limit: subagents may nest at most {max_depth} deep; this session "
        "may not start another agent. Do the work yourself or answer without it."
    )


def children_limit_error(limit: int) -> str:
    """The tool error of a call past the per-turn limit."""
    return (
        f"subagent_limit: at most {limit} subagent calls per turn; this call did not start. "
        "Use the results you have, or continue in the next turn."
    )


resolve_annotations(globals())
