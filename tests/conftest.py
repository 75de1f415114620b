"""Shared fixtures: named personas (owner, other user, staff, superuser, anonymous) and
authenticated API clients, after Healthchecks' ``hc/test.py``."""

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# LiteLLM must not reach the network or read .env files when a test imports it
# (reference/django-notes.md G5).
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True, scope="session")
def fast_password_hasher() -> Iterator[None]:
    """Hash passwords with MD5 in this test process (Django's advice for test suites).

    The production hasher (PBKDF2, 1,000,000 rounds) takes ~1.5 s per ``set_password`` or
    ``check_password`` on a loaded 2-core CI machine, and most tests create two or three users:
    that alone was several minutes of the suite. The tests check that a password is set and
    accepted, not how strongly it is hashed. Child processes (e2e stacks) keep the real hasher.
    """
    from django.test.utils import override_settings

    # ``override_settings`` (not a plain assignment) sends ``setting_changed``, which clears
    # Django's cached hasher list.
    fast = override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"])
    fast.enable()
    try:
        yield
    finally:
        fast.disable()


@pytest.fixture(autouse=True)
def fresh_cache() -> Iterator[None]:
    """Each test starts with an empty default cache (this process's LocMemCache): request
    counts of the API's per-user rate limits (``agents_app.api.throttling``), cached snapshots
    (``agents_app.gateway.snapshot_cache``) and anything else a test cached do not carry into
    the next test, whose users and sessions may reuse the same keys."""
    from django.core.cache import cache

    from agents_app.gateway import snapshot_cache

    cache.clear()
    snapshot_cache.clear_local()
    yield


@pytest.fixture
def owner(db: None) -> Any:
    from tests.factories import UserFactory

    return UserFactory.create(username="owner")


@pytest.fixture
def other_user(db: None) -> Any:
    from tests.factories import UserFactory

    return UserFactory.create(username="other")


@pytest.fixture
def staff(db: None) -> Any:
    """A staff member who is not a superuser."""
    from tests.factories import UserFactory

    return UserFactory.create(username="staff", is_staff=True)


@pytest.fixture
def superuser(db: None) -> Any:
    from tests.factories import UserFactory

    return UserFactory.create(username="root", is_staff=True, is_superuser=True)


def api_token_key(user: Any, name: str = "tests") -> str:
    """A new API token of ``user`` (``api_tokens.api_token_create``); returns its key."""
    from agents_app.services.api_tokens import api_token_create

    return api_token_create(user=user, name=name)[1]


@pytest.fixture
def token_client() -> Callable[[Any], Any]:
    """Build a DRF APIClient that sends ``Authorization: Token <key>`` for a user (one token
    per user and test)."""
    from rest_framework.test import APIClient

    keys: dict[Any, str] = {}

    def build(user: Any) -> APIClient:
        client = APIClient()
        if user.pk not in keys:
            keys[user.pk] = api_token_key(user)
        client.credentials(HTTP_AUTHORIZATION=f"Token {keys[user.pk]}")
        return client

    return build


@pytest.fixture
def owner_client(owner: Any, token_client: Callable[[Any], Any]) -> Any:
    return token_client(owner)


@pytest.fixture
def other_client(other_user: Any, token_client: Callable[[Any], Any]) -> Any:
    return token_client(other_user)


@pytest.fixture
def staff_client(staff: Any, token_client: Callable[[Any], Any]) -> Any:
    return token_client(staff)


@pytest.fixture
def anonymous_client(db: None) -> Any:
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def eager_celery() -> Iterator[None]:
    """Run queued tasks in-process, as a Celery worker would, with the tasks a worker finds.

    A task queued by name (``agents_app.task_queue``) is looked up in the app's registry, which
    a worker fills at start-up from every app's ``tasks`` module; do the same here, so a test
    does not depend on another test having imported them first."""
    from dexagents_site import celery_app

    celery_app.loader.import_default_modules()
    previous = celery_app.conf.task_always_eager
    celery_app.conf.task_always_eager = True
    try:
        yield
    finally:
        celery_app.conf.task_always_eager = previous


@pytest.fixture
def engine_down(settings: Any) -> Iterator[str]:
    """Point the web side at an address where no engine listens (a real refused connection)."""
    # From free_port, so that no later engine of this test process gets the port: this
    # process's gRPC subchannel to a refused port stays in back-off, and an engine that later
    # listened there would see its first calls refused.
    from dex_agents.testing import free_port

    address = f"127.0.0.1:{free_port()}"
    settings.DEXAGENTS = {**settings.DEXAGENTS, "DEX_SERVER_ADDRESS": address}
    yield address


@pytest.fixture
def heartbeat_file(settings: Any, tmp_path: Path) -> Path:
    """Point worker heartbeats at a private directory (and not at Redis); return the beat
    file of one worker there, which does not exist yet (touching it is a fresh beat)."""
    directory = tmp_path / "workers"
    settings.DEXAGENTS = {
        **settings.DEXAGENTS, "WORKER_HEARTBEAT_DIR": directory, "REDIS_URL": "",
    }
    directory.mkdir()
    return directory / "worker-a.heartbeat"


ENGINE_READY_DEADLINE_SECONDS = 30.0


@pytest.fixture
def engine(settings: Any, tmp_path: Path) -> Iterator[str]:
    """Run the real embedded engine (``python -m dex_dev_server``) for one test, on a port
    this test process never used before (``dex_agents.testing.free_port``).

    Yields its ``host:port`` and points ``DEXAGENTS["DEX_SERVER_ADDRESS"]`` at it.
    """
    import queue
    import subprocess
    import sys
    import threading
    import time

    from dex_agents.testing import free_port

    process = subprocess.Popen(
        [sys.executable, "-m", "dex_dev_server", "--port", str(free_port()),
         "--db", str(tmp_path / "dex.db")],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + ENGINE_READY_DEADLINE_SECONDS
    address = ""
    seen: list[str] = []
    try:
        while not address:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or process.poll() is not None:
                raise RuntimeError("engine did not become ready:\n" + "".join(seen))
            try:
                line = lines.get(timeout=min(remaining, 0.5))
            except queue.Empty:
                continue
            seen.append(line)
            if "ready on " in line:
                address = line.rsplit("ready on ", 1)[1].strip()
        settings.DEXAGENTS = {**settings.DEXAGENTS, "DEX_SERVER_ADDRESS": address}
        yield address
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pytest_configure(config: pytest.Config) -> None:
    from tests.module_order import ModuleTimes

    # On an xdist worker the controller reports; a worker has ``workerinput``.
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleTimes(), "dexagents-module-times")


def pytest_collection_modifyitems(config: pytest.Config, items: list[Any]) -> None:
    """Longest modules first (``tests/module_order.py``)."""
    from tests.module_order import longest_first, read_durations

    items[:] = longest_first(items, read_durations())
