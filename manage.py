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
    from django.core.exceptions import ImproperlyConfigured
    from django.core.management import execute_from_command_line

    try:
        execute_from_command_line(sys.argv)
    except ImproperlyConfigured as error:
        # A setting read from the environment is wrong: its message names the variable and
        # what it takes, which a traceback would bury.
        sys.stderr.write(f"dexagents: configuration error: {error}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
