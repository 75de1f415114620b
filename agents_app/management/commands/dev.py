"""``python manage.py dev``: the whole platform in one command (what ``make run`` calls)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from io import StringIO
from typing import Any

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser

from agents_app.conf import dexagents_setting, dexagents_settings
from agents_app.devstack import ChildSpec, DevStack, StackStartError
from mcp_registry.services import servers_discovery_enqueue

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


class Command(BaseCommand):
    help = (
        "Migrate, create the demo data (and import DEXAGENTS_MCP_CONFIG when set), then run "
        "the Dex engine, the demo model, the Dex worker, a Celery worker, Celery beat and the "
        "ASGI web server as supervised processes."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--port", type=int, default=dexagents_setting("WEB_PORT"))
        parser.add_argument("--host", default="127.0.0.1")

    def handle(self, *args: Any, **options: Any) -> None:
        host: str = options["host"]
        port: int = options["port"]
        # The stack serves plain HTTP: cookies marked Secure (the default without DEBUG) would
        # never come back, so the children mark them Secure only when told to.
        for name in ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE"):
            os.environ.setdefault(name, "false")
        call_command("migrate", interactive=False, verbosity=0)
        seeded = StringIO()
        call_command("seed_demo", stdout=seeded)
        admin_login = [line for line in seeded.getvalue().splitlines()
                       if line.startswith("Admin login:")]
        demo_login = [line for line in seeded.getvalue().splitlines()
                      if line.startswith("Demo login:")]
        if os.environ.get("DEXAGENTS_MCP_CONFIG"):
            call_command("mcp_import", stdout=self.stdout)
        # Discovery runs in the Celery worker; the broker holds the messages until it starts.
        discovering = servers_discovery_enqueue()
        token_out = StringIO()
        # Keys are stored hashed, so each start makes a fresh demo token (and revokes the one
        # the previous start printed) to print it here.
        call_command(
            "createtoken", "demo", "--name", "make run", "--replace", stdout=token_out,
            stderr=StringIO(),
        )
        token = token_out.getvalue().strip().splitlines()[-1]

        def announce() -> None:
            url = f"http://{host}:{port}"
            self.stdout.write(f"dexagents is ready at {url}")
            for line in demo_login:
                self.stdout.write(f"{line} Log in at {url}/accounts/login/")
            self.stdout.write(f"API token for the demo user: {token}")
            if discovering:
                self.stdout.write("Discovering the tools of: " + ", ".join(discovering))
            for line in admin_login:
                self.stdout.write(f"{line} Django admin: {url}/admin/")
            if host not in _LOOPBACK_HOSTS and not os.environ.get("ALLOWED_HOSTS"):
                self.stdout.write(
                    "Set ALLOWED_HOSTS to the names clients use for this machine: only "
                    "localhost names are accepted now (DEBUG is off)."
                )
            self.stdout.write(
                f"Try: curl -s -X POST {url}/api/v1/sessions/ "
                f'-H "Authorization: Bearer {token}" -H "Content-Type: application/json" '
                '-d \'{"agent": "demo", "message": "hello"}\''
            )
            self.stdout.flush()

        stack = DevStack(self._child_specs(host, port), cwd=str(settings.BASE_DIR),
                         out=sys.stdout, on_ready=announce)
        try:
            asyncio.run(self._serve(stack))
        except StackStartError as error:
            self.stderr.write(f"dexagents could not start: {error}")
            sys.exit(1)
        self.stdout.write("dexagents stopped")

    async def _serve(self, stack: DevStack) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stack.request_stop)
        await stack.run()

    def _child_specs(self, host: str, port: int) -> list[ChildSpec]:
        python = sys.executable
        knobs = dexagents_settings()
        specs: list[ChildSpec] = []
        if knobs["EMBEDDED_ENGINE"]:
            specs.append(ChildSpec(
                name="engine",
                argv=[python, "-m", "dex_dev_server", "--host", "127.0.0.1",
                      "--port", str(knobs["DEX_PORT"]), "--db", str(knobs["DEX_DB_PATH"])],
                ready_marker="dex_dev_server ready on",
            ))
        specs += [
            ChildSpec(
                name="model",
                argv=[python, "-m", "agents_app.demo_model", "--host", "127.0.0.1",
                      "--port", str(knobs["DEMO_MODEL_PORT"])],
                ready_marker="demo model ready on",
            ),
            ChildSpec(
                name="worker",
                argv=[python, "manage.py", "dexworker"],
                ready_marker="dexworker ready",
            ),
            ChildSpec(
                name="celery",
                argv=[python, "-m", "celery", "-A", "dexagents_site", "worker",
                      "--pool=solo", "--loglevel=INFO", "--without-mingle",
                      "--without-gossip", "-n", f"dexagents-{os.getpid()}@%h"],
                ready_marker=" ready.",
            ),
            ChildSpec(
                name="beat",
                argv=[python, "-m", "celery", "-A", "dexagents_site", "beat",
                      "--loglevel=INFO", "--pidfile="],
                ready_marker="beat: Starting...",
            ),
            ChildSpec(
                name="web",
                argv=[python, "-m", "uvicorn", "dexagents_site.asgi:application",
                      "--host", host, "--port", str(port), "--no-access-log"],
                ready_marker="Application startup complete",
            ),
        ]
        return specs
