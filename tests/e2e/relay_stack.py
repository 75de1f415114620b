"""The platform as real processes for the websocket relay's tests and ``bench/relay.py``.

``start_stack`` (or ``running_stack``, which also stops it) copies a freshly migrated database
(``Processes.migrate``), starts the embedded engine, the demo model, ``manage.py dexworker``, a
Celery worker and uvicorn serving ``dexagents_site.asgi``, seeds the demo agent and creates the
personas (owner, other, staff: API tokens and logged-in session cookies) while they start, and
waits for each one's ready line.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from dex_agents.testing import free_port
from tests.e2e.conftest import (
    DEMO_MODEL_READY,
    ENGINE_READY,
    PYTHON,
    Ports,
    Proc,
    Processes,
    platform_env,
    wait_until,
)

# Seeds the demo agent (``seed_demo``, as ``manage.py dev`` does) and creates the personas in
# one Django process: each ``manage.py`` start costs seconds on a loaded CI machine.
PERSONAS_CODE = """
import json
from django.core.management import call_command
call_command("seed_demo")
from django.contrib.auth import get_user_model
from django.test import Client
from agents_app.services.api_tokens import api_token_create
User = get_user_model()
out = {}
for name, staff in (("owner", False), ("other", False), ("staff", True)):
    user, _ = User.objects.get_or_create(username=name, defaults={"is_staff": staff})
    client = Client()
    client.force_login(user)
    out[name] = {"token": api_token_create(user=user, name="e2e")[1],
                 "cookie": client.cookies["sessionid"].value}
print(json.dumps(out))
"""


@dataclass(frozen=True)
class Persona:
    """A user of the stack: an API token key and a logged-in ``sessionid`` cookie."""

    name: str
    token: str
    cookie: str

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}


@dataclass
class Stack:
    """A running platform; ``processes.stop_all()`` ends it."""

    processes: Processes
    env: dict[str, str]
    web_port: int
    engine_port: int
    model_port: int
    personas: dict[str, Persona] = field(default_factory=dict)
    web: Proc = field(init=False)
    engine: Proc = field(init=False)

    @property
    def engine_address(self) -> str:
        return f"127.0.0.1:{self.engine_port}"

    def base_url(self, port: int | None = None) -> str:
        return f"http://127.0.0.1:{port or self.web_port}"

    def events_url(self, session_id: str, after: str | None = None,
                   port: int | None = None) -> str:
        url = f"ws://127.0.0.1:{port or self.web_port}/ws/sessions/{session_id}/events/"
        return url if after is None else f"{url}?after={after}"

    def api(self, persona: str = "owner") -> httpx.Client:
        return httpx.Client(base_url=self.base_url(),
                            headers=self.personas[persona].bearer(), timeout=30)

    @contextlib.contextmanager
    def persona_clients(
        self,
    ) -> Iterator[tuple[httpx.Client, httpx.Client, httpx.Client, httpx.Client]]:
        """API clients of the permission tests' four personas, in this order: ``owner``,
        ``other``, ``staff`` (each with its bearer token) and anonymous (no credentials);
        closed when the block ends."""
        with (
            self.api("owner") as owner,
            self.api("other") as other,
            self.api("staff") as staff,
            httpx.Client(base_url=self.base_url()) as anonymous,
        ):
            yield owner, other, staff, anonymous

    def held_approvals(self, session_id: str) -> list[dict[str, Any]]:
        """The staff approvals list's pending rows of ``session_id`` that Dex holds too.

        The worker indexes an approval just before the Step that raises it commits (its
        observer hears of it first), so the list can show a row that Dex does not hold yet;
        polling this instead waits until the approval really waits in Dex.
        """
        with self.api("staff") as staff:
            listed = [item for item in staff.get("/api/v1/approvals/").json()
                      if item["session"] == session_id and item["state"] == "pending"]
            if not listed:
                return []
            detail = staff.get(f"/api/v1/sessions/{session_id}/").json()
        held = {item["interrupt_id"] for item in detail.get("pending_interrupts", [])}
        return [item for item in listed if item["interrupt_id"] in held]

    def django_shell(self, code: str) -> Any:
        """Run ``code`` in ``manage.py shell`` against this stack's database; it prints one
        JSON line last, which is returned decoded."""
        out = self.processes.run([PYTHON, "manage.py", "shell", "-c", code])
        return json.loads(out.strip().splitlines()[-1])

    def start_engine(self) -> Proc:
        """Start the engine on ``engine_port`` (``Processes.start_engine``), not waiting."""
        self.engine = self.processes.start_engine(self.engine_port, wait=False)
        return self.engine

    def start_web(self, port: int, env: Mapping[str, str] | None = None,
                  name: str = "web") -> Proc:
        """Start one more uvicorn on ``port`` (same database and engine), not waiting.

        ``env`` adds variables for this process only (e.g. smaller send queues).
        """
        argv = [PYTHON, "-m", "uvicorn", "dexagents_site.asgi:application",
                "--host", "127.0.0.1", "--port", str(port), "--no-access-log"]
        shared = self.processes.env
        self.processes.env = {**shared, **(env or {})}
        try:
            return self.processes.start(name, argv)
        finally:
            self.processes.env = shared


def stack_environment(var_dir: Path, *, web_port: int, engine_port: int, model_port: int,
                      extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment of an isolated platform (``platform_env``) for the relay's stacks, with
    ``extra`` on top."""
    ports = Ports(web=web_port, engine=engine_port, model=model_port)
    return platform_env(var_dir, ports, extra={
        # The tests read the web process's INFO lines (relay started / ended).
        "LOG_LEVEL": "INFO",
        # One persona drives many sessions at once here (tests, bench.scale, bench.rest);
        # the rate limits have their own tests (tests/agents_app/api/test_throttling.py).
        "DEXAGENTS_THROTTLE_READS": "off",
        "DEXAGENTS_THROTTLE_WRITES": "off",
        "DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER": "0",
        **(extra or {}),
    })


def start_stack(root: Path, *, extra_env: Mapping[str, str] | None = None,
                worker_slots: int = 32) -> Stack:
    """Start a whole platform under ``root`` and return it once every part is ready.

    The caller stops it with ``stack.processes.stop_all()`` (also on failure).
    """
    var_dir = root / "var"
    var_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(processes=Processes({}), env={}, web_port=free_port(),
                  engine_port=free_port(), model_port=free_port())
    stack.env = stack_environment(var_dir, web_port=stack.web_port,
                                  engine_port=stack.engine_port, model_port=stack.model_port,
                                  extra=extra_env)
    stack.processes = Processes(stack.env)
    processes = stack.processes
    try:
        processes.migrate()
        engine = stack.start_engine()
        model = processes.start_demo_model(stack.model_port, wait=False)
        worker = processes.start("worker", [PYTHON, "manage.py", "dexworker",
                                            "--max-concurrent-tasks", str(worker_slots)])
        # As in production, a Celery worker delivers what the outbox kept (a message sent
        # while the Dex worker was slow to answer on a loaded machine would otherwise wait).
        celery = processes.start("celery", [
            PYTHON, "-m", "celery", "-A", "dexagents_site", "worker", "--pool=solo",
            "--loglevel=INFO", "--without-mingle", "--without-gossip",
            "-n", f"stack-{stack.web_port}@%h"])
        stack.web = stack.start_web(stack.web_port)
        # While the processes start (the dexworker's LiteLLM warm-up is the longest part):
        # one more Django process, seconds on a loaded machine, which ran before any of them.
        # SQLite in WAL mode with a busy timeout takes its writes beside theirs, as under
        # `manage.py dev`.
        out = processes.run([PYTHON, "manage.py", "shell", "-c", PERSONAS_CODE])
        stack.personas = {
            name: Persona(name, data["token"], data["cookie"])
            for name, data in json.loads(out.strip().splitlines()[-1]).items()
        }
        engine.wait_for_line(ENGINE_READY)
        model.wait_for_line(DEMO_MODEL_READY)
        worker.wait_for_line("dexworker ready")
        stack.web.wait_for_line("Application startup complete")
        celery.wait_for_line(" ready.")
    except BaseException:
        processes.stop_all()
        raise
    return stack


@contextlib.contextmanager
def running_stack(root: Path, *, extra_env: Mapping[str, str] | None = None,
                  worker_slots: int = 32) -> Iterator[Stack]:
    """``start_stack``, stopped again when the block ends (also on failure)."""
    stack = start_stack(root, extra_env=extra_env, worker_slots=worker_slots)
    try:
        yield stack
    finally:
        stack.processes.stop_all()


def busy_session(stack: Stack, message: str, *, timeout: float = 60.0
                 ) -> tuple[str, dict[str, Any]]:
    """Start an ``owner`` session of the demo agent with ``message`` (a ``/tool`` call of a
    write, which waits for approval) and return its ID and its row of the staff approvals
    list (``/api/v1/approvals/``) once the row is there: the session stays busy until the
    call is decided.

    Raises:
        AssertionError: the session was not created (201), or not listed within ``timeout``
            seconds.
    """
    with stack.api("owner") as owner, stack.api("staff") as staff:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
        assert created.status_code == 201, created.text
        session_id = str(created.json()["id"])
        pending = wait_until(
            "the approval to be pending",
            lambda: [
                item for item in staff.get("/api/v1/approvals/").json()
                if item["session"] == session_id
            ],
            timeout=timeout,
        )
    return session_id, dict(pending[0])


@contextlib.asynccontextmanager
async def dex_client(address: str, capacity_bytes: int = 1 << 30
                     ) -> AsyncIterator[tuple[Any, Any]]:
    """A Dex ``AsyncClient`` of the platform's Flow for this test process, and the Flow.

    Its AgentEvents Stream writes with a ``capacity_bytes`` budget: by default 1 GiB, so the
    test's own writes never trim; a small one trims the flow type's oldest events on write.
    """
    from dex import AsyncClient, BlobCacheConfig, ClientOptions, Registry, open_blob_cache

    from agents_app.worker.runner import LiteLLMRunner
    from dex_agents import AgentSessionFlow, AgentSessionOptions

    async def no_servers(name: str) -> Any:
        raise LookupError(name)

    flow = AgentSessionFlow(LiteLLMRunner(no_servers), flow_type="AgentSession",
                            options=AgentSessionOptions(agent_events_capacity_bytes=capacity_bytes))
    with tempfile.TemporaryDirectory() as cache_dir:
        client = AsyncClient(Registry([flow], allow_async_handlers=True),
                             open_blob_cache(BlobCacheConfig(cache_dir, 8 * 1024 * 1024)),
                             ClientOptions(server_address=address))
        try:
            yield client, flow
        finally:
            await client.close()


async def retained_tokens(client: Any, flow: Any, session_id: str) -> list[str]:
    """Every retained token of ``session_id``'s AgentEvents Stream, oldest first, paged
    with ``client`` (``dex_client``)."""
    tokens: list[str] = []
    page_token = ""
    while True:
        page = await client.list_stream_messages(session_id, flow.agent_events, 1000,
                                                 page_token)
        tokens.extend(message.resume_token for message in page.messages)
        if not page.next_page_token:
            return tokens[::-1]
        page_token = page.next_page_token
