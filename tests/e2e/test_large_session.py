"""Sessions larger than one 4 MiB gRPC message stay readable (issue 26): the snapshot and the
message pages hold what fits their byte budgets and the client pages through the rest, and a
queue refuses a message that would outgrow what a snapshot can carry."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PYTHON, wait_until
from tests.e2e.relay_stack import Stack, running_stack
from tests.mcp_registry.stub_server import padded_echo_yaml

pytestmark = pytest.mark.e2e

LONG = "y" * 99_000  # under the API's 100,000-character limit per message
POST = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "big one"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # The count limit (20) would refuse first: these tests reach the queue's byte limit.
    extra = {"DEXAGENTS_MAX_QUEUED_MESSAGES": "100"}
    with running_stack(tmp_path_factory.mktemp("large"), extra_env=extra) as platform:
        yield platform


def test_a_full_queue_refuses_instead_of_outgrowing_the_session(stack: Stack) -> None:
    """Behind a turn waiting for approval, 99,000-character messages are queued until the
    queue's texts would pass 2 MiB: the next one is refused with 409 and nothing changes
    (before, 45 of them made the session unreadable: every read answered 503). The session
    stays readable, other sessions are served, and its approval is decided."""
    owner, staff = stack.api("owner"), stack.api("staff")
    big = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": POST}).json()["id"]
    pending = wait_until(
        "the write to wait for approval",
        lambda: [item for item in staff.get("/api/v1/approvals/").json()
                 if item["session"] == big],
        timeout=30,
    )
    accepted = 0
    for _ in range(45):
        answer = owner.post(f"/api/v1/sessions/{big}/messages/", json={"text": LONG})
        if answer.status_code == 409:
            assert "queue is full" in answer.json()["detail"]
            break
        assert answer.status_code == 202, answer.text
        accepted += 1
    assert accepted == 21  # 21 x 99,002 bytes fit 2 MiB; a 22nd would not

    snapshot = owner.get(f"/api/v1/sessions/{big}/")
    assert snapshot.status_code == 200, snapshot.text[:300]
    assert len(snapshot.json()["queued_messages"]) == accepted
    assert len(snapshot.content) < 4 * 1024 * 1024

    # Every other session is served as usual, the first turn included.
    small = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "still here?"})
    assert small.status_code == 201, small.text
    small_id = small.json()["id"]

    def answered() -> dict[str, Any] | None:
        body: dict[str, Any] = owner.get(f"/api/v1/sessions/{small_id}/").json()
        messages = body.get("messages", [])
        return body if messages and messages[-1]["role"] == "assistant" else None

    assert wait_until("another session to answer", answered, timeout=60)["messages"][-1][
        "text"] == "You said: still here?"

    interrupt_id = pending[0]["interrupt_id"]
    decided = staff.post(f"/api/v1/sessions/{big}/interrupts/{interrupt_id}/",
                         json={"approved": False, "rejection_message": "too big anyway"})
    assert decided.status_code == 200, decided.text
    stopped = owner.post(f"/api/v1/sessions/{big}/stop/")
    assert stopped.status_code == 202, stopped.text
    assert owner.get(f"/api/v1/sessions/{big}/").status_code == 200


BIG_KB = 1024  # the demo model's largest /big


def test_a_session_past_4_mib_is_read_in_pages(stack: Stack) -> None:
    """Four answers of 1 MiB each (over 8 MB with their stored items): the snapshot answers
    with the newest message cut to fit (text_length says how long it is), and the message
    pages, each under 3 MiB, hold every message, the 1 MiB answers whole."""
    owner = stack.api("owner")
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": f"/big {BIG_KB}"})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    for _ in range(3):
        queued = owner.post(f"/api/v1/sessions/{session}/messages/",
                            json={"text": f"/big {BIG_KB}"})
        assert queued.status_code == 202, queued.text

    def all_answered() -> dict[str, Any] | None:
        response = owner.get(f"/api/v1/sessions/{session}/")
        assert response.status_code == 200, response.text[:500]
        body: dict[str, Any] = response.json()
        last = body["messages"][-1] if body["messages"] else None
        done = (body["status"] == "waiting_for_user_message" and not body["queued_messages"]
                and last is not None and last["role"] == "assistant"
                and last["sequence"] >= 8)
        return body if done else None

    snapshot = wait_until("four large answers", all_answered, timeout=240, interval=1)
    newest = snapshot["messages"][-1]
    assert newest["text_length"] == BIG_KB * 1024
    assert newest["text"].endswith("more characters not shown here]")
    assert snapshot["has_older_messages"] is True

    texts: dict[int, str] = {}
    for sequence, item in paged_messages(owner, session).items():
        assert "text_length" not in item, sequence
        texts[sequence] = item["text"]
    assert sorted(texts) == list(range(1, newest["sequence"] + 1))
    answers = [text for text in texts.values() if len(text) == BIG_KB * 1024]
    assert len(answers) == 4

    # The snapshot's cut newest answer, read whole in parts of at most 512 KiB.
    whole = read_whole_text(owner, session, newest["sequence"])
    assert whole == texts[newest["sequence"]]


def test_a_queue_never_outgrows_the_snapshot(stack: Stack) -> None:
    """Queued texts may take 2 MiB of JSON together, whatever their characters (an emoji
    is 12 bytes): a message past that is refused with 409 and nothing changes, so the
    snapshot answers, before and after the session is stopped (it answered 503 for good)."""
    owner = stack.api("owner")
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "/wait 300 hold"})
    assert created.status_code == 201, created.text
    session = created.json()["id"]
    wait_until("the durable wait", lambda: owner.get(
        f"/api/v1/sessions/{session}/").json().get("pending_timer"), timeout=60)
    emoji = "\U0001f642" * 90_000  # 1,080,002 bytes of JSON
    first = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": emoji})
    assert first.status_code == 202, first.text
    refused = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": emoji})
    assert refused.status_code == 409, refused.text
    assert "queue is full" in refused.json()["detail"]
    edited = owner.put(f"/api/v1/sessions/{session}/queue/{first.json()['id']}/",
                       json={"text": emoji[:-1] + "!"})
    assert edited.status_code == 201, edited.text
    snapshot = owner.get(f"/api/v1/sessions/{session}/")
    assert snapshot.status_code == 200, snapshot.text[:300]
    assert [len(item["text"]) for item in snapshot.json()["queued_messages"]] == [90_000]
    assert owner.post(f"/api/v1/sessions/{session}/stop/").status_code == 202
    assert owner.get(f"/api/v1/sessions/{session}/").status_code == 200



def paged_messages(api: Any, session: str) -> dict[int, dict[str, Any]]:
    """Every retained message by sequence, read back page by page (``before`` paging, 50 a
    page); each page answers 200 in under 3.5 MiB."""
    messages: dict[int, dict[str, Any]] = {}
    before: int | None = None
    for _ in range(1000):
        params = {"limit": 50, **({"before": before} if before is not None else {})}
        page = api.get(f"/api/v1/sessions/{session}/messages/", params=params)
        assert page.status_code == 200, page.text[:500]
        assert len(page.content) < 3.5 * 1024 * 1024
        body = page.json()
        messages.update({item["sequence"]: item for item in body["messages"]})
        before = body["next_before"]
        if before is None:
            return messages
    raise AssertionError("paging back never reached the oldest message")

def read_whole_text(api: Any, session: str, sequence: int) -> str:
    """Message ``sequence``'s whole text through ``GET .../messages/<n>/text/?part=``."""
    url = f"/api/v1/sessions/{session}/messages/{sequence}/text/"
    first = api.get(url)
    assert first.status_code == 200, first.text[:500]
    body = first.json()
    texts = [body["text"]]
    for part in range(1, body["parts"]):
        answer = api.get(url, params={"part": part})
        assert answer.status_code == 200, answer.text[:500]
        assert answer.json()["parts"] == body["parts"]
        texts.append(answer.json()["text"])
    assert all(len(text.encode()) <= 512 * 1024 for text in texts)
    past = api.get(url, params={"part": body["parts"]})
    assert past.status_code == 404 and "part(s)" in past.json()["detail"], past.text[:300]
    assert api.get(url, params={"part": "-1"}).status_code == 400
    whole = "".join(texts)
    assert len(whole) == body["text_length"]
    return whole


#: The stub server's ``echo`` pads its answer with this, repeated: one- to four-byte characters.
PAD_TEXT = "line é漢😀\n"
#: Characters of padding: about 21 MB of UTF-8 (15 bytes per 10 characters).
PAD_CHARS = 14_000_000
ATTACH_BULKY = """
import json
from agents_app.models import AgentDefinition
from mcp_registry.models import McpTool
tools = McpTool.objects.filter(exposed_name="bulky__echo", available=True)
AgentDefinition.objects.get(slug="demo").tools.add(*tools)
print(json.dumps([tool.exposed_name for tool in tools]))
"""


def test_a_20_mb_tool_result_is_stored_whole_and_read_in_parts(
    stack: Stack, tmp_path: Path
) -> None:
    """A real stdio MCP server answers one call with about 21 MB of text. The model sees it
    cut to the agent's limit; the session stores it whole (in parts of 512 KiB), the snapshot
    and the message pages stay small, and ``GET .../messages/<n>/text/`` reads it back whole,
    byte for byte. Other sessions are served meanwhile."""
    config = tmp_path / "servers.yaml"
    config.write_text(padded_echo_yaml("bulky", PAD_CHARS, PAD_TEXT, call_timeout=300))
    stack.processes.run([PYTHON, "manage.py", "mcp_import", "--no-discover", str(config)])
    stack.processes.run([PYTHON, "manage.py", "mcp_discover", "bulky"])
    assert stack.django_shell(ATTACH_BULKY) == ["bulky__echo"]
    expected = "start" + (PAD_TEXT * (PAD_CHARS // len(PAD_TEXT) + 1))[:PAD_CHARS]
    assert len(expected.encode()) > 20_000_000

    owner = stack.api("owner")
    message = "/tool bulky__echo " + json.dumps({"text": "start"})
    created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message})
    assert created.status_code == 201, created.text
    session = created.json()["id"]

    def answered() -> dict[str, Any] | None:
        response = owner.get(f"/api/v1/sessions/{session}/")
        assert response.status_code == 200, response.text[:500]
        body: dict[str, Any] = response.json()
        last = body["messages"][-1] if body["messages"] else None
        ended = (last is not None and last["role"] == "assistant") or body.get("last_turn_error")
        return body if body["status"] == "waiting_for_user_message" and ended else None

    snapshot = wait_until("the 21 MB tool result's turn", answered, timeout=240, interval=1)
    assert not snapshot.get("last_turn_error"), snapshot["last_turn_error"]
    assert len(json.dumps(snapshot)) < 2 * 1024 * 1024
    messages = paged_messages(owner, session)
    tool = next(item for item in messages.values() if item["role"] == "tool")
    assert tool["text_length"] == len(expected)
    assert tool["text"].startswith(expected[:1000])
    # What the model saw: the record's 1 MiB of JSON at most (a third of it for these
    # characters), cut further to the agent's limit.
    assert len(tool["text"]) < 400_000

    assert read_whole_text(owner, session, tool["sequence"]) == expected
    other = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "still fine?"})
    assert other.status_code == 201, other.text
    missing = owner.get(f"/api/v1/sessions/{session}/messages/999/text/")
    assert missing.status_code == 404
    assert stack.api("other").get(
        f"/api/v1/sessions/{session}/messages/{tool['sequence']}/text/"
    ).status_code == 404


def test_twenty_queued_messages_of_90000_characters_are_shown_steered_and_taken(
    stack: Stack,
) -> None:
    """Behind a write waiting for approval, 20 messages of 90,000 characters wait (1.8 MB of
    JSON, under the queue's 2 MiB): the snapshot and the queue show every one whole in under
    4 MiB, the approval is decided, the last message is steered ahead of the others, and the
    session takes every one; paging back through the conversation finds every text whole, and
    the agent's answer to each."""
    owner, staff = stack.api("owner"), stack.api("staff")
    message = POST.replace("big one", "ninety thousand")
    session = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": message}).json()[
        "id"]
    pending = wait_until(
        "the write to wait for approval",
        lambda: [item for item in staff.get("/api/v1/approvals/").json()
                 if item["session"] == session],
        timeout=30,
    )
    texts = [f"{n:02d} " + "q" * 89_997 for n in range(20)]
    ids = []
    for text in texts:
        answer = owner.post(f"/api/v1/sessions/{session}/messages/", json={"text": text})
        assert answer.status_code == 202, answer.text
        ids.append(answer.json()["id"])

    snapshot = owner.get(f"/api/v1/sessions/{session}/")
    assert snapshot.status_code == 200 and len(snapshot.content) < 4 * 1024 * 1024
    assert [item["text"] for item in snapshot.json()["queued_messages"]] == texts
    queue = owner.get(f"/api/v1/sessions/{session}/queue/").json()
    assert [item["text"] for item in queue["queued"]] == texts
    decided = staff.post(
        f"/api/v1/sessions/{session}/interrupts/{pending[0]['interrupt_id']}/",
        json={"approved": True},
    )
    assert decided.status_code == 200, decided.text
    # The last of 20 is steered while the first turns run: taken before the 19 others wait.
    steered = owner.post(f"/api/v1/sessions/{session}/queue/{ids[-1]}/steer/")
    assert steered.status_code == 202, steered.text

    def all_taken() -> dict[str, Any] | None:
        body: dict[str, Any] = owner.get(f"/api/v1/sessions/{session}/").json()
        last = body["messages"][-1] if body["messages"] else None
        done = (body["status"] == "waiting_for_user_message" and not body["queued_messages"]
                and not body["steered_messages"] and last is not None
                and last["text"] == f"You said: {texts[-2]}")
        return body if done else None

    final = wait_until("every queued message's turn", all_taken, timeout=240, interval=1)
    assert not final.get("last_turn_error")
    said: dict[int, str] = {}
    for sequence, item in paged_messages(owner, session).items():
        assert "text_length" not in item, sequence
        said[sequence] = item["text"]
    user_texts = [text for _, text in sorted(said.items()) if text in texts]
    assert sorted(user_texts) == sorted(texts)
    assert user_texts.index(texts[-1]) < user_texts.index(texts[-2])  # steered ahead
    answers = [text for text in said.values() if text.startswith("You said: ")]
    assert {text.removeprefix("You said: ") for text in answers} >= set(texts[:-1])
