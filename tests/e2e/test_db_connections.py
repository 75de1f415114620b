"""A web process on PostgreSQL gives back every database connection that cancelled requests
and dropped websockets used (issue 12, "Web").

Real processes: the embedded engine and one uvicorn serving ``dexagents_site.asgi`` with
``DATABASE_URL`` pointing at a fresh PostgreSQL database (``tests/production_services.py``).
No Dex worker runs, so nothing else connects to that database, and a snapshot read (a Dex
RPC, which needs a worker) stays in flight until ``DEXAGENTS_ENGINE_TIMEOUT``: the requests
this test cancels are mid-await for certain, holding their request's connection. The
websockets' relays long-poll the session's AgentEvents Stream, which needs no worker.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from dex_agents.testing import free_port
from tests.e2e.conftest import PYTHON, Processes, wait_until
from tests.e2e.relay_stack import PERSONAS_CODE, Persona, Stack, stack_environment
from tests.production_services import migrated_postgres_url, postgres_connections, postgres_url

__all__ = ["migrated_postgres_url", "postgres_url"]

pytestmark = pytest.mark.e2e

SOCKETS = 200
REQUESTS = 20
RELAY_STARTED = re.compile(r"Events relay for session \S+ started")


@pytest.fixture
def web_on_postgres(tmp_path: Path, migrated_postgres_url: str) -> Iterator[Stack]:
    """Engine and one web process on ``postgres_url`` (migrated); no worker, no Celery."""
    postgres_url = migrated_postgres_url
    stack = Stack(processes=Processes({}), env={}, web_port=free_port(),
                  engine_port=free_port(), model_port=free_port())
    stack.env = stack_environment(
        tmp_path / "var", web_port=stack.web_port, engine_port=stack.engine_port,
        model_port=stack.model_port,
        # Long enough that the cancelled reads are still waiting when they are dropped.
        extra={"DATABASE_URL": postgres_url, "DEXAGENTS_ENGINE_TIMEOUT": "60",
               # A handshake lookup stuck on a lock gives up after 3 s (the locked-table test).
               "DEXAGENTS_WEBSOCKET_DB_TIMEOUT": "3"})
    (tmp_path / "var").mkdir()
    stack.processes = Processes(stack.env)
    try:
        stack.processes.run([PYTHON, "manage.py", "seed_demo"])
        out = stack.processes.run([PYTHON, "manage.py", "shell", "-c", PERSONAS_CODE])
        stack.personas = {
            name: Persona(name, data["token"], data["cookie"])
            for name, data in json.loads(out.strip().splitlines()[-1]).items()
        }
        stack.start_engine().wait_for_line("dex_dev_server ready on")
        stack.web = stack.start_web(stack.web_port)
        stack.web.wait_for_line("Application startup complete")
        yield stack
    finally:
        stack.processes.stop_all()


def settled_connections(url: str) -> int:
    """The database's connection count once two readings in a row agree (the backends of
    finished requests and commands take a moment to go)."""
    readings: list[int] = []

    def probe() -> list[int] | None:
        readings.append(postgres_connections(url))
        return readings[-1:] if readings[-2:-1] == readings[-1:] else None

    return wait_until("the connection count to settle", probe, timeout=30, interval=0.25)[0]


def relays_started(stack: Stack) -> int:
    return sum(bool(RELAY_STARTED.search(line)) for line in list(stack.web.lines))


async def open_sockets(stack: Stack, session_ids: list[str]) -> list[ClientConnection]:
    headers = stack.personas["owner"].bearer()
    return list(await asyncio.gather(*(
        connect(stack.events_url(session_ids[number % len(session_ids)]),
                additional_headers=headers, open_timeout=60)
        for number in range(SOCKETS))))


async def requests_in_flight(stack: Stack, session_id: str) -> list[asyncio.StreamWriter]:
    """Send ``REQUESTS`` snapshot reads on raw sockets, leaving their answers unread."""
    token = stack.personas["owner"].token
    writers = []
    for _ in range(REQUESTS):
        _, writer = await asyncio.open_connection("127.0.0.1", stack.web_port)
        writer.write(
            f"GET /api/v1/sessions/{session_id}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Authorization: Bearer {token}\r\n\r\n".encode())
        await writer.drain()
        writers.append(writer)
    return writers


def test_cancelled_requests_and_dropped_websockets_give_back_db_connections(
    web_on_postgres: Stack, postgres_url: str
) -> None:
    stack = web_on_postgres
    with stack.api() as api:
        session_ids = []
        for _ in range(4):
            created = api.post("/api/v1/sessions/", json={"agent": "demo"})
            assert created.status_code == 201, created.text
            session_ids.append(created.json()["id"])
        assert api.get("/api/v1/agents/").status_code == 200
    baseline = settled_connections(postgres_url)

    async def scenario() -> None:
        # Snapshot reads that wait on Dex (no worker runs their RPC) while holding their
        # request's connection; then the clients go away.
        writers = await requests_in_flight(stack, session_ids[0])
        held = await asyncio.to_thread(
            wait_until, "the in-flight reads to hold connections",
            lambda: postgres_connections(postgres_url) >= baseline + REQUESTS // 2)
        assert held
        for writer in writers:
            writer.transport.abort()

        # Websockets whose relays long-poll the Stream, dropped without a close frame.
        sockets = await open_sockets(stack, session_ids)
        await asyncio.to_thread(wait_until, f"{SOCKETS} relays to start",
                                lambda: relays_started(stack) >= SOCKETS)
        for socket in sockets:
            assert socket.transport is not None
            socket.transport.abort()

        # Sockets dropped during their handshake's database work (token and session lookups).
        token = stack.personas["owner"].token
        for number in range(SOCKETS):
            _, writer = await asyncio.open_connection("127.0.0.1", stack.web_port)
            writer.write(
                f"GET /ws/sessions/{session_ids[number % len(session_ids)]}/events/ HTTP/1.1\r\n"
                "Host: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
                f"Authorization: Bearer {token}\r\n\r\n".encode())
            await writer.drain()
            writer.transport.abort()

    asyncio.run(scenario())

    wait_until(f"Postgres connections back to {baseline}",
               lambda: postgres_connections(postgres_url) <= baseline, timeout=60)
    # Still serving, and still giving connections back.
    with stack.api() as api:
        assert api.get("/api/v1/agents/").status_code == 200
    wait_until(f"Postgres connections back to {baseline} after one more request",
               lambda: postgres_connections(postgres_url) <= baseline, timeout=30)


UNKNOWN_SESSION = "/api/v1/sessions/00000000-0000-4000-8000-000000000000/"


def short_path_connection_opened(api: httpx.Client, postgres_url: str, baseline: int) -> None:
    """Read an unknown session (answered 404 by Django after the short path's token and session
    lookups) and wait for the short path's kept connection to show."""
    assert api.get(UNKNOWN_SESSION).status_code == 404
    wait_until("the short path's connection to show",
               lambda: postgres_connections(postgres_url) >= baseline + 1, timeout=10)


def test_the_snapshot_short_path_keeps_its_connection_between_reads_then_gives_it_back(
    web_on_postgres: Stack, postgres_url: str
) -> None:
    """The short path's database thread keeps its connection while reads come (opening one
    per read was ~40 % of a read's CPU) and closes it once idle
    (``snapshot_db.CONNECTION_IDLE_SECONDS``)."""
    from agents_app.api.snapshot_db import CONNECTION_IDLE_SECONDS

    stack = web_on_postgres
    baseline = settled_connections(postgres_url)
    with stack.api() as api:
        short_path_connection_opened(api, postgres_url, baseline)
        opened = postgres_connections(postgres_url)
        for _ in range(20):
            assert api.get(UNKNOWN_SESSION).status_code == 404
        assert settled_connections(postgres_url) <= opened
    wait_until(f"Postgres connections back to {baseline}",
               lambda: postgres_connections(postgres_url) <= baseline,
               timeout=CONNECTION_IDLE_SECONDS + 30)


def test_a_kept_connection_the_server_closed_is_replaced_before_a_read(
    web_on_postgres: Stack, postgres_url: str
) -> None:
    """A kept connection that PostgreSQL closed (a restart, a failover, an idle timeout) is
    health-checked before the short path's next read uses it, so the read does not fail."""
    import time
    from urllib.parse import urlsplit

    import psycopg

    from agents_app.api.snapshot_db import HEALTH_CHECK_IDLE_SECONDS
    from tests.production_services import POSTGRES_SERVER_URL

    stack = web_on_postgres
    baseline = settled_connections(postgres_url)
    with stack.api() as api:
        short_path_connection_opened(api, postgres_url, baseline)
        with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = %s AND pid <> pg_backend_pid()",
                (urlsplit(postgres_url).path.lstrip("/"),),
            )
        # Not a poll: the check applies to connections idle for longer than this.
        time.sleep(HEALTH_CHECK_IDLE_SECONDS + 0.2)
        for _ in range(3):
            assert api.get(UNKNOWN_SESSION).status_code == 404
    failed = [line for line in list(stack.web.lines) if "Snapshot short path failed" in line]
    assert not failed, failed


def test_a_handshake_stuck_on_a_locked_table_holds_up_no_one_else(
    web_on_postgres: Stack, postgres_url: str
) -> None:
    """Issue 25: with ``django_session`` locked, a websocket authenticating by session cookie
    waits for the database. It used to wait on Channels' one database thread, so every other
    handshake of the process (token-authenticated, other sessions) and REST reads waited
    behind it. Now the token handshake and the reads answer while the lock is held, and the
    cookie socket closes with 4503 once its lookup's deadline passes."""
    import psycopg

    stack = web_on_postgres
    with stack.api() as api:
        created = api.post("/api/v1/sessions/", json={"agent": "demo"})
        assert created.status_code == 201, created.text
        session_id = created.json()["id"]
    owner = stack.personas["owner"]

    async def scenario(lock: Any) -> None:
        cookie = {"Cookie": f"sessionid={owner.cookie}"}
        async def open_with_cookie() -> ClientConnection:
            return await connect(stack.events_url(session_id), additional_headers=cookie,
                                 open_timeout=60)

        stuck = asyncio.create_task(open_with_cookie())
        await asyncio.sleep(0)
        # While the lock is held (it is released only after these checks):
        socket = await asyncio.wait_for(
            connect(stack.events_url(session_id), additional_headers=owner.bearer(),
                    open_timeout=30), 30)
        await socket.close()
        async with httpx.AsyncClient(base_url=stack.base_url(), headers=owner.bearer(),
                                     timeout=30) as client:
            listed = await client.get("/api/v1/sessions/")
            assert listed.status_code == 200
            assert session_id in {item["id"] for item in listed.json()["results"]}
        cookie_socket = await asyncio.wait_for(stuck, 60)
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(cookie_socket.recv(), 60)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4503
        lock.rollback()  # the lock goes; a new cookie handshake is served
        again = await asyncio.wait_for(
            connect(stack.events_url(session_id), additional_headers=cookie, open_timeout=30),
            30)
        await again.close()

    with psycopg.connect(postgres_url) as lock:
        lock.execute("LOCK TABLE django_session IN ACCESS EXCLUSIVE MODE")
        asyncio.run(scenario(lock))
