"""``manage.py seed_demo``: create the demo MCP server, tool, agent and users when missing.

Safe to run on every start: existing rows are left as they are. A generated password is
printed once, when the admin is created without ``DEXAGENTS_ADMIN_PASSWORD`` ("Admin login:")
or the demo user gets its password without ``DEXAGENTS_DEMO_PASSWORD`` ("Demo login:").
"""

from typing import Any

from django.core.management.base import BaseCommand

from agents_app.demo.seed import (
    ADMIN_PASSWORD_ENV,
    ADMIN_USERNAME,
    DEMO_PASSWORD_ENV,
    DEMO_USERNAME,
    demo_seed,
)


class Command(BaseCommand):
    help = "Create the demo MCP server, the demo agent, the demo user and an admin if missing."

    def handle(self, *args: Any, **options: Any) -> None:
        result = demo_seed()
        if not result.created:
            self.stdout.write("Demo data already present; nothing created.")
        for name in result.created:
            self.stdout.write(f"Created {name}.")
        if result.admin_password is not None:
            self.stdout.write(
                f"Admin login: {ADMIN_USERNAME} / {result.admin_password} "
                f"(set {ADMIN_PASSWORD_ENV} to choose it; shown only now)."
            )
        if result.demo_password is not None:
            self.stdout.write(
                f"Demo login: {DEMO_USERNAME} / {result.demo_password} "
                f"(set {DEMO_PASSWORD_ENV} to choose it; shown only now)."
            )
