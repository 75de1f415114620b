"""The schedule's page as Django renders it (issue 29, "each run is listed with its session and
outcome"): its Recent runs, newest first, with slot times in the schedule's zone, outcomes in
words, details and links to the sessions; the empty state; another user's schedule is 404.

Personas (tests/conftest.py): owner, other_user. The page in Chromium, with runs a real
schedule fired, is tests/e2e/test_schedules_browser.py.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest
from django.test import Client

from agents_app.models import AgentDefinition, AgentSession, Schedule, ScheduleRun
from agents_app.selectors import schedules as schedule_reads

pytestmark = pytest.mark.django_db

SLOT = datetime.datetime(2026, 12, 7, 6, 30, tzinfo=datetime.UTC)


@pytest.fixture
def schedule(owner: Any) -> Schedule:
    from agents_app.demo.seed import demo_seed

    demo_seed()
    return Schedule.objects.create(
        owner=owner, agent=AgentDefinition.objects.get(slug="demo"), name="digest",
        message="digest", cron="30 7 * * *", timezone="Europe/Paris",
    )


def page(user: Any, schedule: Schedule) -> Any:
    client = Client()
    client.force_login(user)
    return client.get(f"/schedules/{schedule.pk}/edit/")


def test_a_schedule_without_runs_says_so(owner: Any, schedule: Schedule) -> None:
    html = page(owner, schedule).content.decode()
    assert '<h2 id="runs-heading">Recent runs</h2>' in html
    assert "No runs yet. The first run is listed here once it fires." in html
    schedule.enabled = False
    schedule.save()
    assert "The schedule is paused" in page(owner, schedule).content.decode()


def test_runs_are_listed_newest_first_in_the_schedules_zone(
    owner: Any, schedule: Schedule
) -> None:
    session = AgentSession.objects.create(
        id="ses_run1", owner=owner, agent=schedule.agent, title="Digest of Monday"
    )
    ScheduleRun.objects.create(schedule=schedule, slot=SLOT, outcome="message_sent",
                               session=session)
    ScheduleRun.objects.create(
        schedule=schedule, slot=SLOT + datetime.timedelta(days=1), outcome="failed",
        detail="The persistent session ses_x is stopped.",
    )
    ScheduleRun.objects.create(schedule=schedule, slot=SLOT - datetime.timedelta(days=1),
                               outcome="skipped_missed")
    html = page(owner, schedule).content.decode()
    rows = re.findall(r"<tr>\s*<td data-label=\"Run time\">(.*?)</tr>", html, re.S)
    assert len(rows) == 3
    # 06:30 UTC is 07:30 in Paris (CET, +01:00 in December).
    assert '<time datetime="2026-12-08T07:30:00+01:00">2026-12-08 07:30:00 CET</time>' in rows[0]
    assert "Failed" in rows[0] and "The persistent session ses_x is stopped." in rows[0]
    assert "2026-12-07 07:30:00 CET" in rows[1] and "Message sent" in rows[1]
    assert '<a href="/sessions/ses_run1/">Digest of Monday</a>' in rows[1]
    assert "Skipped: missed while down" in rows[2] and "/sessions/" not in rows[2]
    assert f'href="/api/v1/schedules/{schedule.pk}/runs/"' in html
    assert "No runs yet" not in html


def test_the_page_lists_the_newest_runs_only(owner: Any, schedule: Schedule) -> None:
    ScheduleRun.objects.bulk_create(
        ScheduleRun(schedule=schedule, slot=SLOT + datetime.timedelta(minutes=n),
                    outcome="skipped_missed")
        for n in range(schedule_reads.RECENT_RUNS + 5)
    )
    runs = schedule_reads.schedule_runs_recent(schedule=schedule)
    assert len(runs) == schedule_reads.RECENT_RUNS
    assert runs[0].slot == SLOT + datetime.timedelta(minutes=schedule_reads.RECENT_RUNS + 4)
    assert runs[0].slot.utcoffset() == datetime.timedelta(hours=1)
    html = page(owner, schedule).content.decode()
    assert html.count('data-label="Run time"') == schedule_reads.RECENT_RUNS


def test_another_users_schedule_page_is_404(
    owner: Any, other_user: Any, schedule: Schedule
) -> None:
    assert page(other_user, schedule).status_code == 404
    assert page(owner, schedule).status_code == 200


def test_the_list_names_the_last_runs_outcome_in_words(owner: Any, schedule: Schedule) -> None:
    ScheduleRun.objects.create(schedule=schedule, slot=SLOT, outcome="message_sent")
    client = Client()
    client.force_login(owner)
    html = client.get("/schedules/").content.decode()
    assert '<span class="small">Message sent</span>' in html
    assert "Messagesent" not in html
