"""``python manage.py dev``: the whole platform in one command (what ``make run`` calls)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from io import StringIO
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandParser
from django.db import DatabaseError
from kombu.exceptions import OperationalError as KombuOperationalError

from agents_app.conf import dexagents_setting, dexagents_settings
from agents_app.dev.devstack import ChildSpec, DevStack, StackStartError
from mcp_registry.services import servers_discovery_enqueue

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
# Connections the kernel queues on the shared socket while no web process accepts (one was
# killed and the others are busy); uvicorn's own default.
_LISTEN_BACKLOG = 2048


def listening_socket(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` once, for every web process to accept from.

    The socket is inheritable so each uvicorn child takes it with ``--fd``; the kernel spreads
    connections over the processes accepting on it, and a restarted process takes the same
    socket, so clients never meet a closed port while one process is down.

    Raises:
        OSError: The address is taken or cannot be bound.
    """
    family, kind, proto, _name, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # uvicorn wraps an inherited descriptor as a Unix socket (``socket.fromfd(fd, AF_UNIX,
    # ...)``), so the event loop never sets TCP_NODELAY on the connections it accepts; they
    # inherit it from the listening socket on Linux. Without it every answer written in two
    # sends waited ~40 ms for the client's delayed ACK on a kept-alive connection.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(address)
    sock.listen(_LISTEN_BACKLOG)
    sock.set_inheritable(True)
    return sock


def _without_credentials(url: str) -> str:
    """``url`` with any user and password removed (``host:port/path``), for printing."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _where(database: dict[str, Any]) -> str:
    """The database's vendor and location with no credentials: ``postgresql host:port/name``."""
    vendor = str(database["ENGINE"]).rsplit(".", 1)[-1]
    if vendor == "sqlite3":
        return f"{vendor} {database['NAME']}"
    return (f"{vendor} {database.get('HOST') or 'localhost'}:{database.get('PORT') or ''}/"
            f"{database.get('NAME')}")


#: The Celery task whose queue the discovery worker consumes (``CELERY_TASK_ROUTES``).
DISCOVERY_TASK = "mcp_registry.discover_server_tools"


def celery_queues() -> tuple[str, str]:
    """``(default queue, discovery queue)`` as settings name them: ``CELERY_TASK_DEFAULT_QUEUE``
    and the queue ``CELERY_TASK_ROUTES`` sends MCP tool discovery to (``("celery",
    "discovery")``).

    Raises:
        KeyError: The settings route no queue for ``DISCOVERY_TASK``.
    """
    return (settings.CELERY_TASK_DEFAULT_QUEUE,
            settings.CELERY_TASK_ROUTES[DISCOVERY_TASK]["queue"])


def celery_worker_argv(*, queue: str, node: str, python: str = sys.executable) -> list[str]:
    """The Celery worker ``manage.py dev`` runs for ``queue`` alone (``-Q``), named ``node``
    (Celery's ``-n``, e.g. ``discovery-41@%h``), with the solo pool: one task at a time.

    One worker per queue keeps a discovery that waits on a hanging MCP server (up to its
    start-up timeout) from delaying the default queue's outbox deliveries.
    """
    return [python, "-m", "celery", "-A", "dexagents_site", "worker", "-Q", queue,
            "--pool=solo", "--loglevel=INFO", "--without-mingle", "--without-gossip",
            "-n", node]


def topology_lines(*, host: str, port: int) -> list[str]:
    """What ``manage.py dev`` runs, one line per part, with no credentials in them.

    Shape: ``["Web: 2 processes on http://127.0.0.1:8000 (one shared socket)", "Dex workers:
    3", "Celery: a worker on queue celery (outbox deliveries, housekeeping), a worker on queue
    discovery (MCP tool discovery), beat", "Engine: embedded at 127.0.0.1:8801", "Database:
    postgresql 127.0.0.1:5432/name", "Redis: redis://127.0.0.1:6379/1 (channel layer, Celery
    broker and results, cache)"]``.
    """
    knobs = settings.DEXAGENTS
    engine = (f"embedded at {knobs['DEX_SERVER_ADDRESS']}" if knobs["EMBEDDED_ENGINE"]
              else f"Dex server at {knobs['DEX_SERVER_ADDRESS']}")
    if settings.REDIS_URL:
        redis = (f"{_without_credentials(settings.REDIS_URL)} (channel layer, Celery broker "
                 "and results, cache)")
    else:
        redis = ("none (in-memory channel layer, filesystem Celery broker under "
                 f"{knobs['VAR_DIR']}/celery, per-process cache)")
    web = knobs["WEB_PROCESSES"]
    default_queue, discovery_queue = celery_queues()
    return [
        f"Web: {web} process{'es' if web > 1 else ''} on http://{host}:{port} "
        "(one shared socket)",
        f"Dex workers: {knobs['WORKERS']}",
        f"Celery: a worker on queue {default_queue} (outbox deliveries, housekeeping), a worker "
        f"on queue {discovery_queue} (MCP tool discovery), beat",
        f"Engine: {engine}",
        f"Database: {_where(settings.DATABASES['default'])}",
        f"Redis: {redis}",
    ]


class Command(BaseCommand):
    help = (
        "Migrate, create the demo data (and import DEXAGENTS_MCP_CONFIG when set), then run "
        "the Dex engine, the demo model, DEXAGENTS_WORKERS Dex workers, a Celery worker, a "
        "Celery worker for MCP tool discovery, Celery beat and DEXAGENTS_WEB_PROCESSES ASGI "
        "web servers as supervised processes."
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
        _prometheus_multiprocess_dir_prepare()
        if not settings.REDIS_URL and (
            dexagents_setting("WEB_PROCESSES") > 1 or dexagents_setting("WORKERS") > 1
        ):
            self.stderr.write(
                "Several processes without REDIS_URL: approval notices do not cross web "
                "processes (dashboards fall back to polling) and Celery uses a filesystem "
                "broker. Set REDIS_URL for the production topology."
            )
        try:
            call_command("migrate", interactive=False, verbosity=0)
        except DatabaseError as error:
            first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
            self.stderr.write(
                f"dexagents could not start: the database ({_where(settings.DATABASES['default'])}"
                f") did not answer: {first_line}"
            )
            sys.exit(1)
        seeded = StringIO()
        call_command("seed_demo", stdout=seeded)
        admin_login = [line for line in seeded.getvalue().splitlines()
                       if line.startswith("Admin login:")]
        demo_login = [line for line in seeded.getvalue().splitlines()
                      if line.startswith("Demo login:")]
        if os.environ.get("DEXAGENTS_MCP_CONFIG"):
            call_command("mcp_import", stdout=self.stdout)
        # Discovery runs in the discovery worker; the broker holds the messages until it starts.
        try:
            discovering = servers_discovery_enqueue()
        except KombuOperationalError as error:
            broker = _without_credentials(settings.REDIS_URL)
            self.stderr.write(
                f"dexagents could not start: the Celery broker ({broker}) did not answer: {error}"
            )
            sys.exit(1)
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
            for line in topology_lines(host=host, port=port):
                self.stdout.write(f"  {line}")
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

        try:
            listener = listening_socket(host, port)
        except OSError as error:
            self.stderr.write(f"dexagents could not start: {host}:{port}: {error}")
            sys.exit(1)
        stack = DevStack(self._child_specs(host, port, listener.fileno()),
                         cwd=str(settings.BASE_DIR), out=sys.stdout, on_ready=announce)
        try:
            asyncio.run(self._serve(stack))
        except StackStartError as error:
            self.stderr.write(f"dexagents could not start: {error}")
            sys.exit(1)
        finally:
            listener.close()
        self.stdout.write("dexagents stopped")

    async def _serve(self, stack: DevStack) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stack.request_stop)
        await stack.run()

    def _child_specs(self, host: str, port: int, listener_fd: int) -> list[ChildSpec]:
        python = sys.executable
        knobs = dexagents_settings()
        specs: list[ChildSpec] = []
        if knobs["EMBEDDED_ENGINE"]:
            specs.append(ChildSpec(
                name="engine",
                argv=[python, "-m", "dex_dev_server", "--host", "127.0.0.1",
                      "--port", str(knobs["DEX_PORT"]), "--db", str(knobs["DEX_DB_PATH"]),
                      "--sync", knobs["ENGINE_SYNC"]],
                ready_marker="dex_dev_server ready on",
                # The demo model needs nothing from the engine: both start at once.
                start_with_next=True,
            ))
        specs += [
            ChildSpec(
                name="model",
                argv=[python, "-m", "agents_app.demo.model_server", "--host", "127.0.0.1",
                      "--port", str(knobs["DEMO_MODEL_PORT"])],
                ready_marker="demo model ready on",
            ),
            # Everything below needs the engine (and the model) up, not each other: they start
            # side by side.
        ]
        specs += [
            ChildSpec(
                name=f"worker-{number}",
                argv=[python, "manage.py", "dexworker"],
                ready_marker="dexworker ready",
                # It loads LiteLLM before its ready line (seconds of CPU, a minute on a
                # heavily loaded 2-core machine), the slowest child to start.
                ready_timeout=180.0,
                start_with_next=True,
            )
            for number in range(1, knobs["WORKERS"] + 1)
        ]
        default_queue, discovery_queue = celery_queues()
        specs += [
            ChildSpec(
                name="celery",
                argv=celery_worker_argv(queue=default_queue, node=f"dexagents-{os.getpid()}@%h",
                                        python=python),
                ready_marker=" ready.",
                start_with_next=True,
            ),
            # MCP tool discovery on a worker of its own: a server that hangs holds it for up
            # to its start-up timeout, and outbox deliveries on the worker above go on.
            ChildSpec(
                name="discovery",
                argv=celery_worker_argv(queue=discovery_queue,
                                        node=f"discovery-{os.getpid()}@%h", python=python),
                ready_marker=" ready.",
                start_with_next=True,
            ),
            ChildSpec(
                name="beat",
                argv=[python, "-m", "celery", "-A", "dexagents_site", "beat",
                      "--loglevel=INFO", "--pidfile="],
                ready_marker="beat: Starting...",
                start_with_next=True,
            ),
        ]
        # Several uvicorn processes accepting on one socket rather than `uvicorn --workers`:
        # each is a child of this supervisor like every other part (named, its output
        # prefixed, restarted with the same backoff when it dies).
        specs += [
            ChildSpec(
                name=f"web-{number}",
                argv=[python, "-m", "uvicorn", "dexagents_site.asgi:application",
                      "--fd", str(listener_fd), "--no-access-log"],
                ready_marker="Application startup complete",
                pass_fds=(listener_fd,),
                start_with_next=True,
            )
            for number in range(1, knobs["WEB_PROCESSES"] + 1)
        ]
        return specs


def _prometheus_multiprocess_dir_prepare() -> None:
    """Point the children at one prometheus_client multiprocess directory, emptied now.

    ``PROMETHEUS_MULTIPROC_DIR`` as given, else ``VAR_DIR/run/prometheus``: every child (web,
    Dex worker, Celery) writes its metrics there and ``/metrics`` sums them
    (``agents_app.metrics``). Values files of a previous run's processes are deleted, as
    prometheus_client requires between runs.
    """
    directory = Path(
        os.environ.get("PROMETHEUS_MULTIPROC_DIR")
        or Path(settings.DEXAGENTS["VAR_DIR"]) / "run" / "prometheus"
    )
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink(missing_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
