"""Questions MCP servers ask during a tool call (platform addition, MCP elicitation) against the
real engine and Worker children.

The scripted ``ask_form`` tool asks ``ASK_FORM_SCHEMA`` the way an MCP server's
``elicitation/create`` is answered by the platform (``dex_agents.ToolCallElicitations``, through
the Worker's own Dex client); the test answers through ``AgentSessionClient``, as the REST API
does.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dex_agents import (
    AgentElicitation,
    AgentEventType,
    AgentSessionClient,
    ElicitationStatus,
    ToolCallStatus,
)
from dex_agents.testing import AgentTestStack, FileGate, wait_for_agent_snapshot, wait_until
from tests.dex_agents.scripted_agent import (
    ASK_FORM_MESSAGE,
    ASK_FORM_SCHEMA,
    STEERING_FLOW_TYPE,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    flow_of,
    last_text,
    running_session,
    scripted_stack,
    wait_for_idle,
)

SESSION = "session-ask"


def asked(state_dir: Path) -> list[str]:
    """The outcomes ``ask_form`` returned, one per attempt that got one."""
    return [name for kind, name in invocation_log(state_dir).entries() if kind == "asked"]


async def pending_question(sessions: AgentSessionClient, session_id: str) -> AgentElicitation:
    return await wait_for_agent_snapshot(
        sessions,
        session_id,
        lambda snapshot: next(iter(snapshot.pending_elicitations), None),
        description="a question of the tool call",
    )


async def event_types(stack: AgentTestStack, session_id: str) -> list[tuple[str, dict]]:
    flow = flow_of(stack, STEERING_FLOW_TYPE)
    page = await stack.client.list_stream_messages(session_id, flow.agent_events, 500)
    return [(str(m.value.type), m.value.payload) for m in reversed(page.messages)]


async def test_a_question_waits_for_a_valid_answer_which_the_call_gets_once(
    tmp_path: Path,
) -> None:
    async with running_session(
        tmp_path, "tools: ask_form", flow_type=STEERING_FLOW_TYPE, session_id=SESSION
    ) as (stack, sessions, _):
        question = await pending_question(sessions, SESSION)
        assert question.message == ASK_FORM_MESSAGE
        assert question.requested_schema == ASK_FORM_SCHEMA
        assert question.field_order == ["name", "age"]
        assert question.mode == "form"
        assert question.tool_name == "ask_form"
        assert question.server_name == "scripted"
        assert question.status is ElicitationStatus.PENDING
        assert question.deadline > question.requested_at
        snapshot = await sessions.get_agent_snapshot(SESSION)
        assert [record.status for record in snapshot.tool_calls] == [ToolCallStatus.PENDING]

        refused = await sessions.answer_elicitation(
            SESSION, question.elicitation_id, "accept", {"age": -3, "colour": "red"}
        )
        assert (refused.accepted, refused.reason) == (False, "invalid")
        assert refused.errors == {
            "": ["Not a field of this form: colour."],
            "name": ["This field is required."],
            "age": ["Enter a number of at least 0."],
        }
        # Nothing was lost: the question still waits, and takes a valid answer.
        still = await sessions.get_agent_snapshot(SESSION)
        assert [item.elicitation_id for item in still.pending_elicitations] == [
            question.elicitation_id
        ]
        bad_action = await sessions.answer_elicitation(SESSION, question.elicitation_id, "maybe")
        assert bad_action.reason == "bad_action"
        answered = await sessions.answer_elicitation(
            SESSION, question.elicitation_id, "accept", {"name": "Ada", "age": 36.0}
        )
        assert answered.accepted, answered
        again = await sessions.answer_elicitation(SESSION, question.elicitation_id, "decline")
        assert (again.accepted, again.reason) == (False, "not_pending")

        snapshot = await wait_for_idle(sessions, SESSION, message_count=4)
        assert snapshot.pending_elicitations == []
        assert 'ask_form=succeeded: accept {"age": 36, "name": "Ada"}' in last_text(snapshot)
        assert asked(tmp_path) == ["accept attempt=1"]
        events = await event_types(stack, SESSION)
        requested = [data for kind, data in events if kind == "elicitation_requested"]
        closed = [data for kind, data in events if kind == "elicitation_closed"]
        assert [item["elicitation_id"] for item in requested] == [question.elicitation_id]
        assert requested[0]["message"] == ASK_FORM_MESSAGE
        assert closed == [
            {
                "tool_call_id": question.tool_call_id,
                "tool_name": "ask_form",
                "elicitation_id": question.elicitation_id,
                "server": "scripted",
                "status": "accepted",
                "reason": "",
                "reused": False,
            }
        ]
        assert str(AgentEventType.ELICITATION_CLOSED) == "elicitation_closed"


async def test_decline_and_an_expired_question_answer_the_server(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "tools: ask_form", flow_type=STEERING_FLOW_TYPE, session_id="declined"
    ) as (stack, sessions, _):
        question = await pending_question(sessions, "declined")
        assert (await sessions.answer_elicitation("declined", question.elicitation_id,
                                                  "decline")).accepted
        snapshot = await wait_for_idle(sessions, "declined", message_count=4)
        assert "ask_form=succeeded: decline null" in last_text(snapshot)

        await sessions.start_session(
            "expired", "tools: ask_form", agent_config={"elicitation_timeout": 2}
        )
        question = await pending_question(sessions, "expired")
        snapshot = await wait_for_idle(sessions, "expired", message_count=4)
        assert "ask_form=succeeded: cancel null" in last_text(snapshot)
        assert "expired: the user did not answer within 2 s" in last_text(snapshot)
        late = await sessions.answer_elicitation("expired", question.elicitation_id, "decline")
        assert (late.accepted, late.reason) == (False, "not_pending")
        closed = [data for kind, data in await event_types(stack, "expired")
                  if kind == "elicitation_closed"]
        assert [item["status"] for item in closed] == ["expired"]


async def test_the_questions_of_one_call_share_its_time_for_questions(tmp_path: Path) -> None:
    """The tool Step's limit makes room for one elicitation timeout, so all the questions of
    one attempt share it: once the first used it up, the second is declined unasked and the
    model reads why (it used to be asked, and the Step's limit cut the call off mid-answer)."""
    async with running_session(
        tmp_path,
        "tools: ask_form_twice",
        flow_type=STEERING_FLOW_TYPE,
        session_id=SESSION,
        agent_config={"elicitation_timeout": 2},
    ) as (stack, sessions, _):
        await pending_question(sessions, SESSION)
        snapshot = await wait_for_idle(sessions, SESSION, message_count=4)
        text = last_text(snapshot)
        assert "ask_form_twice=succeeded: cancel null | decline null" in text
        assert "the call's time for questions (2 s in all) is used up" in text
        requested = [data for kind, data in await event_types(stack, SESSION)
                     if kind == "elicitation_requested"]
        assert [item["message"] for item in requested] == ["Who are you?"]


async def test_a_steered_message_withdraws_the_question(tmp_path: Path) -> None:
    async with running_session(
        tmp_path, "tools: ask_form", flow_type=STEERING_FLOW_TYPE, session_id=SESSION
    ) as (stack, sessions, _):
        question = await pending_question(sessions, SESSION)
        assert await sessions.send_user_message(SESSION, "never mind", client_id="m1")
        assert await sessions.steer_queued_message(SESSION, "m1")
        snapshot = await wait_for_idle(sessions, SESSION, message_count=5)
        text = last_text(snapshot)
        assert "ask_form=succeeded: cancel null" in text
        assert "withdrawn (a steered user message superseded it)" in text
        assert "steered=['never mind']" in text
        late = await sessions.answer_elicitation(SESSION, question.elicitation_id, "decline")
        assert late.reason == "not_pending"
        closed = [data for kind, data in await event_types(stack, SESSION)
                  if kind == "elicitation_closed"]
        assert [(item["status"], item["reason"]) for item in closed] == [
            ("withdrawn", "steered")
        ]


async def test_a_killed_worker_leaves_the_question_to_the_retried_attempt(
    tmp_path: Path,
) -> None:
    """A read retries: the next attempt asks the same question, which keeps its ID and deadline
    and takes the answer given meanwhile. A single-attempt write ends ``outcome_unknown`` and
    its question is withdrawn."""
    async with running_session(
        tmp_path, "tools: ask_form", flow_type=STEERING_FLOW_TYPE, session_id=SESSION
    ) as (stack, sessions, worker):
        await sessions.start_session("once", "tools: ask_form_once")
        question = await pending_question(sessions, SESSION)
        once = await pending_question(sessions, "once")
        worker.kill()
        await stack.start_worker()

        snapshot = await wait_for_idle(sessions, "once", message_count=4)
        assert "ask_form_once=outcome_unknown" in last_text(snapshot)
        assert snapshot.pending_elicitations == []
        late = await sessions.answer_elicitation("once", once.elicitation_id, "decline")
        assert late.reason == "not_pending"

        async def asked_again() -> bool:
            kinds = [kind for kind, _ in await event_types(stack, SESSION)]
            return kinds.count("elicitation_requested") == 2

        probe: Callable[[], Any] = asked_again
        await wait_until("the retried attempt to ask again", probe, timeout=40)
        again = await pending_question(sessions, SESSION)
        assert again == question  # same ID, same deadline: the retry waits on it
        answered = await sessions.answer_elicitation(
            SESSION, question.elicitation_id, "accept", {"name": "Grace"}
        )
        assert answered.accepted, answered
        snapshot = await wait_for_idle(sessions, SESSION, message_count=4)
        assert 'ask_form=succeeded: accept {"name": "Grace"}' in last_text(snapshot)
        assert asked(tmp_path) == ["accept attempt=2"]
        closed = [data for kind, data in await event_types(stack, SESSION)
                  if kind == "elicitation_closed"]
        assert [item["status"] for item in closed] == ["accepted"]
        assert json.dumps(again.requested_schema, sort_keys=True) == json.dumps(
            ASK_FORM_SCHEMA, sort_keys=True
        )


async def test_an_answer_given_before_a_worker_died_is_reused_by_the_retry(
    tmp_path: Path,
) -> None:
    """The server got the answer, then the Worker died before the call's result was stored:
    the retried attempt's server asks the same question again and gets the same answer at
    once, without asking the user."""
    async with scripted_stack(tmp_path) as stack:
        sessions = stack.sessions(flow_of(stack, STEERING_FLOW_TYPE))
        worker = await stack.start_worker()
        gate = FileGate(tmp_path, "ask_form_gated")
        await sessions.start_session(SESSION, "tools: ask_form_gated")
        question = await pending_question(sessions, SESSION)
        answered = await sessions.answer_elicitation(
            SESSION, question.elicitation_id, "accept", {"name": "Ada", "age": 36}
        )
        assert answered.accepted, answered
        await gate.wait_until_reached()
        worker.kill()
        gate.release()
        await stack.start_worker()

        snapshot = await wait_for_idle(sessions, SESSION, message_count=4)
        assert 'ask_form_gated=succeeded: accept {"age": 36, "name": "Ada"}' in last_text(
            snapshot
        )
        assert asked(tmp_path) == ["accept attempt=1", "accept attempt=2"]
        events = await event_types(stack, SESSION)
        assert [kind for kind, _ in events].count("elicitation_requested") == 1
        closed = [data for kind, data in events if kind == "elicitation_closed"]
        assert [(item["status"], item["reused"]) for item in closed] == [
            ("accepted", False),
            ("accepted", True),
        ]
