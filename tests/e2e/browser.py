"""Real Chromium for the page tests: Debian's ``chromium`` driven by Playwright.

Playwright cannot download its own browsers here, so it launches the system Chromium through
``executable_path`` (issue 9, "Tests"). ``make test`` installs the Debian package when it is
missing (``make chromium``).

The fixtures ``playwright`` and ``browser`` (one Chromium per test module) are registered in
``tests/e2e/conftest.py`` for every e2e module; the page stack's fixtures sit beside
``page_stack`` in ``tests/e2e/page_stack.py``. The helpers below find what several page
modules look for (an approval card, a decision row) and log in the way each page test does.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Locator, Page, Playwright, expect, sync_playwright

#: Playwright's ``expect`` polls up to this long (ms) in every e2e module: the stacks run on a
#: loaded 2-core machine, where its 5 s default is too short for a turn to show.
expect.set_options(timeout=30_000)

ROOT = Path(__file__).resolve().parents[2]
#: Where the page tests save their screenshots.
SCREENSHOTS = Path(os.environ.get("DEXAGENTS_SCREENSHOT_DIR", ROOT / "var" / "screenshots"))

#: The two widths every page is checked at: a desktop and a phone (CSS pixels).
WIDE = {"width": 1280, "height": 900}
NARROW = {"width": 390, "height": 844}
#: Runs a test once per width, as its ``viewport`` argument (ids ``desktop`` and ``phone``).
VIEWPORTS = pytest.mark.parametrize("viewport", [WIDE, NARROW], ids=["desktop", "phone"])

# Flags for a headless Chromium in a container: no sandbox (root, no user namespaces), no
# GPU, and nothing that phones home or updates itself during a test.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
]

CHROMIUM_CANDIDATES = ("chromium", "chromium-browser")
MISSING_CHROMIUM = "Chromium is missing: install Debian's package (apt-get install chromium)."


def chromium_path() -> str | None:
    """The Chromium executable: ``$DEXAGENTS_CHROMIUM``, else ``chromium`` on ``PATH``."""
    configured = os.environ.get("DEXAGENTS_CHROMIUM", "")
    if configured:
        return configured if Path(configured).exists() else None
    for name in CHROMIUM_CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    """Playwright's driver, started once per test module."""
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Headless Chromium (``chromium_path()``), launched once per test module; the test fails
    with ``MISSING_CHROMIUM`` when there is none."""
    executable = chromium_path()
    if executable is None:
        pytest.fail(MISSING_CHROMIUM)
    launched = playwright.chromium.launch(executable_path=executable, headless=True,
                                          args=CHROMIUM_ARGS)
    yield launched
    launched.close()


def log_in(page: Page, username: str, password: str) -> None:
    """Log ``page`` in through the login form and wait for the portal."""
    page.goto("/accounts/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Start a session")).to_be_visible()


def log_in_to_admin(page: Page, password: str) -> None:
    """Log ``page`` in to Django admin as the superuser ``admin`` and wait for its index."""
    page.goto("/admin/login/")
    page.get_by_label("Username").fill("admin")
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Site administration")).to_be_visible()


def _linking(page: Page, rows: str, session_id: str) -> Locator:
    return page.locator(rows).filter(has=page.locator(f'a[href="/sessions/{session_id}/"]'))


def approval_card(page: Page, session_id: str) -> Locator:
    """The approvals inbox's card of ``session_id``'s call (the card that links to it)."""
    return _linking(page, ".approval-card", session_id)


def decision_row(page: Page, session_id: str) -> Locator:
    """The row of the approvals inbox's Decisions tab that links to ``session_id``."""
    return _linking(page, "#decisions-body tr", session_id)


#: axe-core, installed with the test peers (``tests/peers``, ``npm ci``).
AXE_SCRIPT = (
    Path(__file__).resolve().parents[1] / "peers" / "node_modules" / "axe-core" / "axe.min.js"
)
MISSING_AXE = "axe-core is missing: run npm ci in tests/peers."


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """Run axe-core on what ``page`` (a Playwright ``Page``) shows now; its violations as
    ``[{"id", "impact", "help", "targets": [CSS selectors]}]`` (axe-core's ``violations``).

    Raises:
        FileNotFoundError: axe-core is not installed (``MISSING_AXE``).
    """
    if not AXE_SCRIPT.exists():
        raise FileNotFoundError(MISSING_AXE)
    if not page.evaluate("typeof window.axe === 'object'"):
        # Evaluated through the DevTools protocol, which the pages' Content-Security-Policy
        # (no inline scripts) does not apply to; a <script> tag it would refuse.
        page.evaluate(AXE_SCRIPT.read_text(encoding="utf-8") + "\n;undefined")
    found = page.evaluate(
        """async () => (await window.axe.run(document)).violations.map((item) => ({
            id: item.id,
            impact: item.impact,
            help: item.help,
            targets: item.nodes.map((node) => node.target.join(" ")),
        }))"""
    )
    return list(found)


def serious_axe_violations(page: Page) -> list[dict[str, Any]]:
    """``axe_violations(page)`` whose impact is serious or critical."""
    return [item for item in axe_violations(page) if item["impact"] in ("serious", "critical")]


#: Layout checks for phone width, run with ``Locator.evaluate`` on a container: each returns a
#: list of what is wrong (empty when nothing is).
#:
#: ``BADGES_ON_ONE_LINE``: every shown badge (``.badge``, ``.status``) in the container is one
#: line tall and as wide as its text (not wrapped inside itself, not stretched to a bar).
BADGES_ON_ONE_LINE = """(root) => [...root.querySelectorAll(".badge, .status")]
  .filter((badge) => badge.getClientRects().length > 0 && badge.textContent.trim())
  .flatMap((badge) => {
    const style = getComputedStyle(badge);
    const line = parseFloat(style.lineHeight) || parseFloat(style.fontSize) * 1.5;
    const box = badge.getBoundingClientRect();
    const range = document.createRange();
    range.selectNodeContents(badge);
    const text = range.getBoundingClientRect();
    const sides = ["Left", "Right"].reduce((sum, side) => sum + parseFloat(style[`padding${side}`])
      + parseFloat(style[`border${side}Width`]), 0);
    const name = badge.textContent.trim();
    const problems = [];
    if (box.height > line * 1.5) problems.push(`${name}: ${box.height} px tall`);
    if (box.width > text.width + sides + 4) problems.push(`${name}: stretched to ${box.width} px`);
    return problems;
  })"""

#: ``NOTHING_UNDER_THE_LABELS``: a table shown as stacked cards (a phone's sessions list,
#: decisions, emails: each cell a grid of its ``data-label`` and its value) keeps every part of
#: every cell in the value column, none under the label.
NOTHING_UNDER_THE_LABELS = """(table) => [...table.querySelectorAll("tbody td[data-label]")]
  .filter((cell) => cell.getClientRects().length > 0)
  .flatMap((cell) => {
    const style = getComputedStyle(cell);
    if (style.display !== "grid") return [`${cell.dataset.label}: not stacked (${style.display})`];
    const valueLeft = cell.getBoundingClientRect().left
      + parseFloat(style.gridTemplateColumns.split(" ")[0]) + parseFloat(style.columnGap) - 1;
    return [...cell.childNodes].flatMap((part) => {
      let box;
      if (part.nodeType === Node.ELEMENT_NODE) box = part.getBoundingClientRect();
      else if (part.nodeType === Node.TEXT_NODE && part.textContent.trim()) {
        const range = document.createRange();
        range.selectNodeContents(part);
        box = range.getBoundingClientRect();
      }
      if (!box || box.width === 0 || box.left >= valueLeft) return [];
      return [`${cell.dataset.label}: "${part.textContent.trim().slice(0, 40)}" under the label`];
    });
  })"""
