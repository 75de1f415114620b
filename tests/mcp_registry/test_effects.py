"""Annotations -> effect -> approval, with administrator overrides (mcp_registry.effects)."""

from typing import Any

import pytest

from mcp_registry.effects import (
    ToolEffect,
    approval_decide,
    approval_required_by_default,
    attempts_decide,
    effect_decide,
    effect_from_annotations,
    step_timeout_seconds,
    timeout_decide,
)
from tests.factories import McpServerFactory, McpToolFactory

READ = ToolEffect.READ
IDEMPOTENT = ToolEffect.IDEMPOTENT_WRITE
WRITE = ToolEffect.NON_IDEMPOTENT_WRITE
UNCLASSIFIED = ToolEffect.UNCLASSIFIED


@pytest.mark.parametrize(
    ("annotations", "trusted", "expected"),
    [
        ({"readOnlyHint": True}, True, READ),
        ({"readOnlyHint": True, "destructiveHint": True}, True, READ),
        ({"readOnlyHint": True, "idempotentHint": True}, True, READ),
        ({"idempotentHint": True, "destructiveHint": False}, True, IDEMPOTENT),
        # Idempotent means repeating is harmless, destructive or not (a missing
        # destructiveHint counts as true, the MCP default): retries stay on.
        ({"idempotentHint": True}, True, IDEMPOTENT),
        ({"idempotentHint": True, "destructiveHint": True}, True, IDEMPOTENT),
        ({"readOnlyHint": False}, True, WRITE),
        ({"destructiveHint": False}, True, WRITE),
        ({"openWorldHint": True}, True, WRITE),
        ({"readOnlyHint": False, "idempotentHint": False, "destructiveHint": False}, True, WRITE),
        # Hints must be JSON booleans; truthy strings do not count.
        ({"readOnlyHint": "true"}, True, WRITE),
        ({"idempotentHint": 1, "destructiveHint": 0}, True, WRITE),
        # No behavioural hints at all.
        ({}, True, UNCLASSIFIED),
        (None, True, UNCLASSIFIED),
        ({"title": "Search"}, True, UNCLASSIFIED),
        # Untrusted servers are never believed.
        ({"readOnlyHint": True}, False, UNCLASSIFIED),
        ({"idempotentHint": True, "destructiveHint": False}, False, UNCLASSIFIED),
        ({"destructiveHint": True}, False, UNCLASSIFIED),
    ],
)
def test_effect_from_annotations(
    annotations: dict[str, Any] | None, trusted: bool, expected: ToolEffect
) -> None:
    assert effect_from_annotations(annotations=annotations, trusted=trusted) is expected


@pytest.mark.parametrize(
    ("effect", "expected"),
    [(READ, False), (IDEMPOTENT, True), (WRITE, True), (UNCLASSIFIED, True)],
)
def test_every_effect_but_read_requires_approval(effect: ToolEffect, expected: bool) -> None:
    assert approval_required_by_default(effect=effect) is expected


@pytest.mark.django_db
@pytest.mark.parametrize(
    (
        "trusted",
        "annotations",
        "effect_override",
        "approval_override",
        "expected_effect",
        "expected_approval",
    ),
    [
        (True, {"readOnlyHint": True}, None, None, "read", False),
        (
            True,
            {"idempotentHint": True, "destructiveHint": False},
            None,
            None,
            "idempotent_write",
            True,
        ),
        (True, {"destructiveHint": True}, None, None, "non_idempotent_write", True),
        (False, {"readOnlyHint": True}, None, None, "unclassified", True),
        (True, {}, None, None, "unclassified", True),
        # The administrator's effect override wins over annotations and trust.
        (False, {}, "read", None, "read", False),
        (True, {"readOnlyHint": True}, "non_idempotent_write", None, "non_idempotent_write", True),
        # The approval override lifts (or imposes) approval whatever the effect.
        (True, {"destructiveHint": True}, None, False, "non_idempotent_write", False),
        (False, {}, None, False, "unclassified", False),
        (True, {"readOnlyHint": True}, None, True, "read", True),
        (True, {}, "idempotent_write", False, "idempotent_write", False),
    ],
)
def test_tool_effective_effect_and_approval(
    trusted: bool,
    annotations: dict[str, Any],
    effect_override: str | None,
    approval_override: bool | None,
    expected_effect: str,
    expected_approval: bool,
) -> None:
    tool = McpToolFactory.create(
        server=McpServerFactory.create(trust_annotations=trusted),
        annotations=annotations,
        effect_override=effect_override,
        requires_approval_override=approval_override,
    )
    tool.refresh_from_db()
    assert tool.effective_effect == expected_effect
    assert tool.effective_requires_approval is expected_approval


@pytest.mark.parametrize(
    ("annotations", "trusted", "override", "effect", "reason"),
    [
        ({"readOnlyHint": True}, True, None, READ, "trusted annotations: readOnlyHint is true"),
        ({"idempotentHint": True, "destructiveHint": False}, True, None, IDEMPOTENT,
         "trusted annotations: idempotentHint is true and destructiveHint is false"),
        ({"idempotentHint": True}, True, None, IDEMPOTENT,
         "trusted annotations: idempotentHint is true, so repeating is harmless and retries "
         "are safe; destructiveHint is missing (MCP default: true), so every call waits for "
         "approval"),
        ({"idempotentHint": True, "destructiveHint": True}, True, None, IDEMPOTENT,
         "trusted annotations: idempotentHint is true, so repeating is harmless and retries "
         "are safe; destructiveHint is true, so every call waits for approval"),
        ({"openWorldHint": True}, True, None, WRITE,
         "trusted annotations: neither readOnlyHint nor idempotentHint is true"),
        ({"title": "Search"}, True, None, UNCLASSIFIED,
         "trusted server, but the tool has no hints"),
        ({"readOnlyHint": True}, False, None, UNCLASSIFIED,
         "server annotations are not trusted"),
        ({"readOnlyHint": True}, True, "non_idempotent_write", WRITE, "administrator override"),
        ({}, False, "read", READ, "administrator override"),
    ],
)
def test_effect_decision_says_which_rule_decided(
    annotations: dict[str, Any],
    trusted: bool,
    override: str | None,
    effect: ToolEffect,
    reason: str,
) -> None:
    decision = effect_decide(annotations=annotations, trusted=trusted, override=override)
    assert (decision.value, decision.reason) == (effect, reason)


@pytest.mark.parametrize(
    ("effect", "override", "expected", "reason"),
    [
        (READ, None, False, "platform rule: read tools run without approval"),
        (IDEMPOTENT, None, True, "platform rule: idempotent_write tools wait for approval"),
        (WRITE, None, True, "platform rule: non_idempotent_write tools wait for approval"),
        (UNCLASSIFIED, None, True, "platform rule: unclassified tools wait for approval"),
        (WRITE, False, False, "administrator override"),
        (READ, True, True, "administrator override"),
    ],
)
def test_approval_decision_says_which_rule_decided(
    effect: ToolEffect, override: bool | None, expected: bool, reason: str
) -> None:
    decision = approval_decide(effect=effect, override=override)
    assert (decision.value, decision.reason) == (expected, reason)


@pytest.mark.parametrize(
    ("override", "expected", "reason"),
    [(None, 60, "server call timeout"), (5, 5, "tool override")],
)
def test_timeout_decision_says_where_it_comes_from(
    override: int | None, expected: int, reason: str
) -> None:
    decision = timeout_decide(call_timeout=60, override=override)
    assert (decision.value, decision.reason) == (expected, reason)


@pytest.mark.parametrize(
    ("effect", "override", "expected", "reason"),
    [
        (READ, None, 3, "server retries 2"),
        (IDEMPOTENT, None, 3, "server retries 2"),
        (READ, 0, 1, "retries override 0"),
        (IDEMPOTENT, 4, 5, "retries override 4"),
        # The seed's effect table wins over any retries setting.
        (WRITE, None, 1, "non_idempotent_write calls are never retried"),
        (WRITE, 3, 1, "non_idempotent_write calls are never retried"),
        (UNCLASSIFIED, 3, 1, "unclassified calls are never retried"),
    ],
)
def test_attempts_decision_retries_only_what_may_be_repeated(
    effect: ToolEffect, override: int | None, expected: int, reason: str
) -> None:
    decision = attempts_decide(effect=effect, retries=2, override=override)
    assert (decision.value, decision.reason) == (expected, reason)


def test_a_steps_limit_outlasts_the_request_and_the_server_start() -> None:
    assert step_timeout_seconds(call_timeout=5, startup_timeout=30) == 5 + 30 + 10
