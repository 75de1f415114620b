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
