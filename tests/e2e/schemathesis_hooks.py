"""Schemathesis hooks for tests/e2e/test_api_contract.py (``SCHEMATHESIS_HOOKS``).

Random path parameters would only ever meet 404s, so most generated requests use the IDs of
real objects the test created first: ``$DEXAGENTS_CONTRACT_IDS`` is a JSON object from a path
parameter's name (``session_id``, ``interrupt_id``, ``message_id``) to a list of real values.
The generated value stays among the choices, so unknown IDs are still tried.
"""

from __future__ import annotations

import json
import os
from typing import Any

import schemathesis
from hypothesis import strategies as st

KNOWN_IDS: dict[str, list[str]] = json.loads(os.environ.get("DEXAGENTS_CONTRACT_IDS", "{}"))


DELETE_SESSION = "DELETE /api/v1/sessions/{session_id}/"


@schemathesis.hook
def flatmap_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> Any:
    if not path_parameters:
        return st.just(path_parameters)
    choices = {}
    # Deleting a session would leave the other operations only 404s: DELETE gets its own.
    deleting = getattr(getattr(context, "operation", None), "label", "") == DELETE_SESSION
    for name, generated in path_parameters.items():
        real = KNOWN_IDS.get(f"deletable_{name}" if deleting else name, [])
        # Three real IDs for every generated one: most requests reach the view's logic.
        choices[name] = st.sampled_from([*real, *real, *real, generated])
    return st.fixed_dictionaries(choices)


#: Agents ``manage.py dev`` seeds: a random slug would always be refused (400).
AGENT_SLUGS = ["demo", "demo-small"]


def valid_agent(value: Any) -> bool:
    """A valid ``agent`` value (schema: 1 to 64 characters, not blank, no NUL), the way DRF's
    ``CharField`` judges it."""
    return (
        isinstance(value, str) and len(value) <= 64 and value.strip() != ""
        and "\x00" not in value
    )


def valid_tools(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= 500 and all(map(valid_agent, value))


@schemathesis.hook
def flatmap_body(context: Any, body: Any) -> Any:
    """Start most generated sessions with a real agent and, in a request that is valid,
    ``"tools": []`` (a random tool name is refused), so session creation runs past
    validation. Only valid values are replaced by other valid values, so a request generated
    to be invalid stays invalid; the generated body stays among the choices."""
    operation = getattr(context, "operation", None)
    if operation is None or operation.label != "POST /api/v1/sessions/":
        return st.just(body)
    if not isinstance(body, dict) or not valid_agent(body.get("agent")):
        return st.just(body)
    choices = [{**body, "agent": slug} for slug in AGENT_SLUGS]
    if valid_tools(body.get("tools")):
        choices = [{**choice, "tools": []} for choice in choices]
    return st.sampled_from([*choices, body])
