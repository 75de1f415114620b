"""The platform the page tests run against: ``manage.py dev`` (engine, worker, web, Celery and
the demo model as processes on private ports and a private var dir) with the personas
``owner``, ``intruder``, ``reviewer`` (staff) and the seeded ``demo``, started once per test run
(``page_stack``), and the page modules' fixtures on it: ``stack`` (the same stack, module scope)
and ``contexts`` (browser contexts, one per person). All three are registered in
``tests/e2e/conftest.py``, so a page module takes them by name without importing them."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, BrowserContext, Page

from dex_agents.testing import free_port
from tests.e2e.browser import WIDE, log_in
from tests.e2e.conftest import PYTHON, ROOT, Ports, Processes, platform_env

PASSWORD = "browser-test-password-1"

USERS_CODE = """
from django.contrib.auth import get_user_model
from agents_app.services.api_tokens import api_token_create
User = get_user_model()
tokens = {}
for name, staff in (("owner", False), ("intruder", False), ("reviewer", True)):
    user, _ = User.objects.get_or_create(username=name)
    user.is_staff = staff
    user.set_password(PASSWORD)
    user.save()
    tokens[name] = api_token_create(user=user, name="browser test")[1]
demo = User.objects.get(username="demo")
tokens["demo"] = api_token_create(user=demo, name="browser test")[1]
import datetime
import json
print(json.dumps(tokens))
""".replace("PASSWORD", repr(PASSWORD))


@dataclass
class PageStack:
    """The running platform: its URL, the demo password and API tokens per persona."""

    base_url: str
    demo_password: str
    tokens: dict[str, str]
    env: dict[str, str]
    admin_password: str = ""

    def shell(self, code: str) -> Any:
        """Run ``code`` in ``manage.py shell`` on the stack's database; it prints one JSON
        line last, which is returned decoded."""
        done = subprocess.run(
            [PYTHON, "manage.py", "shell", "-c", code],
            cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.strip().splitlines()[-1])

    def api(self, persona: str) -> httpx.Client:
        return httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Token {self.tokens[persona]}"},
            timeout=30,
        )

    def ws_url(self, session_id: str) -> str:
        return self.base_url.replace("http://", "ws://") + f"/ws/sessions/{session_id}/events/"


@pytest.fixture(scope="session")
def page_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageStack]:
    """``manage.py dev`` (what ``make run`` runs) on private ports, plus the personas; one
    for the whole run (per xdist worker), shared by every page module: starting it costs
    about 15 s. Tests scope what they assert to the sessions they start."""
    root = tmp_path_factory.mktemp("pages")
    var = root / "var"
    var.mkdir()
    web = free_port()
    env = platform_env(
        var, Ports(web=web, engine=free_port(), model=free_port()),
        # ``manage.py dev`` generates both and prints them, which the fixture reads.
        leave_out={"DEXAGENTS_DEMO_PASSWORD", "DEXAGENTS_ADMIN_PASSWORD"},
        # Webhooks registered in admin may call a receiver of the test process on the
        # loopback address (``tests/webhook_receiver.py``); the refusal of such URLs is
        # tested without the stack (``tests/agents_app/test_admin.py``).
        extra={"DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE": "true"},
    )
    processes = Processes(env)
    try:
        dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(web)])
        dev.wait_for_line("dexagents is ready at", timeout=180)
        demo_line = dev.wait_for_line("Demo login: demo / ")
        demo_password = demo_line.split("Demo login: demo / ", 1)[1].split(" ", 1)[0]
        admin_line = dev.wait_for_line("Admin login: admin / ")
        admin_password = admin_line.split("Admin login: admin / ", 1)[1].split(" ", 1)[0]
        done = subprocess.run(
            [PYTHON, "manage.py", "shell", "-c", USERS_CODE],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        tokens = json.loads(done.stdout.strip().splitlines()[-1])
        yield PageStack(f"http://127.0.0.1:{web}", demo_password, tokens, env, admin_password)
    finally:
        processes.stop_all()


@pytest.fixture(scope="module")
def stack(page_stack: PageStack) -> PageStack:
    """The page tests' platform: one ``manage.py dev`` stack shared by every page module
    (``page_stack``). A module that runs its own platform defines its own ``stack``."""
    return page_stack


class Contexts:
    """Browser contexts (separate cookie jars, like separate people) closed after a test."""

    def __init__(self, browser: Browser, stack: PageStack) -> None:
        self.browser = browser
        self.stack = stack
        self.opened: list[BrowserContext] = []
        self.errors: list[str] = []

    def new(self, viewport: dict[str, int] | None = None) -> BrowserContext:
        context = self.browser.new_context(base_url=self.stack.base_url,
                                           viewport=viewport or WIDE)  # type: ignore[arg-type]
        context.on("weberror", lambda error: self.errors.append(str(error.error)))
        self.opened.append(context)
        return context

    def logged_in(self, username: str, password: str = PASSWORD,
                  viewport: dict[str, int] | None = None) -> Page:
        page = self.new(viewport).new_page()
        log_in(page, username, password)
        return page

    def close(self) -> None:
        for context in self.opened:
            context.close()


@pytest.fixture
def contexts(browser: Browser, stack: PageStack) -> Iterator[Contexts]:
    """Contexts on ``stack``; after the test they are closed and it fails if any page had an
    uncaught exception."""
    opened = Contexts(browser, stack)
    yield opened
    opened.close()
    assert not opened.errors, opened.errors  # no uncaught exception in any page module
