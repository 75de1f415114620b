"""The pages in real Chromium against the real stack (``manage.py dev``: engine, worker, web,
Celery and the demo model as processes on private ports and a private var dir).

Personas: ``demo`` (the seeded user, logging in with the password ``make run`` prints),
``owner``, ``intruder`` (another user) and ``reviewer`` (staff). Waits are Playwright's
``expect`` (which polls until its deadline) or ``wait_until``; nothing sleeps and hopes.
Screenshots of every page at 1280 and 390 px go to ``var/screenshots/`` (or
``$DEXAGENTS_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import datetime
import json
import re
from typing import Any

import pytest
from playwright.sync_api import Dialog, Page, expect

from tests.e2e.browser import (
    NARROW,
    SCREENSHOTS,
    VIEWPORTS,
    WIDE,
    approval_card,
    decision_row,
    log_in,
    serious_axe_violations,
)
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import PASSWORD, Contexts, PageStack

pytestmark = pytest.mark.e2e


def start_session(page: Page, message: str) -> str:
    """Start a demo-agent session from the portal; return its ID once the chat page shows."""
    page.goto("/")
    page.get_by_role("textbox", name="Message").fill(message)
    page.get_by_role("button", name="Start session").click()
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    return page.url.rstrip("/").rsplit("/", 1)[1]


SHOWN_TEXT = """() => {
  const announcer = document.getElementById("announcer");
  const was = announcer?.hidden;
  if (announcer) announcer.hidden = true;
  const text = document.body.innerText;
  if (announcer) announcer.hidden = was;
  return text;
}"""


def shown_text(page: Page) -> str:
    """The page's text as it is laid out, without what the screen reader region repeats
    (``#announcer`` says the newest answer again)."""
    text: str = page.evaluate(SHOWN_TEXT)
    return text


def region(page: Page, name: str) -> Any:
    return page.get_by_role("region", name=name, exact=True)


def assistant_texts(page: Page) -> Any:
    return region(page, "Conversation").locator(".message-assistant .message-text")


def stored_messages(stack: PageStack, persona: str, session_id: str) -> list[dict[str, Any]]:
    with stack.api(persona) as api:
        snapshot = api.get(f"/api/v1/sessions/{session_id}/")
        assert snapshot.status_code == 200, snapshot.text
        messages: list[dict[str, Any]] = snapshot.json()["messages"]
        return messages


def wait_for_turn_end(stack: PageStack, persona: str, session_id: str) -> list[dict[str, Any]]:
    """Poll the API until the session waits for a message again; return its messages."""

    def probe() -> list[dict[str, Any]] | None:
        with stack.api(persona) as api:
            snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
        messages = snapshot["messages"]
        if snapshot["status"] == "waiting_for_user_message" and messages[-1:]:
            return list(messages) if messages[-1]["role"] == "assistant" else None
        return None

    return wait_until("the turn to end", probe, timeout=90)


#: Sticky elements laid out where the page's flow puts them (``position: static`` through the
#: CSSOM, which the pages' Content-Security-Policy allows); the number of elements changed.
UNSTICK = """() => {
  const stuck = [...document.querySelectorAll("body *")]
    .filter((node) => getComputedStyle(node).position === "sticky");
  for (const node of stuck) {
    node.style.setProperty("position", "static");
    node.dataset.unstuck = "";
  }
  return stuck.length;
}"""
RESTICK = """() => {
  for (const node of document.querySelectorAll("[data-unstuck]")) {
    node.style.removeProperty("position");
    delete node.dataset.unstuck;
  }
}"""


def screenshot(
    page: Page, name: str, *, screen_too: bool = False, full_page: bool = True
) -> None:
    """Save a full-page PNG (and with ``screen_too`` what the screen shows as it is scrolled,
    as ``<name>-screen``) and check that nothing is wider than the viewport. ``full_page``
    False keeps only the screen's picture: a page holding a megabyte of text is over 100,000
    px tall, and Chromium takes longer than Playwright waits to capture it whole."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    if screen_too or not full_page:
        page.screenshot(path=str(SCREENSHOTS / f"{name}-screen-{width}.png"))
    if full_page:
        # Chromium captures a full page without growing the viewport, so a sticky bar is drawn
        # where the first screen puts it, over the conversation (the composer at 600-844 px of
        # a phone's picture) and away from its own place: the picture shows the flow instead.
        page.evaluate("window.scrollTo(0, 0)")
        page.evaluate(UNSTICK)
        try:
            page.screenshot(path=str(SCREENSHOTS / f"{name}-{width}.png"), full_page=True)
        finally:
            page.evaluate(RESTICK)
    overflow = page.evaluate("document.documentElement.scrollWidth")
    assert overflow <= width, f"{name} is {overflow} px wide in a {width} px viewport"


SLOW_WORDS = ("the quick brown fox jumps over the lazy dog while the agent streams "
              "its answer one small chunk after another")


def test_login_portal_and_a_slow_reply_streams_before_it_is_stored(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("demo", stack.demo_password)  # the password `make run` printed
    agent = page.get_by_role("combobox", name="Agent")
    expect(agent).to_have_value("demo")
    session_id = start_session(page, f"/slow 0.4\n{SLOW_WORDS}")

    response = region(page, "Response")
    expect(response).to_contain_text("You said:")
    # The text is live: the turn has not stored its answer yet.
    assert assistant_texts(page).count() == 0
    expect(page.locator("#chat-status")).to_have_text("Model running")

    final = f"You said: {SLOW_WORDS}"
    expect(assistant_texts(page)).to_have_text([final])
    expect(response).to_be_hidden()
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    assert stored_messages(stack, "demo", session_id)[-1]["text"] == final


def test_reasoning_streams_under_thinking_and_is_kept_collapsed_with_the_answer(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    session_id = start_session(page, f"/think\n/slow 0.4\n{SLOW_WORDS}")
    thinking = region(page, "Thinking")
    expect(thinking).to_contain_text("Thinking about:")
    expect(assistant_texts(page)).to_have_text([f"You said: {SLOW_WORDS}"])
    expect(thinking).to_be_hidden()

    # After the turn the reasoning stays with the answer, collapsed, readable, not encrypted.
    [answer] = [m for m in stored_messages(stack, "owner", session_id) if m["role"] == "assistant"]
    assert answer["reasoning"]["text"].startswith("Thinking about:")
    assert answer["reasoning"]["seconds"] >= 0
    assert set(answer["reasoning"]) == {"text", "seconds"}
    kept = region(page, "Conversation").locator(".message-assistant .message-reasoning")
    summary = kept.locator("summary")
    expect(summary).to_have_text(re.compile(r"^Thought for \d+ s$"))
    expect(kept.locator(".reasoning-text")).to_be_hidden()
    summary.click()
    expect(kept.locator(".reasoning-text")).to_have_text(answer["reasoning"]["text"])
    screenshot(page, "reasoning-kept", screen_too=True)
    page.reload()
    expect(region(page, "Conversation").locator(".message-reasoning summary")).to_have_text(
        summary.inner_text()
    )


def test_messages_sent_during_a_turn_wait_in_the_queue(contexts: Contexts) -> None:
    page = contexts.logged_in("owner")
    start_session(page, f"/slow 0.5\n{SLOW_WORDS}")
    expect(region(page, "Response")).to_contain_text("You said:")
    composer = page.get_by_role("textbox", name="Message")
    composer.fill("waiting in line")
    page.get_by_role("button", name="Send").click()
    queue = region(page, "Message queue")
    expect(queue.locator("li")).to_have_text([re.compile("Queued.*waiting in line")])
    expect(queue).to_contain_text("1 message waiting")
    # The queued message starts the next turn once this one ends.
    expect(assistant_texts(page)).to_have_text(
        [f"You said: {SLOW_WORDS}", "You said: waiting in line"]
    )
    expect(queue.locator("li")).to_have_count(0)
    expect(queue).to_contain_text("No messages waiting.")


def test_a_message_queued_elsewhere_shows_in_every_open_page_at_once(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    session_id = start_session(page, f"/slow 1\n{SLOW_WORDS}")  # about seven seconds
    expect(region(page, "Response")).to_contain_text("You said:")
    composer = page.get_by_role("textbox", name="Message")
    composer.fill("   ")
    page.get_by_role("button", name="Send").click()
    expect(page.get_by_role("alert").filter(has_text="Write a message first.")).to_be_visible()

    with stack.api("owner") as api:
        sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "from the api"})
        assert sent.status_code == 202, sent.text
    # The web side announces it on the session's events; the page does not wait for the turn
    # to end (or for its periodic refresh) to show it.
    expect(region(page, "Activity")).to_contain_text("Message queued")
    queue = region(page, "Message queue")
    expect(queue).to_contain_text("from the api", timeout=3_000)
    expect(region(page, "Response")).to_be_visible()


def test_older_messages_load_through_the_paged_messages_endpoint(
    contexts: Contexts, stack: PageStack
) -> None:
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": "one"})
        session_id = created.json()["id"]
        wait_for_turn_end(stack, "owner", session_id)
        for text in ("two", "three"):
            assert api.post(f"/api/v1/sessions/{session_id}/messages/",
                            json={"text": text}).status_code == 202

            def answered(text: str = text) -> bool:
                last = wait_for_turn_end(stack, "owner", session_id)[-1]
                return bool(last["text"] == f"You said: {text}")

            wait_until(f"the answer to {text!r}", answered)

    page = contexts.logged_in("owner")
    older_pages: list[str] = []

    def newest_two_only(route: Any) -> None:
        # A session longer than one snapshot, in miniature: the snapshot holds only the two
        # newest messages, so the page must fetch the others from the messages endpoint.
        answer = route.fetch()
        snapshot = answer.json()
        snapshot["messages"] = snapshot["messages"][-2:]
        snapshot["has_older_messages"] = True
        route.fulfill(response=answer, json=snapshot)

    page.route(re.compile(rf"/api/v1/sessions/{session_id}/$"), newest_two_only)
    page.on("request", lambda request: older_pages.append(request.url)
            if "/messages/?before=" in request.url else None)
    page.goto(f"/sessions/{session_id}/")
    messages = region(page, "Conversation").locator(".message")
    expect(messages).to_have_count(6)
    expect(messages.locator(".message-text")).to_have_text([
        "one", "You said: one", "two", "You said: two", "three", "You said: three",
    ])
    assert [url.split("?", 1)[1] for url in older_pages] == ["before=5&limit=50"]
    expect(page.get_by_role("button", name="Load older messages")).to_be_hidden()


def test_a_message_shown_cut_is_read_whole_from_its_button(
    contexts: Contexts, stack: PageStack
) -> None:
    """A 1 MiB answer is past the snapshot's budget, so the page gets its start and its
    length; the button reads the rest in parts (``.../messages/<n>/text/?part=``) and shows the
    whole text in place."""
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": "/big 1024"})
        session_id = created.json()["id"]
        last = wait_for_turn_end(stack, "owner", session_id)[-1]
        assert last["text_length"] == 1024 * 1024

    page = contexts.logged_in("owner")
    parts: list[str] = []
    page.on("request", lambda request: parts.append(request.url.rsplit("?", 1)[-1])
            if "/text/?part=" in request.url else None)
    page.goto(f"/sessions/{session_id}/")
    answer = region(page, "Conversation").locator(".message-assistant").last
    button = answer.get_by_role("button", name="Show the whole text (1,048,576 characters)")
    expect(button).to_be_visible()
    assert len(answer.locator(".message-text").inner_text()) < 1024 * 1024
    button.scroll_into_view_if_needed()
    screenshot(page, "chat-cut-message-wide", full_page=False)
    page.set_viewport_size({"width": 390, "height": 844})
    button.scroll_into_view_if_needed()
    screenshot(page, "chat-cut-message-narrow", full_page=False)
    button.click()
    expect(button).to_have_count(0)
    # The button goes once the whole text replaced the start.
    text = answer.locator(".message-text")
    assert text.evaluate("n => n.textContent.length") == 1024 * 1024
    assert not text.inner_text().endswith("not shown here]")
    assert parts == ["part=0", "part=1"]


def test_a_page_opened_mid_turn_shows_what_the_turn_streamed_so_far(contexts: Contexts) -> None:
    context = contexts.new()
    first = context.new_page()
    log_in(first, "owner", PASSWORD)
    session_id = start_session(first, f"/slow 0.6\n{SLOW_WORDS}")
    expect(region(first, "Response")).to_contain_text("You said: the quick brown")

    second = context.new_page()
    second.goto(f"/sessions/{session_id}/")
    # The beginning of the answer was streamed before this page existed.
    expect(region(second, "Response")).to_contain_text("You said: the quick brown fox")
    final = f"You said: {SLOW_WORDS}"
    expect(assistant_texts(second)).to_have_text([final])
    expect(region(second, "Response")).to_be_hidden()
    assert shown_text(second).count(final) == 1


def test_a_tool_turn_shows_its_activity(contexts: Contexts) -> None:
    page = contexts.logged_in("owner")
    start_session(page, '/slow 0.5\n/tool search__web_search {"query": "durable agents"}')
    activity = region(page, "Activity")
    expect(activity).to_contain_text("Turn started")
    expect(activity).to_contain_text("Tool requested search__web_search (read)")
    expect(activity).to_contain_text("Tool started search__web_search")
    expect(activity).to_contain_text("Tool finished search__web_search: succeeded")
    expect(activity).to_contain_text("Usage")
    expect(activity).to_contain_text("Turn completed")
    conversation = region(page, "Conversation")
    expect(conversation.locator(".message-tool")).to_contain_text("Tool · search__web_search")
    expect(assistant_texts(page).last).to_contain_text("durable agents")


def test_staff_approve_on_the_dashboard_and_the_owner_sees_the_result_live(
    contexts: Contexts, stack: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(
        owner, '/tool slack__post_message {"channel": "general", "text": "hello from a browser"}'
    )
    waiting = region(owner, "Waiting for approval")
    expect(waiting).to_contain_text("slack__post_message")
    expect(waiting).to_contain_text("waits until a staff member approves")
    expect(waiting.get_by_role("button", name="Approve")).to_have_count(0)
    expect(owner.locator("#chat-status")).to_have_text("Waiting for approval")

    reviewer = contexts.logged_in("reviewer")
    reviewer.goto("/approvals/")
    card = approval_card(reviewer, session_id)
    expect(card).to_contain_text("slack__post_message")
    expect(card.locator(".arguments")).to_contain_text('"channel": "general"')
    expect(card).to_contain_text("owner")
    card.get_by_role("button", name="Approve").click()
    expect(card).to_have_count(0)
    reviewer.get_by_role("tab", name="Decisions").click()
    decision = decision_row(reviewer, session_id)
    expect(decision).to_contain_text("Approved")
    expect(decision).to_contain_text("reviewer")
    expect(decision).to_contain_text("slack__post_message")

    # The owner's open page (never reloaded) shows the decision and the answer.
    expect(region(owner, "Activity")).to_contain_text("Approved")
    expect(waiting).to_be_hidden()
    expect(assistant_texts(owner).last).to_contain_text("hello from a browser")
    assert owner.evaluate("performance.getEntriesByType('navigation').length") == 1


def pending_count(page: Page) -> int:
    text = page.locator("#nav-pending-count .count").text_content() or ""
    return int(text) if text.strip() else 0


@VIEWPORTS
def test_the_nav_pending_count_is_live_on_pages_other_than_approvals(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    reviewer = contexts.logged_in("reviewer", viewport=viewport)
    reviewer.goto("/sessions/")
    expect(reviewer.locator("#nav-pending-count")).to_be_visible()
    before = pending_count(reviewer)
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={
            "agent": "demo",
            "message": '/tool slack__post_message {"channel": "general", "text": "count me"}',
        })
        assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    # The page is not reloaded: the count follows the approvals socket.
    expect(reviewer.locator("#nav-pending-count .count")).to_have_text(str(before + 1))
    expect(reviewer.locator("#nav-pending-count .visually-hidden")).to_have_text(
        f" ({before + 1} pending)"
    )
    screenshot(reviewer, "nav-pending-count")
    with stack.api("reviewer") as staff:
        pending = [item for item in staff.get("/api/v1/approvals/").json()
                   if item["session"] == session_id]
        assert len(pending) == 1
        decided = staff.post(
            f"/api/v1/sessions/{session_id}/interrupts/{pending[0]['interrupt_id']}/",
            json={"approved": False, "rejection_message": "not now"},
        )
        assert decided.status_code in (200, 202), decided.text
    expect(reviewer.locator("#nav-pending-count .count")).to_have_text(
        str(before) if before else ""
    )
    assert reviewer.evaluate("performance.getEntriesByType('navigation').length") == 1


def test_staff_reject_inline_on_the_chat_page_with_a_message(contexts: Contexts) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(
        owner, '/tool docs__create_document {"title": "Plan", "body": "Ship on Friday"}'
    )
    expect(region(owner, "Waiting for approval")).to_contain_text("docs__create_document")

    reviewer = contexts.logged_in("reviewer")
    reviewer.goto(f"/sessions/{session_id}/")
    waiting = region(reviewer, "Waiting for approval")
    expect(reviewer.get_by_role("textbox", name="Message", exact=True)).to_have_count(0)
    waiting.get_by_role("textbox", name="Rejection message").fill("not before the review")
    waiting.get_by_role("button", name="Reject").click()
    expect(waiting).to_be_hidden()

    expect(region(owner, "Activity")).to_contain_text("Rejected not before the review")
    expect(region(owner, "Activity")).to_contain_text("docs__create_document: rejected")
    expect(region(owner, "Waiting for approval")).to_be_hidden()
    expect(owner.locator("#chat-status")).to_have_text("Waiting for a message")


def test_stopping_a_session_waiting_for_approval_is_final(
    contexts: Contexts, stack: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(
        owner, '/tool slack__post_message {"channel": "random", "text": "never posted"}'
    )
    expect(region(owner, "Waiting for approval")).to_contain_text("slack__post_message")

    composer = owner.get_by_role("textbox", name="Message", exact=True)
    composer.fill("queued before the stop")
    # A double-click on Send sends once, with no refusal of the box the first click emptied.
    owner.get_by_role("button", name="Send").dblclick()
    expect(region(owner, "Message queue")).to_contain_text("queued before the stop")
    expect(region(owner, "Message queue").get_by_text("queued before the stop")).to_have_count(1)
    expect(owner.locator("#composer-error")).to_be_hidden()

    # Stop asks in the page's own dialog (as Delete does); Cancel keeps the session running.
    browser_dialogs: list[str] = []

    def refuse_browser_dialog(dialog: Dialog) -> None:
        browser_dialogs.append(dialog.message)
        dialog.dismiss()

    owner.on("dialog", refuse_browser_dialog)
    dialog = owner.get_by_role("dialog", name="Stop this session?")
    owner.get_by_role("button", name="Stop session").click()
    expect(dialog).to_be_visible()
    screenshot(owner, "chat-stop-dialog", screen_too=True)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    expect(region(owner, "Waiting for approval")).to_be_visible()
    owner.get_by_role("button", name="Stop session").click()
    dialog.get_by_role("button", name="Stop session").click()
    assert browser_dialogs == []
    expect(owner.locator("#chat-status")).to_have_text("Stopped")
    expect(region(owner, "Activity")).to_contain_text("Session stopped")
    expect(region(owner, "Message queue")).to_contain_text("No messages waiting.")
    expect(region(owner, "Waiting for approval")).to_be_hidden()
    expect(owner.get_by_role("textbox", name="Message", exact=True)).to_be_hidden()
    expect(owner.get_by_role("button", name="Stop session")).to_be_hidden()

    with stack.api("reviewer") as api:
        snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
        assert (snapshot["status"], snapshot["pending_interrupts"]) == ("stopped", [])
        pending = [item for item in api.get("/api/v1/approvals/").json()
                   if item["session"] == session_id]
        assert pending == []
    with stack.api("owner") as api:
        refused = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "again"})
        assert refused.status_code == 409, refused.text


def test_network_drop_mid_stream_loses_and_repeats_nothing(
    contexts: Contexts, stack: PageStack
) -> None:
    context = contexts.new()
    page = context.new_page()
    log_in(page, "owner", PASSWORD)
    session_id = start_session(page, f"/slow 0.5\n{SLOW_WORDS}")
    response = region(page, "Response")
    expect(response).to_contain_text("You said:")

    context.set_offline(True)
    expect(page.locator("#connection")).not_to_have_text("Live")
    messages = wait_for_turn_end(stack, "owner", session_id)  # the turn ends while offline
    final = messages[-1]["text"]
    assert final == f"You said: {SLOW_WORDS}"
    context.set_offline(False)

    expect(assistant_texts(page)).to_have_text([final])
    expect(response).to_be_hidden()
    expect(page.locator("#connection")).to_have_text("Live")
    body = shown_text(page)
    assert body.count(final) == 1, body


def test_portal_narrows_the_tools_of_a_session(contexts: Contexts) -> None:
    page = contexts.logged_in("owner")
    tools = page.get_by_role("group", name="Tools of Demo agent")
    expect(tools.get_by_role("checkbox")).to_have_count(5)
    post = tools.locator("li").filter(has_text="slack__post_message")
    expect(post.locator(".badge-approval")).to_have_text("approval")
    expect(tools.locator("li").filter(has_text="search__web_search").locator(".badge-approval")
           ).to_have_count(0)
    tools.get_by_role("checkbox", name=re.compile("Post a message")).uncheck()
    page.get_by_role("textbox", name="Message").fill(
        # /slow keeps the turn running until the chat page follows it (Activity shows the
        # running turn's events).
        'only four tools\n/slow 1\n/tool slack__post_message {"channel": "general", "text": "hi"}'
    )
    with page.expect_request(lambda request: request.url.endswith("/api/v1/sessions/")
                             and request.method == "POST") as started:
        page.get_by_role("button", name="Start session").click()
    body = started.value.post_data_json
    assert isinstance(body, dict)
    assert body["agent"] == "demo"
    assert sorted(body["tools"]) == [
        "docs__create_document", "docs__search_documents", "search__web_search",
        "slack__search_messages",
    ]
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    # The unchecked tool is refused without an approval; Activity says why.
    refusal = "Tool 'slack__post_message' is not enabled for this session."
    expect(region(page, "Activity")).to_contain_text(
        f"Tool finished slack__post_message: failed ({refusal})"
    )
    expect(assistant_texts(page)).to_have_text([re.compile(re.escape(refusal))])


def test_keyboard_only_login_start_and_send(contexts: Contexts) -> None:
    page = contexts.new().new_page()
    page.goto("/accounts/login/")
    # The username field has focus; the form is filled and sent with the keyboard alone.
    expect(page.get_by_label("Username")).to_be_focused()
    page.keyboard.type("owner")
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    expect(page.get_by_role("heading", name="Start a session")).to_be_visible()
    # The heading shows as soon as the HTML is parsed; the shortcut's handler comes with the
    # page's module, which "load" waits for (on a loaded machine the keys came first).
    page.wait_for_load_state("load")

    message = page.get_by_role("textbox", name="Message")
    message.focus()
    page.keyboard.type("first line")
    page.keyboard.press("Enter")  # a newline, not a start
    page.keyboard.type("second line")
    expect(message).to_have_value("first line\nsecond line")
    page.keyboard.press("Control+Enter")
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    expect(assistant_texts(page)).to_have_text(["You said: first line\nsecond line"])

    composer = page.get_by_role("textbox", name="Message")
    composer.focus()
    page.keyboard.type("alt sends")
    page.keyboard.press("Enter")
    page.keyboard.type("too")
    page.keyboard.press("Alt+Enter")
    expect(composer).to_have_value("")
    expect(assistant_texts(page).last).to_have_text("You said: alt sends\ntoo")

    page.keyboard.type("meta or control")
    page.keyboard.press("Control+Enter")
    expect(assistant_texts(page).last).to_have_text("You said: meta or control")
    page.keyboard.press("Tab")
    expect(page.get_by_role("button", name="Send")).to_be_focused()


def test_another_user_gets_no_page_and_no_socket(contexts: Contexts, stack: PageStack) -> None:
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo", "message": "private"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]

    intruder = contexts.logged_in("intruder")
    answer = intruder.goto(f"/sessions/{session_id}/")
    assert answer is not None and answer.status == 404
    refused = intruder.evaluate(
        """(url) => new Promise((resolve) => {
            const socket = new WebSocket(url);
            let frames = 0;
            socket.onmessage = () => { frames += 1; };
            socket.onclose = (event) => resolve({code: event.code, frames});
        })""",
        stack.ws_url(session_id),
    )
    assert refused == {"code": 4404, "frames": 0}
    approvals = intruder.goto("/approvals/")
    assert approvals is not None and approvals.status == 403

    anonymous = contexts.new().new_page()
    anonymous.goto(f"/sessions/{session_id}/")
    expect(anonymous.get_by_role("button", name="Log in")).to_be_visible()
    assert "/accounts/login/?next=" in anonymous.url


def test_screenshots_of_every_page_at_both_widths(contexts: Contexts, stack: PageStack) -> None:
    owner = contexts.logged_in("owner")
    done_id = start_session(
        owner, 'find screenshots\n/tool search__web_search {"query": "screenshots"}'
    )
    expect(assistant_texts(owner).last).to_contain_text("screenshots")
    waiting_id = start_session(
        owner, '/tool docs__create_document {"title": "Screenshot", "body": "Pending approval"}'
    )
    expect(region(owner, "Waiting for approval")).to_be_visible()

    for viewport in (WIDE, NARROW):
        anonymous = contexts.new(viewport).new_page()
        anonymous.goto("/accounts/login/")
        screenshot(anonymous, "login")

        page = contexts.logged_in("owner", viewport=viewport)
        screenshot(page, "portal")
        page.goto("/sessions/")
        expect(page.get_by_role("link", name=re.compile("screenshots"))).to_be_visible()
        screenshot(page, "sessions")
        page.goto(f"/sessions/{done_id}/")
        expect(assistant_texts(page).last).to_contain_text("screenshots")
        screenshot(page, "chat", screen_too=True)
        page.goto(f"/sessions/{waiting_id}/")
        expect(region(page, "Waiting for approval")).to_be_visible()
        expect(page.locator("#chat-status")).to_have_text("Waiting for approval")
        screenshot(page, "chat-waiting-owner", screen_too=True)
        start_session(page, f"/think\n/slow 0.5\n{SLOW_WORDS}")
        expect(region(page, "Response")).to_contain_text("You said: the quick")
        expect(region(page, "Thinking")).to_contain_text("Thinking about:")
        screenshot(page, "chat-live", screen_too=True)

    for viewport in (WIDE, NARROW):
        staff = contexts.logged_in("reviewer", viewport=viewport)
        staff.goto("/approvals/")
        expect(staff.locator(".approval-card").first).to_be_visible()
        screenshot(staff, "approvals")
        staff.get_by_role("tab", name="Decisions").click()
        expect(staff.locator("#decisions-status")).not_to_be_empty()
        screenshot(staff, "decisions")
        staff.goto(f"/sessions/{waiting_id}/")
        expect(region(staff, "Waiting for approval").get_by_role("button", name="Approve")
               ).to_be_visible()
        screenshot(staff, "chat-waiting-staff", screen_too=True)


def test_the_queue_panel_deletes_edits_and_steers(contexts: Contexts, stack: PageStack) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(
        owner, '/tool slack__post_message {"channel": "general", "text": "held by a steer"}'
    )
    expect(region(owner, "Waiting for approval")).to_contain_text("slack__post_message")
    composer = owner.get_by_role("textbox", name="Message", exact=True)
    for text in ("first", "second", "third", "fourth"):
        composer.fill(text)
        owner.get_by_role("button", name="Send").click()
    queue = region(owner, "Message queue")
    queued = queue.locator('li[data-kind="queued"]')
    expect(queued.locator(".queue-text")).to_have_text(["first", "second", "third", "fourth"])
    expect(queue).to_contain_text("4 messages waiting")

    # Staff read the queue but get no buttons to change it.
    reviewer = contexts.logged_in("reviewer")
    reviewer.goto(f"/sessions/{session_id}/")
    expect(region(reviewer, "Message queue").locator(".queue-text")).to_have_text(
        ["first", "second", "third", "fourth"]
    )
    expect(region(reviewer, "Message queue").get_by_role("button")).to_have_count(0)

    # Delete: every queue button is disabled while the request is in flight.
    held: list[Any] = []

    def hold_deletes(route: Any) -> None:
        if route.request.method == "DELETE":
            held.append(route)
        else:
            route.continue_()

    owner.route(re.compile(r"/api/v1/sessions/[^/]+/queue/[^/]+/$"), hold_deletes)
    queued.filter(has_text="second").get_by_role("button", name="Delete queued message").click()
    buttons = queue.get_by_role("button")
    expect(buttons).to_have_count(12)
    for button in buttons.all():
        expect(button).to_be_disabled()
    assert len(held) == 1
    held[0].continue_()
    owner.unroute(re.compile(r"/api/v1/sessions/[^/]+/queue/[^/]+/$"))
    expect(queued.locator(".queue-text")).to_have_text(["first", "third", "fourth"])
    expect(queue.get_by_role("button", name="Steer queued message").first).to_be_enabled()
    # Focus moved to the Delete button of the message that took the deleted one's place.
    expect(queued.filter(has_text="third").get_by_role("button", name="Delete queued message")
           ).to_be_focused()

    # Edit: the message leaves the queue and its text is back in the composer.
    queued.filter(has_text="third").get_by_role("button", name="Edit queued message").click()
    expect(queued.locator(".queue-text")).to_have_text(["first", "fourth"])
    expect(composer).to_have_value("third")
    expect(composer).to_be_focused()
    composer.fill("third, edited")
    owner.get_by_role("button", name="Send").click()
    expect(queued.locator(".queue-text")).to_have_text(["first", "fourth", "third, edited"])
    with stack.api("owner") as api:
        listed = api.get(f"/api/v1/sessions/{session_id}/queue/").json()
    assert [item["text"] for item in listed["queued"]] == ["first", "fourth", "third, edited"]

    # Steer: the turn drops the call waiting for approval and answers the steered message.
    queued.filter(has_text="first").get_by_role("button", name="Steer queued message").click()
    activity = region(owner, "Activity")
    expect(activity).to_contain_text("Steered 1 steered message applied; 1 approval withdrawn")
    expect(activity).to_contain_text("slack__post_message: cancelled")
    expect(activity).to_contain_text("Approval withdrawn")
    expect(region(owner, "Waiting for approval")).to_be_hidden()
    expect(assistant_texts(owner)).to_have_text(
        ["You said: first", "You said: fourth", "You said: third, edited"]
    )
    expect(queue).to_contain_text("No messages waiting.")
    user_texts = region(owner, "Conversation").locator(".message-user .message-text")
    expect(user_texts.last).to_have_text("third, edited")
    # The reviewer's open page followed along.
    expect(region(reviewer, "Message queue")).to_contain_text("No messages waiting.")


def test_screenshots_of_the_queue_with_a_steered_and_a_queued_message(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    # A model call that streams for about 14 s: a steered message waits for it to end.
    session_id = start_session(page, f"/slow 2\n{SLOW_WORDS}")
    expect(region(page, "Response")).to_contain_text("You said:")
    composer = page.get_by_role("textbox", name="Message", exact=True)
    composer.fill("Actually, answer in French.")
    page.get_by_role("button", name="Send").click()
    with stack.api("owner") as api:
        sent = api.post(
            f"/api/v1/sessions/{session_id}/messages/",
            json={"text": "Then plan the release checklist.", "plan_mode": True},
        )
        assert sent.status_code == 202, sent.text
    queue = region(page, "Message queue")
    queued = queue.locator('li[data-kind="queued"]')
    expect(queued).to_have_count(2)
    expect(queued.filter(has_text="release checklist").locator(".badge-plan")).to_have_text(
        "Plan mode"
    )
    # By keyboard (focus, then Enter): the answer streaming above moves the list, and a
    # pointer click aimed a moment earlier can land on the neighbouring row's button.
    queued.filter(has_text="French").get_by_role("button", name="Steer queued message").press(
        "Enter"
    )
    with stack.api("owner") as api:
        # What the server steered, apart from what the page shows of it.
        def steered_texts() -> list[str] | None:
            listed = api.get(f"/api/v1/sessions/{session_id}/queue/").json()["steered"]
            return [entry["text"] for entry in listed] or None

        assert wait_until("the server to list a steered message", steered_texts) == [
            "Actually, answer in French."
        ]
    steered = queue.locator('li[data-kind="steered"]')
    expect(steered).to_contain_text("Steering")
    expect(steered).to_contain_text("Actually, answer in French.")
    expect(steered.get_by_role("button")).to_have_count(0)
    expect(queue).to_contain_text("1 message steering the current turn, 1 waiting.")
    for viewport in (WIDE, NARROW):
        page.set_viewport_size(viewport)  # type: ignore[arg-type]
        expect(steered).to_be_visible()
        screenshot(page, "chat-queue", screen_too=True)
    # The steered message was answered in the running turn, then the queued one ran.
    expect(region(page, "Conversation")).to_contain_text("You said: Actually, answer in French.")
    expect(region(page, "Conversation").locator(".message-user").last).to_contain_text(
        "Then plan the release checklist."
    )
    expect(queue).to_contain_text("No messages waiting.")


def test_a_question_is_answered_with_a_choice_button_or_free_text(contexts: Contexts) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(owner, "/ask Which colour? | red | blue")
    question = region(owner, "Which colour?")
    expect(question).to_be_visible()
    expect(question.get_by_role("button")).to_have_text(
        ["red", "blue", "write a message instead"]
    )
    # The question takes the composer's place, and focus moves to it.
    expect(question.get_by_role("button", name="red")).to_be_focused()
    expect(owner.get_by_role("textbox", name="Message", exact=True)).to_be_hidden()
    expect(owner.locator("#chat-status")).to_have_text("Waiting for an answer")
    expect(region(owner, "Activity")).to_contain_text("Question Which colour? (red / blue)")
    # Staff read the question; only the owner answers it.
    reviewer = contexts.logged_in("reviewer")
    reviewer.goto(f"/sessions/{session_id}/")
    staff_view = region(reviewer, "Which colour?")
    expect(staff_view).to_contain_text("Waiting for owner's answer.")
    expect(staff_view.get_by_role("button")).to_have_count(0)

    question.get_by_role("button", name="blue").click()
    expect(assistant_texts(owner)).to_have_text(["You said: blue"])
    expect(question).to_be_hidden()
    user_texts = region(owner, "Conversation").locator(".message-user .message-text")
    expect(user_texts).to_have_text(["/ask Which colour? | red | blue", "blue"])
    expect(region(owner, "Activity")).to_contain_text("Answered")
    # The choice buttons went with the question: focus is in the message box again.
    expect(owner.get_by_role("textbox", name="Message", exact=True)).to_be_focused()
    expect(owner.locator("#chat-status")).to_have_text("Waiting for a message")
    expect(staff_view).to_be_hidden()

    # A question without choices takes free text; Ctrl+Enter submits it.
    composer = owner.get_by_role("textbox", name="Message", exact=True)
    composer.fill("/ask What should I call you?")
    owner.get_by_role("button", name="Send").click()
    answer = region(owner, "What should I call you?").get_by_role("textbox", name="Your answer")
    expect(answer).to_be_focused()
    answer.fill("Ada")
    answer.press("Control+Enter")
    expect(assistant_texts(owner).last).to_have_text("You said: Ada")
    expect(region(owner, "What should I call you?")).to_be_hidden()


def test_a_plan_is_drafted_in_plan_mode_and_executed_from_the_plan_card(
    contexts: Contexts, stack: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(owner, "hello")
    expect(assistant_texts(owner)).to_have_text(["You said: hello"])
    plan_mode = owner.get_by_role("checkbox", name="Plan mode")
    plan_mode.check()
    # The demo model stops at a task with /stop; the plan can then be continued.
    owner.get_by_role("textbox", name="Message", exact=True).fill("step one\ncheck /stop")
    owner.get_by_role("button", name="Create plan").click()
    expect(plan_mode).not_to_be_checked()  # Plan mode is per message
    expect(owner.get_by_role("button", name="Send")).to_be_visible()

    plan = region(owner, "Plan")
    expect(plan).to_contain_text("Revision 1 · Draft · 0/2 completed")
    expect(plan.locator(".plan-task")).to_have_text(["○Pending: step one", "○Pending: check /stop"])
    execute = plan.get_by_role("button", name="Execute plan")
    expect(execute).to_be_visible()
    execute.click()
    expect(assistant_texts(owner).last).to_have_text("Stopped at: check /stop")
    expect(plan).to_contain_text("Active · 1/2 completed")
    expect(plan.locator(".plan-task")).to_have_text(
        ["✓Completed: step one", "●In progress: check /stop"]
    )
    plan.get_by_role("button", name="Continue plan").click()
    expect(plan).to_contain_text("Completed · 2/2 completed")
    expect(plan.locator(".plan-task")).to_have_text(
        ["✓Completed: step one", "✓Completed: check /stop"]
    )
    expect(plan.get_by_role("button")).to_have_count(0)
    expect(assistant_texts(owner).last).to_have_text("Plan complete: all 2 task(s) are done.")
    activity = region(owner, "Activity")
    expect(activity).to_contain_text("Plan started executing revision 1")
    expect(activity).to_contain_text("Plan updated revision 1: draft, 2 tasks")
    expect(activity).to_contain_text("Plan started executing revision 3")
    with stack.api("owner") as api:
        snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
    assert snapshot["plan"]["status"] == "completed"


def test_a_durable_wait_shows_a_timer_until_a_steered_message_ends_it(
    contexts: Contexts,
) -> None:
    owner = contexts.logged_in("owner")
    start_session(owner, "/wait 3600 cooling off")
    timer = owner.get_by_role("region", name=re.compile(r"^Waiting until \S"))
    expect(timer).to_contain_text("cooling off")
    expect(timer.locator("#timer-left")).to_have_text(re.compile(r"^in (59 min|1 h 00 min)"))
    expect(owner.locator("#chat-status")).to_have_text("Waiting on a timer")
    expect(region(owner, "Activity")).to_contain_text("Waiting until")

    # Edit keeps a queued message's Plan mode.
    composer = owner.get_by_role("textbox", name="Message", exact=True)
    plan_mode = owner.get_by_role("checkbox", name="Plan mode")
    plan_mode.check()
    composer.fill("plan the cooling")
    owner.get_by_role("button", name="Create plan").click()
    queue = region(owner, "Message queue")
    queued = queue.locator('li[data-kind="queued"]')
    expect(queued.locator(".badge-plan")).to_have_text(["Plan mode"])
    queued.get_by_role("button", name="Edit queued message").click()
    expect(composer).to_have_value("plan the cooling")
    expect(plan_mode).to_be_checked()
    plan_mode.uncheck()
    composer.fill("are you still there?")
    owner.get_by_role("button", name="Send").click()
    expect(queued.locator(".queue-text")).to_have_text(["are you still there?"])
    expect(timer).to_be_visible()  # a queued message does not end the wait

    queued.get_by_role("button", name="Steer queued message").click()
    expect(assistant_texts(owner).last).to_have_text("You said: are you still there?")
    expect(timer).to_be_hidden()
    expect(owner.locator("#chat-status")).to_have_text("Waiting for a message")
    # The wait's result, the platform's own JSON, reads as a sentence.
    expect(region(owner, "Conversation").locator(".message-tool .message-text")).to_have_text(
        ["Interrupted: a steered message ended the wait."])


def test_screenshots_of_a_plan_a_question_and_a_timer(contexts: Contexts, stack: PageStack) -> None:
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo"})
        planned = created.json()["id"]
        wait_until(
            "the session to wait for a message",
            lambda: api.get(f"/api/v1/sessions/{planned}/").json()["status"]
            == "waiting_for_user_message",
        )
        sent = api.post(
            f"/api/v1/sessions/{planned}/messages/",
            json={
                "text": "Collect the release notes from the changelog\n"
                "Draft the announcement for the blog and the mailing list\n"
                "Ask the team to review it before Friday",
                "plan_mode": True,
            },
        )
        assert sent.status_code == 202, sent.text
        wait_for_turn_end(stack, "owner", planned)
    owner = contexts.logged_in("owner")
    asking = start_session(
        owner, "/ask Which environment should I deploy to? | staging | production | both"
    )
    expect(region(owner, "Which environment should I deploy to?")).to_be_visible()
    naming = start_session(owner, "/ask What should the release be called?")
    expect(region(owner, "What should the release be called?")).to_be_visible()
    waiting = start_session(owner, "/wait 5400 Waiting for the nightly build to finish")
    expect(owner.get_by_role("region", name=re.compile(r"^Waiting until"))).to_be_visible()

    for viewport in (WIDE, NARROW):
        page = contexts.logged_in("owner", viewport=viewport)
        page.goto(f"/sessions/{planned}/")
        expect(region(page, "Plan").get_by_role("button", name="Execute plan")).to_be_visible()
        page.get_by_role("checkbox", name="Plan mode").check()
        expect(page.get_by_role("button", name="Create plan")).to_be_visible()
        screenshot(page, "chat-plan", screen_too=True)
        page.goto(f"/sessions/{asking}/")
        question = region(page, "Which environment should I deploy to?")
        expect(question.get_by_role("button", name="staging")).to_be_focused()
        screenshot(page, "chat-question", screen_too=True)
        page.goto(f"/sessions/{naming}/")
        expect(page.get_by_role("textbox", name="Your answer")).to_be_focused()
        screenshot(page, "chat-question-text", screen_too=True)
        page.goto(f"/sessions/{waiting}/")
        expect(page.locator("#timer-left")).to_have_text(re.compile(r"^in 1 h"))
        screenshot(page, "chat-timer", screen_too=True)


def test_a_compacted_session_shows_its_summary_above_the_conversation(
    contexts: Contexts, stack: PageStack
) -> None:
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo-small", "message": "hello"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
        wait_for_turn_end(stack, "owner", session_id)

        def summarized() -> dict[str, Any] | None:
            snapshot = api.get(f"/api/v1/sessions/{session_id}/").json()
            idle = snapshot["status"] == "waiting_for_user_message"
            if snapshot["summary"] is not None or not idle or snapshot["queued_messages"]:
                return snapshot["summary"]
            sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={"text": "/big 4"})
            assert sent.status_code == 202, sent.text
            return None

        summary = wait_until("a compaction", summarized, timeout=120)

    page = contexts.logged_in("owner")
    page.goto(f"/sessions/{session_id}/")
    assert summary["through_sequence"] >= 2
    # Messages the poll queued meanwhile may compact further: any later summary will do.
    disclosure = region(page, "Conversation").get_by_text(
        re.compile(r"^Summary of earlier messages \(through message \d+\)$")
    )
    expect(disclosure).to_be_visible()
    disclosure.click()
    expect(page.locator("#context-summary-text")).to_contain_text("user #1: hello")
    screenshot(page, "chat-summary")


def test_a_reload_keeps_the_text_being_written(contexts: Contexts, stack: PageStack) -> None:
    page = contexts.logged_in("owner")
    session_id = start_session(page, "hello")
    composer = page.get_by_role("textbox", name="Message")
    composer.fill("half a thought")
    page.reload()
    expect(page.get_by_role("textbox", name="Message")).to_have_value("half a thought")
    page.get_by_role("button", name="Send").click()
    wait_until("the message to be answered", lambda: any(
        message["text"] == "You said: half a thought"
        for message in stored_messages(stack, "owner", session_id)
    ), timeout=60)
    page.reload()
    expect(page.get_by_role("textbox", name="Message")).to_have_value("")


@VIEWPORTS
def test_the_composer_counts_near_the_limit_and_refuses_past_it(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, "hello")
    expect(assistant_texts(page)).to_have_text(["You said: hello"])
    composer = page.get_by_role("textbox", name="Message", exact=True)
    counter = page.locator("#composer-text-count")
    composer.fill("x" * 80_000)
    expect(counter).to_be_hidden()
    # An emoji is one character to the API and two UTF-16 units to a maxlength attribute.
    composer.fill("😀" * 99_990)
    expect(counter).to_have_text("99,990 / 100,000 characters")
    expect(composer).not_to_have_attribute("aria-invalid", "true")
    send = page.get_by_role("button", name="Send")
    expect(send).to_be_enabled()
    composer.fill("😀" * 100_005)
    # Refused as soon as it is past the limit, before any Send: said, and Send disabled.
    expect(counter).to_have_text(
        "100,005 / 100,000 characters: 5 over the limit; shorten it to send"
    )
    expect(composer).to_have_attribute("aria-invalid", "true")
    expect(send).to_be_disabled()
    posts: list[str] = []
    page.on("request", lambda request: posts.append(request.url)
            if request.method == "POST" else None)
    composer.press("Control+Enter")
    # The keyboard shortcut reaches the send handler, which refuses instead of posting.
    expect(page.locator("#composer-error")).to_have_text(
        "The message is 5 characters over the limit of 100,000; shorten it to send. "
        "Nothing was sent."
    )
    screenshot(page, f"composer-over-limit-{viewport['width']}", screen_too=True)
    assert posts == []
    assert composer.input_value() == "😀" * 100_005  # nothing of the text was cut

    composer.fill("😀" * 100_000)
    expect(composer).not_to_have_attribute("aria-invalid", "true")
    expect(send).to_be_enabled()
    if viewport is NARROW:
        return  # what is sent is the same at both widths
    page.get_by_role("button", name="Send").click()
    stored = wait_until("the 100,000-character message to be stored", lambda: next(
        (message for message in stored_messages(stack, "owner", session_id)
         if message["role"] == "user" and message["text"].startswith("😀")), None
    ), timeout=60)
    # The snapshot shows a text this long cut, with the whole text's length.
    assert stored.get("text_length", len(stored["text"])) == 100_000
    assert set(stored["text"].split("\n", 1)[0]) == {"😀"}
    expect(counter).to_be_hidden()


@VIEWPORTS
def test_the_portal_message_box_is_on_the_first_screen(
    contexts: Contexts, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    page.goto("/")
    # Right after the agent, before the (long) list of tools, at both widths.
    box = page.get_by_role("textbox", name="Message").bounding_box()
    assert box is not None and box["y"] + box["height"] <= viewport["height"], box
    tools = page.get_by_role("heading", name="Tools for this session").bounding_box()
    assert tools is not None
    if viewport is NARROW:
        assert tools["y"] > box["y"]
    screenshot(page, "portal-first-screen", screen_too=True)


def test_the_portal_starts_a_session_in_plan_mode(contexts: Contexts, stack: PageStack) -> None:
    page = contexts.logged_in("owner")
    page.get_by_role("textbox", name="Message").fill("draft it\nship it")
    start = page.get_by_role("button", name="Start session", exact=True)
    expect(start).to_be_visible()
    page.get_by_role("checkbox", name="Plan mode").check()
    # The button says what it starts.
    expect(start).to_be_hidden()
    page.get_by_role("checkbox", name="Plan mode").uncheck()
    expect(start).to_be_visible()
    page.get_by_role("checkbox", name="Plan mode").check()
    with page.expect_request(lambda request: request.url.endswith("/api/v1/sessions/")
                             and request.method == "POST") as started:
        page.get_by_role("button", name="Start session in plan mode", exact=True).click()
    body = started.value.post_data_json
    assert isinstance(body, dict) and body["plan_mode"] is True
    page.wait_for_url(re.compile(r"/sessions/ses_[0-9a-f]+/$"))
    plan = region(page, "Plan")
    expect(plan).to_contain_text("Revision 1 · Draft · 0/2 completed")
    expect(plan.get_by_role("button", name="Execute plan")).to_be_visible()


@VIEWPORTS
def test_messages_show_their_time_and_the_day_they_start(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, "what time is it")
    expect(assistant_texts(page)).to_have_text(["You said: what time is it"])
    stored = stored_messages(stack, "owner", session_id)
    conversation = region(page, "Conversation")
    times = conversation.locator(".message .message-time")
    expect(times).to_have_count(2)
    assert [times.nth(index).get_attribute("datetime") for index in range(2)] == [
        message["created_at"] for message in stored
    ]
    # The full date is the time's title (shown on hover) and its accessible name.
    title = times.first.get_attribute("title") or ""
    assert str(datetime.date.today().year) in title and title == times.first.get_attribute(
        "aria-label"
    )
    separators = conversation.locator(".day-separator")
    expect(separators).to_have_text(["Today"])
    expect(conversation.locator("li").first).to_have_class("day-separator")
    if viewport is NARROW:
        expect(times.first).to_have_css("opacity", "1")  # no hover on a phone
    else:
        conversation.locator(".message").first.hover()
        expect(times.first).to_have_css("opacity", "1")
    screenshot(page, f"message-times-{viewport['width']}", screen_too=True)


def test_stop_generating_keeps_the_text_so_far_and_the_session(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("owner")
    session_id = start_session(page, f"/slow 0.4\n{SLOW_WORDS} {SLOW_WORDS}")
    stop = page.get_by_role("button", name="Stop generating")
    expect(region(page, "Response")).to_contain_text("You said:")
    expect(stop).to_be_visible()
    screenshot(page, "chat-stop-generating")

    stop.click()
    expect(stop).to_be_hidden()
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    stored = stored_messages(stack, "owner", session_id)[-1]
    assert stored["interrupted"] is True
    assert f"You said: {SLOW_WORDS} {SLOW_WORDS}".startswith(stored["text"])
    assert len(stored["text"]) < len(f"You said: {SLOW_WORDS} {SLOW_WORDS}")
    # What had streamed stays in the conversation, marked; the session goes on.
    expect(assistant_texts(page)).to_have_text([stored["text"]])
    expect(region(page, "Conversation").locator(".message-interrupted-note")).to_be_visible()
    expect(region(page, "Conversation").locator(".message-assistant .badge-stopped")).to_have_text(
        "Stopped"
    )
    expect(region(page, "Response")).to_be_hidden()
    expect(page.get_by_role("button", name="Stop session")).to_be_visible()
    screenshot(page, "chat-stopped-answer")

    page.get_by_role("textbox", name="Message").fill("and now in full")
    page.get_by_role("button", name="Send").click()
    expect(assistant_texts(page)).to_have_text([stored["text"], "You said: and now in full"])
    expect(stop).to_be_hidden()

    phone = contexts.logged_in("owner", viewport=NARROW)
    start_session(phone, f"/slow 0.4\n{SLOW_WORDS} {SLOW_WORDS}")
    expect(region(phone, "Response")).to_contain_text("You said:")
    expect(phone.get_by_role("button", name="Stop generating")).to_be_visible()
    screenshot(phone, "chat-stop-generating")
    phone.get_by_role("button", name="Stop generating").click()
    expect(phone.locator(".message-interrupted-note")).to_be_visible()
    screenshot(phone, "chat-stopped-answer")


@VIEWPORTS
def test_stop_generating_while_a_call_waits_shows_a_stopped_notice_not_a_user_message(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(
        page, '/tool slack__post_message {"channel": "general", "text": "never sent"}'
    )
    expect(region(page, "Waiting for approval")).to_contain_text("slack__post_message")
    page.get_by_role("button", name="Stop generating").click()
    expect(page.locator("#chat-status")).to_have_text("Waiting for a message")
    stored = stored_messages(stack, "owner", session_id)
    assert [(item["role"], item.get("notice")) for item in stored] == [
        ("user", None), ("system", "turn_cancelled")
    ]
    conversation = region(page, "Conversation")
    for _ in ("live", "after a reload"):
        # One message of the user's; the cancel is the session's notice, marked Stopped.
        expect(conversation.locator(".message-user")).to_have_count(1)
        notice = conversation.locator(".message-notice")
        expect(notice).to_have_count(1)
        expect(notice.locator(".badge-stopped")).to_have_text("Stopped")
        # For people: the call never ran, and none of the model's JSON shows.
        expect(notice.locator(".message-text")).to_have_text(
            "This turn was cancelled. Its tool calls:")
        expect(notice.locator(".notice-calls li")).to_have_text(
            ["slack__post_message: cancelled; it did not run"])
        expect(notice).not_to_contain_text("{")
        expect(notice).not_to_contain_text("[Dex]")
        expect(conversation).not_to_contain_text("You#2")
        assert "You" not in (notice.locator(".message-meta").text_content() or "")
        page.reload()
    screenshot(page, "chat-stopped-notice")


RECORD_ANNOUNCEMENTS = """() => {
  const region = document.getElementById("announcer");
  window.__said = [];
  new MutationObserver(() => {
    if (region.textContent) window.__said.push(region.textContent);
  }).observe(region, { childList: true, characterData: true, subtree: true });
}"""


def announced_answer(page: Page, pace: float) -> list[str]:
    """Send ``SLOW_WORDS`` from the chat page's composer, streamed a chunk every ``pace``
    seconds (``/slow``), and return the texts its live region (``#announcer``, recorded since
    ``RECORD_ANNOUNCEMENTS`` ran on the page) has said, oldest first, once it announced the
    answer. Checked here: "The assistant is writing an answer…" was said, the answer was
    announced once and not chunk by chunk (six texts at most), and the last text is the
    status "Waiting for a message".

    Raises:
        AssertionError: the answer is not shown or not announced within 30 s, or the
            announcements are not as above.
    """
    page.get_by_role("textbox", name="Message", exact=True).fill(f"/slow {pace}\n{SLOW_WORDS}")
    page.get_by_role("button", name="Send").click()
    expect(assistant_texts(page).last).to_have_text(f"You said: {SLOW_WORDS}")

    def announced() -> list[str] | None:
        texts: list[str] = page.evaluate("window.__said")
        heard = any(f"Assistant: You said: {SLOW_WORDS}" in text for text in texts)
        return texts if heard else None

    said = wait_until("the answer to be announced", announced, timeout=30)
    assert "The assistant is writing an answer…" in said
    assert "Status: Waiting for a message" in said[-1], said
    assert len(said) <= 6, said
    return said


def test_screen_readers_hear_answers_and_status_changes_not_each_token(
    contexts: Contexts,
) -> None:
    page = contexts.logged_in("owner")
    start_session(page, "hello")
    expect(assistant_texts(page)).to_have_text(["You said: hello"])
    announcer = page.locator("#announcer")
    expect(announcer).to_have_attribute("aria-live", "polite")
    page.evaluate(RECORD_ANNOUNCEMENTS)
    assert page.evaluate("window.__said") == []  # what the page opened with is not news
    said = announced_answer(page, 0.2)
    assert any(text.startswith("Status: ") and "Waiting" not in text for text in said), said


@VIEWPORTS
def test_sessions_are_renamed_archived_searched_and_deleted_after_confirmation(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    """Issue 27 "Sessions": rename on the chat page and in the list, archive (hidden from the
    list, shown with the filter), search over a message's words (the worker's full-text
    index) with the matching snippet, and delete through a confirmation dialog."""
    word = f"quokkaland{viewport['width']}"
    page = contexts.logged_in("owner", viewport=viewport)
    session_id = start_session(page, f"Plan a trip\nWhere should we stay near {word} beach?")
    wait_for_turn_end(stack, "owner", session_id)
    title = f"Trip {viewport['width']}"

    # Rename in the chat header.
    page.get_by_role("button", name="Rename").click()
    box = page.get_by_role("textbox", name="Session title")
    expect(box).to_have_value("Plan a trip")
    box.fill("")
    box.press("Enter")
    expect(page.get_by_role("alert").filter(has_text="cannot be blank")).to_be_visible()
    screenshot(page, "chat-rename", full_page=False)
    box.fill(title)
    box.press("Enter")
    expect(page.get_by_role("heading", name=title, level=1)).to_be_visible()
    expect(page.get_by_role("button", name="Rename")).to_be_focused()

    # Archive: still usable here, gone from the list until the filter asks for it.
    page.get_by_role("button", name="Archive").click()
    expect(page.locator("#chat-archived")).to_be_visible()
    expect(page.get_by_role("button", name="Unarchive")).to_be_visible()
    screenshot(page, "chat-archived", screen_too=True)
    page.goto("/sessions/")
    expect(page.get_by_role("status").first).to_be_visible()
    expect(page.get_by_role("link", name=title)).to_have_count(0)
    page.get_by_label("Archived sessions").check()
    page.get_by_role("button", name="Apply").click()
    expect(page.get_by_role("link", name=title)).to_be_visible()

    # Rename in the list.
    renamed = f"Beach plans {viewport['width']}"
    page.get_by_role("button", name=f"Rename {title}").click()
    page.get_by_role("textbox", name="Session title").fill(renamed)
    page.get_by_role("button", name="Save").click()
    expect(page.get_by_role("link", name=renamed)).to_be_visible()
    with stack.api("owner") as api:
        assert api.get(f"/api/v1/sessions/{session_id}/").json()["title"] == renamed

    # Search: a word of the message, not of the title; the row shows where it matched.
    page.get_by_role("searchbox", name="Search").fill(word[:-3])
    page.get_by_role("button", name="Apply").click()
    row = page.get_by_role("row").filter(has=page.get_by_role("link", name=renamed))
    expect(row.locator(".search-match mark").first).to_have_text(word)
    expect(page.get_by_role("link")).not_to_contain_text(["Plan a trip"])
    screenshot(page, "sessions-search")
    if viewport is WIDE:
        # Sessions older than the index are filled from Dex by a command, idempotently.
        refilled = stack.shell(
            "import io, json\n"
            "from django.core.management import call_command\n"
            "from agents_app.models import SessionMessageText\n"
            f"SessionMessageText.objects.filter(session_id={session_id!r}).delete()\n"
            "out = io.StringIO()\n"
            f"call_command('sessionsearch_index', {session_id!r}, stdout=out)\n"
            f"call_command('sessionsearch_index', {session_id!r}, stdout=out)\n"
            "print(json.dumps([out.getvalue(), sorted(SessionMessageText.objects.filter("
            f"session_id={session_id!r}).values_list('sequence', 'role'))]))\n"
        )
        assert refilled == ["Indexed 2 messages.\nIndexed 2 messages.\n",
                            [[1, "user"], [2, "assistant"]]]
        page.reload()
        expect(row.locator(".search-match mark").first).to_have_text(word)

    # Delete: a real dialog that says it cannot be undone; Cancel keeps the session.
    page.get_by_role("link", name=renamed).click()
    expect(page.get_by_role("heading", name=renamed, level=1)).to_be_visible()
    page.get_by_role("button", name="Delete session").click()
    dialog = page.get_by_role("dialog", name="Delete this session?")
    expect(dialog).to_be_visible()
    expect(dialog).to_contain_text("This cannot be undone.")
    screenshot(page, "chat-delete-dialog", full_page=False)
    dialog.get_by_role("button", name="Cancel").click()
    expect(dialog).to_be_hidden()
    with stack.api("owner") as api:
        assert api.get(f"/api/v1/sessions/{session_id}/").status_code == 200
    page.get_by_role("button", name="Delete session").click()
    dialog.get_by_role("button", name="Delete session").click()
    page.wait_for_url(re.compile(r"/sessions/$"))
    expect(page.get_by_role("heading", name="Sessions", level=1)).to_be_visible()
    with stack.api("owner") as api:
        assert api.get(f"/api/v1/sessions/{session_id}/").status_code == 404
        assert api.get("/api/v1/sessions/", params={"search": word}).json()["results"] == []
    gone = page.goto(f"/sessions/{session_id}/")
    assert gone is not None and gone.status == 404


def activity_rows(page: Page) -> list[str]:
    """The Activity rows' text without their times, oldest first."""
    rows: list[str] = region(page, "Activity").locator(".activity-row > span").all_inner_texts()
    return rows


PARALLEL_AND_WAIT = "\n".join([
    '/tool search__web_search {"query": "durable agents"}',
    '/tool search__web_search {"query": "steering"}',
    "/wait 3600 cooling off",
])


@VIEWPORTS
def test_a_reloaded_page_rebuilds_the_running_turns_activity(
    contexts: Contexts, viewport: dict[str, int]
) -> None:
    context = contexts.new(viewport)
    live = context.new_page()
    log_in(live, "owner", PASSWORD)
    session_id = start_session(live, PARALLEL_AND_WAIT)
    expect(live.locator("#chat-status")).to_have_text("Waiting on a timer")
    composer = live.get_by_role("textbox", name="Message", exact=True)
    composer.fill("/ask Which colour? | red | blue")
    live.get_by_role("button", name="Send").click()
    queued = region(live, "Message queue").locator('li[data-kind="queued"]')
    queued.get_by_role("button", name="Steer queued message").click()
    expect(region(live, "Which colour?")).to_be_visible()
    expect(region(live, "Activity")).to_contain_text("Question Which colour?")
    # Both searches ran and the wait ended before the question was asked.
    expect(region(live, "Activity").locator('[data-type="tool_call_finished"]')).to_have_count(3)

    reloaded = context.new_page()
    reloaded.goto(f"/sessions/{session_id}/")
    expect(region(reloaded, "Which colour?")).to_be_visible()
    expected = activity_rows(live)
    expect(region(reloaded, "Activity").locator(".activity-row > span")).to_have_text(expected)
    assert "Tool finished durable_wait: interrupted" in expected
    assert expected.count("Tool finished search__web_search: succeeded") == 2
    assert expected[0] == "Turn started turn-1"
    # The steered message is announced before the turn takes it.
    steered = expected.index("Steered 1 steered message applied")
    assert expected[steered - 1] == "Queue changed a queued message was steered into the turn"
    screenshot(reloaded, "activity-after-reload", screen_too=True)

    # The reloaded page goes on live: the answer's rows arrive in both pages alike.
    region(reloaded, "Which colour?").get_by_role("button", name="red").click()
    for page in (live, reloaded):
        expect(region(page, "Activity")).to_contain_text("Turn completed turn-1")
    assert "Tool finished request_user_input: answered" in activity_rows(reloaded)
    assert activity_rows(reloaded) == activity_rows(live)

    # A message sent while no turn runs: its row comes before the start of the turn it began.
    composer.fill("one more")
    live.get_by_role("button", name="Send").click()
    expect(region(live, "Activity")).to_contain_text("Turn completed turn-2")
    rows = activity_rows(live)
    assert rows.index("Message queued") < rows.index("Turn started turn-2"), rows


@VIEWPORTS
def test_the_timeline_tab_lists_every_step_with_attempts_and_errors(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    owner = contexts.logged_in("owner", viewport=viewport)
    # The first model request is refused once with a 503: its Step's second attempt answers.
    # (The demo model counts failures per distinct request: each width sends its own.)
    query = json.dumps({"query": f"durable agents at {viewport['width']} px"})
    session_id = start_session(owner, f"/fail 1 503\n/tool search__web_search {query}")
    expect(assistant_texts(owner).last).to_contain_text("durable agents")
    tabs = owner.get_by_role("tablist", name="Session views")
    chat_tab = tabs.get_by_role("tab", name="Chat")
    timeline_tab = tabs.get_by_role("tab", name="Timeline")
    expect(chat_tab).to_have_attribute("aria-selected", "true")
    # Keyboard: the arrow keys move between the tabs and select them.
    chat_tab.focus()
    owner.keyboard.press("ArrowRight")
    expect(timeline_tab).to_be_focused()
    expect(timeline_tab).to_have_attribute("aria-selected", "true")
    expect(region(owner, "Conversation")).to_be_hidden()
    timeline = owner.get_by_role("tabpanel", name="Timeline")
    model_call = timeline.locator('[data-step="RunModel-1"]')
    expect(model_call.locator(".timeline-step-kind")).to_have_text("Model call #1")
    expect(model_call).to_contain_text("Run 2 attempts")
    expect(model_call.locator(".timeline-error")).to_have_text(
        re.compile(r"^Attempt 1 failed: The model provider failed \(HTTP 503\)")
    )
    expect(model_call.locator(".timeline-status")).to_have_text("completed")
    tool = timeline.locator('[data-step="CallTool-1"]')
    expect(tool).to_contain_text("For tool call search__web_search (call_1)")
    expect(tool.locator(".timeline-status")).to_have_text("completed")
    expect(tool.locator(".timeline-method")).to_have_text([re.compile(r"^Run 1 attempt, from ")])

    # Live: a turn that waits for an approval shows its Steps as they end, with no reload.
    with stack.api("owner") as api:
        sent = api.post(f"/api/v1/sessions/{session_id}/messages/", json={
            "text": '/tool slack__post_message {"channel": "general", "text": "hi"}'})
        assert sent.status_code == 202, sent.text
    expect(timeline.locator('[data-step="RunModel-3"] .timeline-status')).to_have_text("completed")

    def pending() -> str | None:
        with stack.api("owner") as api:
            interrupts = api.get(f"/api/v1/sessions/{session_id}/").json()["pending_interrupts"]
        return interrupts[0]["interrupt_id"] if interrupts else None

    interrupt_id = wait_until("the approval to wait", pending, timeout=30)
    with stack.api("reviewer") as staff:
        decided = staff.post(f"/api/v1/sessions/{session_id}/interrupts/{interrupt_id}/",
                             json={"approved": True})
        assert decided.status_code == 200, decided.text
    approval = timeline.locator('[data-step="AwaitToolApproval-1"]')
    expect(approval).to_contain_text("For approval of slack__post_message (call_2)")
    expect(approval.locator(".timeline-status")).to_have_text("approved")
    # The wait lasted until the decision ran the Step on, not the wait_for method's own time.
    expect(approval.locator('[data-method="wait_for"]')).to_have_text(
        re.compile(r"^Wait 1 attempt, from \S+, waited \d"))
    expect(timeline.locator('[data-step="CallSingleAttemptTool-1"]')).to_contain_text(
        "For tool call slack__post_message (call_2)"
    )
    expect(timeline.locator('[data-step="RunModel-4"] .timeline-status')).to_have_text("completed")
    # The wait for the next message is still open.
    open_wait = timeline.locator('.timeline-step[data-status="waiting"]')
    expect(open_wait).to_have_count(1)
    expect(open_wait.locator(".timeline-step-kind")).to_have_text("Wait for a message")
    expect(open_wait.locator('[data-method="wait_for"]')).to_contain_text("waiting")

    # A model call the provider refuses fails, with the provider's error.
    with stack.api("owner") as api:
        sent = api.post(f"/api/v1/sessions/{session_id}/messages/",
                        json={"text": f"/fail 1 400\nRefuse me at {viewport['width']}"})
        assert sent.status_code == 202, sent.text
    refused = timeline.locator('[data-step="RunModel-5"]')
    expect(refused.locator(".timeline-status")).to_have_text("failed")
    expect(refused.locator(".timeline-error")).to_have_text(
        re.compile(r"^Failed: The model provider refused the request \(HTTP 400\)"))
    screenshot(owner, "timeline", screen_too=True)
    serious = serious_axe_violations(owner)
    assert serious == [], serious
    owner.keyboard.press("ArrowLeft")
    expect(chat_tab).to_have_attribute("aria-selected", "true")
    expect(region(owner, "Conversation")).to_be_visible()
    expect(timeline).to_be_hidden()

    # Staff read the timeline; another user gets no page at all, nor the history.
    reviewer = contexts.logged_in("reviewer", viewport=viewport)
    reviewer.goto(f"/sessions/{session_id}/")
    reviewer.get_by_role("tab", name="Timeline").click()
    expect(reviewer.get_by_role("tabpanel", name="Timeline").locator(
        '[data-step="RunModel-1"]')).to_contain_text("Attempt 1 failed")
    intruder = contexts.logged_in("intruder", viewport=viewport)
    answer = intruder.goto(f"/sessions/{session_id}/")
    assert answer is not None and answer.status == 404
    expect(intruder.get_by_role("tab", name="Timeline")).to_have_count(0)
    with stack.api("intruder") as api:
        assert api.get(f"/api/v1/sessions/{session_id}/history/").status_code == 404
