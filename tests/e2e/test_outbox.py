"""Messages and approval decisions sent while the Dex worker is down are kept and delivered
once, end to end: the real engine, dexworker, web, demo model and a Celery worker as processes
(``tests/e2e/relay_stack.py``).

Each test stops the dexworker (the engine stays up, so Dex RPCs find no worker), writes
through the API, checks the write is kept and listed, starts a new dexworker and waits for the
Celery worker's retrying task to deliver it.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import PYTHON, wait_until
from tests.e2e.relay_stack import Stack, busy_session, running_stack
from tests.webhook_receiver import running_receiver

pytestmark = pytest.mark.e2e

GATED = "/tool slack__post_message " + json.dumps({"channel": "general", "text": "kept"})


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("outbox")
    # Approval emails are written as files (one per message) for the notification test;
    # webhooks may call its receiver on the loopback address.
    notices = {
        "EMAIL_URL": "filemail://",
        "EMAIL_FILE_PATH": str(root / "mail"),
        "DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE": "true",
        "DEXAGENTS_PUBLIC_URL": "https://agents.example.com",
    }
    # running_stack's own Celery worker delivers (a second one only competed for the CPU).
    with running_stack(root, extra_env=notices) as platform:
        yield platform


def stop_worker(stack: Stack) -> None:
    for proc in stack.processes.started:
        if proc.name == "worker":
            proc.stop()


def start_worker(stack: Stack) -> None:
    stack.processes.start(
        "worker", [PYTHON, "manage.py", "dexworker", "--max-concurrent-tasks", "32"]
    ).wait_for_line("dexworker ready")


def idle_snapshot(stack: Stack, session_id: str, *, user_messages: int) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        with stack.api("owner") as owner:
            answer = owner.get(f"/api/v1/sessions/{session_id}/")
        if answer.status_code != 200:
            return None
        snapshot: dict[str, Any] = answer.json()
        assert not snapshot.get("last_turn_error"), snapshot
        users = [m for m in snapshot["messages"] if m["role"] == "user"]
        if snapshot["status"] == "waiting_for_user_message" and len(users) >= user_messages:
            return snapshot
        return None

    return wait_until(f"{session_id} to answer", probe, timeout=120)


def user_texts(snapshot: dict[str, Any]) -> list[str]:
    return [m["text"] for m in snapshot["messages"] if m["role"] == "user"]


def outbox_row(stack: Stack, message_id: str) -> dict[str, Any]:
    row: dict[str, Any] = stack.django_shell(
        "import json; from agents_app.models import OutboxMessage as M; "
        f"m = M.objects.get(pk={message_id!r}); "
        "print(json.dumps({'delivery': m.delivery, 'attempts': m.attempts}))"
    )
    return row


def test_a_message_sent_while_the_worker_is_down_is_kept_listed_and_delivered_once(
    stack: Stack,
) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": "hello"})
        assert created.status_code == 201, created.text
        session_id = str(created.json()["id"])
        idle_snapshot(stack, session_id, user_messages=1)

        stop_worker(stack)
        sent = owner.post(
            f"/api/v1/sessions/{session_id}/messages/", json={"text": "sent while down"}
        )
        # Before the outbox: 503 "the engine did not answer", and the message was lost.
        assert sent.status_code == 202, sent.text
        body = sent.json()
        assert body["queued"] is True and body["delivery"] == "pending"
        queue = owner.get(f"/api/v1/sessions/{session_id}/queue/")
        assert queue.status_code == 200, queue.text
        assert [(e["id"], e["text"], e["delivery"]) for e in queue.json()["queued"]] == [
            (body["id"], "sent while down", "pending")
        ]

        start_worker(stack)
        snapshot = idle_snapshot(stack, session_id, user_messages=2)
        assert user_texts(snapshot) == ["hello", "sent while down"]
        row = outbox_row(stack, body["id"])
        assert row["delivery"] == "delivered" and row["attempts"] >= 2, row
        # Delivered exactly once: nothing more arrives after it (the queue is empty).
        assert owner.get(f"/api/v1/sessions/{session_id}/queue/").json()["queued"] == []
        assert user_texts(owner.get(f"/api/v1/sessions/{session_id}/").json()) == [
            "hello", "sent while down",
        ]


def test_delivering_the_same_outbox_row_twice_queues_it_once(stack: Stack) -> None:
    session_id, _ = busy_session(stack, GATED)
    # The turn waits for approval, so a delivered message stays in the queue. The row is
    # delivered, then set back to pending (as if the first answer had been lost) and
    # delivered again.
    result = stack.django_shell(
        "import json, uuid; from agents_app.sessions import outbox; "
        "from agents_app.models import AgentSession, OutboxMessage as M; "
        f"s = AgentSession.objects.get(pk={session_id!r}); "
        "m = M.objects.create(id=uuid.uuid4().hex, session=s, text='twice'); "
        "first = outbox.outbox_message_deliver(message=m); "
        "M.objects.filter(pk=m.pk).update(delivery='pending'); m.refresh_from_db(); "
        "second = outbox.outbox_message_deliver(message=m); "
        "print(json.dumps({'id': m.id, 'first': first, 'second': second}))"
    )
    assert (result["first"], result["second"]) == ("delivered", "delivered")
    with stack.api("owner") as owner:
        queued = owner.get(f"/api/v1/sessions/{session_id}/queue/").json()["queued"]
    assert [(e["text"], e["delivery"]) for e in queued] == [("twice", "delivered")]


WITHDRAWN_MID_SEND = """
import json, uuid
from agents_app.gateway import dex_gateway
from agents_app.sessions import outbox
from agents_app.models import AgentSession, OutboxMessage as M
s = AgentSession.objects.get(pk=SESSION)
m = M.objects.create(id=uuid.uuid4().hex, session=s, text='withdrawn mid-send')
send = dex_gateway.run
calls = []
def run(call, **options):
    answer = send(call, **options)
    calls.append(1)
    if len(calls) == 1:
        # The message reached Dex; its sender withdraws and deletes the row meanwhile
        # (session_input.session_message_send refusing it on a full queue).
        outbox.outbox_message_withdraw(session=s, message_id=m.id)
        M.objects.filter(pk=m.pk).delete()
    return answer
dex_gateway.run = run
print(json.dumps({"delivery": outbox.outbox_message_deliver(message=m)}))
"""


def test_a_row_withdrawn_and_deleted_mid_send_is_taken_back(stack: Stack) -> None:
    """Two senders: one delivers a row while the other, refused on a full queue, withdraws
    and deletes it. The deliverer takes the message back out of the queue instead of
    failing on the missing row (a 500 for a message that then ran)."""
    session_id, _ = busy_session(stack, GATED)
    result = stack.django_shell(
        "exec(" + repr(WITHDRAWN_MID_SEND.replace("SESSION", repr(session_id))) + ")"
    )
    assert result == {"delivery": "withdrawn"}
    with stack.api("owner") as owner:
        queued = owner.get(f"/api/v1/sessions/{session_id}/queue/").json()["queued"]
    assert all(entry["text"] != "withdrawn mid-send" for entry in queued), queued


def slack_posts(stack: Stack) -> list[dict[str, Any]]:
    path = Path(stack.env["DEXAGENTS_VAR_DIR"]) / "demo_mcp" / "slack_messages.json"
    return json.loads(path.read_text()) if path.exists() else []


def test_a_decision_while_the_worker_is_down_is_kept_and_delivered(stack: Stack) -> None:
    session_id, pending = busy_session(stack, GATED)
    posts_before = len(slack_posts(stack))
    url = f"/api/v1/sessions/{session_id}/interrupts/{pending['interrupt_id']}/"
    with stack.api("staff") as staff:
        stop_worker(stack)
        decided = staff.post(url, json={"approved": True})
        assert decided.status_code == 202, decided.text
        body = decided.json()
        assert (body["resolved"], body["delivery"]) == (False, "pending")
        assert body["decision"]["approved"] is True
        assert body["decision"]["decided_by"] == "staff"
        listed = [
            item for item in staff.get("/api/v1/approvals/").json()
            if item["session"] == session_id
        ]
        assert [(item["state"], item["decision"]["delivery"]) for item in listed] == [
            ("decided", "pending")
        ]
        again = staff.post(url, json={"approved": False, "rejection_message": "no"})
        assert again.status_code == 409, again.text
        assert again.json()["decision"] == body["decision"]

        start_worker(stack)
        snapshot = idle_snapshot(stack, session_id, user_messages=1)
        assert snapshot["pending_interrupts"] == []
        # The approved write ran once.
        assert len(slack_posts(stack)) == posts_before + 1
        final = staff.post(url, json={"approved": True})
        assert final.status_code == 409, final.text
        recorded = final.json()["decision"]
        assert (recorded["approved"], recorded["delivery"]) == (True, "delivered")
        assert [
            item for item in staff.get("/api/v1/approvals/").json()
            if item["session"] == session_id
        ] == []


#: A reply of 900 words streamed three words a second (five minutes): far longer than a worker
#: restart and the cancel's delivery after it, which end it early.
LONG_SLOW = "/slow 1\n" + " ".join(f"word{n}" for n in range(900))


def test_a_cancel_while_the_worker_is_down_is_kept_and_ends_the_turn(stack: Stack) -> None:
    with stack.api("owner") as owner:
        created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": LONG_SLOW})
        assert created.status_code == 201, created.text
        session_id = str(created.json()["id"])
        wait_until(
            "the model to stream",
            lambda: owner.get(f"/api/v1/sessions/{session_id}/").json()["status"]
            == "running_model",
            timeout=60,
        )
        # A crash, not a clean stop (which would let the streaming Step finish first).
        for proc in stack.processes.started:
            if proc.name == "worker":
                proc.signal_group(signal.SIGKILL)
                proc.popen.wait(timeout=30)
        cancel = f"/api/v1/sessions/{session_id}/turn/cancel/"
        assert owner.post(cancel, json={"turn_id": "x"}).status_code == 400
        answer = owner.post(cancel, json={"turn_id": "turn-1"})
        assert answer.status_code == 202, answer.text
        body = answer.json()
        assert (body["cancelled"], body["turn_id"], body["delivery"]) == (True, "turn-1", "pending")
        kept: dict[str, Any] = stack.django_shell(
            "import json; from agents_app.models import OutboxTurnCancel as C; "
            f"print(json.dumps(list(C.objects.filter(session_id={session_id!r})"
            ".values('turn_id', 'delivery'))))"
        )
        assert kept == [{"turn_id": "turn-1", "delivery": "pending"}]

        start_worker(stack)
        snapshot = idle_snapshot(stack, session_id, user_messages=1)
        # The turn ended cancelled: no complete answer was stored.
        full = "You said: " + LONG_SLOW.split("\n", 1)[1]
        assert all(message["text"] != full for message in snapshot["messages"])
        # What follows the message is marked: streamed text as interrupted, or, when the
        # restarted call made no request, the cancelled turn's notice.
        assert snapshot["messages"][1:], snapshot["messages"]
        assert all(
            message.get("interrupted") or message.get("notice") == "turn_cancelled"
            for message in snapshot["messages"][1:]
        ), snapshot["messages"]
        delivered: dict[str, Any] = stack.django_shell(
            "import json; from agents_app.models import OutboxTurnCancel as C; "
            f"print(json.dumps(list(C.objects.filter(session_id={session_id!r})"
            ".values_list('delivery', flat=True))))"
        )
        assert delivered == ["delivered"]
        assert owner.post(cancel).status_code == 409


WEBHOOK_SECRET = "whsec_e2e-secret"


def test_an_approval_mails_opted_in_staff_and_webhooks_report_it_signed(stack: Stack) -> None:
    """A write waits for approval: the opted-in staff user alone gets an email (through the
    file backend, from the Celery worker) and the local receiver gets approval.requested,
    approval.decided and turn.completed, each with a signature it verifies."""
    from agents_app.notify.webhooks import webhook_signature_verify

    mail_dir = Path(stack.env["EMAIL_FILE_PATH"])
    with running_receiver() as receiver, stack.api("staff") as staff, \
            stack.api("owner") as owner:
        created_hook = stack.django_shell(
            "import json; from django.contrib.auth import get_user_model; "
            "from agents_app.models import Webhook; U = get_user_model(); "
            "U.objects.filter(username='staff').update(email='staff@example.com'); "
            "U.objects.create(username='quiet-reviewer', is_staff=True, "
            "email='quiet@example.com'); "
            f"w = Webhook.objects.create(name='e2e', url={receiver.url!r}, "
            f"secret={WEBHOOK_SECRET!r}, events=['approval.requested', 'approval.decided', "
            "'turn.completed']); print(json.dumps(w.pk))"
        )
        try:
            opted = staff.put("/api/v1/me/notifications/", json={"email_on_approval": True})
            assert opted.status_code == 200, opted.text
            assert opted.json() == {"email_on_approval": True, "email": "staff@example.com"}
            # Not staff: no say in approvals, no emails.
            assert owner.put("/api/v1/me/notifications/",
                             json={"email_on_approval": True}).status_code == 403

            created = owner.post("/api/v1/sessions/", json={"agent": "demo", "message": GATED})
            assert created.status_code == 201, created.text
            session_id = str(created.json()["id"])
            held = wait_until("the approval to wait in Dex",
                              lambda: stack.held_approvals(session_id), timeout=60)

            def session_mails() -> list[str] | None:
                texts = [path.read_text() for path in sorted(mail_dir.glob("*.log"))]
                mine = [text for text in texts if f"/sessions/{session_id}/" in text]
                return mine or None

            mails = wait_until("the approval email", session_mails, timeout=60)
            assert len(mails) == 1, mails
            assert "To: staff@example.com" in mails[0]
            assert "Subject: [dexagents] Approval needed: slack__post_message (demo)" in mails[0]
            assert "Tool: slack__post_message" in mails[0]
            assert (f"https://agents.example.com/sessions/{session_id}/"
                    f"#call-{held[0]['tool_call_id']}") in mails[0]

            url = f"/api/v1/sessions/{session_id}/interrupts/{held[0]['interrupt_id']}/"
            decided = staff.post(url, json={"approved": True})
            assert decided.status_code == 200, decided.text
            idle_snapshot(stack, session_id, user_messages=1)

            def session_events() -> list[dict[str, Any]] | None:
                found = []
                for request in list(receiver.requests):
                    body = json.loads(request["body"])
                    if body["data"].get("session") == session_id:
                        found.append({**request, "json": body})
                return found if len(found) >= 3 else None

            received = wait_until("three webhook events", session_events, timeout=90)
            by_event = {item["json"]["event"]: item for item in received}
            assert sorted(by_event) == ["approval.decided", "approval.requested",
                                        "turn.completed"]
            assert len(received) == 3, [item["json"]["event"] for item in received]
            for item in received:
                headers = item["headers"]
                assert webhook_signature_verify(
                    secret=WEBHOOK_SECRET, timestamp=headers["X-Dexagents-Timestamp"],
                    body=item["body"], signature=headers["X-Dexagents-Signature"],
                    now=time.time(),
                ), item
            # Emitted in the order the facts were committed.
            order = sorted(received, key=lambda item: item["json"]["created_at"])
            assert [item["json"]["event"] for item in order] == [
                "approval.requested", "approval.decided", "turn.completed"]
            decided_data = by_event["approval.decided"]["json"]["data"]
            assert (decided_data["outcome"], decided_data["decided_by"]) == ("approved", "staff")
            assert by_event["approval.requested"]["json"]["data"]["tool"] == (
                "slack__post_message")
            # Only the opted-in reviewer was mailed, once.
            assert len(session_mails() or []) == 1
        finally:
            stack.django_shell(
                "import json; from agents_app.models import Webhook; "
                f"print(json.dumps(Webhook.objects.filter(pk={created_hook}).update("
                "active=False)))"
            )
