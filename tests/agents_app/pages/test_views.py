"""The pages as Django renders them: who may see what, and what each page carries.

Personas (tests/conftest.py): owner, other_user, staff, anonymous. The browser behaviour is
tested in tests/e2e/test_pages_browser.py against the real stack.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from agents_app.models import AgentDefinition, AgentSession, ApprovalRequest

pytestmark = pytest.mark.django_db

PAGES = ("/", "/sessions/", "/approvals/")


@pytest.fixture
def agent() -> AgentDefinition:
    from agents_app.demo.seed import demo_seed

    demo_seed()
    return AgentDefinition.objects.get(slug="demo")


@pytest.fixture
def session(owner: Any, agent: AgentDefinition) -> AgentSession:
    return AgentSession.objects.create(id="ses_owned", owner=owner, agent=agent, title="Owned chat")


def browser(user: Any | None) -> Client:
    client = Client()
    if user is not None:
        client.force_login(user)
    return client


def test_login_page_uses_django_names_and_logs_in(owner: Any) -> None:
    owner.set_password("a-long-test-password")
    owner.save()
    client = Client(enforce_csrf_checks=True)
    page = client.get("/accounts/login/")
    html = page.content.decode()
    assert page.status_code == 200
    assert re.search(r"<label for=\"id_username\">Username</label>", html)
    assert re.search(r"<label for=\"id_password\">Password</label>", html)
    assert ">Log in</button>" in html
    token = client.cookies["csrftoken"].value
    answer = client.post(
        "/accounts/login/",
        {"username": "owner", "password": "a-long-test-password", "csrfmiddlewaretoken": token},
    )
    assert answer.status_code == 302
    assert answer["Location"] == "/"
    assert client.get("/").status_code == 200


def test_login_without_csrf_token_is_refused(owner: Any) -> None:
    owner.set_password("a-long-test-password")
    owner.save()
    client = Client(enforce_csrf_checks=True)
    answer = client.post(
        "/accounts/login/", {"username": "owner", "password": "a-long-test-password"}
    )
    assert answer.status_code == 403


def test_logout_is_a_post(owner: Any) -> None:
    client = browser(owner)
    assert client.get("/accounts/logout/").status_code == 405
    answer = client.post("/accounts/logout/")
    assert answer.status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.parametrize("path", [*PAGES, "/sessions/ses_owned/"])
def test_anonymous_is_sent_to_login(path: str, session: AgentSession) -> None:
    answer = browser(None).get(path)
    assert answer.status_code == 302
    assert answer["Location"].startswith("/accounts/login/?next=")


def test_chat_page_for_owner_and_staff_only(
    session: AgentSession, owner: Any, other_user: Any, staff: Any
) -> None:
    assert browser(owner).get("/sessions/ses_owned/").status_code == 200
    assert browser(staff).get("/sessions/ses_owned/").status_code == 200
    assert browser(other_user).get("/sessions/ses_owned/").status_code == 404
    assert browser(owner).get("/sessions/ses_unknown/").status_code == 404


def test_chat_page_regions_and_composer(session: AgentSession, owner: Any, staff: Any) -> None:
    html = browser(owner).get("/sessions/ses_owned/").content.decode()
    for name in ("Conversation", "Thinking", "Response", "Activity", "Message queue"):
        heading = rf'<h2 id="[a-z-]+-heading"[^>]*>(<span[^>]*></span>)?{name}</h2>'
        assert re.search(heading, html), name
    assert '<label for="composer-text" class="visually-hidden">Message</label>' in html
    assert ">Send</button>" in html
    assert '"canSend": true' in html
    assert '"canApprove": false' in html
    staff_html = browser(staff).get("/sessions/ses_owned/").content.decode()
    assert 'id="composer"' not in staff_html  # staff read, only the owner writes
    assert '"canApprove": true' in staff_html
    assert "only its owner writes to it" in staff_html


def test_chat_page_has_plan_mode_and_the_plan_question_and_timer_panels(
    session: AgentSession, owner: Any, staff: Any
) -> None:
    html = browser(owner).get("/sessions/ses_owned/").content.decode()
    toggle = r'<input type="checkbox" id="composer-plan" name="plan_mode"[^>]*> Plan mode'
    assert re.search(toggle, html)
    for panel in ("plan", "timer", "user-input"):
        section = rf'<section id="{panel}" [^>]*aria-labelledby="{panel}-heading" hidden>'
        assert re.search(section, html), panel
    assert '<h2 id="plan-heading">Plan</h2>' in html
    assert ">Submit answer</button>" in html
    assert '<label for="user-input-text">Your answer</label>' in html
    staff_html = browser(staff).get("/sessions/ses_owned/").content.decode()
    assert 'id="user-input-form"' not in staff_html and 'id="composer-plan"' not in staff_html
    assert "Waiting for owner's answer." in staff_html


def test_approvals_dashboard_is_staff_only(owner: Any, staff: Any) -> None:
    refused = browser(owner).get("/approvals/")
    assert refused.status_code == 403
    # A page of the site, with its navigation and the reason, not a bare "403 Forbidden".
    html = refused.content.decode()
    assert "Only staff decide approvals." in html
    assert 'aria-label="Main"' in html
    page = browser(staff).get("/approvals/")
    assert page.status_code == 200
    assert 'role="tab"' in page.content.decode()


def test_nav_shows_approvals_to_staff_only(owner: Any, staff: Any, agent: AgentDefinition) -> None:
    assert 'href="/approvals/"' not in browser(owner).get("/").content.decode()
    assert 'href="/approvals/"' in browser(staff).get("/").content.decode()


def test_staff_see_the_pending_count_in_the_navigation_of_every_page(
    owner: Any, staff: Any, session: AgentSession
) -> None:
    for call in ("call_1", "call_2"):
        ApprovalRequest.objects.create(
            session=session, interrupt_id=f"turn-1.{call}", tool_call_id=call,
            tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
        )
    ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-0.call_0", tool_call_id="call_0",
        tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
        state="approved",
    )
    for path in (*PAGES, f"/sessions/{session.id}/"):
        html = browser(staff).get(path).content.decode()
        link = re.search(r'<a id="nav-pending-count"[^>]*>(.*?)</a>', html)
        assert link is not None, path
        # The badge shows "2"; it is aria-hidden, so the link's name is "Approvals (2 pending)".
        assert re.sub(r"<[^>]+>", "", link.group(1)) == "Approvals 2 (2 pending)", path
    assert browser(staff).get("/approvals/").content.decode().count("<title>(2) Approvals") == 1
    owner_page = browser(owner).get(f"/sessions/{session.id}/").content.decode()
    assert "nav-pending-count" not in owner_page


def test_portal_lists_agents_tools_and_approval_badges(owner: Any, agent: AgentDefinition) -> None:
    html = browser(owner).get("/").content.decode()
    assert '<label for="agent">Agent</label>' in html
    assert '<label for="message">Message</label>' in html
    assert ">Start session</button>" in html
    assert 'value="slack__post_message" checked' in html
    post = html.split('value="slack__post_message"', 1)[1].split("</li>", 1)[0]
    assert "badge-approval" in post
    search = html.split('value="search__web_search"', 1)[1].split("</li>", 1)[0]
    assert "badge-approval" not in search


def test_portal_disables_unconfigured_agents_with_the_reason_for_staff(
    owner: Any, staff: Any, agent: AgentDefinition, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DEXAGENTS_TEST_SECRET_KEY", raising=False)
    AgentDefinition.objects.create(
        slug="paid", name="Paid agent", model="anthropic/claude-x",
        api_key_env="DEXAGENTS_TEST_SECRET_KEY",
    )
    staff_html = browser(staff).get("/").content.decode()
    user_html = browser(owner).get("/").content.decode()
    option = r'<option value="paid" disabled>Paid agent — not configured</option>'
    assert re.search(option, user_html)
    assert "DEXAGENTS_TEST_SECRET_KEY" in staff_html
    assert "DEXAGENTS_TEST_SECRET_KEY" not in user_html
    assert "An administrator must configure its API key." in user_html


def test_portal_never_shows_credential_values(
    owner: Any, staff: Any, agent: AgentDefinition, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEXAGENTS_TEST_SECRET_KEY", "sk-very-secret-value")
    AgentDefinition.objects.create(
        slug="paid", name="Paid agent", model="anthropic/claude-x",
        api_key_env="DEXAGENTS_TEST_SECRET_KEY",
    )
    for user in (owner, staff):
        assert "sk-very-secret-value" not in browser(user).get("/").content.decode()


def test_sessions_list_filters_sorts_and_pages(
    owner: Any, other_user: Any, staff: Any, agent: AgentDefinition
) -> None:
    for number in range(25):
        AgentSession.objects.create(
            id=f"ses_{number:02}", owner=owner, agent=agent, title=f"Chat {number:02}",
            status="stopped" if number % 5 == 0 else "waiting_for_user_message",
        )
    AgentSession.objects.create(id="ses_other", owner=other_user, agent=agent, title="Not yours")
    owner_client = browser(owner)

    first = owner_client.get("/sessions/", {"ordering": "title"}).content.decode()
    assert "25 sessions, page 1 of 2" in first
    assert "Not yours" not in first
    assert first.index("Chat 00") < first.index("Chat 19")
    assert "Chat 20" not in first
    assert "page=2" in first

    second = owner_client.get("/sessions/", {"ordering": "title", "page": "2"}).content.decode()
    assert "Chat 24" in second and "Chat 00" not in second

    stopped = owner_client.get("/sessions/", {"status": "stopped"}).content.decode()
    assert "5 sessions" in stopped
    assert "Chat 05" in stopped and "Chat 06" not in stopped

    found = owner_client.get("/sessions/", {"search": "chat 1"}).content.decode()
    assert "10 sessions" in found

    by_agent = owner_client.get("/sessions/", {"search": "demo"}).content.decode()
    assert "25 sessions" in by_agent

    everyone = browser(staff).get("/sessions/", {"search": "yours"}).content.decode()
    assert "Not yours" in everyone
    assert '<th scope="col">Owner</th>' in everyone

    ApprovalRequest.objects.create(
        session_id="ses_03", interrupt_id="turn-1.call_1", tool_call_id="call_1",
        tool_name="slack__post_message", requested_at=timezone.now(),
    )
    waiting = owner_client.get("/sessions/", {"status": "awaiting_approval"}).content.decode()
    assert "1 session" in waiting and "Chat 03" in waiting
    assert "status-awaiting_approval" in waiting

    junk = owner_client.get("/sessions/", {"page": "abc", "status": "nope", "ordering": "x"})
    assert junk.status_code == 200


def test_sessions_page_reads_archived_as_the_api_does(owner: Any, agent: AgentDefinition) -> None:
    """``archived=1`` (the page's own form) and ``archived=true`` (what the API takes) both
    list the archived sessions; anything else lists the others."""
    AgentSession.objects.create(id="ses_kept", owner=owner, agent=agent, title="Kept chat")
    AgentSession.objects.create(
        id="ses_old", owner=owner, agent=agent, title="Old chat", archived_at=timezone.now()
    )
    owner_client = browser(owner)
    for value in ("1", "true", "True", "on", "yes"):
        html = owner_client.get("/sessions/", {"archived": value}).content.decode()
        assert "Old chat" in html and "Kept chat" not in html, value
        assert 'name="archived" value="1" checked' in html, value
    for value in ("", "0", "false", "no"):
        html = owner_client.get("/sessions/", {"archived": value}).content.decode()
        assert "Kept chat" in html and "Old chat" not in html, value


def test_every_page_names_the_site_icon_and_favicon_ico_finds_it(
    owner: Any, staff: Any, agent: AgentDefinition
) -> None:
    """No 404 for /favicon.ico is logged: pages (the admin's too) link the SVG icon, and the
    path browsers try without a link redirects to it."""
    icon = '<link rel="icon" href="/static/agents_app/favicon.svg" type="image/svg+xml">'
    for path in ("/", "/sessions/", "/api/redoc/"):
        assert icon in browser(owner).get(path).content.decode(), path
    assert icon in browser(None).get("/accounts/login/").content.decode()
    staff.is_superuser = True
    staff.save()
    for path in ("/admin/", "/admin/agents_app/agentdefinition/"):
        answer = browser(staff).get(path)
        assert answer.status_code == 200, path
        assert icon in answer.content.decode(), path
    assert icon in browser(None).get("/admin/login/").content.decode()
    redirect = Client().get("/favicon.ico")
    assert redirect.status_code == 301
    assert redirect["Location"] == "/static/agents_app/favicon.svg"
    svg = Client().get(redirect["Location"])
    assert svg.status_code == 200 and svg["Content-Type"].startswith("image/svg+xml")


@pytest.mark.parametrize("path", PAGES)
def test_pages_have_no_inline_scripts_or_handlers(
    path: str, staff: Any, agent: AgentDefinition
) -> None:
    html = browser(staff).get(path).content.decode()
    for tag in re.findall(r"<script\b[^>]*>", html):
        assert 'type="module"' in tag or 'type="application/json"' in tag, tag
        if 'type="module"' in tag:
            assert "src=" in tag, tag
    assert not re.search(r"\son[a-z]+\s*=", html), "inline event handler"


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/static/agents_app/site.css", "text/css"),
        ("/static/agents_app/chat.mjs", "text/javascript"),
        ("/static/agents_app/ws_client.mjs", "text/javascript"),
    ],
)
def test_static_files_are_served_by_the_app(path: str, content_type: str) -> None:
    answer = Client().get(path)
    assert answer.status_code == 200
    # ES modules only run when served with a JavaScript type.
    assert answer["Content-Type"].startswith(content_type)


def test_not_found_pages_are_pages_of_the_site(owner: Any, settings: Any) -> None:
    settings.DEBUG = False  # with DEBUG on Django shows its own technical page instead
    page = browser(owner).get("/sessions/ses_nobody/")
    assert page.status_code == 404
    html = page.content.decode()
    assert "<h1>Not found</h1>" in html
    assert 'aria-label="Main"' in html


def test_notification_settings_are_staff_only_and_list_the_emails_sent(
    owner: Any, staff: Any, session: AgentSession
) -> None:
    """``/settings/notifications/``: 403 for non-staff (a page of the site with the reason),
    the login page for anonymous visitors; staff see their choice, where emails go (or that
    no address is set) and their latest approval emails, linked to the call."""
    from agents_app.models import ApprovalNotification, NotificationPreference

    refused = browser(owner).get("/settings/notifications/")
    assert refused.status_code == 403
    assert "Only staff are told about approvals." in refused.content.decode()
    assert "/settings/notifications/" not in browser(owner).get("/").content.decode()
    anonymous = browser(None).get("/settings/notifications/")
    assert anonymous.status_code == 302 and "/accounts/login/" in anonymous["Location"]

    staff.email = ""
    staff.save()
    html = browser(staff).get("/settings/notifications/").content.decode()
    assert re.search(r'<input type="checkbox" id="email-on-approval"[^>]*>', html)
    assert not re.search(r'<input type="checkbox" id="email-on-approval"[^>]*checked', html)
    assert "set an email address in admin" in html
    assert "No approval emails yet." in html
    assert 'data-api="/api/v1/me/notifications/"' in html
    assert 'src="/static/agents_app/notification_settings.mjs"' in html
    # Linked from the navigation (current here) and from the approvals page.
    assert re.search(r'href="/settings/notifications/" aria-current="page">Notifications<', html)
    assert 'href="/settings/notifications/"' in browser(staff).get("/approvals/").content.decode()

    staff.email = "staff@example.com"
    staff.save()
    NotificationPreference.objects.create(user=staff, email_on_approval=True)
    request = ApprovalRequest.objects.create(
        session=session, interrupt_id="turn-1.call_1", tool_call_id="call_1",
        tool_name="slack__post_message", arguments="{}", requested_at=timezone.now(),
    )
    ApprovalNotification.objects.create(request=request, user=staff, kind="requested",
                                        sent_at=timezone.now())
    ApprovalNotification.objects.create(request=request, user=staff, kind="reminder",
                                        last_error="SMTPServerDisconnected: gone")
    ApprovalNotification.objects.create(request=request, user=owner, kind="requested")
    html = browser(staff).get("/settings/notifications/").content.decode()
    assert re.search(r'<input type="checkbox" id="email-on-approval"[^>]*checked', html)
    assert "Emails go to <strong>staff@example.com</strong>." in html
    rows = re.findall(r"<tr>\s*<td data-label=\"Time\">.*?</tr>", html, re.S)
    assert len(rows) == 2  # the owner's notification is not listed
    texts = [re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", row)).strip() for row in rows]
    assert "Reminder slack__post_message Owned chat Failed SMTPServerDisconnected: gone" in (
        texts[0]
    )
    assert "Approval needed slack__post_message Owned chat Sent" in texts[1]
    assert f'href="/sessions/{session.id}/#call-call_1"' in rows[1]
