"""The message queue and Steer (platform additions) against the real engine and Worker children."""

from __future__ import annotations

import asyncio
import datetime
from pathlib import Path

from dex_agents import (
    CANCELLED_BY_STEER_OUTPUT,
    AgentEventType,
    AgentSessionClient,
    AgentSnapshot,
    ToolCallStatus,
)
from dex_agents.testing import wait_for_agent_snapshot
from tests.dex_agents.scripted_agent import (
    STEERING_FLOW_TYPE,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    closed_interrupts,
    flow_of,
    last_text,
    running_session,
    session_at_gate,
    user_texts,
    wait_for_idle,
    wait_for_interrupt,
)


async def queued_texts(sessions: AgentSessionClient, session_id: str) -> list[str]:
    queue = await sessions.get_message_queue(session_id)
    return [item.text for item in queue.queued]


async def test_queue_lists_edits_and_deletes_pending_messages(tmp_path: Path) -> None:
    async with session_at_gate(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _, gate):
        assert await sessions.send_user_message("session-1", "one", plan_mode=True, client_id="c1")
        assert await sessions.send_user_message("session-1", "two")
        queue = await sessions.get_message_queue("session-1")
        assert [(item.text, item.plan_mode) for item in queue.queued] == [
            ("one", True),
            ("two", False),
        ]
        assert queue.steered == []
        assert queue.queued[0].client_id == "c1"
        assert all(item.message_id and item.created_at is not None for item in queue.queued)
        two_id = queue.queued[1].message_id
        assert two_id != "c1"

        # By the sender's own ID, then again: the second time it is no longer pending.
        assert await sessions.delete_queued_message("session-1", "c1")
        assert not await sessions.delete_queued_message("session-1", "c1")
        assert await queued_texts(sessions, "session-1") == ["two"]

        # Edit: the old message leaves, the new one joins at the tail under a new ID.
        assert await sessions.send_user_message("session-1", "tail")
        assert await sessions.replace_queued_message("session-1", two_id, "three", client_id="c3")
        queue = await sessions.get_message_queue("session-1")
        assert [item.text for item in queue.queued] == ["tail", "three"]
        assert two_id not in {item.message_id for item in queue.queued}
        assert not await sessions.replace_queued_message("session-1", two_id, "again")
        assert not await sessions.replace_queued_message("session-1", "c3", "   ")
        assert not await sessions.steer_queued_message("session-1", "no-such-message")
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert [item.text for item in snapshot.queued_messages] == ["tail", "three"]

        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=8)
        assert user_texts(snapshot)[-2:] == ["tail", "three"]
        assert last_text(snapshot) == "echo: three"


async def test_a_send_repeated_under_its_client_id_queues_the_message_once(
    tmp_path: Path,
) -> None:
    async with session_at_gate(
        tmp_path, flow_type=STEERING_FLOW_TYPE
    ) as (stack, sessions, _, gate):
        # A sender that lost the answer sends again under the same ID: True, nothing new.
        assert await sessions.send_user_message("session-1", "once", client_id="outbox-1")
        assert await sessions.send_user_message("session-1", "once", client_id="outbox-1")
        # Concurrent repeats take turns on the ID's lock; one of them queues.
        results = await asyncio.gather(
            *(
                sessions.send_user_message("session-1", "raced", client_id="outbox-2")
                for _ in range(3)
            )
        )
        assert results == [True, True, True]
        assert await queued_texts(sessions, "session-1") == ["once", "raced"]

        gate.release()
        # Each message runs its own turn (user message and answer).
        snapshot = await wait_for_idle(sessions, "session-1", message_count=8)
        assert user_texts(snapshot)[-2:] == ["once", "raced"]
        # Once a turn took it, the ID still finds it: a late repeat is not queued again.
        assert await sessions.send_user_message("session-1", "once", client_id="outbox-1")
        assert await sessions.send_user_message("session-1", "after", client_id="outbox-3")
        snapshot = await wait_for_idle(sessions, "session-1", message_count=10)
        assert user_texts(snapshot)[-3:] == ["once", "raced", "after"]
        assert user_texts(snapshot).count("once") == 1
        # Each turn's turn_started names the client_id of the message it took (none for the
        # start message, which had none), so a sender can find the turn that answers it.
        events = await stack.client.list_stream_messages(
            "session-1", flow_of(stack, STEERING_FLOW_TYPE).agent_events, 200
        )
        started = [message.value.payload for message in reversed(events.messages)
                   if message.value.type == AgentEventType.TURN_STARTED]
        assert [item.get("client_ids") for item in started] == [
            None, ["outbox-1"], ["outbox-2"], ["outbox-3"]
        ]


async def test_steer_cancels_unstarted_calls_withdraws_approvals_and_reaches_the_model(
    tmp_path: Path,
) -> None:
    async with session_at_gate(
        tmp_path, "gated_read", "tools: gated_read, refund", flow_type=STEERING_FLOW_TYPE
    ) as (_, sessions, _, gate):
        interrupt = await wait_for_interrupt(sessions, "session-1")

        assert await sessions.send_user_message("session-1", "change course", client_id="s1")
        assert await sessions.steer_queued_message("session-1", "s1")
        assert not await sessions.steer_queued_message("session-1", "s1")

        def superseded(snapshot: AgentSnapshot) -> AgentSnapshot | None:
            statuses = {call.tool_name: call.status for call in snapshot.tool_calls}
            if not snapshot.pending_interrupts and statuses.get("refund") == "cancelled":
                return snapshot
            return None

        snapshot = await wait_for_agent_snapshot(
            sessions, "session-1", superseded, description="the approval withdrawn"
        )
        # The running read is not cancelled: it finishes and keeps its record.
        statuses = {call.tool_name: call.status for call in snapshot.tool_calls}
        assert statuses["gated_read"] is ToolCallStatus.PENDING
        assert [item.text for item in snapshot.steered_messages] == ["change course"]
        assert snapshot.queued_messages == []
        assert not await sessions.resolve_interrupt(
            "session-1", interrupt.interrupt_id, approved=True
        )

        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert last_text(snapshot) == (
            "gated_read=succeeded: gated_read ok; "
            f"refund=cancelled: {CANCELLED_BY_STEER_OUTPUT} steered=['change course']"
        )
        assert user_texts(snapshot) == ["tools: gated_read, refund", "change course"]
        assert snapshot.steered_messages == []
        assert invocation_log(tmp_path).count("tool", "refund") == 0
        assert invocation_log(tmp_path).count("model", "turn-1") == 2
        assert closed_interrupts(tmp_path) == [[interrupt.interrupt_id, "withdrawn"]]


async def test_a_queued_message_never_interrupts_an_approval_wait(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "tools: refund", flow_type=STEERING_FLOW_TYPE
    ) as (_, sessions, _):
        interrupt = await wait_for_interrupt(sessions, "session-1")
        assert await sessions.send_user_message("session-1", "later")
        snapshot = await sessions.get_agent_snapshot("session-1")
        assert snapshot.queued_message_count == 1
        assert [item.interrupt_id for item in snapshot.pending_interrupts] == [
            interrupt.interrupt_id
        ]

        assert await sessions.resolve_interrupt("session-1", interrupt.interrupt_id, approved=True)
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert [message.text for message in snapshot.messages[-3:-1]] == [
            "refund=succeeded: refund ok",
            "later",
        ]
        assert last_text(snapshot) == "echo: later"


async def test_a_steer_survives_a_worker_kill_before_the_next_boundary(tmp_path: Path) -> None:
    async with session_at_gate(
        tmp_path, flow_type=STEERING_FLOW_TYPE
    ) as (stack, sessions, worker, gate):
        assert await sessions.send_user_message("session-1", "steer me", client_id="k1")
        assert await sessions.steer_queued_message("session-1", "k1")
        worker.kill()
        gate.release()
        await stack.start_worker()

        snapshot = await wait_for_idle(sessions, "session-1", message_count=5)
        # The read had started, so its retry runs it again rather than cancelling it.
        assert last_text(snapshot) == "gated_read=succeeded: gated_read ok steered=['steer me']"
        assert user_texts(snapshot).count("steer me") == 1
        assert invocation_log(tmp_path).count("tool", "gated_read") == 2
        assert (await sessions.get_message_queue("session-1")).steered == []


async def test_two_steers_reach_the_resumed_model_call_in_order(tmp_path: Path) -> None:
    async with session_at_gate(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _, gate):
        # Two steers while the tool runs: both reach the resumed model call, in order.
        for client_id in ("a", "b"):
            assert await sessions.send_user_message(
                "session-1", f"steer {client_id}", client_id=client_id
            )
            assert await sessions.steer_queued_message("session-1", client_id)
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert last_text(snapshot).endswith("steered=['steer a', 'steer b']")


async def test_a_flow_without_steering_refuses_to_steer(tmp_path: Path) -> None:
    async with session_at_gate(tmp_path) as (_, sessions, _, gate):
        assert await sessions.send_user_message("session-1", "wait your turn", client_id="w")
        assert not await sessions.steer_queued_message("session-1", "w")
        assert await queued_texts(sessions, "session-1") == ["wait your turn"]
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert last_text(snapshot) == "echo: wait your turn"


async def test_a_message_keeps_the_time_its_sender_gives_it(tmp_path: Path) -> None:
    """A sender that kept a message before sending it (the platform's outbox, while a budget
    held it) gives the time it was sent: the queue and the stored message keep that time,
    not the time the session accepted it."""
    sent = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    async with session_at_gate(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _, gate):
        assert await sessions.send_user_message(
            "session-1", "kept a while", client_id="k1", created_at=sent
        )
        assert await sessions.send_user_message("session-1", "sent now")
        queue = await sessions.get_message_queue("session-1")
        assert queue.queued[0].created_at == sent
        assert queue.queued[1].created_at is not None and queue.queued[1].created_at > sent
        gate.release()
        snapshot = await wait_for_idle(sessions, "session-1", message_count=7)
        kept = [message for message in snapshot.messages if message.text == "kept a while"]
        assert [message.created_at for message in kept] == [sent]


async def test_the_queue_lists_a_steered_message_apart_from_the_queued_ones(
    tmp_path: Path,
) -> None:
    async with session_at_gate(tmp_path, flow_type=STEERING_FLOW_TYPE) as (_, sessions, _, gate):
        assert await sessions.send_user_message("session-1", "first", client_id="c-first")
        assert await sessions.send_user_message(
            "session-1", "second", plan_mode=True, client_id="c-second"
        )
        # The second one is steered: the steered Channel's first message must not be taken
        # for the queued Channel's first one.
        assert await sessions.steer_queued_message("session-1", "c-second")
        # ResumeTurn takes a steered message at once; between its wait consuming the message
        # and its commit keeping it for the next model call, neither lists it.
        snapshot = await wait_for_agent_snapshot(
            sessions, "session-1", lambda snapshot: snapshot if snapshot.steered_messages else None,
            description="the steered message listed",
        )
        queue = await sessions.get_message_queue("session-1")
        assert [(item.client_id, item.plan_mode) for item in queue.steered] == [
            ("c-second", True)
        ]
        assert [(item.client_id, item.text) for item in queue.queued] == [("c-first", "first")]
        assert [item.text for item in snapshot.steered_messages] == ["second"]
        assert [item.text for item in snapshot.queued_messages] == ["first"]
        gate.release()


async def test_a_message_steered_while_the_last_model_call_streams_starts_the_next_turn(
    tmp_path: Path,
) -> None:
    async with session_at_gate(
        tmp_path, "model_hold", "hold", flow_type=STEERING_FLOW_TYPE
    ) as (_, sessions, _, gate):
        assert await sessions.send_user_message("session-1", "queued first", client_id="q1")
        assert await sessions.send_user_message("session-1", "steered", client_id="q2")
        assert await sessions.steer_queued_message("session-1", "q2")
        gate.release()
        # The call answers without tools, so the turn ends; the steered message, sent after
        # the other one, is the next turn all the same.
        snapshot = await wait_for_idle(sessions, "session-1", message_count=6)
        assert user_texts(snapshot) == ["hold", "steered", "queued first"]
