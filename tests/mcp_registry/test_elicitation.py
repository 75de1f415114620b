"""A server's questions during a call (MCP ``elicitation/create``) reach ``on_elicit`` and its
answer reaches the server: ``@modelcontextprotocol/server-everything`` as a real subprocess,
its ``trigger-elicitation-request`` (a form of every field kind the restricted schema allows)
and ``trigger-url-elicitation`` (URL mode) tools.

The form's schema is also read by the platform's schema reader and checker
(``dex_agents.elicitation_form``), which the session uses before it asks the user."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp.types import (
    ElicitRequestFormParams,
    ElicitRequestParams,
    ElicitRequestURLParams,
    ElicitResult,
)

from dex_agents import elicitation_content_check, elicitation_form
from mcp_registry.client import McpClientPool, McpScope, McpServerSpec

# A question goes to a call of the agent session its connection serves.
SESSION = McpScope("ses_asking", "7")
FORM_TOOL = "trigger-elicitation-request"
URL_TOOL = "trigger-url-elicitation"


def raw_result(text: str) -> dict[str, Any]:
    """The ``Raw result: {...}`` server-everything appends: the ElicitResult it received."""
    raw: dict[str, Any] = json.loads(text.split("Raw result:", 1)[1])
    return raw


async def test_a_form_question_reaches_on_elicit_and_its_answer_the_tool_result(
    everything_spec: McpServerSpec,
) -> None:
    asked: list[ElicitRequestParams] = []

    async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(
            action="accept",
            content={"name": "Ada Lovelace", "check": True, "integer": 7,
                     "untitledMultipleSelectEnum": ["Piano", "Drums"]},
        )

    async with McpClientPool() as pool:
        output = await pool.call_tool(
            everything_spec, FORM_TOOL, {}, idempotency_key=None, timeout=None,
            on_elicit=on_elicit, scope=SESSION,
        )
    [params] = asked
    assert isinstance(params, ElicitRequestFormParams)
    assert params.message == "Please provide inputs for the following fields:"
    assert params.requested_schema["required"] == ["name"]
    assert "✅ User provided the requested information!" in output.text
    assert "- Name: Ada Lovelace" in output.text
    assert "- Agreed to terms: true" in output.text
    assert "- Favorite Integer: 7" in output.text
    assert raw_result(output.text)["content"]["untitledMultipleSelectEnum"] == ["Piano", "Drums"]

    # The platform reads every field of this form, in the server's order, and checks answers.
    form = elicitation_form(params.requested_schema)
    kinds = {item.name: item.kind for item in form.fields}
    assert kinds == {
        "name": "string", "check": "boolean", "firstLine": "string", "email": "string",
        "homepage": "string", "birthdate": "string", "integer": "integer", "number": "number",
        "untitledSingleSelectEnum": "choice", "untitledMultipleSelectEnum": "choices",
        "titledSingleSelectEnum": "choice", "titledMultipleSelectEnum": "choices",
        "legacyTitledEnum": "choice",
    }
    titled = next(item for item in form.fields if item.name == "titledSingleSelectEnum")
    assert titled.options[0] == ("hero-1", "Superman")
    legacy = next(item for item in form.fields if item.name == "legacyTitledEnum")
    assert legacy.options[1] == ("pet-2", "Dogs")
    clean, errors = elicitation_content_check(
        form, {"name": "Ada", "integer": 101, "email": "ada@", "titledMultipleSelectEnum": []}
    )
    assert errors == {
        "integer": ["Enter a number of at most 100."],
        "email": ["Enter a valid email address."],
        "titledMultipleSelectEnum": ["Choose at least 1."],
    }
    assert clean == {"name": "Ada"}


@pytest.mark.parametrize(
    ("action", "expected"),
    [
        ("decline", "❌ User declined to provide the requested information."),
        ("cancel", "⚠️ User cancelled the elicitation dialog."),
    ],
)
async def test_decline_and_cancel_reach_the_server(
    everything_spec: McpServerSpec, action: str, expected: str
) -> None:
    async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
        return ElicitResult(action=action)  # type: ignore[arg-type]

    async with McpClientPool() as pool:
        output = await pool.call_tool(
            everything_spec, FORM_TOOL, {}, idempotency_key=None, timeout=None,
            on_elicit=on_elicit, scope=SESSION,
        )
    assert expected in output.text
    assert raw_result(output.text) == {"action": action}


async def test_a_url_question_carries_its_url_and_id(everything_spec: McpServerSpec) -> None:
    asked: list[ElicitRequestParams] = []

    async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept")

    async with McpClientPool() as pool:
        output = await pool.call_tool(
            everything_spec,
            URL_TOOL,
            {"url": "https://example.com/authorize", "message": "Sign in, please.",
             "elicitationId": "sign-in-1"},
            idempotency_key=None,
            timeout=None,
            on_elicit=on_elicit, scope=SESSION,
        )
    [params] = asked
    assert isinstance(params, ElicitRequestURLParams)
    assert (params.message, params.url, params.elicitation_id) == (
        "Sign in, please.", "https://example.com/authorize", "sign-in-1"
    )
    assert "✅ User completed the URL elicitation flow." in output.text
    assert "Elicitation ID: sign-in-1" in output.text


async def test_without_on_elicit_the_question_is_declined(everything_spec: McpServerSpec) -> None:
    async with McpClientPool() as pool:
        output = await pool.call_tool(
            everything_spec, FORM_TOOL, {}, idempotency_key=None, timeout=None
        )
    assert raw_result(output.text) == {"action": "decline"}


async def test_a_question_on_a_shared_connection_is_declined(
    everything_spec: McpServerSpec,
) -> None:
    """On a connection every user's calls share, a question may come from any user's earlier
    call: it is declined, never shown to whoever is calling now."""
    from dataclasses import replace

    asked: list[ElicitRequestParams] = []

    async def on_elicit(params: ElicitRequestParams) -> ElicitResult:
        asked.append(params)
        return ElicitResult(action="accept", content={"name": "Ada Lovelace"})

    async with McpClientPool() as pool:
        output = await pool.call_tool(
            replace(everything_spec, isolation="shared"), FORM_TOOL, {}, idempotency_key=None,
            timeout=None, on_elicit=on_elicit, scope=SESSION,
        )
    assert asked == []
    assert raw_result(output.text) == {"action": "decline"}
