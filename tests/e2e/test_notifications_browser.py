"""The staff notification settings page in real Chromium against the real stack
(``manage.py dev``, whose Celery worker sends emails with the console backend): approval
emails turned on and off and kept across reloads, the address they go to, the emails sent
listed, axe-core, screenshots at 1280 and 390 px, and no page for non-staff.

Personas as in ``test_pages_browser`` (whose stack and browser fixtures this module uses):
``owner`` starts a session whose call waits for approval, ``reviewer`` (staff) is emailed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import Page, expect

from tests.e2e import test_pages_browser as pages
from tests.e2e.browser import axe_violations
from tests.e2e.conftest import wait_until
from tests.e2e.test_pages_browser import NARROW, WIDE, Contexts, PageStack, screenshot

# The page tests' fixtures: the real stack (``manage.py dev``), Chromium and its contexts.
playwright = pages.playwright
browser = pages.browser
stack = pages.stack
contexts = pages.contexts

pytestmark = pytest.mark.e2e

PAGE = "/settings/notifications/"
LABEL = "Email me when a tool call waits for approval"
ADDRESS = "reviewer@example.com"

REVIEWER_EMAIL_CODE = """
import json
from django.contrib.auth import get_user_model
from agents_app.models import NotificationPreference
user = get_user_model().objects.get(username="reviewer")
user.email = EMAIL
user.save(update_fields=["email"])
if RESET:
    NotificationPreference.objects.filter(user=user).delete()
print(json.dumps({"email": user.email}))
"""



def reviewer_email(stack: PageStack, email: str, *, reset: bool = False) -> None:
    code = REVIEWER_EMAIL_CODE.replace("EMAIL", repr(email)).replace("RESET", repr(reset))
    assert stack.shell(code) == {"email": email}


@pytest.fixture
def reviewer_reset(stack: PageStack) -> Iterator[None]:
    """The reviewer starts with no address and no choice, and ends opted out: the stack is
    shared, and other modules' approvals should email nobody."""
    reviewer_email(stack, "", reset=True)
    yield
    with stack.api("reviewer") as api:
        answer = api.put("/api/v1/me/notifications/", json={"email_on_approval": False})
        assert answer.status_code == 200, answer.text


def serious_axe(page: Page) -> list[dict[str, Any]]:
    return [item for item in axe_violations(page) if item["impact"] in ("serious", "critical")]


def save(page: Page, checked: bool, said: str) -> None:
    box = page.get_by_role("checkbox", name=LABEL)
    box.set_checked(checked)
    page.get_by_role("button", name="Save").click()
    expect(page.locator("#notification-form").get_by_role("status")).to_have_text(said)


def test_staff_turn_approval_emails_on_and_see_them_sent(
    contexts: Contexts, stack: PageStack, reviewer_reset: None
) -> None:
    reviewer = contexts.logged_in("reviewer")
    # From the approvals page, and from the navigation of every page.
    reviewer.goto("/approvals/")
    reviewer.get_by_role("link", name="Get an email when one starts waiting").click()
    expect(reviewer).to_have_url(stack.base_url + PAGE)
    expect(reviewer.get_by_role("navigation", name="Main").get_by_role(
        "link", name="Notifications")).to_have_attribute("aria-current", "page")
    expect(reviewer.get_by_role("heading", name="Notifications", level=1)).to_be_visible()
    box = reviewer.get_by_role("checkbox", name=LABEL)
    expect(box).not_to_be_checked()
    expect(reviewer.locator("#email-address")).to_contain_text("set an email address in admin")
    expect(reviewer.get_by_text("No approval emails yet.")).to_be_visible()
    assert serious_axe(reviewer) == []

    # On without an address: saved, and told that nothing is sent yet. Kept over a reload.
    save(reviewer, True,
         "Saved, but no email is sent until you set an email address in admin.")
    reviewer.reload()
    expect(box).to_be_checked()
    with stack.api("reviewer") as api:
        assert api.get("/api/v1/me/notifications/").json() == {
            "email_on_approval": True, "email": ""}

    # With an address, a call that starts waiting is mailed by the Celery worker and listed.
    reviewer_email(stack, ADDRESS)
    arguments = json.dumps({"channel": "general", "text": "notify the reviewer"})
    with stack.api("owner") as api:
        created = api.post("/api/v1/sessions/", json={
            "agent": "demo", "message": f"/tool slack__post_message {arguments}"})
    assert created.status_code == 201, created.text
    session_id = created.json()["id"]
    row = reviewer.get_by_role("table").get_by_role("row").filter(
        has=reviewer.locator(f'a[href^="/sessions/{session_id}/#call-"]'))

    def pending_call() -> str | None:
        with stack.api("reviewer") as api:
            listed = api.get("/api/v1/approvals/", params={"session": session_id}).json()
        return next((str(item["tool_call_id"]) for item in listed
                     if item["session"] == session_id), None)

    def email_sent() -> bool:
        reviewer.reload()
        return row.count() == 1 and "Sent" in row.inner_text()

    try:
        tool_call_id = wait_until("the call to wait for approval", pending_call, timeout=90)
        wait_until("the approval email to be sent", email_sent, timeout=90, interval=0.5)
    finally:
        with stack.api("owner") as api:
            assert api.post(f"/api/v1/sessions/{session_id}/stop/").status_code in (200, 202)
    expect(reviewer.locator("#email-address")).to_have_text(f"Emails go to {ADDRESS}.")
    expect(row).to_contain_text("Approval needed")
    expect(row.get_by_role("cell").nth(2)).to_have_text("slack__post_message")
    expect(row.get_by_role("link")).to_have_attribute(
        "href", f"/sessions/{session_id}/#call-{tool_call_id}")
    assert serious_axe(reviewer) == []
    screenshot(reviewer, "notification-settings")

    # Off, kept over a reload; on again, saying where emails go.
    save(reviewer, False, "Saved: you get no approval emails.")
    reviewer.reload()
    expect(box).not_to_be_checked()
    save(reviewer, True, f"Saved: approval emails go to {ADDRESS}.")
    # A save that does not reach the server says so, and nothing changed.
    reviewer.route("**/api/v1/me/notifications/", lambda route: route.abort())
    save(reviewer, False, "Not saved: The server cannot be reached; check the connection.")
    expect(reviewer.get_by_role("button", name="Save")).to_be_enabled()
    reviewer.unroute("**/api/v1/me/notifications/")
    reviewer.reload()
    expect(box).to_be_checked()

    # At phone width: the same page, nothing wider than the screen, no serious violation.
    phone = contexts.logged_in("reviewer", viewport=NARROW)
    phone.goto(PAGE)
    phone_box = phone.get_by_role("checkbox", name=LABEL)
    expect(phone_box).to_be_checked()
    expect(phone.get_by_role("table").get_by_role("row").filter(
        has_text="slack__post_message")).to_contain_text("Sent")
    assert serious_axe(phone) == []
    screenshot(phone, "notification-settings")
    save(phone, False, "Saved: you get no approval emails.")
    phone.reload()
    expect(phone_box).not_to_be_checked()


def test_non_staff_get_no_notification_settings(contexts: Contexts) -> None:
    owner = contexts.logged_in("owner")
    for viewport in (WIDE, NARROW):
        owner.set_viewport_size(viewport)  # type: ignore[arg-type]
        answer = owner.goto(PAGE)
        assert answer is not None and answer.status == 403
        expect(owner.get_by_role("heading", name="Not allowed")).to_be_visible()
        expect(owner.get_by_role("checkbox", name=LABEL)).to_have_count(0)
        expect(owner.get_by_role("navigation", name="Main").get_by_role(
            "link", name="Notifications")).to_have_count(0)
