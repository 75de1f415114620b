"""Real Chromium for the page tests: Debian's ``chromium`` driven by Playwright.

Playwright cannot download its own browsers here, so it launches the system Chromium through
``executable_path`` (issue 9, "Tests"). ``make test`` installs the Debian package when it is
missing (``make chromium``).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

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
