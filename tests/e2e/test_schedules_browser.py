"""The Schedules pages in real Chromium (issue 29): the list with the seeded paused demo
schedule, the form's live preview of the next 5 runs (``schedule_form.mjs`` calling
``POST /api/v1/schedules/preview/``), a bad cron refused beside its field, a created
schedule listed, paused and resumed, and a schedule's page listing the runs it fired
(its Recent runs, linked to their sessions), at 1280 and 390 px (screenshots in
``var/screenshots/``)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.browser import NARROW, WIDE, serious_axe_violations
from tests.e2e.conftest import wait_until
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_pages_browser import screenshot

pytestmark = pytest.mark.e2e


def test_the_demo_user_sees_the_seeded_paused_schedule(
    contexts: Contexts, stack: PageStack
) -> None:
    for viewport in (WIDE, NARROW):
        page = contexts.logged_in("demo", password=stack.demo_password, viewport=viewport)
        page.goto(f"{stack.base_url}/schedules/")
        expect(page.get_by_role("heading", name="Schedules", level=1)).to_be_visible()
        row = page.get_by_role("row").filter(has_text="Weekday morning digest")
        expect(row).to_contain_text("Paused")
        expect(row.get_by_role("button", name="Resume Weekday morning digest")).to_be_visible()
        assert serious_axe_violations(page) == []
        screenshot(page, "schedules-list")


def test_create_preview_pause_and_resume(contexts: Contexts, stack: PageStack) -> None:
    page = contexts.logged_in("owner", viewport=WIDE)
    page.goto(f"{stack.base_url}/schedules/")
    page.get_by_role("link", name="New schedule").first.click()
    expect(page.get_by_role("heading", name="New schedule", level=1)).to_be_visible()
    runs = page.get_by_role("region", name="Next 5 runs").get_by_role("listitem")
    expect(runs).to_have_count(5)

    page.get_by_label("Cron expression").fill("30 7 * * *")
    page.get_by_label("Time zone").fill("Asia/Tokyo")
    expect(runs.first).to_contain_text(re.compile(r"T07:30:00\+09:00"))
    page.get_by_label("Cron expression").fill("61 * * * *")
    expect(runs).to_have_count(0)
    expect(page.locator("#preview-error")).to_contain_text("not a valid cron expression")

    page.get_by_label("Name", exact=True).fill("Tokyo standup")
    page.get_by_label("Message", exact=True).fill("Standup notes for {scheduled_for}")
    page.get_by_role("button", name="Create schedule").click()
    expect(page.get_by_role("alert")).to_contain_text("not saved")
    expect(page.get_by_label("Cron expression")).to_have_attribute("aria-invalid", "true")
    assert serious_axe_violations(page) == []
    screenshot(page, "schedule-form-error")

    page.get_by_label("Cron expression").fill("30 7 * * 1-5")
    expect(runs).to_have_count(5)
    page.get_by_role("button", name="Create schedule").click()
    row = page.get_by_role("row").filter(has_text="Tokyo standup")
    expect(row).to_contain_text("Enabled")
    expect(row).to_contain_text("+09:00")
    row.get_by_role("button", name="Pause Tokyo standup").click()
    expect(page.get_by_role("row").filter(has_text="Tokyo standup")).to_contain_text("Paused")
    page.get_by_role("row").filter(has_text="Tokyo standup").get_by_role(
        "button", name="Resume Tokyo standup").click()
    expect(page.get_by_role("row").filter(has_text="Tokyo standup")).to_contain_text("Enabled")
    screenshot(page, "schedules-list-owner")

    phone = contexts.logged_in("owner", viewport=NARROW)
    phone.goto(f"{stack.base_url}/schedules/")
    phone.get_by_role("link", name="Tokyo standup").click()
    expect(phone.get_by_role("heading", name="Edit schedule", level=1)).to_be_visible()
    expect(phone.get_by_role("region", name="Next 5 runs").get_by_role("listitem")).to_have_count(5)
    screenshot(phone, "schedule-form")
    with stack.api("owner") as api:
        listed = api.get("/api/v1/schedules/").json()["results"]
        for item in listed:
            assert api.delete(f"/api/v1/schedules/{item['id']}/").status_code == 204


def test_the_schedules_page_lists_its_runs_with_their_sessions(
    contexts: Contexts, stack: PageStack
) -> None:
    """A real schedule every 5 s fires on the stack; its page lists the run (time in its zone,
    outcome in words, a link to the session's chat page) and links the JSON runs."""
    with stack.api("owner") as api:
        created = api.post("/api/v1/schedules/", json={
            "agent": "demo", "name": "Runs listed", "message": "Ping for {scheduled_for}",
            "interval_seconds": 5, "timezone": "Asia/Kolkata",
        })
        assert created.status_code == 201, created.text
        schedule_id = created.json()["id"]

        def sent_run() -> dict[str, Any] | None:
            runs = api.get(f"/api/v1/schedules/{schedule_id}/runs/").json()["results"]
            done = [item for item in runs if item["outcome"] == "message_sent"]
            return done[-1] if done else None

        run = wait_until("a run of the schedule to be sent", sent_run, timeout=60)
        paused = api.patch(f"/api/v1/schedules/{schedule_id}/", json={"enabled": False})
        assert paused.status_code == 200, paused.text
    try:
        for viewport, name in ((WIDE, "schedule-runs"), (NARROW, "schedule-runs-phone")):
            page = contexts.logged_in("owner", viewport=viewport)
            page.goto(f"{stack.base_url}/schedules/{schedule_id}/edit/")
            runs_region = page.get_by_role("region", name="Recent runs")
            row = runs_region.get_by_role("row").filter(
                has=page.locator(f'a[href="/sessions/{run["session"]}/"]'))
            expect(row).to_contain_text("Message sent")
            expect(row).to_contain_text("IST")  # the slot in Asia/Kolkata
            expect(runs_region.get_by_role("link", name="Every run (JSON)")).to_have_attribute(
                "href", f"/api/v1/schedules/{schedule_id}/runs/")
            assert serious_axe_violations(page) == []
            screenshot(page, name)
        row.get_by_role("link").click()
        expect(page).to_have_url(f"{stack.base_url}/sessions/{run['session']}/")
        expect(page.locator("main")).to_contain_text("Ping for")
    finally:
        with stack.api("owner") as api:
            assert api.delete(f"/api/v1/schedules/{schedule_id}/").status_code == 204


def test_a_schedule_without_runs_shows_the_empty_state(
    contexts: Contexts, stack: PageStack
) -> None:
    page = contexts.logged_in("demo", password=stack.demo_password, viewport=NARROW)
    page.goto(f"{stack.base_url}/schedules/")
    page.get_by_role("link", name="Weekday morning digest").click()
    expect(page.get_by_role("region", name="Recent runs")).to_contain_text(
        "No runs yet. The schedule is paused")
    screenshot(page, "schedule-runs-empty-phone")
