"""The served API against its OpenAPI schema, and the schema's pages, on the real stack.

``manage.py dev`` (engine, worker, web, Celery, demo model as processes on private ports)
serves the platform. The persona is ``contract``, a staff user with an API token who owns the
sessions made before the run, so generated requests reach every endpoint's logic: an idle
session, one waiting for an approval with a queued message, and a stopped one.

- ``test_served_responses_match_the_schema`` runs schemathesis (tests/e2e/schemathesis.toml)
  over every operation of the served schema: at least ``MIN_CASES`` generated cases, no
  server error, no response that differs from the schema. On failure its report (with a
  curl command per failure) is in the assertion message.
- ``test_a_generated_client_reads_typed_fields`` generates a client from the served schema
  with ``openapi-python-client`` and runs a read tool's turn and an approved write through
  it, reading only typed attributes (``snapshot.messages[-1].role``, ``tool_calls[0].status``,
  ``pending_interrupts[0].interrupt_id``, ``usage.requests``), never a dict.
- ``test_swagger_and_redoc_render_offline`` opens ``/api/docs/`` and ``/api/redoc/`` in
  Chromium as the logged-in user, checks the operations render and that no request leaves
  the machine, and saves screenshots to ``var/screenshots/`` (or
  ``$DEXAGENTS_SCREENSHOT_DIR``).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Route, expect

from dex_agents.testing import free_port
from tests.e2e.browser import SCREENSHOTS
from tests.e2e.conftest import PYTHON, ROOT, Ports, Processes, platform_env, wait_until

pytestmark = pytest.mark.e2e

#: The issue's floor for generated cases over all operations.
MIN_CASES = 1000
PASSWORD = "contract-test-password-1"
SCHEMATHESIS = str(Path(PYTHON).with_name("schemathesis"))
CONFIG = ROOT / "tests" / "e2e" / "schemathesis.toml"
HOOKS = ROOT / "tests" / "e2e" / "schemathesis_hooks.py"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

USER_CODE = """
from django.contrib.auth import get_user_model
from agents_app.services.api_tokens import api_token_create
user, _ = get_user_model().objects.get_or_create(username="contract")
user.is_staff = True
user.set_password(PASSWORD)
user.save()
print(api_token_create(user=user, name="contract", replace=True)[1])
""".replace("PASSWORD", repr(PASSWORD))


@dataclass
class ContractStack:
    base_url: str
    token: str
    ids: dict[str, list[str]]


def api(base_url: str, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=base_url + "/api/v1",
        headers={"Authorization": f"Bearer {token}"},
        timeout=60,
    )


def snapshot_when(client: httpx.Client, session_id: str, description: str,
                  ready: Any) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        response = client.get(f"/sessions/{session_id}/")
        if response.status_code != 200:
            return None
        body: dict[str, Any] = response.json()
        return body if ready(body) else None

    return wait_until(description, probe, timeout=120, interval=0.3)


def make_sessions(base_url: str, token: str) -> dict[str, list[str]]:
    """An idle session, one waiting for approval (with a queued message), a stopped one and
    two for DELETE to delete; returns the path parameter values schemathesis should use
    (schemathesis_hooks.py)."""
    with api(base_url, token) as client:

        def start(message: str) -> str:
            response = client.post("/sessions/", json={"agent": "demo", "message": message})
            assert response.status_code == 201, response.text
            session_id: str = response.json()["id"]
            return session_id

        idle = start("hello")
        waiting = start('/tool slack__post_message {"channel": "general", "text": "hi"}')
        stopped = start("hello")
        deletable = [start("delete me"), start("delete me too")]
        snapshot_when(client, idle, "the idle session's turn to end",
                      lambda body: body["status"] == "waiting_for_user_message")
        pending = snapshot_when(client, waiting, "the approval to be requested",
                                lambda body: body["pending_interrupts"])
        queued = client.post(f"/sessions/{waiting}/messages/", json={"text": "later"})
        assert queued.status_code == 202, queued.text
        stop = client.post(f"/sessions/{stopped}/stop/")
        assert stop.status_code == 202, stop.text
    return {
        "session_id": [idle, waiting, stopped],
        # DELETE /sessions/{session_id}/ gets these instead, so the others stay for the rest.
        "deletable_session_id": deletable,
        "interrupt_id": [pending["pending_interrupts"][0]["interrupt_id"]],
        "message_id": [queued.json()["id"]],
        # The inbound trigger manage.py dev seeds: unsigned requests reach its checks (401).
        "slug": ["demo"],
        "name": ["github-pr"],
    }


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContractStack]:
    root = tmp_path_factory.mktemp("contract")
    var = root / "var"
    var.mkdir()
    web = free_port()
    env = platform_env(var, Ports(web=web, engine=free_port(), model=free_port()), extra={
        # A loaded CI machine may take more than the default 5 s to answer an RPC; a 503 is
        # then served correctly but would count as a server error.
        "DEXAGENTS_ENGINE_TIMEOUT": "30",
        # Generated ?wait= values hold requests up to this long; keep the run short.
        "DEXAGENTS_MAX_WAIT_SECONDS": "1",
        # Over a thousand generated requests by one user in about a minute.
        "DEXAGENTS_THROTTLE_READS": "off",
        "DEXAGENTS_THROTTLE_WRITES": "off",
        "DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER": "0",
    })
    processes = Processes(env)
    try:
        dev = processes.start("dev", [PYTHON, "manage.py", "dev", "--port", str(web)])
        dev.wait_for_line("dexagents is ready at", timeout=180)
        token = processes.run([PYTHON, "manage.py", "shell", "-c", USER_CODE]).split()[-1]
        base_url = f"http://127.0.0.1:{web}"
        yield ContractStack(base_url, token, make_sessions(base_url, token))
    finally:
        processes.stop_all()


def schema_operations(stack: ContractStack) -> set[str]:
    with httpx.Client(headers={"Authorization": f"Bearer {stack.token}"}, timeout=60) as client:
        response = client.get(f"{stack.base_url}/api/schema/?format=json")
    assert response.status_code == 200, response.text
    return {
        f"{method.upper()} {path}"
        for path, item in response.json()["paths"].items()
        for method in item
        if method in {"get", "post", "put", "patch", "delete"}
    }


# About 80 s alone; several times that on a machine loaded by other runs.
@pytest.mark.timeout(900)
def test_served_responses_match_the_schema(stack: ContractStack, tmp_path: Path) -> None:
    report = tmp_path / "report.ndjson"
    env = {**os.environ, "SCHEMATHESIS_HOOKS": str(HOOKS),
           "DEXAGENTS_CONTRACT_IDS": json.dumps(stack.ids)}
    argv = [
        SCHEMATHESIS, "--no-color", "--config-file", str(CONFIG), "run",
        f"{stack.base_url}/api/schema/?format=json",
        "--header", f"Authorization: Bearer {stack.token}",
        "--report", "ndjson", "--report-ndjson-path", str(report),
    ]
    started = time.monotonic()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)
    elapsed = time.monotonic() - started
    output = (done.stdout + done.stderr).replace(stack.token, "<token>")
    assert done.returncode == 0, f"schemathesis found problems:\n{output[-20000:]}"
    cases, tested = cases_and_operations(report)
    print(f"schemathesis: {cases} cases over {len(tested)} operations in {elapsed:.0f} s")
    assert cases >= MIN_CASES, f"only {cases} cases:\n{output[-4000:]}"
    missing = schema_operations(stack) - tested
    assert not missing, f"operations schemathesis did not test: {sorted(missing)}"


def cases_and_operations(report: Path) -> tuple[int, set[str]]:
    """Cases schemathesis generated and the operations it tested, from its NDJSON report
    (one ``ScenarioFinished`` event per operation and phase, whose ``recorder`` holds the
    operation's ``label`` and its ``cases`` by ID)."""
    cases: set[str] = set()
    operations: set[str] = set()
    for line in report.read_text().splitlines():
        finished = json.loads(line).get("ScenarioFinished")
        if not finished:
            continue
        recorder = finished.get("recorder") or {}
        found = recorder.get("cases") or {}
        if found:
            operations.add(recorder["label"])
            cases.update(found)
    return len(cases), operations


OPENAPI_PYTHON_CLIENT = str(Path(PYTHON).with_name("openapi-python-client"))


@pytest.fixture
def generated_client(stack: ContractStack, tmp_path: Path) -> Iterator[Any]:
    """The ``dexagents_client`` package generated from the served ``/api/schema/`` (a warning
    fails the generation), imported from ``tmp_path``; removed from ``sys.modules`` after."""
    with httpx.Client(headers={"Authorization": f"Bearer {stack.token}"}, timeout=60) as client:
        response = client.get(f"{stack.base_url}/api/schema/?format=json")
    assert response.status_code == 200, response.text
    schema = tmp_path / "schema.json"
    schema.write_bytes(response.content)
    # The generator formats its output with ruff, found on PATH.
    env = {**os.environ, "PATH": f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [OPENAPI_PYTHON_CLIENT, "generate", "--path", str(schema), "--meta", "none",
         "--output-path", str(tmp_path / "dexagents_client"), "--fail-on-warning"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("dexagents_client")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [name for name in sys.modules if name.split(".")[0] == "dexagents_client"]:
            del sys.modules[name]


def test_a_generated_client_reads_typed_fields(stack: ContractStack, generated_client: Any) -> None:
    def module(name: str) -> Any:
        return importlib.import_module(f"dexagents_client.{name}")

    models = module("models")
    sessions = "api.sessions."
    create, retrieve, send, decide, pages = (
        module(sessions + name) for name in (
            "sessions_create", "sessions_retrieve", "sessions_messages_create",
            "sessions_interrupts_create", "sessions_messages_retrieve",
        )
    )
    client = generated_client.AuthenticatedClient(
        base_url=stack.base_url, token=stack.token, raise_on_unexpected_status=True,
        timeout=httpx.Timeout(60),
    )

    def snapshot_when(description: str, ready: Any) -> Any:
        def probe() -> Any:
            snapshot = retrieve.sync(session_id, client=client)
            assert not isinstance(snapshot, dict)
            return snapshot if isinstance(snapshot, models.SessionSnapshot) and ready(
                snapshot) else None

        return wait_until(description, probe, timeout=120, interval=0.3)

    waiting = models.ToolCallRecordStatusEnum.AWAITING_APPROVAL
    idle = "waiting_for_user_message"
    with client:
        created = create.sync(client=client, body=models.SessionCreateInput(
            agent="demo", message='/tool search__web_search {"query": "durable agents"}'))
        assert isinstance(created, models.SessionCreatedWaited), created
        session_id = created.id

        # A read tool's turn: the call, its result linked to it, and the model's answer.
        done = snapshot_when("the read tool's turn to end", lambda s: s.status == idle)
        roles = [message.role for message in done.messages]
        assert roles == [models.RoleEnum.USER, models.RoleEnum.ASSISTANT, models.RoleEnum.TOOL,
                         models.RoleEnum.ASSISTANT], roles
        asked, result = done.messages[1], done.messages[2]
        assert asked.tool_calls[0].name == "search__web_search"
        assert json.loads(asked.tool_calls[0].arguments) == {"query": "durable agents"}
        assert result.tool_call_id == asked.tool_calls[0].id
        assert isinstance(result.tool_call_id, str) and result.text
        assert done.messages[0].tool_calls is module("types").UNSET
        assert done.tool_calls == [] and done.pending_interrupts == []
        assert done.usage.requests == 2 and done.usage.input_tokens > 0
        assert done.last_turn_error is None

        # A write waits for approval; a staff member approves it through the client.
        queued = send.sync(session_id, client=client, body=models.MessageInput(
            text='/tool slack__post_message {"channel": "general", "text": "typed"}'))
        assert isinstance(queued, models.MessageQueued), queued
        pending = snapshot_when("the approval to be requested",
                                lambda s: s.pending_interrupts)
        interrupt = pending.pending_interrupts[0]
        assert interrupt.tool_name == "slack__post_message" and interrupt.deadline is None
        record = next(call for call in pending.tool_calls
                      if call.tool_call_id == interrupt.tool_call_id)
        assert record.status == waiting and record.requires_approval is True
        assert record.effect == models.EffectEnum.NON_IDEMPOTENT_WRITE
        assert record.output is None and record.error is None
        assert pending.awaiting_approval is True

        resolved = decide.sync(session_id, interrupt.interrupt_id, client=client,
                               body=models.InterruptResolveInput(approved=True))
        assert isinstance(resolved, models.InterruptResolved), resolved
        done = snapshot_when("the approved turn to end", lambda s: s.status == idle)
        assert done.pending_interrupts == [] and done.usage.requests == 4
        written = [message for message in done.messages
                   if message.role == models.RoleEnum.TOOL
                   and message.tool_call_id == interrupt.tool_call_id]
        assert len(written) == 1 and written[0].text, done.messages
        assert done.messages[-1].role == models.RoleEnum.ASSISTANT
        assert done.messages[-1].turn_id == "turn-2"

        page = pages.sync(session_id, client=client, limit=2)
        assert isinstance(page, models.MessagePage), page
        assert [message.sequence for message in page.messages] == [
            message.sequence for message in done.messages[-2:]]
        assert page.next_before == done.messages[-2].sequence


def test_swagger_and_redoc_render_offline(stack: ContractStack, browser: Browser) -> None:
    operations = schema_operations(stack)
    outside: list[str] = []
    errors: list[str] = []

    def refuse(route: Route) -> None:
        # Only requests the browser really sends reach the router; one the page's
        # Content-Security-Policy blocks never does (test_content_security_browser sees those).
        outside.append(route.request.url)
        route.abort()

    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(base_url=stack.base_url, viewport={"width": 1280, "height": 900})
    try:
        context.route(
            lambda url: (urlsplit(url).hostname or "") not in LOCAL_HOSTS, refuse
        )
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto("/api/docs/")
        expect(page).to_have_url(f"{stack.base_url}/accounts/login/?next=/api/docs/")
        page.get_by_label("Username").fill("contract")
        page.get_by_label("Password").fill(PASSWORD)
        page.get_by_role("button", name="Log in").click()
        page.wait_for_url(f"{stack.base_url}/api/docs/")
        blocks = page.locator(".opblock")
        expect(blocks).to_have_count(len(operations), timeout=60_000)
        expect(page.get_by_text("/api/v1/sessions/{session_id}/stop/")).to_be_visible()
        page.screenshot(path=str(SCREENSHOTS / "api-docs-1280.png"), full_page=True)

        page.goto("/api/redoc/")
        expect(page.get_by_role("heading", name="dexagents API (1)")).to_be_visible(
            timeout=60_000
        )
        expect(page.locator("[data-section-id^='tag/']").first).to_be_attached()
        page.screenshot(path=str(SCREENSHOTS / "api-redoc-1280.png"))
    finally:
        context.close()
    assert not outside, f"requests left the machine: {outside}"
    assert not errors, errors
