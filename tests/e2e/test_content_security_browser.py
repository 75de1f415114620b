"""Every page under the Content-Security-Policy, in real Chromium against the real stack
(the shared ``manage.py dev`` of ``page_stack``): a page that needed an inline script
or style, or a file from another host, would be reported here.

Violations are collected two ways: the console messages Chromium writes ("Refused to ...
because it violates the following Content Security Policy directive") and the page's
``securitypolicyviolation`` events, sent to the test through an exposed function so that none
is lost to a navigation. Personas: ``owner``, ``reviewer`` (staff), ``admin`` (the seeded
superuser), anonymous.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from playwright.sync_api import BrowserContext, ConsoleMessage, Page, expect

from tests.e2e.browser import VIEWPORTS, log_in, log_in_to_admin, serious_axe_violations
from tests.e2e.page_stack import Contexts, PageStack
from tests.e2e.test_markdown_browser import MARKDOWN_MESSAGE
from tests.e2e.test_pages_browser import region, start_session

pytestmark = pytest.mark.e2e

REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (event) => {
  window.__cspViolation(JSON.stringify({
    page: location.pathname, directive: event.violatedDirective,
    blocked: event.blockedURI, sample: event.sample,
  }));
});
"""


class Violations:
    """What Chromium reported in the contexts it watches."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.console: list[str] = []

    def watch(self, context: BrowserContext) -> BrowserContext:
        context.expose_function("__cspViolation", self.on_event)
        context.add_init_script(REPORT_VIOLATIONS)
        context.on("console", self.on_console)
        return context

    def on_event(self, event: str) -> None:
        self.events.append(event)

    def on_console(self, message: ConsoleMessage) -> None:
        text = message.text
        if "Content Security Policy" in text or "Content-Security-Policy" in text:
            self.console.append(text)

    def assert_none(self, where: str) -> None:
        assert not self.events, f"{where}: " + "\n".join(self.events)
        assert not self.console, f"{where}: " + "\n".join(self.console)


def visit(page: Page, path: str, ready: Any) -> None:
    """Open ``path``, wait for what shows it works (``ready(page)``), and check it was served
    under the strict policy (or the docs pages' own)."""
    response = page.goto(path)
    assert response is not None, path
    assert response.status == 200, f"{path}: {response.status}"
    policy = response.headers.get("content-security-policy", "")
    assert "default-src 'self'" in policy, f"{path} has no policy: {policy!r}"
    ready(page)
    # Background fetches (the page modules' API calls) have settled too.
    page.wait_for_load_state("networkidle")


def test_every_page_loads_without_a_policy_violation(
    contexts: Contexts, stack: PageStack
) -> None:
    violations = Violations()

    anonymous = violations.watch(contexts.new()).new_page()
    visit(anonymous, "/accounts/login/",
          lambda page: expect(page.get_by_role("button", name="Log in")).to_be_visible())
    violations.assert_none("login")

    owner = violations.watch(contexts.new()).new_page()
    log_in(owner, "owner", "browser-test-password-1")
    visit(owner, "/", lambda page: expect(page.get_by_role("heading", name="Start a session"))
          .to_be_visible())
    # A chat page with everything the modules draw: Markdown with a highlighted code block, a
    # tool call with Copy buttons, and the live websocket (connect-src).
    markdown_id = start_session(owner, MARKDOWN_MESSAGE.replace("/slow 0.25\n", ""))
    expect(owner.locator(".message-assistant .code-block")).to_be_visible()
    waiting_id = start_session(
        owner,
        'check the CSP\n/tool docs__create_document {"title": "CSP", "body": "Pending approval"}',
    )
    expect(region(owner, "Waiting for approval")).to_be_visible()
    for session_id in (markdown_id, waiting_id):
        visit(owner, f"/sessions/{session_id}/",
              lambda page: expect(page.locator("#connection")).to_have_attribute(
                  "data-state", "open"))
        if session_id == markdown_id:
            expect(owner.locator(".message-assistant .hljs-keyword").first).to_be_visible()
    visit(owner, "/sessions/",
          lambda page: expect(page.get_by_role("link", name=re.compile("CSP"))).to_be_visible())
    for docs in ("/api/docs/", "/api/redoc/"):
        visit(owner, docs, lambda page: expect(page.get_by_text("/api/v1/sessions/").first)
              .to_be_visible())
    violations.assert_none("owner's pages")

    staff = violations.watch(contexts.new()).new_page()
    log_in(staff, "reviewer", "browser-test-password-1")
    visit(staff, "/approvals/",
          lambda page: expect(page.locator(".approval-card").first).to_be_visible())
    staff.get_by_role("tab", name="Decisions").click()
    expect(staff.locator("#decisions-status")).not_to_be_empty()
    visit(staff, f"/sessions/{waiting_id}/",
          lambda page: expect(region(page, "Waiting for approval")
                              .get_by_role("button", name="Approve")).to_be_visible())
    # The notification settings save through the API (a PUT with the CSRF token).
    visit(staff, "/settings/notifications/",
          lambda page: expect(page.get_by_role("button", name="Save")).to_be_visible())
    staff.get_by_role("button", name="Save").click()
    expect(staff.locator("#save-state")).to_have_attribute("data-state", "saved")
    violations.assert_none("staff pages")

    admin = violations.watch(contexts.new()).new_page()
    log_in_to_admin(admin, stack.admin_password)
    visit(admin, "/admin/",
          lambda page: expect(page.get_by_role("heading", name="Site administration"))
          .to_be_visible())
    # Pages whose scripts do the most: a changelist with actions and filters, change forms
    # with inlines, and the admin's own theme toggle.
    for path in ("/admin/mcp_registry/mcpserver/", "/admin/mcp_registry/mcpserver/add/",
                 "/admin/agents_app/agentdefinition/", "/admin/mcp_registry/mcptool/",
                 "/admin/auth/user/", "/admin/auth/user/add/"):
        visit(admin, path, lambda page: expect(page.locator("#content")).to_be_visible())
    admin.goto("/admin/agents_app/agentdefinition/")
    admin.locator("#result_list tbody a").first.click()
    expect(admin.get_by_role("button", name="Save", exact=True)).to_be_visible()
    admin.wait_for_load_state("networkidle")
    # The changelist's "select all" checkbox and the action bar are script-driven.
    visit(admin, "/admin/mcp_registry/mcpserver/",
          lambda page: expect(page.locator("#action-toggle")).to_be_visible())
    admin.locator("#action-toggle").check()
    expect(admin.locator(".action-counter")).to_contain_text("selected")
    admin.locator("button.theme-toggle").first.click()
    violations.assert_none("Django admin")

    # The check itself works: an inline script is refused and reported.
    admin.evaluate("""() => {
      const script = document.createElement("script");
      script.textContent = "window.__ran = true";
      document.body.append(script);
    }""")
    assert admin.evaluate("window.__ran") is None
    assert violations.events or violations.console
    directives = [json.loads(event)["directive"] for event in violations.events]
    assert any(directive.startswith("script-src") for directive in directives), directives


@VIEWPORTS
def test_every_page_has_no_serious_accessibility_violation(
    contexts: Contexts, stack: PageStack, viewport: dict[str, int]
) -> None:
    """Issue 27, "Accessibility": axe-core on every page of the product (login, portal, a chat
    with Markdown and a tool call, one waiting for approval, the sessions list, usage, the
    approvals inbox and its decisions, the notification settings) at both widths."""
    found: dict[str, list[dict[str, Any]]] = {}

    def check(page: Page, name: str) -> None:
        page.wait_for_load_state("networkidle")
        violations = serious_axe_violations(page)
        if violations:
            found[name] = violations

    anonymous = contexts.new(viewport).new_page()
    anonymous.goto("/accounts/login/")
    expect(anonymous.get_by_role("button", name="Log in")).to_be_visible()
    check(anonymous, "login")

    owner = contexts.logged_in("owner", viewport=viewport)
    check(owner, "portal")
    answered = start_session(owner, MARKDOWN_MESSAGE.replace("/slow 0.25\n", ""))
    expect(owner.locator(".message-assistant .code-block")).to_be_visible()
    check(owner, "chat with an answer")
    waiting = start_session(
        owner, 'check axe\n/tool docs__create_document {"title": "axe", "body": "Pending"}'
    )
    expect(region(owner, "Waiting for approval")).to_be_visible()
    check(owner, "chat waiting for approval")
    owner.goto("/sessions/")
    expect(owner.get_by_role("link", name=re.compile("check axe")).first).to_be_visible()
    check(owner, "sessions")
    owner.goto("/usage/")
    expect(owner.get_by_role("heading", level=1)).to_be_visible()
    check(owner, "usage")

    staff = contexts.logged_in("reviewer", viewport=viewport)
    staff.goto("/approvals/")
    expect(staff.locator(".approval-card").first).to_be_visible()
    check(staff, "approvals")
    staff.get_by_role("tab", name="Decisions").click()
    expect(staff.locator("#decisions-status")).not_to_be_empty()
    check(staff, "approval decisions")
    staff.goto(f"/sessions/{waiting}/")
    expect(region(staff, "Waiting for approval")).to_be_visible()
    check(staff, "chat as staff")
    staff.goto(f"/sessions/{answered}/")
    staff.get_by_role("tab", name="Timeline").click()
    expect(staff.get_by_role("tabpanel", name="Timeline").locator("[data-step]").first
           ).to_be_visible()
    check(staff, "timeline")
    staff.goto("/settings/notifications/")
    expect(staff.get_by_role("heading", name="Approval emails", exact=True)).to_be_visible()
    check(staff, "notification settings")
    assert found == {}, found
