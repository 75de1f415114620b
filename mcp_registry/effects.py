"""Tool effects and the default approval rule of the platform.

The effect decides how a tool call runs as a Dex Step (seed dex-agents-0.1.0, "Effects and
policies"): ``read`` and ``idempotent_write`` retry, ``non_idempotent_write`` and
``unclassified`` run once. The wire values are the plain strings of ``dex_agents.ToolEffect``.

Mapping from MCP tool annotations (MCP specification, "Tool annotations"), applied only
when the server is trusted to annotate honestly:

- ``readOnlyHint`` true -> ``read``;
- else ``idempotentHint`` true and ``destructiveHint`` false -> ``idempotent_write``
  (a missing ``destructiveHint`` counts as true, the MCP default);
- else any tool carrying at least one behavioural hint -> ``non_idempotent_write``;
- no hints, or an untrusted server -> ``unclassified``.

An administrator's override always wins over this mapping.
"""

from collections.abc import Mapping
from typing import Any

from django.db import models

# The behavioural hints of MCP ToolAnnotations; ``title`` alone says nothing about effects.
BEHAVIOUR_HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")


class ToolEffect(models.TextChoices):
    """What a tool call does to the world; values match ``dex_agents.ToolEffect``."""

    READ = "read", "Read"
    IDEMPOTENT_WRITE = "idempotent_write", "Idempotent write"
    NON_IDEMPOTENT_WRITE = "non_idempotent_write", "Non-idempotent write"
    UNCLASSIFIED = "unclassified", "Unclassified"


def effect_from_annotations(*, annotations: Mapping[str, Any] | None, trusted: bool) -> ToolEffect:
    """Map MCP tool annotations to an effect, following the table in this module's docstring.

    Args:
        annotations: The tool's ``annotations`` object as sent by the server (camelCase
            keys); ``None`` or ``{}`` when the tool has none.
        trusted: Whether the server is trusted to annotate honestly
            (``McpServer.trust_annotations``).

    Returns:
        The effect. Hints count only when they are JSON ``true``/``false`` exactly.
    """
    if not trusted or not annotations:
        return ToolEffect.UNCLASSIFIED
    if not any(hint in annotations for hint in BEHAVIOUR_HINTS):
        return ToolEffect.UNCLASSIFIED
    if annotations.get("readOnlyHint") is True:
        return ToolEffect.READ
    destructive = annotations.get("destructiveHint", True)
    if annotations.get("idempotentHint") is True and destructive is False:
        return ToolEffect.IDEMPOTENT_WRITE
    return ToolEffect.NON_IDEMPOTENT_WRITE


def approval_required_by_default(*, effect: str) -> bool:
    """Return whether a tool with ``effect`` waits for approval on this platform.

    Every effect except ``read`` requires approval unless an administrator lifts it
    (ARCHITECTURE.md, "Approvals"); this is stricter than the library's default table.
    """
    return effect != ToolEffect.READ
