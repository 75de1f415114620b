"""The system messages that tell a model it plans or executes a plan (AI Agent "Durable plans").

``LiteLLMRunner`` adds one to the model input of a ``planning`` or ``executing`` turn
(``dex_agents.TurnMode``); the demo model recognises them by their first line. Django-free, so the
demo model can import it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

#: First line of the system message of a planning turn.
PLANNING_MARKER = "[dexagents plan mode]"
#: First line of the system message of a plan execution turn; the plan follows as JSON.
EXECUTING_MARKER = "[dexagents plan execution]"
#: Prefix of the line that carries the plan JSON (``{"revision", "status", "tasks"}``).
PLAN_LINE_PREFIX = "Plan: "


def plan_json(plan: Any) -> str:
    """The ``AgentPlan`` as compact JSON: ``{"revision", "status", "tasks": [{"content",
    "status"}]}``."""
    return json.dumps(
        {
            "revision": plan.revision,
            "status": str(plan.status),
            "tasks": [{"content": task.content, "status": str(task.status)} for task in plan.tasks],
        }
    )


def planning_prompt(plan: Any | None) -> str:
    """The system message of a planning turn; names the current plan when there is one."""
    lines = [
        PLANNING_MARKER,
        "Write or revise a plan for the user's request with one write_todos call (tasks in "
        "order, status pending). Do not carry out any task: the user reviews the plan and "
        "starts it.",
    ]
    if plan is not None and plan.tasks:
        lines.append(PLAN_LINE_PREFIX + plan_json(plan))
    return "\n".join(lines)


def executing_prompt(plan: Any) -> str:
    """The system message of a plan execution turn, with the current plan."""
    return "\n".join(
        [
            EXECUTING_MARKER,
            "Carry out this plan in order. Mark the task you work on in_progress and each "
            "finished task completed with write_todos (the whole list, once per response). "
            "When every task is completed, answer with a short summary. If you cannot go on, "
            "stop and say why: the plan stays active and the user can continue it.",
            PLAN_LINE_PREFIX + plan_json(plan),
        ]
    )


def plan_from_prompt(messages: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """``(mode, plan)`` read from a request's system messages: mode is ``"planning"``,
    ``"executing"`` or ``"chat"``; plan is the parsed plan JSON or ``None``."""
    for message in messages:
        if message.get("role") != "system" or not isinstance(message.get("content"), str):
            continue
        content: str = message["content"]
        first = content.split("\n", 1)[0]
        if first not in (PLANNING_MARKER, EXECUTING_MARKER):
            continue
        plan = None
        for line in content.splitlines():
            if line.startswith(PLAN_LINE_PREFIX):
                plan = json.loads(line[len(PLAN_LINE_PREFIX) :])
        return ("planning" if first == PLANNING_MARKER else "executing"), plan
    return "chat", None
