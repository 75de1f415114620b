"""Subagents in real Chromium against the real stack (``manage.py dev``, issue 29): the parent's
Activity nests the child's events under its call and links the child's page, which links
back, and after the turn and a reload Activity and the Timeline still nest the child; the
approvals inbox says on whose behalf the child's call waits. Screenshots at 1280 and 390 px.

Personas of the shared page stack (``tests/e2e/page_stack.py``): ``owner`` starts the
session, ``reviewer`` (staff) decides.
"""

from __future__ import annotations

import json
import re

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import VIEWPORTS
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import screenshot
from tests.e2e.test_subagents import start_parent_with_waiting_child

pytestmark = pytest.mark.e2e


@VIEWPORTS
def test_the_parents_activity_nests_the_child_and_the_pages_link_both_ways(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    task = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "nested"})
    parent_id, pending = start_parent_with_waiting_child(
        stack, task, approver="reviewer", timeout=90
    )
    child_id = str(pending["session"])

    inbox = contexts.logged_in("reviewer", viewport=viewport)
    inbox.goto("/approvals/")
    card = inbox.locator(".approval-card", has_text="nested")
    expect(card.locator(".on-behalf a")).to_have_attribute("href", f"/sessions/{parent_id}/")
    screenshot(inbox, "subagents-approvals")

    page = contexts.logged_in("reviewer", viewport=viewport)
    page.goto(f"/sessions/{parent_id}/")
    activity = page.locator("#activity-list")
    started = activity.locator(".activity-row", has_text="Subagent started")
    expect(started.locator("a")).to_have_attribute(
        "href", re.compile(re.escape(f"/sessions/SubFlow%3A{parent_id}-CallSubagent-1-0/"))
    )
    nested = activity.locator(".activity-nested")
    expect(nested.filter(has_text="Approval requested")).to_have_count(1)

    with stack.api("reviewer") as api:
        decided = api.post(
            f"/api/v1/sessions/{child_id}/interrupts/{pending['interrupt_id']}/",
            json={"approved": True},
        )
        assert decided.status_code == 200, decided.text
    expect(nested.filter(has_text="Tool finished slack__post_message: succeeded")).to_have_count(1)
    expect(activity.locator(".activity-row", has_text="Subagent finished")).to_contain_text(
        "completed"
    )
    screenshot(page, "subagents-parent")

    started.locator("a").click()
    expect(page).to_have_url(re.compile(re.escape("CallSubagent-1-0/")))
    back = page.locator("#chat-parent a")
    expect(back).to_have_attribute("href", re.compile(re.escape(f"/sessions/{parent_id}/#call-")))

    # After the parent's turn ended, a page opened afresh (nothing live to follow) still nests
    # the child: Activity replays the child's events under the call, the Timeline its Steps.
    def parent_waits() -> bool:
        with stack.api("owner") as api:
            return bool(api.get(f"/api/v1/sessions/{parent_id}/").json()["status"]
                        == "waiting_for_user_message")

    wait_until("the parent's turn to end", parent_waits, timeout=60)
    page.goto(f"/sessions/{parent_id}/")
    page.reload()
    group = page.locator("#activity-list .activity-subagent-row")
    expect(group).to_have_count(1)
    summary = group.locator("summary")
    expect(summary).to_contain_text("agent__demo: 1 tool call, finished")
    expect(group.locator("details")).not_to_have_attribute("open", "")
    expect(group.locator("a.activity-subagent-link")).to_have_attribute(
        "href", re.compile(re.escape(f"/sessions/SubFlow%3A{parent_id}-CallSubagent-1-0/"))
    )
    child_rows = page.get_by_role("list", name=re.compile(r"^Subagent demo session "))
    expect(child_rows).to_be_hidden()
    summary.click()
    expect(child_rows.locator(".activity-nested").filter(
        has_text="Tool finished slack__post_message: succeeded")).to_be_visible()
    # Each of the child's rows once, though the child's Stream was read twice (live, then
    # after the reload, by a page that also read the sessions index).
    expect(child_rows.locator(".activity-nested").filter(
        has_text="Tool requested")).to_have_count(1)
    screenshot(page, "subagents-parent-reloaded")

    page.get_by_role("tab", name="Timeline").click()
    call = page.locator(".timeline-step", has=page.locator(".timeline-step-kind",
                                                            has_text="Subagent call"))
    expect(call).to_have_count(1)
    expect(call.locator(".timeline-belongs").first).to_contain_text("agent__demo")
    call.locator(".timeline-subagent summary").click()
    steps = call.get_by_role("list", name=re.compile(r"^Subagent demo session "))
    expect(steps.locator(".timeline-step", has_text="Tool call").filter(
        has_text="slack__post_message")).to_have_count(1)
    expect(steps.locator(".timeline-step", has_text="Approval").first).to_contain_text("approved")
    screenshot(page, "subagents-timeline")
