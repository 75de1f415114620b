"""Tool effects and the default approval rule of the platform.

The effect decides how a tool call runs as a Dex Step (seed dex-agents-0.1.0, "Effects and
policies"): ``read`` and ``idempotent_write`` retry, ``non_idempotent_write`` and
``unclassified`` run once. The wire values are the plain strings of ``dex_agents.ToolEffect``.

Mapping from MCP tool annotations (MCP specification, "Tool annotations"), applied only
when the server is trusted to annotate honestly:

- ``readOnlyHint`` true -> ``read``;
- else ``idempotentHint`` true -> ``idempotent_write``, destructive or not: idempotent means
  that repeating the call with the same arguments has no further effect, so a retry is
  harmless (``write_file``, ``git_reset``, ``delete_entities``). Whether it is destructive
  (``destructiveHint`` true, or missing: the MCP default) decides approval, not retries;
- else any tool carrying at least one behavioural hint -> ``non_idempotent_write``;
- no hints, or an untrusted server -> ``unclassified``.

Approval (:func:`approval_decide`): every effect but ``read`` waits for approval on this
platform; the reason names a destructive tool as such. An administrator's override always
wins over this mapping.

Limits (:func:`timeout_decide`, :func:`attempts_decide`, :func:`step_timeout_seconds`): one
call's MCP request may take the tool's ``timeout_override``, else the server's
``call_timeout``; a ``read`` or ``idempotent_write`` call runs ``retries + 1`` attempts (the
tool's ``retries_override``, else the server's ``retries``), any other effect one attempt.
Each attempt's Dex Step is cut off at the request timeout plus the server's
``startup_timeout`` plus ``STEP_TIMEOUT_MARGIN_SECONDS``: the MCP client gives up first, with
an error the session records, and the Step timeout is only the backstop.
"""

from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Decision:
    """A decided value and the rule that decided it, worded for the admin.

    Attributes:
        value: The effect (a ``ToolEffect`` value) or the approval flag.
        reason: Which rule of this module (or which override) decided, e.g.
            ``"trusted annotations: readOnlyHint is true"``.
    """

    value: Any
    reason: str


def effect_decide(
    *, annotations: Mapping[str, Any] | None, trusted: bool, override: str | None = None
) -> Decision:
    """Decide a tool's effect and say why, following the table in this module's docstring.

    Args:
        annotations: The tool's ``annotations`` object as sent by the server (camelCase
            keys); ``None`` or ``{}`` when the tool has none.
        trusted: Whether the server is trusted to annotate honestly
            (``McpServer.trust_annotations``).
        override: The administrator's ``effect_override`` (a ``ToolEffect`` value) or
            ``None``/``""`` for none.

    Returns:
        ``Decision(value=ToolEffect, reason=str)``. Hints count only when they are JSON
        ``true``/``false`` exactly.
    """
    if override:
        return Decision(ToolEffect(override), "administrator override")
    if not trusted:
        return Decision(ToolEffect.UNCLASSIFIED, "server annotations are not trusted")
    if not annotations or not any(hint in annotations for hint in BEHAVIOUR_HINTS):
        return Decision(ToolEffect.UNCLASSIFIED, "trusted server, but the tool has no hints")
    if annotations.get("readOnlyHint") is True:
        return Decision(ToolEffect.READ, "trusted annotations: readOnlyHint is true")
    if annotations.get("idempotentHint") is True:
        if annotations_destructive(annotations):
            why = "destructiveHint is true" if "destructiveHint" in annotations else (
                "destructiveHint is missing (MCP default: true)"
            )
            return Decision(
                ToolEffect.IDEMPOTENT_WRITE,
                "trusted annotations: idempotentHint is true, so repeating is harmless and "
                f"retries are safe; {why}, so every call waits for approval",
            )
        return Decision(
            ToolEffect.IDEMPOTENT_WRITE,
            "trusted annotations: idempotentHint is true and destructiveHint is false",
        )
    return Decision(
        ToolEffect.NON_IDEMPOTENT_WRITE,
        "trusted annotations: neither readOnlyHint nor idempotentHint is true",
    )


def annotations_destructive(annotations: Mapping[str, Any] | None) -> bool:
    """Whether a tool that is not read-only may destroy data: ``destructiveHint`` is true or
    missing (MCP default: true). ``False`` for a read-only tool or one without annotations."""
    if not annotations or annotations.get("readOnlyHint") is True:
        return False
    if not any(hint in annotations for hint in BEHAVIOUR_HINTS):
        return False
    return annotations.get("destructiveHint", True) is not False


def effect_from_annotations(*, annotations: Mapping[str, Any] | None, trusted: bool) -> ToolEffect:
    """Map MCP tool annotations to an effect (:func:`effect_decide` without an override)."""
    return ToolEffect(effect_decide(annotations=annotations, trusted=trusted).value)


def approval_decide(
    *, effect: str, override: bool | None = None, destructive: bool = False
) -> Decision:
    """Decide whether a call of a tool with ``effect`` waits for approval, and say why.

    Args:
        effect: The tool's effective effect (a ``ToolEffect`` value).
        override: The administrator's ``requires_approval_override``; ``None`` for none.
        destructive: The tool's trusted annotations say it may destroy data
            (:func:`annotations_destructive`); named in the reason.

    Returns:
        ``Decision(value=bool, reason=str)`` (ARCHITECTURE.md, "Approvals").
    """
    if override is not None:
        return Decision(override, "administrator override")
    if effect == ToolEffect.READ:
        return Decision(False, "platform rule: read tools run without approval")
    if destructive:
        return Decision(
            True, f"platform rule: {effect} tools wait for approval; this one is destructive"
        )
    return Decision(True, f"platform rule: {effect} tools wait for approval")


def approval_required_by_default(*, effect: str) -> bool:
    """Return whether a tool with ``effect`` waits for approval on this platform.

    Every effect except ``read`` requires approval unless an administrator lifts it
    (ARCHITECTURE.md, "Approvals"); this is stricter than the library's default table.
    """
    return effect != ToolEffect.READ


#: Seconds a tool call's Dex Step allows beyond the MCP request timeout and the server's startup
#: timeout: the Step's own work around the request (its events and heartbeat, reading the
#: server's settings) on a loaded machine.
STEP_TIMEOUT_MARGIN_SECONDS = 10

#: The effects whose calls are retried (seed dex-agents-0.1.0, "Effects and policies").
RETRYING_EFFECTS = frozenset({ToolEffect.READ, ToolEffect.IDEMPOTENT_WRITE})


def timeout_decide(*, call_timeout: int, override: int | None) -> Decision:
    """Decide how long one call of a tool may take, and say why.

    Args:
        call_timeout: The server's ``call_timeout``, in seconds.
        override: The tool's ``timeout_override`` in seconds, or ``None`` for none.

    Returns:
        ``Decision(value=seconds, reason)``, the reason ``"tool override"`` or
        ``"server call timeout"``.
    """
    if override is not None:
        return Decision(override, "tool override")
    return Decision(call_timeout, "server call timeout")


def attempts_decide(*, effect: str, retries: int, override: int | None) -> Decision:
    """Decide how many attempts a call of a tool with ``effect`` gets, and say why.

    Args:
        effect: The tool's effective effect (a ``ToolEffect`` value).
        retries: The server's ``retries`` (extra attempts after the first).
        override: The tool's ``retries_override``, or ``None`` for none.

    Returns:
        ``Decision(value=attempts, reason)``: ``retries + 1`` for ``read`` and
        ``idempotent_write`` (reason ``"retries override N"`` or ``"server retries N"``), and
        1 for any other effect, whose calls are never repeated (seed dex-agents-0.1.0,
        "Effects and policies").
    """
    if effect not in RETRYING_EFFECTS:
        return Decision(1, f"{effect} calls are never retried")
    if override is not None:
        return Decision(override + 1, f"retries override {override}")
    return Decision(retries + 1, f"server retries {retries}")


def step_timeout_seconds(*, call_timeout: int, startup_timeout: int) -> int:
    """Seconds each attempt of a tool call's Dex Step may run (``ToolPolicy.timeout_seconds``).

    ``call_timeout`` (the tool's effective MCP request timeout) plus ``startup_timeout`` (the
    server's, for a call that first has to start or reach it) plus
    ``STEP_TIMEOUT_MARGIN_SECONDS``, so the MCP client times out first.
    """
    return call_timeout + startup_timeout + STEP_TIMEOUT_MARGIN_SECONDS
