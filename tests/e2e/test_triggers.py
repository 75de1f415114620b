"""Inbound triggers end to end: the real engine, demo model, ``manage.py dexworker``, Celery and
uvicorn as processes (``tests/e2e/relay_stack.py``), deliveries signed as GitHub signs them.

- A delivery sent three times at once (three threads, one ``X-GitHub-Delivery``) starts one
  session: one answer is 202, the others 200 with the same session, and the session's first
  turn gets its answer from the demo model; one more send after the turn answers 200 with it.
- A bad signature is 401, a body that is not a JSON object or lacks a field the template
  reads is 400, a body over the limit is 413, also when sent chunked without
  ``Content-Length``; none of them starts a session.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import wait_for_reply
from tests.e2e.relay_stack import Stack, running_stack

pytestmark = pytest.mark.e2e

SECRET = "trsec_e2e-secret"
PATH = "/api/v1/agents/demo/triggers/e2e-pr/"
LIMIT = 2048

TRIGGER_CODE = """
import json
from agents_app.models import AgentDefinition, AgentTrigger
from django.contrib.auth import get_user_model
AgentTrigger.objects.create(
    agent=AgentDefinition.objects.get(slug="demo"), name="e2e-pr",
    message_template="Review PR {{ body.pull_request.title }} by {{ body.sender.login }}",
    run_as=get_user_model().objects.get(username="owner"), signature_style="github",
    idempotency_header="X-GitHub-Delivery", max_body_bytes=LIMIT, secret=SECRET,
)
print(json.dumps("ok"))
""".replace("LIMIT", str(LIMIT)).replace("SECRET", repr(SECRET))

COUNTS_CODE = """
import json
from agents_app.models import AgentSession, TriggerDelivery
print(json.dumps([AgentSession.objects.count(), TriggerDelivery.objects.count()]))
"""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(tmp_path_factory.mktemp("triggers")) as platform:
        assert platform.django_shell(TRIGGER_CODE) == "ok"
        yield platform


def signed(body: bytes, delivery: str = "", secret: str = SECRET) -> dict[str, str]:
    """GitHub's headers: ``X-Hub-Signature-256: sha256=`` the hex HMAC-SHA256 of the raw
    body with the secret ("Validating webhook deliveries")."""
    headers = {
        "Content-Type": "application/json",
        "X-GitHub-Event": "pull_request",
        "X-Hub-Signature-256": "sha256="
        + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest(),
    }
    if delivery:
        headers["X-GitHub-Delivery"] = delivery
    return headers


def pull_request(title: str) -> bytes:
    return json.dumps(
        {"action": "opened", "pull_request": {"title": title}, "sender": {"login": "octocat"}},
        indent=2,
    ).encode()


def test_a_delivery_sent_three_times_at_once_starts_one_session_that_the_model_answers(
    stack: Stack,
) -> None:
    body = pull_request("Add triggers")
    answers: list[httpx.Response] = []
    ready = threading.Barrier(3)

    def send() -> None:
        with httpx.Client(base_url=stack.base_url(), timeout=60) as client:
            ready.wait(timeout=30)
            answers.append(client.post(PATH, content=body, headers=signed(body, "d-1")))

    threads = [threading.Thread(target=send) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=90)
    assert sorted(answer.status_code for answer in answers) == [200, 200, 202], [
        answer.text for answer in answers
    ]
    first, *repeats = sorted(answers, key=lambda answer: answer.status_code, reverse=True)
    session_id = first.json()["id"]
    assert [repeat.json()["id"] for repeat in repeats] == [session_id, session_id]
    assert [answer.json()["repeated"] for answer in (first, *repeats)] == [False, True, True]
    assert first.json()["url"].endswith(f"/api/v1/sessions/{session_id}/")

    with stack.api("owner") as owner:
        snapshot = wait_for_reply(owner, session_id, 2, timeout=90)
    user, answer = snapshot["messages"][0], snapshot["messages"][-1]
    assert (user["role"], user["text"]) == ("user", "Review PR Add triggers by octocat")
    assert answer["role"] == "assistant" and answer["text"]

    with httpx.Client(base_url=stack.base_url(), timeout=60) as client:
        again = client.post(PATH, content=body, headers=signed(body, "d-1"))
    assert again.status_code == 200, again.text
    assert again.json()["id"] == session_id
    assert stack.django_shell(COUNTS_CODE) == [1, 1]


def test_refused_deliveries_start_nothing(stack: Stack) -> None:
    before = stack.django_shell(COUNTS_CODE)
    body = pull_request("Refused")
    with httpx.Client(base_url=stack.base_url(), timeout=60) as client:

        def post(content: Any, headers: dict[str, str]) -> httpx.Response:
            return client.post(PATH, content=content, headers=headers)

        wrong = post(body, signed(body, "r-1", secret="trsec_not-the-secret"))
        assert wrong.status_code == 401, wrong.text
        unsigned = post(body, {"Content-Type": "application/json"})
        assert unsigned.status_code == 401, unsigned.text

        array = b"[1, 2, 3]"
        assert post(array, signed(array)).json() == {"body": ["The body must be a JSON object."]}
        no_title = json.dumps({"pull_request": {}, "sender": {"login": "x"}}).encode()
        lacking = post(no_title, signed(no_title, "r-2"))
        assert lacking.status_code == 400, lacking.text
        assert lacking.json() == {"body": ["'pull_request' has no field 'title'"]}

        big = pull_request("x" * LIMIT)
        too_big = post(big, signed(big, "r-3"))
        assert too_big.status_code == 413, too_big.text

        def chunks() -> Iterator[bytes]:
            for start in range(0, len(big), 512):
                yield big[start:start + 512]

        chunked = post(chunks(), signed(big, "r-4"))  # no Content-Length
        assert chunked.request.headers.get("Transfer-Encoding") == "chunked"
        assert chunked.status_code == 413, chunked.text

        assert client.post(
            "/api/v1/agents/demo/triggers/no-such-trigger/", content=body, headers=signed(body)
        ).status_code == 404
    assert stack.django_shell(COUNTS_CODE) == before
