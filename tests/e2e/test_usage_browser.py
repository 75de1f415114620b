"""Cost and usage in real Chromium (issue 27): a message's own call on hover, the session's
cost in the chat header and in the sessions list, the usage page with its two charts, and a
message held by a spent budget until an administrator raises it in admin, at 1280 and 390 px
(screenshots in ``var/screenshots/``). The demo agent gets its own prices so every figure is
non-zero and checkable against the API; prices and budgets are undone after each use (the
stack is shared by every page module)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import NARROW, WIDE, log_in_to_admin
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import (
    assistant_texts,
    region,
    screenshot,
    start_session,
    wait_for_turn_end,
)

pytestmark = pytest.mark.e2e

PRICES_CODE = (
    "import json; from agents_app.models import AgentDefinition as A; "
    "print(json.dumps(A.objects.filter(slug='demo').update("
    "input_price_per_mtok='2.5', output_price_per_mtok='40')))"
)


#: Undo: the stack is shared by every page module.
NO_PRICES_CODE = (
    "import json; from agents_app.models import AgentDefinition as A; "
    "print(json.dumps(A.objects.filter(slug='demo').update("
    "input_price_per_mtok=None, output_price_per_mtok=None)))"
)


@pytest.fixture(scope="module")
def priced(stack: PageStack) -> Iterator[PageStack]:
    assert stack.shell(PRICES_CODE) == 1
    try:
        yield stack
    finally:
        stack.shell(NO_PRICES_CODE)


def displayed(cost_usd: str) -> str:
    from agents_app.pages.page_selectors import usd_display

    return usd_display(cost_usd)


def session_usage(platform: PageStack, persona: str, session_id: str) -> dict[str, Any]:
    with platform.api(persona) as api:
        usage: dict[str, Any] = api.get(f"/api/v1/sessions/{session_id}/").json()["usage"]
    return usage


#: Whether every part of a message header (role, badges, time, usage, Copy) is one line tall.
PARTS_ON_ONE_LINE = """meta => [...meta.children].every((part) => {
  const style = getComputedStyle(part);
  const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.4;
  const padding = parseFloat(style.paddingTop) + parseFloat(style.paddingBottom)
    + parseFloat(style.borderTopWidth) + parseFloat(style.borderBottomWidth);
  return part.getBoundingClientRect().height - padding < line * 1.5;
})"""


def test_cost_shows_per_message_session_list_and_usage_page(
    contexts: Contexts, priced: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    # A line that is not a directive: it is the session's title, which the list links.
    session_id = start_session(
        owner, 'what it costs\n/tool search__web_search {"query": "what it costs"}'
    )
    messages = wait_for_turn_end(priced, "owner", session_id)
    total = session_usage(priced, "owner", session_id)
    assert Decimal(total["cost_usd"]) > 0 and total["requests"] == 2
    reply = [m for m in messages if m["role"] == "assistant"][-1]

    for viewport in (WIDE, NARROW):
        page = contexts.logged_in("owner", viewport=viewport)
        page.goto(f"/sessions/{session_id}/")
        expect(assistant_texts(page).last).to_contain_text("what it costs")
        # The header: the session's total, its tokens on hover.
        cost = page.locator("#chat-cost")
        expect(cost).to_have_text(displayed(total["cost_usd"]))
        expect(cost).to_have_attribute("title", re.compile(r"2 model calls"))
        # Each reply: the call that produced it, on hover.
        last = page.locator(".message-assistant").last
        last.hover()
        # The turn's last reply adds the turn's total (two calls: the tool request, the answer).
        expect(last).to_have_attribute(
            "title",
            f"This reply: {reply['usage']['input_tokens']:,} input tokens, "
            f"{reply['usage']['output_tokens']:,} output tokens; cost "
            f"{displayed(reply['usage']['cost_usd'])}\n"
            f"This turn: {displayed(total['cost_usd'])}, {total['input_tokens']:,} input tokens, "
            f"{total['output_tokens']:,} output tokens, 2 model calls",
        )
        tokens = reply["usage"]["input_tokens"] + reply["usage"]["output_tokens"]
        badge = last.locator(".message-usage")
        expect(badge).to_have_text(f"{displayed(reply['usage']['cost_usd'])} · {tokens} tokens")
        expect(badge).to_have_css("opacity", "1")
        # The reply's header wraps between its parts, never inside one (a phone's "12:20\nPM").
        assert last.locator(".message-meta").evaluate(PARTS_ON_ONE_LINE), viewport
        screenshot(page, "usage-chat", screen_too=True)

        # The sessions list: a Cost column.
        page.goto("/sessions/")
        link = page.get_by_role("link", name=re.compile("what it costs"))
        row = page.get_by_role("row").filter(has=link)
        expect(row.locator('td[data-label="Cost"]')).to_have_text(displayed(total["cost_usd"]))
        screenshot(page, "usage-sessions")

        # The usage page: the owner's own figures, charts drawn by Chart.js.
        page.goto("/usage/")
        expect(page.get_by_role("heading", name="Usage", exact=True)).to_be_visible()
        expect(page.get_by_text("Model calls of your sessions")).to_be_visible()
        wait_for_chart(page, "#usage-days-chart")
        wait_for_chart(page, "#usage-agents-chart")
        agents = page.get_by_role("region", name="Cost per agent")
        expect(agents.get_by_role("row", name=re.compile(r"^Demo agent \$"))).to_be_visible()
        screenshot(page, "usage-owner")

    # Staff see everyone's figures, with a per-user table.
    for viewport in (WIDE, NARROW):
        staff = contexts.logged_in("reviewer", viewport=viewport)
        staff.goto("/usage/")
        expect(staff.get_by_text("every user's sessions")).to_be_visible()
        users = staff.get_by_role("region", name="Cost per user")
        expect(users.get_by_role("row").filter(has_text="owner")).to_be_visible()
        wait_for_chart(staff, "#usage-days-chart")
        screenshot(staff, "usage-staff")

    # A bad date is refused with a message beside its field; the page still shows figures.
    answer = owner.goto("/usage/?from=2026-12-31&to=2026-01-01")
    assert answer is not None and answer.status == 400
    expect(owner.locator("#usage-from-error")).to_have_text("Must not be after the last day (to).")


def wait_for_chart(page: Any, selector: str) -> None:
    """Wait until Chart.js has drawn a chart on the canvas ``selector`` with non-zero data."""
    expect(page.locator(selector)).to_be_visible()
    page.wait_for_function(
        "(selector) => { const c = window.Chart && window.Chart.getChart("
        "document.querySelector(selector)); return !!c && "
        "c.data.datasets[0].data.some((v) => v > 0); }",
        arg=selector,
    )


BUDGET_CODE = (
    "import json; from agents_app.models import Budget as B; "
    "from django.contrib.auth import get_user_model as U; "
    "print(json.dumps(B.objects.create(user=U().objects.get(username='owner'), period='day', "
    "limit_usd='0').pk))"
)
#: Undo: budgets are per user, and the stack is shared by every page module.
NO_BUDGET_CODE = (
    "import json; from agents_app.models import Budget as B; "
    "print(json.dumps(B.objects.filter(user__username='owner').delete()[0]))"
)


def test_a_spent_budget_holds_the_message_until_admin_raises_it(
    contexts: Contexts, stack: PageStack
) -> None:
    owner = contexts.logged_in("owner")
    session_id = start_session(owner, "before the budget")
    wait_for_turn_end(stack, "owner", session_id)
    admin = contexts.new().new_page()
    log_in_to_admin(admin, stack.admin_password)
    try:
        for viewport in (WIDE, NARROW):
            budget_id = stack.shell(BUDGET_CODE)
            width = viewport["width"]
            page = contexts.logged_in("owner", viewport=viewport)
            page.goto(f"/sessions/{session_id}/")
            page.get_by_role("textbox", name="Message").fill(f"held at {width}")
            page.get_by_role("button", name="Send").click()
            # Kept in the queue with the budget's reason; no turn starts.
            queue = region(page, "Message queue")
            held = queue.locator("li").filter(has_text=f"held at {width}")
            expect(held.locator(".badge-held")).to_have_text("Held: budget spent")
            expect(held.locator(".queue-held")).to_contain_text(
                "Budget reached: your daily budget of $0"
            )
            # No turn runs and none may take it: the summary says it is held, and it offers
            # no Steer (only Edit and Delete).
            expect(queue.locator("#queue-summary")).to_have_text(
                "1 message held: a budget is spent."
            )
            expect(held.get_by_role("button")).to_have_text(["Edit", "Delete"])
            held.scroll_into_view_if_needed()
            screenshot(page, "budget-held", screen_too=True)

            # An administrator raises the limit in admin: the message goes at once and runs.
            admin.goto(f"/admin/agents_app/budget/{budget_id}/change/")
            admin.get_by_label("Limit (USD)").fill("1000")
            admin.get_by_role("button", name="Save", exact=True).click()
            expect(admin.locator(".messagelist")).to_contain_text("was changed successfully")
            expect(assistant_texts(page).last).to_have_text(f"You said: held at {width}",
                                                            timeout=60_000)
            expect(queue.locator("li")).to_have_count(0)
            assistant_texts(page).last.scroll_into_view_if_needed()
            screenshot(page, "budget-delivered", screen_too=True)
            stack.shell(NO_BUDGET_CODE)
    finally:
        stack.shell(NO_BUDGET_CODE)
