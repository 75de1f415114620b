"""The approvals inbox in real Chromium against the real stack (``manage.py dev``): filters,
approve with edits, the lost race told on the card, bulk decisions, the link to the session at
the call, the pending count, axe-core, and screenshots at 1280 and 390 px.

Personas of the shared page stack (``tests/e2e/page_stack.py``, as in ``test_pages_browser``):
``owner`` and ``demo`` start sessions, ``reviewer`` (staff) decides.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import Route, expect

from tests.e2e.browser import (
    NARROW,
    NOTHING_UNDER_THE_LABELS,
    VIEWPORTS,
    WIDE,
    approval_card,
    axe_violations,
    decision_row,
)
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import screenshot, wait_for_turn_end

pytestmark = pytest.mark.e2e


def post_message_session(stack: PageStack, persona: str, channel: str, text: str) -> str:
    """Start a demo session whose first turn calls the write ``slack__post_message``."""
    arguments = json.dumps({"channel": channel, "text": text})
    with stack.api(persona) as api:
        created = api.post("/api/v1/sessions/", json={
            "agent": "demo", "message": f"/tool slack__post_message {arguments}"})
        assert created.status_code == 201, created.text
        return str(created.json()["id"])


def pending_by_session(stack: PageStack, sessions: list[str]) -> dict[str, dict[str, Any]]:
    """Wait until each session's call waits for approval and Dex holds it; by session ID."""

    def probe() -> dict[str, dict[str, Any]] | None:
        with stack.api("reviewer") as api:
            listed = {item["session"]: item for item in api.get("/api/v1/approvals/").json()}
            if not set(sessions) <= set(listed):
                return None
            for session_id in sessions:
                held = api.get(f"/api/v1/sessions/{session_id}/").json()["pending_interrupts"]
                if listed[session_id]["interrupt_id"] not in {i["interrupt_id"] for i in held}:
                    return None
        return {session_id: listed[session_id] for session_id in sessions}

    return wait_until("every call to wait for approval", probe, timeout=90)


def inbox_emptied(stack: PageStack) -> None:
    """Stop the sessions other page modules left waiting for approval (the page stack is
    shared), so the inbox's counts are this test's own."""
    with stack.api("reviewer") as api:
        for item in api.get("/api/v1/approvals/").json():
            api.post(f"/api/v1/sessions/{item['session']}/stop/")

        def empty() -> bool | None:
            return api.get("/api/v1/approvals/").json() == [] or None

        wait_until("the approvals inbox to be empty", empty, timeout=90)


@VIEWPORTS
def test_the_approvals_inbox(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    inbox_emptied(stack)
    edited_id = post_message_session(stack, "owner", "general", "draft from the model")
    raced_id = post_message_session(stack, "owner", "general", "raced")
    bulk_ids = [post_message_session(stack, "owner", "general", f"bulk {n}") for n in (1, 2)]
    demo_id = post_message_session(stack, "demo", "random", "from demo")
    pending = pending_by_session(stack, [edited_id, raced_id, *bulk_ids, demo_id])

    reviewer = contexts.logged_in("reviewer", viewport=viewport)
    reviewer.goto("/approvals/")
    cards = reviewer.locator(".approval-card")
    expect(cards).to_have_count(5)
    # The count, in the tab title and in the navigation.
    expect(reviewer).to_have_title("(5) Approvals · dexagents")
    expect(reviewer.get_by_role("link", name="Approvals (5 pending)")).to_be_visible()
    expect(reviewer.get_by_role("tab", name="Pending 5")).to_be_visible()
    # axe-core finds nothing on the page with its cards (the Pending tab's name once
    # mismatched its text).
    assert axe_violations(reviewer) == []

    # Filters: by owner, then cleared; they live in the URL.
    reviewer.get_by_label("Owner").fill("demo")
    reviewer.get_by_role("button", name="Filter", exact=True).click()
    expect(cards).to_have_count(1)
    expect(approval_card(reviewer, demo_id)).to_be_visible()
    assert "owner=demo" in reviewer.url
    screenshot(reviewer, "approvals-filtered")
    reviewer.get_by_role("button", name="Clear filters").click()
    expect(cards).to_have_count(5)

    # The link from a card opens the chat page at that call, scrolled to it and marked.
    edited_card = approval_card(reviewer, edited_id)
    call_id = pending[edited_id]["tool_call_id"]
    link = edited_card.get_by_role("link", name="Open the session at this call")
    expect(link).to_have_attribute("href", f"/sessions/{edited_id}/#call-{call_id}")
    linked = contexts.logged_in("reviewer", viewport=viewport)
    linked.goto(f"/sessions/{edited_id}/#call-{call_id}")
    target = linked.locator(f'.inline-approval[data-call-id="{call_id}"]')
    expect(target).to_have_class(re.compile(r"\blinked-call\b"))
    expect(target).to_be_in_viewport()
    screenshot(linked, "approvals-link-target", screen_too=True)

    # Approve with edits: the schema's messages first, then the edited call runs.
    edited_card.get_by_role("button", name="Edit arguments").click()
    editor = edited_card.get_by_role("textbox", name=re.compile(r"^Arguments to approve"))
    editor.fill('{"channel": "random"}')
    edited_card.get_by_role("button", name="Approve with edits").click()
    problems = edited_card.get_by_role("list", name="Problems with the edited arguments")
    expect(problems).to_contain_text("'text' is a required property")
    screenshot(reviewer, "approvals-edit")
    editor.fill('{"channel": "random", "text": "edited by the reviewer"}')
    edited_card.get_by_role("button", name="Approve with edits").click()
    expect(edited_card).to_have_count(0)
    messages = wait_for_turn_end(stack, "owner", edited_id)
    assert "a reviewer edited the arguments" in messages[-1]["text"]
    assert "edited by the reviewer" in messages[-1]["text"]

    # The lost race: while this page cannot refresh its list, another decision lands first;
    # the card then says who decided and when, and stays until dismissed.
    raced_card = approval_card(reviewer, raced_id)
    expect(raced_card).to_be_visible()

    def hold(route: Route) -> None:
        route.abort()

    reviewer.route(re.compile(r"/api/v1/approvals/(\?.*)?$"), hold)
    with stack.api("reviewer") as api:
        first = api.post(
            f"/api/v1/sessions/{raced_id}/interrupts/{pending[raced_id]['interrupt_id']}/",
            json={"approved": True},
        )
        assert first.status_code == 200, first.text
    raced_card.get_by_role("button", name="Approve").click()
    # When, in the viewer's zone and naming it (the API speaks UTC).
    expect(raced_card.locator(".settled-note p")).to_have_text(
        re.compile(r"^Already approved by reviewer at .+\d:\d\d( [AP]M)? (UTC|GMT[+-][\d:]+)\.$")
    )
    reviewer.unroute(re.compile(r"/api/v1/approvals/(\?.*)?$"), hold)
    reviewer.evaluate("window.dispatchEvent(new Event('focus'))")
    # Three still wait; the raced card stays, settled, next to them.
    expect(reviewer.locator('.approval-card:not([data-state="settled"])')).to_have_count(3)
    expect(raced_card).to_have_attribute("data-state", "settled")
    screenshot(reviewer, "approvals-lost-race")

    # Bulk: two selected calls rejected in one go.
    for session_id in bulk_ids:
        approval_card(reviewer, session_id).get_by_role("checkbox").check()
    expect(reviewer.locator("#bulk-count")).to_have_text("2 selected")
    # The decisions of the other width's run are listed too: this run's message is its own.
    not_today = f"Not today ({viewport['width']} px)."
    reviewer.get_by_role("textbox", name="Rejection message for the selected calls").fill(
        not_today
    )
    screenshot(reviewer, "approvals-bulk")
    reviewer.get_by_role("button", name="Reject selected").click()
    expect(reviewer.locator("#bulk-result")).to_have_text("Rejected 2 of 2.")
    expect(cards).to_have_count(2)
    expect(reviewer).to_have_title("(1) Approvals · dexagents")
    screenshot(reviewer, "approvals-after-bulk")
    # Filtered to the owner's calls (case ignored), only the settled card is left: the line
    # above it says that card no longer waits, not that nothing matching waits.
    reviewer.get_by_label("Owner").fill("OWNER")
    reviewer.get_by_role("button", name="Filter", exact=True).click()
    expect(cards).to_have_count(1)
    expect(raced_card).to_have_attribute("data-state", "settled")
    status = reviewer.locator("#pending-status")
    expect(status).to_have_text("The card below no longer waits for a decision; it says why.")
    screenshot(reviewer, "approvals-settled-only")
    raced_card.get_by_role("button", name="Dismiss").click()
    expect(status).to_have_text("Nothing matching the filters waits for approval.")
    reviewer.get_by_role("button", name="Clear filters").click()
    expect(cards).to_have_count(1)
    expect(status).to_have_text("1 waiting for a decision.")

    # The decisions tab: what was decided, by whom, with the edit.
    reviewer.get_by_role("tab", name="Decisions").click()
    edited_row = decision_row(reviewer, edited_id)
    expect(edited_row).to_contain_text("Edited before approval")
    expect(edited_row).to_contain_text("edited by the reviewer")
    expect(edited_row).to_contain_text("reviewer")
    if viewport is WIDE:
        # At 1280 px the Arguments column has room for a line of JSON (it once wrapped
        # every few characters).
        newest_arguments = reviewer.locator(
            '#decisions-body td[data-label="Arguments"] pre.arguments'
        ).first
        expect(newest_arguments).to_contain_text('"channel": "general"')
        box = newest_arguments.bounding_box()
        assert box is not None and box["width"] >= 250, box
    # The time names its zone.
    expect(reviewer.locator('#decisions-body td[data-label="Decided"]').first).to_have_text(
        re.compile(r"(UTC|GMT[+-][\d:]+)$")
    )
    rejected = reviewer.locator("#decisions-body tr").filter(has_text=not_today)
    expect(rejected).to_have_count(2)
    assert axe_violations(reviewer) == []
    if viewport is NARROW:
        # The rows are stacked cards: every part of a cell beside its label, none under it.
        assert reviewer.locator("#decisions-table").evaluate(NOTHING_UNDER_THE_LABELS) == []
    screenshot(reviewer, "approvals-decisions")
