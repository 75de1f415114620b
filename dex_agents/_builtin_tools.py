"""Built-in tools the session itself runs (platform addition; AI Agent "Durable waits",
"request_user_input" and "Durable plans").

A runner offers these tools to its model when the Flow enables them
(``AgentSessionOptions.durable_waits`` / ``user_input``) and defers their calls like any other;
the session recognises them by name and runs them as Steps of its own instead of calling
``execute_deferred_tool_call``. Bad arguments become a ``failed`` record the model can read.
"""

from __future__ import annotations

import json
from typing import Any

from dex_agents._builtin_records import PlanTask, PlanTaskStatus

#: Name of the durable wait tool.
DURABLE_WAIT_TOOL = "durable_wait"
#: Name of the user-input tool.
REQUEST_USER_INPUT_TOOL = "request_user_input"
#: Name of the plan tool.
WRITE_TODOS_TOOL = "write_todos"
#: Most tasks a plan holds; longest task, in characters.
MAX_PLAN_TASKS, MAX_TASK_CHARS = 50, 500
#: Longest durable wait, in seconds (30 days).
MAX_WAIT_SECONDS = 30 * 24 * 3600
#: ``request_user_input`` takes no choices, or 2 to 8 of them.
MIN_CHOICES, MAX_CHOICES = 2, 8
#: Longest prompt and choice, in characters.
MAX_PROMPT_CHARS, MAX_CHOICE_CHARS = 2000, 200


class BuiltinToolArgumentError(ValueError):
    """A built-in tool call's arguments are unusable; the message is model-readable."""


def durable_wait_definition() -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` (JSON Schema) of ``durable_wait``."""
    return {
        "name": DURABLE_WAIT_TOOL,
        "description": (
            "Pause this session durably for a number of seconds (it survives restarts), then "
            "continue. The user can end the wait early by steering a message."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "duration_seconds": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": MAX_WAIT_SECONDS,
                    "description": "How long to wait, in whole seconds.",
                },
                "reason": {"type": "string", "description": "Why you wait, shown to the user."},
            },
            "required": ["duration_seconds", "reason"],
            "additionalProperties": False,
        },
    }


def request_user_input_definition() -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` (JSON Schema) of ``request_user_input``."""
    return {
        "name": REQUEST_USER_INPUT_TOOL,
        "description": (
            "Ask the user a question and wait for the answer. Offer 2 to 8 choices when the "
            "answer is one of a few options; omit them for a free-text answer. Other tool calls "
            "of the same response are cancelled."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "prompt": {"type": "string", "description": "The question."},
                "choices": {
                    "type": "array",
                    "items": {"type": "string"},
                    "minItems": MIN_CHOICES,
                    "maxItems": MAX_CHOICES,
                    "description": "Distinct suggested answers.",
                },
            },
            "required": ["prompt"],
            "additionalProperties": False,
        },
    }


def write_todos_definition() -> dict[str, Any]:
    """``{"name", "description", "parameters"}`` (JSON Schema) of ``write_todos``."""
    return {
        "name": WRITE_TODOS_TOOL,
        "description": (
            "Write or replace the whole plan: an ordered list of tasks, each with a status. "
            "Call it once per response; an empty list clears the plan."
        ),
        "parameters": {
            "type": "object",
            "properties": {
                "todos": {
                    "type": "array",
                    "maxItems": MAX_PLAN_TASKS,
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string"},
                            "status": {
                                "type": "string",
                                "enum": [status.value for status in PlanTaskStatus],
                            },
                        },
                        "required": ["content", "status"],
                        "additionalProperties": False,
                    },
                }
            },
            "required": ["todos"],
            "additionalProperties": False,
        },
    }


def parse_todos(arguments: str) -> list[PlanTask]:
    """The tasks of a ``write_todos`` call, contents trimmed.

    Raises:
        BuiltinToolArgumentError: No ``todos`` list, more than ``MAX_PLAN_TASKS`` tasks, a blank
            or too long content, an unknown status, or extra properties.
    """
    value = _arguments(arguments)
    todos = value.get("todos")
    if not isinstance(todos, list):
        raise BuiltinToolArgumentError("todos must be a list")
    if len(todos) > MAX_PLAN_TASKS:
        raise BuiltinToolArgumentError(f"a plan holds at most {MAX_PLAN_TASKS} tasks")
    statuses = {status.value for status in PlanTaskStatus}
    tasks: list[PlanTask] = []
    for index, item in enumerate(todos, start=1):
        if not isinstance(item, dict) or set(item) - {"content", "status"}:
            raise BuiltinToolArgumentError(
                f"task {index} must be an object with only content and status"
            )
        content, status = item.get("content"), item.get("status")
        if not isinstance(content, str) or not content.strip():
            raise BuiltinToolArgumentError(f"task {index} needs non-blank content")
        if len(content) > MAX_TASK_CHARS:
            raise BuiltinToolArgumentError(
                f"task {index} content must be at most {MAX_TASK_CHARS} characters"
            )
        if status not in statuses:
            raise BuiltinToolArgumentError(
                f"task {index} status must be one of {', '.join(sorted(statuses))}"
            )
        tasks.append(PlanTask(content.strip(), PlanTaskStatus(status)))
    return tasks


def _arguments(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise BuiltinToolArgumentError(f"arguments are not JSON: {error.msg}") from None
    if not isinstance(value, dict):
        raise BuiltinToolArgumentError("arguments must be a JSON object")
    return value


def parse_durable_wait(arguments: str) -> tuple[int, str]:
    """``(duration_seconds, reason)`` from a ``durable_wait`` call.

    Raises:
        BuiltinToolArgumentError: Not an integer in ``1..MAX_WAIT_SECONDS``, or a non-text
            reason.
    """
    value = _arguments(arguments)
    seconds = value.get("duration_seconds")
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise BuiltinToolArgumentError("duration_seconds must be an integer")
    if not 1 <= seconds <= MAX_WAIT_SECONDS:
        raise BuiltinToolArgumentError(f"duration_seconds must be between 1 and {MAX_WAIT_SECONDS}")
    reason = value.get("reason", "")
    if not isinstance(reason, str):
        raise BuiltinToolArgumentError("reason must be text")
    return seconds, reason.strip() or "Requested wait"


def parse_user_input(arguments: str) -> tuple[str, list[str]]:
    """``(prompt, choices)`` from a ``request_user_input`` call; choices trimmed.

    Raises:
        BuiltinToolArgumentError: A blank or too long prompt; choices that are not 2 to 8
            distinct non-blank strings.
    """
    value = _arguments(arguments)
    prompt = value.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise BuiltinToolArgumentError("prompt must be non-blank text")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise BuiltinToolArgumentError(f"prompt must be at most {MAX_PROMPT_CHARS} characters")
    raw = value.get("choices")
    if raw is None or raw == []:
        return prompt.strip(), []
    if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
        raise BuiltinToolArgumentError("choices must be a list of strings")
    choices = [item.strip() for item in raw]
    if not MIN_CHOICES <= len(choices) <= MAX_CHOICES:
        raise BuiltinToolArgumentError(
            f"choices must hold {MIN_CHOICES} to {MAX_CHOICES} options, or be omitted"
        )
    if any(not item or len(item) > MAX_CHOICE_CHARS for item in choices):
        raise BuiltinToolArgumentError(
            f"each choice must be non-blank and at most {MAX_CHOICE_CHARS} characters"
        )
    if len(set(choices)) != len(choices):
        raise BuiltinToolArgumentError("choices must be distinct")
    return prompt.strip(), choices


def waiting_for_user_output(prompt: str, choices: list[str]) -> str:
    """The model-visible result of an answered ``request_user_input`` call (the answer follows
    as a user message)."""
    return json.dumps({"status": "waiting_for_user", "prompt": prompt, "choices": choices})


def wait_completed_output(seconds: int, reason: str) -> str:
    """The model-visible result of a ``durable_wait`` whose Timer fired."""
    return json.dumps({"status": "completed", "duration_seconds": seconds, "reason": reason})


#: The model-visible result of a ``durable_wait`` a steered message ended early.
WAIT_INTERRUPTED_OUTPUT = json.dumps(
    {"status": "interrupted", "reason": "superseded_by_steered_user_message"}
)
#: The model-visible result of a ``durable_wait`` that the cancel of its turn ended early
#: (platform addition, ``cancel_turn``): no steered message superseded it.
WAIT_CANCELLED_OUTPUT = json.dumps({"status": "interrupted", "reason": "turn_cancelled_by_user"})
#: The model-visible result of a call cancelled because the same response asked the user.
CANCELLED_BY_USER_INPUT_OUTPUT = json.dumps(
    {"status": "cancelled", "reason": "superseded_by_user_input"}
)


def plan_updated_output(*, cleared: bool, revision: int, task_count: int) -> str:
    """The model-visible result of a ``write_todos`` call that took effect."""
    status = "cleared" if cleared else "updated"
    return json.dumps({"status": status, "revision": revision, "task_count": task_count})
