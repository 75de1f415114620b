"""PostgreSQL and Redis for the production-topology tests.

The tests that need them take the ``postgres_url`` and ``redis_url`` fixtures (import them in a
``conftest.py`` or a test module). Each ``postgres_url`` is a fresh database, dropped after the
test; each ``redis_url`` is a Redis logical database (1-15) held for the test by a lock key in
database 0 and flushed before and after, so two test runs on one machine do not meet.

Where the services are:
    DEXAGENTS_TEST_POSTGRES_URL  (default ``postgres://postgres@127.0.0.1:5432/postgres``: a
        server URL whose user may ``CREATE DATABASE``)
    DEXAGENTS_TEST_REDIS_URL     (default ``redis://127.0.0.1:6379``)

A service that does not answer skips its tests with the reason, unless
``DEXAGENTS_REQUIRE_SERVICES`` is set (CI sets it in ``.ci/run``): then the test fails.
"""

from __future__ import annotations

import atexit
import os
import secrets
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

POSTGRES_SERVER_URL = os.environ.get(
    "DEXAGENTS_TEST_POSTGRES_URL", "postgres://postgres@127.0.0.1:5432/postgres"
)
REDIS_SERVER_URL = os.environ.get("DEXAGENTS_TEST_REDIS_URL", "redis://127.0.0.1:6379")
_LOCK_SECONDS = 3600


def _absent(what: str, error: BaseException) -> None:
    """Skip (or, when DEXAGENTS_REQUIRE_SERVICES is set, fail) because ``what`` is absent."""
    reason = (f"{what} is not reachable ({error}); start it or point "
              "DEXAGENTS_TEST_POSTGRES_URL / DEXAGENTS_TEST_REDIS_URL at one")
    if os.environ.get("DEXAGENTS_REQUIRE_SERVICES"):
        pytest.fail(reason + " (DEXAGENTS_REQUIRE_SERVICES is set)")
    pytest.skip(reason)


def _with_path(url: str, path: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, parts.fragment))


def postgres_connections(database_url: str) -> int:
    """Client connections the server holds open to the database of ``database_url``."""
    import psycopg

    name = urlsplit(database_url).path.lstrip("/")
    with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
        row = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (name,),
        ).fetchone()
    return int(row[0]) if row else 0


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """The URL of a new, empty PostgreSQL database (``DATABASE_URL`` form), dropped after."""
    import psycopg

    name = f"dexagents_test_{secrets.token_hex(6)}"
    try:
        admin = psycopg.connect(POSTGRES_SERVER_URL, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as error:
        _absent("PostgreSQL", error)
        raise
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield _with_path(POSTGRES_SERVER_URL, f"/{name}")
    finally:
        with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_MIGRATED_TEMPLATE: str | None = None


def _drop_database(name: str) -> None:
    import psycopg

    with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _migrated_template() -> str:
    """The name of a PostgreSQL database that ``manage.py migrate`` made, once per test
    process, dropped when the process exits.

    Every migration on PostgreSQL commits on its own: a ``migrate`` took 20-40 s on a loaded
    2-core CI machine, for the same result in every test that needed a migrated database.
    ``CREATE DATABASE ... TEMPLATE`` copies this one in well under a second. (The tests of
    ``manage.py dev`` still run the real ``migrate``.)

    Raises:
        AssertionError: If ``migrate`` fails (its output is in the message).
    """
    global _MIGRATED_TEMPLATE
    if _MIGRATED_TEMPLATE is not None:
        return _MIGRATED_TEMPLATE
    import psycopg

    name = f"dexagents_template_{secrets.token_hex(6)}"
    with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    atexit.register(_drop_database, name)
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="dexagents-pg-template-") as var_dir:
        env = {key: value for key, value in os.environ.items()
               if key not in {"DEX_SERVER_ADDRESS", "REDIS_URL"}}
        env.update({"DATABASE_URL": _with_path(POSTGRES_SERVER_URL, f"/{name}"),
                    "DEXAGENTS_VAR_DIR": var_dir,
                    "DJANGO_SETTINGS_MODULE": "dexagents_site.settings"})
        done = subprocess.run([sys.executable, "manage.py", "migrate", "--noinput"], cwd=root,
                              env=env, capture_output=True, text=True, timeout=600,
                              check=False)
    assert done.returncode == 0, f"migrate failed:\n{done.stdout}\n{done.stderr}"
    _MIGRATED_TEMPLATE = name
    return name


@pytest.fixture
def migrated_postgres_url(postgres_url: str) -> str:
    """The URL of a new PostgreSQL database with every migration applied, dropped after: a
    copy of one database ``manage.py migrate`` made for this test process
    (``CREATE DATABASE ... TEMPLATE``), in place of ``postgres_url``'s empty one."""
    import psycopg

    template = _migrated_template()
    name = urlsplit(postgres_url).path.lstrip("/")
    with psycopg.connect(POSTGRES_SERVER_URL, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}"')
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return postgres_url


@pytest.fixture
def redis_url() -> Iterator[str]:
    """The URL of an empty Redis logical database held by this test (``REDIS_URL`` form)."""
    import redis

    control = redis.Redis.from_url(REDIS_SERVER_URL, socket_connect_timeout=3)
    try:
        control.ping()
    except redis.RedisError as error:
        _absent("Redis", error)
        raise
    owner = secrets.token_hex(8)
    for index in range(1, 16):
        if control.set(f"dexagents-test-db:{index}", owner, nx=True, ex=_LOCK_SECONDS):
            break
    else:
        pytest.fail("every Redis database 1-15 is held by another test run")
    url = _with_path(REDIS_SERVER_URL, f"/{index}")
    database = redis.Redis.from_url(url)
    database.flushdb()
    try:
        yield url
    finally:
        database.flushdb()
        if control.get(f"dexagents-test-db:{index}") == owner.encode():
            control.delete(f"dexagents-test-db:{index}")
        database.close()
        control.close()
