"""The outbox without a worker: what is kept, retried, refused and pruned.

Dex is absent (a real refused connection, ``engine_down``); delivery with the engine and a
worker, and a redelivery of the same row, are in ``tests/e2e/test_outbox.py``.
"""

import datetime
from typing import Any

import pytest
from celery.exceptions import Retry
from django.utils import timezone

from agents_app import tasks
from agents_app.models import AgentSession, OutboxMessage
from agents_app.sessions import outbox
from tests.factories import AgentDefinitionFactory, AgentSessionFactory

pytestmark = pytest.mark.django_db

SESSION_ID = "ses_fffffffffffffffffffffffffffffff3"


@pytest.fixture
def session(owner: Any) -> AgentSession:
    return AgentSessionFactory.create(
        id=SESSION_ID, owner=owner, agent=AgentDefinitionFactory.create(slug="demo"),
        status="waiting_for_user_message",
    )


def kept(session: AgentSession, text: str, **fields: Any) -> OutboxMessage:
    return OutboxMessage.objects.create(
        id=f"{len(text):02d}{text:0<30}"[:32], session=session, text=text, **fields
    )


def test_the_delivery_task_retries_while_the_engine_does_not_answer(
    session: AgentSession, engine_down: str, settings: Any
) -> None:
    message = kept(session, "later")
    # The task function itself, run in this process (the retry path): it asks Celery for a
    # retry and leaves the row pending, with the attempt and its error noted.
    with pytest.raises(Retry):
        tasks.deliver_session_messages.apply(args=(SESSION_ID,), throw=True)
    message.refresh_from_db()
    assert message.delivery == "pending"
    assert message.attempts == 1 and engine_down in message.last_error


def test_the_sweep_stops_at_the_first_deferral_and_counts_what_waits(
    session: AgentSession, engine_down: str
) -> None:
    kept(session, "one")
    kept(session, "two")
    counts = outbox.outbox_deliver_all()
    assert counts == {"messages": 0, "decisions": 0, "cancels": 0, "pruned": 0, "pending": 2}
    # Messages of a session are tried oldest first; the second waits behind the first.
    attempts = OutboxMessage.objects.order_by("created_at").values_list("attempts", flat=True)
    assert list(attempts) == [1, 0]


def test_a_message_for_a_stopped_session_is_refused_without_asking_dex(
    session: AgentSession, engine_down: str
) -> None:
    message = kept(session, "too late")
    AgentSession.objects.filter(pk=SESSION_ID).update(status="stopped")
    assert outbox.outbox_session_deliver(session_id=SESSION_ID) == 0
    message.refresh_from_db()
    assert (message.delivery, message.attempts) == ("refused", 0)
    assert message.last_error == outbox.SESSION_STOPPED_REASON


def test_finished_messages_are_pruned_after_a_week(session: AgentSession) -> None:
    old = timezone.now() - datetime.timedelta(days=outbox.OUTBOX_KEEP_DAYS + 1)
    for text, delivery in (("done", "delivered"), ("gone", "withdrawn"), ("waits", "pending")):
        kept(session, text, delivery=delivery)
    OutboxMessage.objects.update(created_at=old)
    kept(session, "fresh", delivery="delivered")
    assert outbox.outbox_prune() == 2
    assert sorted(OutboxMessage.objects.values_list("text", flat=True)) == ["fresh", "waits"]


def test_a_message_dex_already_lists_is_not_added_again_from_the_outbox(
    session: AgentSession,
) -> None:
    from agents_app.selectors.session_reads import snapshot_with_outbox

    # Delivered while the snapshot was read: Dex lists it, its row is not marked delivered yet.
    delivered = kept(session, "delivered meanwhile")
    waiting = kept(session, "still waiting")
    snapshot = {
        "queued_messages": [{"id": delivered.id, "text": delivered.text, "plan_mode": False,
                             "created_at": None}],
        "steered_messages": [],
        "queued_message_count": 1,
    }
    shown = snapshot_with_outbox(session=session, snapshot=snapshot)
    assert [(entry["id"], entry["delivery"]) for entry in shown["queued_messages"]] == [
        (delivered.id, "delivered"), (waiting.id, "pending"),
    ]
    assert shown["queued_message_count"] == 2
