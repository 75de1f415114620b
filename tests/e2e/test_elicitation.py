"""Questions MCP servers ask during a tool call (MCP elicitation), through the REST API, against
the real platform: engine, dexworker, web, Celery and the demo model as processes
(``tests/e2e/relay_stack.py``), and ``@modelcontextprotocol/server-everything`` (npm) as the
worker's stdio MCP server.

The ``asker`` agent has server-everything's ``trigger-elicitation-request`` (a form of every
field kind, set to ``read`` so a retry asks again) and ``trigger-url-elicitation`` (URL mode,
a single-attempt write as the server's annotations say), both without approval;
``asker-quick`` is the same with a 3-second answer deadline. The demo model calls a tool with
``/tool <name> <json>``. Personas: owner, another user, staff, anonymous. One test answers the
form on the chat page in Chromium (Playwright) and saves screenshots at 1280 and 390 px
(``var/screenshots/``).
"""

from __future__ import annotations

import asyncio
import datetime
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

from dex_agents import EXECUTE_COMPLETED_EVENT
from tests.e2e.browser import NARROW, WIDE
from tests.e2e.relay_stack import Stack, running_stack
from tests.e2e.test_durable_kill import replace_worker
from tests.e2e.test_pages_browser import screenshot
from tests.e2e.test_queue import events_until, snapshot_when
from tests.mcp_registry.conftest import everything_command

pytestmark = pytest.mark.e2e

FORM_TOOL = "everything__trigger-elicitation-request"
URL_TOOL = "everything__trigger-url-elicitation"
ASK_FORM = f"/tool {FORM_TOOL} {{}}"
FORM_MESSAGE = "Please provide inputs for the following fields:"

SETUP_CODE = """
import json
from agents_app.models import AgentDefinition
from mcp_registry.models import McpServer
from mcp_registry.services import server_discover_tools
server = McpServer.objects.create(
    name="everything", transport="stdio", command=NODE, args=[SCRIPT, "stdio"],
    trust_annotations=True, startup_timeout=60, call_timeout=60,
)
tools = {tool.name: tool for tool in server_discover_tools(server=server)}
form = tools["trigger-elicitation-request"]
form.effect_override = "read"
form.requires_approval_override = False
form.save()
link = tools["trigger-url-elicitation"]
link.requires_approval_override = False
link.save()
demo = AgentDefinition.objects.get(slug="demo")
for slug, seconds in (("asker", None), ("asker-quick", 3)):
    agent = AgentDefinition.objects.create(
        slug=slug, name=f"Asker {slug}", model=demo.model, api_base=demo.api_base,
        system_prompt="", elicitation_timeout_seconds=seconds,
    )
    agent.tools.add(form, link)
print(json.dumps({"form": form.effective_effect, "url": link.effective_effect}))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    node, script = everything_command()
    with running_stack(tmp_path_factory.mktemp("elicitation")) as platform:
        code = SETUP_CODE.replace("NODE", repr(node)).replace("SCRIPT", repr(script))
        effects = platform.django_shell(code)
        assert effects == {"form": "read", "url": "non_idempotent_write"}, effects
        yield platform


def start(api: httpx.Client, message: str, agent: str = "asker") -> str:
    created = api.post("/api/v1/sessions/", json={"agent": agent, "message": message})
    assert created.status_code == 201, created.text
    return str(created.json()["id"])


def question_of(api: httpx.Client, session_id: str) -> dict[str, Any]:
    """The session's first pending elicitation, once there is one."""
    snapshot = snapshot_when(
        api, session_id, lambda snapshot: bool(snapshot["pending_elicitations"]), "a question"
    )
    question: dict[str, Any] = snapshot["pending_elicitations"][0]
    return question


def answer(api: httpx.Client, session_id: str, question: dict[str, Any],
           body: dict[str, Any]) -> httpx.Response:
    return api.post(
        f"/api/v1/sessions/{session_id}/elicitations/{question['elicitation_id']}/", json=body
    )


def tool_result_when_idle(api: httpx.Client, session_id: str) -> str:
    """The tool message of the finished turn."""
    snapshot = snapshot_when(
        api,
        session_id,
        lambda snapshot: snapshot["status"] == "waiting_for_user_message",
        "the turn to end",
    )
    assert snapshot["pending_elicitations"] == []
    tools = [message["text"] for message in snapshot["messages"] if message["role"] == "tool"]
    assert len(tools) == 1, snapshot["messages"]
    return str(tools[0])


def closed_events(stack: Stack, session_id: str) -> list[dict[str, Any]]:
    events = asyncio.run(
        events_until(
            stack,
            session_id,
            lambda events: any(event["type"] == "turn_completed" for event in events),
        )
    )
    return [event for event in events if event["type"].startswith("elicitation_")]


def test_the_form_waits_refuses_bad_content_and_goes_on_with_the_owners_answer(
    stack: Stack,
) -> None:
    with stack.persona_clients() as (owner, other, staff, anonymous):
        before = datetime.datetime.now(datetime.UTC)
        session_id = start(owner, ASK_FORM)
        question = question_of(owner, session_id)
        assert question["kind"] == "elicitation"
        assert (question["mode"], question["server"], question["tool_name"]) == (
            "form", "everything", FORM_TOOL
        )
        assert question["message"] == FORM_MESSAGE
        assert question["url"] is None
        schema = question["requested_schema"]
        assert schema["required"] == ["name"]
        # The server's order of the fields (Dex keeps JSON keys sorted).
        assert question["field_order"][:4] == ["name", "check", "firstLine", "email"]
        assert list(schema["properties"]) == question["field_order"]
        assert schema["properties"]["integer"]["maximum"] == 100
        deadline = datetime.datetime.fromisoformat(question["deadline"])
        assert before + datetime.timedelta(seconds=590) <= deadline
        assert deadline <= datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=600)
        snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot["status"] == "running_tools"
        [call] = snapshot["tool_calls"]
        assert (call["tool_call_id"], call["status"]) == (question["call_id"], "pending")

        # Bad content: 400 with a message per field, and the question still waits.
        refused = answer(owner, session_id, question, {
            "action": "accept",
            "content": {"integer": 500, "email": "nope", "colour": "red"},
        })
        assert refused.status_code == 400, refused.text
        assert refused.json() == {
            "content": {
                "non_field_errors": ["Not a field of this form: colour."],
                "name": ["This field is required."],
                "email": ["Enter a valid email address."],
                "integer": ["Enter a number of at most 100."],
            }
        }
        assert owner.get(f"/api/v1/sessions/{session_id}/").json()["pending_elicitations"] == [
            question
        ]
        declined_with_content = answer(
            owner, session_id, question, {"action": "decline", "content": {"name": "x"}}
        )
        assert declined_with_content.status_code == 400, declined_with_content.text

        # Only the owner answers: staff read the question, others cannot tell it exists.
        right = {"action": "accept", "content": {"name": "Ada Lovelace", "check": True,
                                                 "integer": 7, "email": "ada@example.com"}}
        assert answer(anonymous, session_id, question, right).status_code == 401
        assert answer(other, session_id, question, right).status_code == 404
        assert other.get(f"/api/v1/sessions/{session_id}/").status_code == 404
        read = staff.get(f"/api/v1/sessions/{session_id}/").json()
        assert read["pending_elicitations"] == [question]
        assert answer(staff, session_id, question, right).status_code == 403

        accepted = answer(owner, session_id, question, right)
        assert accepted.status_code == 202, accepted.text
        assert accepted.json() == {"answered": True, "action": "accept"}
        again = answer(owner, session_id, question, {"action": "decline"})
        assert again.status_code == 409, again.text
        assert again.json()["reason"] == "not_pending"

        result = tool_result_when_idle(owner, session_id)
        assert "✅ User provided the requested information!" in result
        assert "- Name: Ada Lovelace" in result
        assert "- Agreed to terms: true" in result
        assert "- Email: ada@example.com" in result
        assert "[dexagents]" not in result
        assert answer(owner, session_id, question, right).status_code == 409

    events = closed_events(stack, session_id)
    assert [(event["type"], event["data"].get("status")) for event in events] == [
        ("elicitation_requested", None),
        ("elicitation_closed", "accepted"),
    ]
    assert events[0]["data"]["elicitation_id"] == question["elicitation_id"]
    assert events[0]["data"]["message"] == FORM_MESSAGE


def test_decline_reaches_the_server(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner, ASK_FORM)
        question = question_of(owner, session_id)
        declined = answer(owner, session_id, question, {"action": "decline"})
        assert declined.status_code == 202, declined.text
        assert declined.json() == {"answered": True, "action": "decline"}
        result = tool_result_when_idle(owner, session_id)
        assert "❌ User declined to provide the requested information." in result
        assert '"action": "decline"' in result


def test_an_unanswered_question_expires_and_the_result_says_so(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner, ASK_FORM, agent="asker-quick")
        question = question_of(owner, session_id)
        requested = datetime.datetime.fromisoformat(question["requested_at"])
        deadline = datetime.datetime.fromisoformat(question["deadline"])
        assert deadline - requested == datetime.timedelta(seconds=3)
        result = tool_result_when_idle(owner, session_id)
        assert "⚠️ User cancelled the elicitation dialog." in result
        assert (
            f"[dexagents] The MCP server's question {FORM_MESSAGE!r} expired: the user did not "
            "answer within 3 s, so the server was told the question was cancelled."
        ) in result
        late = answer(owner, session_id, question, {"action": "cancel"})
        assert late.status_code == 409, late.text
    events = closed_events(stack, session_id)
    assert [event["data"].get("status") for event in events] == [None, "expired"]


def test_a_url_question_shows_its_link_and_done_accepts_it(stack: Stack) -> None:
    arguments = {"url": "https://example.com/authorize?client=dexagents",
                 "message": "Sign in to Example, then press Done.", "elicitationId": "e2e-url"}
    with stack.api("owner") as owner:
        session_id = start(owner, f"/tool {URL_TOOL} {json.dumps(arguments)}")
        question = question_of(owner, session_id)
        assert (question["mode"], question["url"], question["message"]) == (
            "url", arguments["url"], arguments["message"]
        )
        assert question["requested_schema"] is None
        with_content = answer(owner, session_id, question,
                              {"action": "accept", "content": {"done": True}})
        assert with_content.status_code == 400, with_content.text
        done = answer(owner, session_id, question, {"action": "accept"})
        assert done.status_code == 202, done.text
        result = tool_result_when_idle(owner, session_id)
        assert "✅ User completed the URL elicitation flow." in result
        assert "Elicitation ID: e2e-url" in result


def test_a_stopped_session_takes_no_answer(stack: Stack) -> None:
    with stack.api("owner") as owner:
        session_id = start(owner, ASK_FORM)
        question = question_of(owner, session_id)
        assert owner.post(f"/api/v1/sessions/{session_id}/stop/").status_code == 202
        snapshot = owner.get(f"/api/v1/sessions/{session_id}/").json()
        assert snapshot["status"] == "stopped"
        assert snapshot["pending_elicitations"] == []
        late = answer(owner, session_id, question, {"action": "decline"})
        assert late.status_code == 409, late.text
        assert late.json()["reason"] == "session_stopped"


def test_a_killed_worker_leaves_the_question_waiting_for_the_retried_call(stack: Stack) -> None:
    """The form tool is a read: its Step retries on a new worker, whose server process asks
    the same question, which keeps its ID and deadline and takes the answer. The URL tool is a
    single-attempt write: it ends ``outcome_unknown`` and its question is withdrawn."""
    arguments = {"url": "https://example.com/approve", "message": "Approve it."}
    with stack.api("owner") as owner:
        retried = start(owner, ASK_FORM)
        single = start(owner, f"/tool {URL_TOOL} {json.dumps(arguments)}")
        question = question_of(owner, retried)
        lost = question_of(owner, single)
        replace_worker(stack)

        result = snapshot_when(
            owner, single,
            lambda snapshot: snapshot["status"] == "waiting_for_user_message", "the write to end",
        )
        assert result["pending_elicitations"] == []
        tool = next(message for message in result["messages"] if message["role"] == "tool")
        assert "outcome" in tool["text"].lower(), tool
        refused = answer(owner, single, lost, {"action": "accept"})
        assert refused.status_code == 409, refused.text

        # The retried attempt asks again (the relay waits up to a minute for it).
        asyncio.run(events_until(
            stack,
            retried,
            lambda events: [event["type"] for event in events].count("elicitation_requested")
            == 2,
        ))
        again = question_of(owner, retried)
        assert again == question
        accepted = answer(owner, retried, question, {"action": "accept",
                                                     "content": {"name": "Grace Hopper"}})
        assert accepted.status_code == 202, accepted.text
        assert "- Name: Grace Hopper" in tool_result_when_idle(owner, retried)
        history = owner.get(f"/api/v1/sessions/{retried}/history/").json()
        attempts = [entry["final_attempt"] for entry in history
                    if entry["step_type"] == "CallTool"
                    and entry["event_type"] == EXECUTE_COMPLETED_EVENT]
        assert attempts == [2], history
    events = closed_events(stack, retried)
    assert [(event["type"], event["attempt"]) for event in events] == [
        ("elicitation_requested", 1),
        ("elicitation_requested", 2),
        ("elicitation_closed", 2),
    ]


# ---------------------------------------------------------------- the chat page, in Chromium
# (``browser``: the e2e conftest's Chromium, one per module)


def page_as(browser: Browser, stack: Stack, persona: str, viewport: dict[str, int],
            errors: list[str]) -> Page:
    """A page of a new context logged in as ``persona`` (its session cookie)."""
    context = browser.new_context(base_url=stack.base_url(), viewport=viewport)  # type: ignore[arg-type]
    context.add_cookies([{"name": "sessionid", "value": stack.personas[persona].cookie,
                          "url": stack.base_url()}])
    context.on("weberror", lambda error: errors.append(str(error.error)))
    return context.new_page()


def test_the_chat_page_answers_a_servers_form(stack: Stack, browser: Browser) -> None:
    errors: list[str] = []
    with stack.api("owner") as owner:
        session_id = start(owner, ASK_FORM)
        question_of(owner, session_id)
        linked = start(owner, f"/tool {URL_TOOL} " + json.dumps(
            {"url": "https://example.com/authorize?client=dexagents",
             "message": "Sign in to Example, then press Done."}))
        question_of(owner, linked)
    for viewport in (WIDE, NARROW):
        page = page_as(browser, stack, "owner", viewport, errors)
        page.goto(f"/sessions/{linked}/")
        card = page.get_by_role("region", name="Sign in to Example, then press Done.")
        link = card.get_by_role("link", name="https://example.com/authorize?client=dexagents")
        expect(link).to_have_attribute("target", "_blank")
        expect(card.get_by_role("button", name="Done")).to_be_focused()
        screenshot(page, "chat-elicitation-url", screen_too=True)
        page.context.close()

    narrow = page_as(browser, stack, "owner", NARROW, errors)
    narrow.goto(f"/sessions/{session_id}/")
    expect(narrow.get_by_role("textbox", name="String (required)")).to_be_focused()
    screenshot(narrow, "chat-elicitation-form", screen_too=True)
    narrow.context.close()

    reviewer = page_as(browser, stack, "staff", WIDE, errors)
    reviewer.goto(f"/sessions/{session_id}/")
    staff_view = reviewer.get_by_role("region", name=FORM_MESSAGE)
    expect(staff_view).to_contain_text("Waiting for owner's answer.")
    expect(staff_view.get_by_role("textbox", name="String (required)")).to_be_disabled()
    expect(staff_view.get_by_role("button", name="Submit")).to_have_count(0)

    page = page_as(browser, stack, "owner", WIDE, errors)
    page.goto(f"/sessions/{session_id}/")
    form = page.get_by_role("region", name=FORM_MESSAGE)
    expect(form).to_contain_text("everything asks")
    name = form.get_by_role("textbox", name="String (required)")
    expect(name).to_be_focused()
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_be_hidden()
    expect(page.locator("#chat-status")).to_have_text("Waiting for an answer")
    expect(form.get_by_role("spinbutton", name="Integer")).to_have_value("42")
    expect(form.get_by_role("combobox", name="Untitled Single Select Enum")).to_have_value(
        "Monica")
    expect(form.get_by_role("checkbox", name="Guitar")).to_be_checked()
    # Bad values: the server's messages show next to their fields; nothing is lost.
    form.get_by_role("textbox", name="String with email format").fill("nope")
    form.get_by_role("spinbutton", name="Integer").fill("500")
    form.get_by_role("button", name="Submit").click()
    expect(form.locator("[data-name='name'] .field-error")).to_have_text(
        "This field is required.")
    expect(form.locator("[data-name='email'] .field-error")).to_have_text(
        "Enter a valid email address.")
    expect(form.locator("[data-name='integer'] .field-error")).to_have_text(
        "Enter a number of at most 100.")
    expect(name).to_be_focused()
    expect(name).to_have_attribute("aria-invalid", "true")
    screenshot(page, "chat-elicitation-errors", screen_too=True)

    # With the keyboard: type, tick, and Enter submits.
    name.fill("Ada Lovelace")
    form.get_by_role("textbox", name="String with email format").fill("ada@example.com")
    form.get_by_role("spinbutton", name="Integer").fill("7")
    form.get_by_role("checkbox", name="Boolean").press("Space")
    name.press("Enter")
    expect(form).to_be_hidden()
    tool_text = page.get_by_role("region", name="Conversation").locator(
        ".message-tool .message-text")
    expect(tool_text).to_contain_text("- Name: Ada Lovelace")
    expect(tool_text).to_contain_text("- Agreed to terms: true")
    activity = page.get_by_role("region", name="Activity")
    expect(activity).to_contain_text("Question from everything")
    expect(activity).to_contain_text("Answered the server got the answer")
    expect(page.get_by_role("textbox", name="Message", exact=True)).to_be_visible()
    expect(staff_view).to_be_hidden()
    assert not errors, errors
    # Leave no call waiting on a question: the worker's stop would drain it until killed.
    with stack.api("owner") as owner:
        assert answer(owner, linked, question_of(owner, linked),
                      {"action": "cancel"}).status_code == 202
