"""Django set-up shared by the benchmarks that drive the platform's own stack."""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def django_setup(root: Path) -> None:
    """Set up Django in this process with its var dir under ``root`` (a bench's temporary
    directory), so the bench uses the platform's code (the Flow, the SDK client) but none of
    the checkout's state; LiteLLM is told to stay offline before anything imports it."""
    os.environ.setdefault("DEXAGENTS_VAR_DIR", str(root / "bench-var"))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dexagents_site.settings")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
    sys.path.insert(0, str(REPO))
    import django

    django.setup()
