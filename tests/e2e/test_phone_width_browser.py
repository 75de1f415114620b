"""Issue 27's items at phone width (390 px) that the other page modules check at desktop width
only, in real Chromium against the real stack (the shared ``manage.py dev`` of
``page_stack``), plus session titles at both widths.

Each test reuses one page for several items so that the phone pass costs few turns: the
answer test reads Markdown with reasoning, a code block and the XSS payloads, copies, and
hears the next answer; the layout test starts in plan mode, answers a choice, queues a message
and reads the sessions list. Both watch for Content-Security-Policy violations on every page
they open. Screenshots go to ``var/screenshots/`` (``*-390.png``). Personas: ``owner``,
``reviewer`` (staff).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.browser import (
    BADGES_ON_ONE_LINE,
    NARROW,
    NOTHING_UNDER_THE_LABELS,
    VIEWPORTS,
    approval_card,
    log_in,
)
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import PASSWORD, Contexts, PageStack
from tests.e2e.test_content_security_browser import Violations
from tests.e2e.test_markdown_browser import CHECK_DOM, CODE, XSS_PAYLOADS, clipboard
from tests.e2e.test_pages_browser import (
    RECORD_ANNOUNCEMENTS,
    announced_answer,
    assistant_texts,
    region,
    screenshot,
    start_session,
    stored_messages,
    wait_for_turn_end,
)

pytestmark = pytest.mark.e2e

#: An answer with everything the conversation renders: reasoning (``/think``), a highlighted
#: code block, and every XSS payload of the Markdown module's list, streamed in small chunks.
ANSWER_MESSAGE = "\n".join([
    "/think",
    "/slow 0.1",
    "an answer to read on a phone",
    "",
    "```python",
    CODE,
    "```",
    "",
    "\n\n".join(XSS_PAYLOADS),
])


def phone_page(opened: Contexts, violations: Violations, persona: str) -> Page:
    """A logged-in page at 390 px whose context reports policy violations to ``violations``."""
    page = violations.watch(opened.new(NARROW)).new_page()
    log_in(page, persona, PASSWORD)
    return page


def test_a_phone_renders_copies_and_announces_answers_and_runs_no_payload(
    contexts: Contexts, stack: PageStack
) -> None:
    """Issue 27 at 390 px: Markdown with a highlighted code block while streaming and after,
    the XSS list inert (no dialog, no script, no handler), the reasoning kept as "Thought for
    N s", Copy on code, messages, tool arguments and results, the live region announcing an
    answer once and status changes, and no CSP violation."""
    violations = Violations()
    page = phone_page(contexts, violations, "owner")
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(dialog.message)
        dialog.dismiss()

    page.on("dialog", on_dialog)
    session_id = start_session(page, ANSWER_MESSAGE)
    # The title is the first line that is not a directive.
    expect(page.get_by_role("heading", level=1)).to_have_text("an answer to read on a phone")
    response = region(page, "Response")
    expect(response).to_contain_text("an answer to read on a phone")
    assert page.evaluate(CHECK_DOM, response.element_handle()) == []

    answer = page.locator(".message-assistant").last
    expect(answer).to_contain_text("svg link")
    messages = wait_for_turn_end(stack, "owner", session_id)
    stored = messages[-1]
    expect(answer.locator(".code-block .hljs-keyword").first).to_have_text("def")
    for link in answer.get_by_role("link").all():
        link.hover()
    # Every message's text (the reasoning's own <details> is the page's, not a payload's).
    for text in page.locator("#messages .message-text").element_handles():
        assert page.evaluate(CHECK_DOM, text) == []
    assert page.evaluate("window.__xss") is None
    assert dialogs == []
    expect(answer).to_contain_text("<script>window.__xss = 1; alert(1)</script>")

    # The reasoning: collapsed under "Thought for N s", its text (payloads too) shown as text.
    reasoning = answer.locator(".message-reasoning")
    expect(reasoning.locator("summary")).to_have_text(re.compile(r"^Thought for \d+ s$"))
    expect(reasoning.locator(".reasoning-text")).to_be_hidden()
    reasoning.locator("summary").click()
    expect(reasoning.locator(".reasoning-text")).to_have_text(stored["reasoning"]["text"])
    assert reasoning.locator(".reasoning-text").evaluate("node => node.children.length") == 0
    screenshot(page, "phone-answer", screen_too=True)

    # Copy: the code block, the answer and the user's message, as stored.
    copy_code = answer.get_by_role("button", name="Copy code")
    copy_code.click()
    expect(copy_code).to_have_text("Copied")
    assert clipboard(page) == CODE
    answer.get_by_role("button", name="Copy message").click()
    assert clipboard(page) == stored["text"]
    page.locator(".message-user").first.get_by_role("button", name="Copy message").click()
    assert clipboard(page) == ANSWER_MESSAGE

    # A tool call's arguments and result.
    composer = page.get_by_role("textbox", name="Message", exact=True)
    composer.fill('/tool search__web_search {"query": "copy on a phone"}')
    page.get_by_role("button", name="Send").click()
    tool = page.locator(".message-tool").last
    expect(tool).to_contain_text("copy on a phone")
    page.get_by_role("list", name="Tool calls").get_by_role("button", name="Copy arguments").click()
    assert clipboard(page) == '{\n  "query": "copy on a phone"\n}'
    tool.get_by_role("button", name="Copy result").click()
    result = next(message["text"] for message in wait_for_turn_end(stack, "owner", session_id)
                  if message["role"] == "tool")
    assert clipboard(page) == result
    tool.scroll_into_view_if_needed()
    screenshot(page, "phone-copy-tool", screen_too=True)

    # The live region: the next answer is announced once, not chunk by chunk.
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    expect(page.locator("#announcer")).to_have_attribute("aria-live", "polite")
    page.evaluate(RECORD_ANNOUNCEMENTS)
    announced_answer(page, 0.1)
    violations.assert_none("the chat page at 390 px")


#: Where the newest message, the dock (queue and composer) and Activity are on the page, in
#: page coordinates, once the page is scrolled to its end (the dock is sticky).
FLOW_ORDER = """() => {
  window.scrollTo(0, document.documentElement.scrollHeight);
  const top = (node) => node.getBoundingClientRect().top + window.scrollY;
  const bottom = (node) => node.getBoundingClientRect().bottom + window.scrollY;
  const newest = [...document.querySelectorAll("#messages > .message")].at(-1);
  const dock = document.querySelector(".dock");
  const activity = document.getElementById("activity");
  return {newest: bottom(newest), dockTop: top(dock), dockBottom: bottom(dock),
          activity: top(activity)};
}"""
#: 12rem: the least a queued message's text keeps beside its buttons (site.css).
QUEUE_TEXT_MIN_PX = 12 * 16


def test_a_phone_starts_in_plan_mode_answers_a_choice_and_lays_out_queue_and_lists(
    contexts: Contexts, stack: PageStack
) -> None:
    """Issue 27 at 390 px: plan mode on a session's first message, focus back in the message
    box after a choice answer, the phone-layout glitches gone (badges on one line and beside
    their labels, a queued message not one word per line, Activity after the composer, not
    between it and the newest message, a sessions list row's badges and search match beside
    their labels), and no CSP violation on the pages it opens (login, portal, chat and its
    Timeline, sessions, usage, approvals, notification settings)."""
    violations = Violations()
    page = phone_page(contexts, violations, "owner")
    tools = page.get_by_role("group", name="Tools of Demo agent")
    expect(tools.locator(".badge-approval").first).to_be_visible()
    assert tools.evaluate(BADGES_ON_ONE_LINE) == []
    screenshot(page, "phone-portal")

    # Plan mode on the first message.
    page.get_by_role("textbox", name="Message").fill(
        "pack for the phonewidthtrip\nbook the train"
    )
    page.get_by_role("checkbox", name="Plan mode").check()
    page.get_by_role("button", name="Start session in plan mode", exact=True).click()
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    session_id = page.url.rstrip("/").rsplit("/", 1)[1]
    try:
        plan = region(page, "Plan")
        expect(plan).to_contain_text("Revision 1 · Draft · 0/2 completed")
        expect(plan.get_by_role("button", name="Execute plan")).to_be_visible()
        screenshot(page, "phone-plan-first-message", screen_too=True)

        # A choice answered: the buttons go, and focus is back in the message box.
        composer = page.get_by_role("textbox", name="Message", exact=True)
        composer.fill("/ask Which colour? | red | blue")
        page.get_by_role("button", name="Send").click()
        question = region(page, "Which colour?")
        expect(question.get_by_role("button", name="red")).to_be_focused()
        expect(question).to_be_in_viewport()
        screenshot(page, "phone-question", screen_too=True)
        question.get_by_role("button", name="blue").click()
        expect(assistant_texts(page).last).to_have_text("You said: blue")
        expect(composer).to_be_focused()

        # The composer follows the newest message; Activity comes after it.
        order = page.evaluate(FLOW_ORDER)
        assert order["newest"] <= order["dockTop"] < order["dockBottom"] <= order["activity"], (
            order
        )

        # A queued message while a call waits for approval: its text keeps a readable width.
        composer.fill('/tool slack__post_message {"channel": "general", "text": "phone queue"}')
        page.get_by_role("button", name="Send").click()
        expect(region(page, "Waiting for approval")).to_contain_text("slack__post_message")
        page.get_by_role("checkbox", name="Plan mode").check()
        composer.fill("Then write the release notes for the phone layout fixes and send them "
                      "to the whole team before Friday")
        page.get_by_role("button", name="Create plan").click()
        queue = region(page, "Message queue")
        queued = queue.locator('li[data-kind="queued"]')
        expect(queued.locator(".badge-plan")).to_have_text(["Plan mode"])
        width = queued.locator(".queue-text").evaluate("node => node.clientWidth")
        assert width >= QUEUE_TEXT_MIN_PX, f"the queued text is {width} px wide"
        assert queue.evaluate(BADGES_ON_ONE_LINE) == []
        assert page.locator(".chat-header").evaluate(BADGES_ON_ONE_LINE) == []
        queued.scroll_into_view_if_needed()
        screenshot(page, "phone-queue", screen_too=True)
        # The Timeline tab reads the history (a fetch the policy's connect-src allows).
        page.get_by_role("tab", name="Timeline").click()
        expect(page.get_by_role("tabpanel", name="Timeline").locator("[data-step]").first
               ).to_be_visible()

        # The sessions list as stacked cards: the row's two status badges and its search
        # match sit beside their labels, not under them.
        page.goto("/sessions/")
        page.get_by_role("searchbox", name="Search").fill("phonewidthtrip")
        page.get_by_role("button", name="Apply").click()
        row = page.get_by_role("row").filter(has=page.locator(f'a[href="/sessions/{session_id}/"]'))
        expect(row.locator(".status-awaiting_approval")).to_have_text("Waiting for approval")
        expect(row.locator(".search-match mark")).to_have_text("phonewidthtrip")
        table = page.get_by_role("table")
        assert table.evaluate(NOTHING_UNDER_THE_LABELS) == []
        assert table.evaluate(BADGES_ON_ONE_LINE) == []
        screenshot(page, "phone-sessions-search")
        page.goto("/usage/")
        expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
        page.wait_for_load_state("networkidle")

        staff = phone_page(contexts, violations, "reviewer")
        staff.goto("/approvals/")
        card = approval_card(staff, session_id)
        expect(card).to_contain_text("phone queue")
        assert staff.locator("main").evaluate(BADGES_ON_ONE_LINE) == []
        staff.goto("/settings/notifications/")
        expect(staff.get_by_role("button", name="Save")).to_be_visible()
        staff.wait_for_load_state("networkidle")
        violations.assert_none("the pages at 390 px")
    finally:
        with stack.api("owner") as api:
            api.post(f"/api/v1/sessions/{session_id}/stop/")


#: The demo agent writes titles with its model after a first turn, for this module's last tests;
#: undone after them (the stack is shared by every page module).
TITLES_CODE = (
    "import json; from agents_app.models import AgentDefinition as A; "
    "print(json.dumps(A.objects.filter(slug='demo').update(generate_titles={on})))"
)


@pytest.fixture(scope="module")
def generated_titles(stack: PageStack) -> Iterator[None]:
    assert stack.shell(TITLES_CODE.format(on=True)) == 1
    try:
        yield
    finally:
        stack.shell(TITLES_CODE.format(on=False))


@VIEWPORTS
def test_a_session_is_named_by_its_first_line_then_by_the_model(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int],
    generated_titles: None,
) -> None:
    """Issue 27 "Titles": the first line that is not a demo directive names the session at
    once; after the first turn the agent's model writes a short title (the demo model answers
    a title request with the line's first six words), shown in the header, the tab title and
    the sessions list."""
    width = viewport["width"]
    first_line = f"lunch near pier {width} with the whole team please"
    page = contexts.logged_in("owner", viewport=viewport)
    # The answer comes a second a piece, so the turn still runs (and no title is generated
    # yet: that waits for the turn's end) while the first line names the session.
    session_id = start_session(page, f"/slow 1\n{first_line}")
    heading = page.get_by_role("heading", level=1)
    expect(page.get_by_role("button", name="Stop generating")).to_be_visible()
    expect(heading).to_have_text(first_line)
    wait_for_turn_end(stack, "owner", session_id)
    generated = f"Lunch near pier {width} with the"

    def titled() -> bool:
        page.reload()
        return heading.inner_text() == generated

    wait_until("the generated title", titled, timeout=60, interval=0.5)
    expect(page).to_have_title(f"{generated} · dexagents")
    screenshot(page, "title-generated")
    page.goto("/sessions/")
    expect(page.get_by_role("link", name=generated)).to_have_attribute(
        "href", f"/sessions/{session_id}/")
    assert stored_messages(stack, "owner", session_id)[0]["text"].endswith(first_line)
