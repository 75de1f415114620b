#!/usr/bin/env python
"""Django's command-line utility for dexagents."""

import os
import sys


def main() -> None:
    """Run an administrative task with the project's settings."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dexagents_site.settings")
    # LiteLLM fetches a cost map and loads .env files at import time unless told
    # not to (reference/django-notes.md G5); set both before anything imports it.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
    os.environ.setdefault("LITELLM_MODE", "PRODUCTION")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
