"""The staff notification settings page in real Chromium against the real stack
(``manage.py dev``, whose Celery worker sends emails with the console backend): approval
emails turned on and off and kept across reloads, the address they go to, the emails sent
listed, axe-core, screenshots at 1280 and 390 px, and no page for non-staff.

Personas of the shared page stack (``tests/e2e/page_stack.py``, as in ``test_pages_browser``):
``owner`` starts a session whose call waits for approval, ``reviewer`` (staff) is emailed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from tests.e2e.browser import NARROW, VIEWPORTS, WIDE, serious_axe_violations
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import screenshot

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
    assert serious_axe_violations(reviewer) == []

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
    assert serious_axe_violations(reviewer) == []
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
    assert serious_axe_violations(phone) == []
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


DEMO_DEADLINE_CODE = """
import json
from agents_app.models import AgentDefinition
agent = AgentDefinition.objects.get(slug="demo")
before = agent.approval_deadline_seconds
agent.approval_deadline_seconds = SECONDS
agent.save(update_fields=["approval_deadline_seconds"])
print(json.dumps({"before": before}))
"""

REMINDERS_CODE = """
import datetime, json
from agents_app.models import ApprovalRequest
from agents_app.notify.notifications import approval_reminders_send
request = ApprovalRequest.objects.get(session_id=SESSION, state="pending")
# Celery beat runs this each minute; here it runs once, as if five minutes were left.
queued = approval_reminders_send(now=request.deadline - datetime.timedelta(minutes=5))
print(json.dumps({"queued": queued}))
"""


def demo_deadline(stack: PageStack, seconds: int | None) -> int | None:
    """Set the demo agent's approval deadline; return the one it had."""
    before = stack.shell(DEMO_DEADLINE_CODE.replace("SECONDS", repr(seconds)))["before"]
    return None if before is None else int(before)


@VIEWPORTS
def test_a_reminder_before_the_deadline_is_emailed_and_listed(
    contexts: Contexts, stack: PageStack, reviewer_reset: None, viewport: dict[str, int]
) -> None:
    """An approval with a deadline gets a reminder email to opted-in staff before it passes
    (``DEXAGENTS_APPROVAL_REMINDER_BEFORE``, 10 minutes by default); the Celery worker sends
    it and the settings page lists it next to the first email."""
    reviewer_email(stack, ADDRESS)
    with stack.api("reviewer") as api:
        assert api.put("/api/v1/me/notifications/",
                       json={"email_on_approval": True}).status_code == 200
    before = demo_deadline(stack, 3600)
    session_id = ""
    try:
        arguments = json.dumps({"channel": "general", "text": "remind the reviewer"})
        with stack.api("owner") as api:
            created = api.post("/api/v1/sessions/", json={
                "agent": "demo", "message": f"/tool slack__post_message {arguments}"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]

        def waiting_with_a_deadline() -> str | None:
            with stack.api("reviewer") as api:
                listed = api.get("/api/v1/approvals/", params={"session": session_id}).json()
            return next((str(item["deadline"]) for item in listed if item.get("deadline")), None)

        wait_until("the call to wait for approval with a deadline", waiting_with_a_deadline,
                   timeout=90)
        reviewer = contexts.logged_in("reviewer", viewport=viewport)
        reviewer.goto(PAGE)
        rows = reviewer.get_by_role("table").get_by_role("row").filter(
            has=reviewer.locator(f'a[href^="/sessions/{session_id}/#call-"]'))

        def emails_sent(kinds: list[str]) -> bool:
            reviewer.reload()
            texts = rows.all_inner_texts()
            return sorted(kind for kind in kinds) == sorted(
                kind for text in texts for kind in ("Approval needed", "Reminder")
                if kind in text and "Sent" in text
            )

        wait_until("the first email to be sent", lambda: emails_sent(["Approval needed"]),
                   timeout=90, interval=0.5)
        assert stack.shell(REMINDERS_CODE.replace("SESSION", repr(session_id))) == {"queued": 1}
        wait_until("the reminder to be sent",
                   lambda: emails_sent(["Approval needed", "Reminder"]),
                   timeout=90, interval=0.5)
        # Once per approval and person: the next run sends no second reminder.
        assert stack.shell(REMINDERS_CODE.replace("SESSION", repr(session_id))) == {"queued": 0}
        expect(rows.filter(has_text="Reminder").get_by_role("cell").nth(2)).to_have_text(
            "slack__post_message")
        assert serious_axe_violations(reviewer) == []
        screenshot(reviewer, "notification-reminder")
    finally:
        demo_deadline(stack, before)
        if session_id:
            with stack.api("owner") as api:
                api.post(f"/api/v1/sessions/{session_id}/stop/")
