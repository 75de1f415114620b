"""``manage.py mcp_discover [NAME] [--json]``: discover tools now and print the catalogue.

Connects to each enabled server (or to NAME, enabled or not), stores what it lists
(``services.server_discover_tools``) and prints each tool's exposed name, effect and
approval, and why. A server that fails is reported with the real reason (for a stdio
server that cannot start, the last lines of its stderr) and keeps its last good catalogue
when it had one; the command then exits with status 1 after reporting every server. With
``--json`` each entry is ``{"server", "error", "catalogue_kept", "tools"}``.
"""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from mcp_registry.models import McpServer, McpTool
from mcp_registry.services import ToolDiscoveryError, server_discover_tools


def tool_describe(tool: McpTool) -> dict[str, Any]:
    """The printed shape of one tool: ``{"exposed_name", "server", "tool", "available",
    "enabled", "effect", "effect_reason", "requires_approval", "approval_reason",
    "quarantine_reason"}``."""
    effect = tool.effect_decision
    approval = tool.approval_decision
    return {
        "exposed_name": tool.exposed_name,
        "server": tool.server.name,
        "tool": tool.name,
        "available": tool.available,
        "enabled": tool.enabled,
        "effect": str(effect.value),
        "effect_reason": effect.reason,
        "requires_approval": bool(approval.value),
        "approval_reason": approval.reason,
        "quarantine_reason": tool.quarantine_reason,
    }


class Command(BaseCommand):
    help = "Discover the tools of MCP servers now and print exposed name, effect and approval."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", nargs="?", help="Only this server (enabled or not).")
        parser.add_argument("--json", action="store_true", help="Print JSON.")

    def handle(self, *args: Any, **options: Any) -> None:
        if options["name"]:
            servers = list(McpServer.objects.filter(name=options["name"]))
            if not servers:
                raise CommandError(f"No MCP server is called {options['name']!r}.")
        else:
            servers = list(McpServer.objects.filter(enabled=True).order_by("name"))
        report: list[dict[str, Any]] = []
        failed = False
        for server in servers:
            error = ""
            had_catalogue = server.last_discovered_at is not None
            try:
                server_discover_tools(server=server)
            except ToolDiscoveryError as failure:
                error, failed = str(failure), True
            tools = McpTool.objects.select_related("server").filter(server=server)
            report.append(
                {
                    "server": server.name,
                    "error": error,
                    "catalogue_kept": bool(error) and had_catalogue,
                    "tools": [tool_describe(tool) for tool in tools.order_by("name")],
                }
            )
        if options["json"]:
            self.stdout.write(json.dumps(report, indent=2))
        else:
            self._print(report)
        if failed:
            raise CommandError("Discovery failed for at least one server (see above).")

    def _print(self, report: list[dict[str, Any]]) -> None:
        for entry in report:
            status = "ok"
            if entry["error"]:
                kept = (
                    "last good catalogue kept"
                    if entry["catalogue_kept"]
                    else "no catalogue: discovery never succeeded"
                )
                error = entry["error"].replace("\n", "\n    ")
                status = f"ERROR ({kept}) {error}"
            self.stdout.write(f"{entry['server']}: {status}")
            for tool in entry["tools"]:
                if tool["quarantine_reason"]:
                    state = f"QUARANTINED: {tool['quarantine_reason']}"
                elif not tool["available"]:
                    state = "not listed"
                elif not tool["enabled"]:
                    state = "disabled"
                else:
                    approval = "approval" if tool["requires_approval"] else "no approval"
                    state = (
                        f"{tool['effect']} ({tool['effect_reason']}); "
                        f"{approval} ({tool['approval_reason']})"
                    )
                self.stdout.write(f"  {tool['exposed_name']}  {state}")
