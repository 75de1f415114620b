"""``manage.py mcp_import [FILE]``: create or update MCP servers from a YAML declaration.

FILE defaults to ``$DEXAGENTS_MCP_CONFIG``; the format is in ``mcp_registry.config``. The
import is all or nothing, importing the same file twice changes nothing, and discovery is
queued for every created or changed enabled server once the import is committed (printed as
``Discovery queued for: NAME, ...``; ``--no-discover`` leaves it to the periodic run). A
stdio command that is neither on PATH nor an existing file (or a missing working directory) is
imported with a warning on stderr.
"""

import os
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcp_registry.config import CONFIG_ENV_VAR, McpConfigError, mcp_config_parse
from mcp_registry.services import ServersImportError, servers_import


class Command(BaseCommand):
    help = f"Import MCP servers from a YAML file (default: ${CONFIG_ENV_VAR})."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("file", nargs="?", help=f"YAML file; default ${CONFIG_ENV_VAR}.")
        parser.add_argument(
            "--no-discover", action="store_true", help="Do not queue tool discovery."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        path = options["file"] or os.environ.get(CONFIG_ENV_VAR, "")
        if not path:
            raise CommandError(f"Give a FILE or set {CONFIG_ENV_VAR}.")
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as error:
            raise CommandError(f"Cannot read {path}: {error.strerror or error}") from error
        try:
            declarations = mcp_config_parse(text)
            result = servers_import(
                declarations=declarations, discover=not options["no_discover"]
            )
        except (McpConfigError, ServersImportError) as error:
            raise CommandError(f"{path}: {error}. Nothing was imported.") from error
        for label, names in (
            ("Created", result.created),
            ("Updated", result.updated),
            ("Unchanged", result.unchanged),
        ):
            if names:
                self.stdout.write(f"{label}: {', '.join(names)}")
        if not (result.created or result.updated or result.unchanged):
            self.stdout.write("No servers declared.")
        if result.discovery_queued:
            self.stdout.write(
                f"Discovery queued for: {', '.join(result.discovery_queued)} (it runs in the "
                "background once the import is saved)"
            )
        for warning in result.warnings:
            self.stderr.write(f"Warning: {warning}.")
