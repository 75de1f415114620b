"""Real Chromium for the page tests: Debian's ``chromium`` driven by Playwright.

Playwright cannot download its own browsers here, so it launches the system Chromium through
``executable_path`` (issue 9, "Tests"). ``make test`` installs the Debian package when it is
missing (``make chromium``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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
