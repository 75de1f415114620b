"""Context compaction and retention (platform addition) against the real engine and Worker
children, with the scripted runner's deterministic token counts and summarizer."""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from dex_agents import (
    AGENT_MESSAGES,
    AGENT_TOOL_CALLS,
    AgentEvent,
    AgentEventType,
    AgentMessage,
    AgentSessionClient,
    AgentSessionFlow,
    AgentSessionOptions,
    AgentSnapshot,
    AgentStatus,
    CompactContext,
    CompactionOptions,
    CompactionPlan,
    ContextSummary,
    MessageRole,
    RecordTurnFailure,
    RunModel,
    ToolCallStatus,
    message_sequence_key,
)
from dex_agents._compaction import CompactionBudgets, choose_cutoff, plan_chunks
from dex_agents._steps import compact_movement, run_model_movement
from dex_agents.testing import (
    EXECUTE_COMPLETED_EVENT,
    AgentTestStack,
    FileGate,
    wait_for_agent_snapshot,
)
from tests.dex_agents.scripted_agent import (
    COMPACTING_FLOW_TYPE,
    HUGE_RESULT,
    MODEL_USAGE,
    SUMMARIZE_GATE,
    SUMMARY_USAGE,
    TOOL_RESULT_MAX_CHARS,
    WHOLE_RESULT,
    ScriptedRunner,
    changes_path,
    inputs_path,
    invocation_log,
)
from tests.dex_agents.scripted_sessions import (
    TURN_TIMEOUT,
    RunningSession,
    flow_of,
    read_whole,
    running_session,
    stored_part_keys,
    wait_for_interrupt,
)

#: 1,000 tokens: the trigger is 850, the keep budget 100, a "big: 1" answer about 257 tokens.
SMALL_WINDOW = {"context_window": 1000, "record_inputs": True}


# --- cutoffs, chunks and options (pure) ---------------------------------------------------------


def message(sequence: int, role: MessageRole, turn: int, tokens: int = 10) -> AgentMessage:
    return AgentMessage(sequence, role, "x" * tokens, {}, f"turn-{turn}")


def by_text_length(item: AgentMessage) -> int:
    return len(item.text)


# turn-1: user, assistant asking for two tools, two results, answer; turn-2: user, answer;
# turn-3 (running): user.
CONVERSATION = [
    message(1, MessageRole.USER, 1),
    message(2, MessageRole.ASSISTANT, 1),
    message(3, MessageRole.TOOL, 1),
    message(4, MessageRole.TOOL, 1),
    message(5, MessageRole.ASSISTANT, 1),
    message(6, MessageRole.USER, 2),
    message(7, MessageRole.ASSISTANT, 2),
    message(8, MessageRole.USER, 3),
]


def cutoff_for(keep: int, **overrides: Any) -> int | None:
    settings = CompactionOptions()
    budgets = CompactionBudgets.of(1000, settings)
    arguments: dict[str, Any] = {
        "tail": CONVERSATION,
        "tokens_of": by_text_length,
        "budgets": CompactionBudgets(**{**budgets.__dict__, "keep": keep}),
        "settings": settings,
        "summary": ContextSummary(),
        "message_count": 8,
        "turn_id": "turn-3",
        "over_tokens": True,
    }
    arguments.update(overrides)
    return choose_cutoff(**arguments)


@pytest.mark.parametrize(
    ("keep", "cutoff"),
    [
        (15, 7),  # 7 crosses the keep budget; 8 is the running turn's
        (25, 6),
        (35, 5),
        (45, 4),  # after the last result: the whole tool group is summarized
        (55, 1),  # 3 crosses: back before request 2, so results 3 and 4 stay with it
        (65, 1),  # 2 crosses: the same group
    ],
)
def test_the_cutoff_never_separates_a_tool_request_from_its_results(
    keep: int, cutoff: int
) -> None:
    assert cutoff_for(keep) == cutoff


def test_no_cutoff_below_the_summary_or_without_pressure() -> None:
    assert cutoff_for(1000) is None  # everything fits the keep budget
    assert cutoff_for(15, over_tokens=False) is None
    assert cutoff_for(55, summary=ContextSummary(generation=1, through_sequence=5)) is None
    # Forced (the provider refused the input): everything before the running turn.
    assert cutoff_for(1000, force=True) == 7
    # Retention pressure alone: down to 90 % of the limit unsummarized.
    settings = CompactionOptions(retention_limit=4)
    assert cutoff_for(1000, over_tokens=False, settings=settings) == 4
    assert cutoff_for(1000, turn_id=None, message_count=8) is None


def test_chunks_stay_within_the_budget_and_end_where_no_result_follows() -> None:
    ranged = CONVERSATION[:7]
    ends = plan_chunks(ranged, by_text_length, 25, None)
    assert ends[-1] == 7
    for end in ends:
        following = next((m for m in CONVERSATION if m.sequence == end + 1), None)
        assert following is None or following.role is not MessageRole.TOOL
    assert ends == [1, 4, 6, 7]  # 2..4 exceed 25 together but cannot be split
    big = [message(1, MessageRole.USER, 1, 100), message(2, MessageRole.ASSISTANT, 1, 5)]
    assert plan_chunks(big, by_text_length, 25, None) == [1, 2]


def test_options_validate_and_agents_override_them() -> None:
    for bad in (
        {"keep_fraction": 0.9},
        {"trigger_fraction": 1.0},
        {"retention_limit": 0},
        {"summary_fraction": 0.6},
        {"keep_fraction": True},
    ):
        with pytest.raises(ValueError):
            CompactionOptions(**bad)
    options = CompactionOptions()
    assert options.for_agent(None) is options
    agent = options.for_agent(
        {"message_retention_limit": 50, "compaction_trigger_fraction": 0.7, "model": "m"}
    )
    assert (agent.retention_limit, agent.trigger_fraction, agent.keep_fraction) == (50, 0.7, 0.1)
    with pytest.raises(ValueError):
        options.for_agent({"compaction_keep_fraction": 0.95})


def test_run_model_loads_only_the_unsummarized_tail() -> None:
    flow = AgentSessionFlow(
        ScriptedRunner(), options=AgentSessionOptions(compaction=CompactionOptions())
    )
    static = RunModel(flow).get_step_options()
    assert static.execute_load_attribute_maps == (AGENT_TOOL_CALLS,)
    summary = ContextSummary(generation=2, through_sequence=40, first_retained_sequence=10)
    movement = run_model_movement(flow, 45, summary)
    assert movement.options is not None
    assert movement.options.execute_load_attribute_maps == (AGENT_TOOL_CALLS,)
    assert movement.options.execute_load_attribute_map_instances == tuple(
        AGENT_MESSAGES.load(message_sequence_key(n)) for n in range(41, 46)
    )
    assert movement.options._execute_failure_target is RecordTurnFailure
    compact = compact_movement(CompactionPlan([44, 45], "context"), summary).options
    assert compact is not None
    assert compact.execute_load_attribute_map_instances == tuple(
        AGENT_MESSAGES.load(message_sequence_key(n)) for n in range(41, 45)
    )
    assert compact.execute_retry is not None and compact.execute_retry.maximum_attempts == 3
    assert compact.execute_method_timeout == timedelta(minutes=15)
    assert compact._execute_failure_target is RecordTurnFailure
    assert CompactContext(flow).get_step_options()._execute_failure_target is RecordTurnFailure
    # Without compaction RunModel keeps the seed's whole-map load.
    seed = RunModel(AgentSessionFlow(ScriptedRunner())).get_step_options()
    assert seed.execute_load_attribute_maps == (AGENT_MESSAGES, AGENT_TOOL_CALLS)


def test_compaction_needs_a_compacting_runner() -> None:
    class PlainRunner:
        def build_user_message(self, text: str) -> Any: ...

        async def run_model_step(self, turn: Any) -> Any: ...

        async def execute_deferred_tool_call(self, call: Any) -> Any: ...

    with pytest.raises(TypeError, match="CompactingRunner"):
        AgentSessionFlow(PlainRunner(), options=AgentSessionOptions(compaction=CompactionOptions()))


# --- against the engine -------------------------------------------------------------------------


async def wait_for_turn(
    sessions: AgentSessionClient, session_id: str, turn_number: int
) -> AgentSnapshot:
    """The snapshot once turn ``turn_number`` ended and the session waits again."""

    def done(snapshot: AgentSnapshot) -> AgentSnapshot | None:
        state = snapshot.state
        if (
            state is not None
            and state.turn_number >= turn_number
            and state.status is AgentStatus.WAITING_FOR_USER_MESSAGE
        ):
            return snapshot
        return None

    return await wait_for_agent_snapshot(
        sessions,
        session_id,
        done,
        description=f"turn {turn_number} finished",
        timeout=TURN_TIMEOUT,
    )


async def run_turns(
    sessions: AgentSessionClient, session_id: str, texts: list[str], first_turn: int
) -> AgentSnapshot:
    snapshot: AgentSnapshot | None = None
    for number, text in enumerate(texts, start=first_turn):
        assert await sessions.send_user_message(session_id, text)
        snapshot = await wait_for_turn(sessions, session_id, number)
    assert snapshot is not None
    return snapshot


def compacting_session(
    tmp_path: Path, message: str, agent_config: dict[str, Any]
) -> AbstractAsyncContextManager[RunningSession]:
    """Session ``"s"`` of the compacting Flow, started with ``message`` and ``agent_config``."""
    return running_session(
        tmp_path,
        message,
        flow_type=COMPACTING_FLOW_TYPE,
        session_id="s",
        agent_config=agent_config,
    )


def model_inputs(directory: Path) -> list[dict[str, Any]]:
    path = inputs_path(directory)
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


async def events_of(stack: AgentTestStack, session_id: str) -> list[AgentEvent]:
    flow = flow_of(stack, COMPACTING_FLOW_TYPE)
    page = await stack.client.list_stream_messages(session_id, flow.agent_events, 1000)
    return [message.value for message in reversed(page.messages)]


async def all_retained(sessions: AgentSessionClient, session_id: str) -> list[AgentMessage]:
    """Every retained message, read page by page from the newest (``before`` paging)."""
    pages: list[list[AgentMessage]] = []
    before: int | None = None
    while True:
        page = await sessions.list_agent_messages_before(session_id, before=before, limit=3)
        assert page.messages == sorted(page.messages, key=lambda m: m.sequence)
        pages.append(page.messages)
        if page.next_before_sequence is None:
            break
        assert page.next_before_sequence == page.messages[0].sequence
        before = page.next_before_sequence
    return [message for page in reversed(pages) for message in page]


def assert_tool_results_paired(messages: list[dict[str, Any]]) -> None:
    """In one model input, every tool result follows the request that asked for it, and each
    call ID has exactly one result."""
    requested: set[str] = set()
    answered: list[str] = []
    for message in messages:
        item = message["item"] or {}
        if message["role"] == MessageRole.ASSISTANT and "tool_calls" in item:
            requested.update(item["tool_calls"])
        if message["role"] == MessageRole.TOOL:
            assert item["tool_call_id"] in requested, messages
            answered.append(item["tool_call_id"])
    assert len(answered) == len(set(answered)), answered


async def test_compaction_summarizes_older_messages_and_keeps_the_tail(tmp_path: Path) -> None:
    config = {**SMALL_WINDOW, "message_retention_limit": 8}
    async with compacting_session(tmp_path, "big: 1", config) as (stack, sessions, _):
        await wait_for_turn(sessions, "s", 1)
        snapshot = await run_turns(sessions, "s", ["big: 1"] * 5, first_turn=2)

        summary = snapshot.summary
        assert summary is not None and summary.through_sequence > 0
        assert summary.text.startswith("user#1: big: 1")
        state = snapshot.state
        assert state is not None and state.message_count == 12
        # The map keeps the newest eight; the summary covers everything older.
        assert summary.first_retained_sequence == state.message_count - 8 + 1
        retained = await all_retained(sessions, "s")
        assert [m.sequence for m in retained] == list(range(summary.first_retained_sequence, 13))
        assert [m.sequence for m in snapshot.messages] == [m.sequence for m in retained]
        assert summary.first_retained_sequence <= summary.through_sequence + 1

        # Every model call saw only the summary and the messages after it, always its own
        # turn's user message, and stayed under the 850-token trigger once compacted.
        inputs = model_inputs(tmp_path)
        assert len(inputs) == 6
        for sent in inputs:
            sequences = [message["sequence"] for message in sent["messages"]]
            assert sequences == list(range(sent["summary_through"] + 1, sequences[-1] + 1))
            assert sent["messages"][-1]["role"] == MessageRole.USER
            assert sent["tokens"] < 850
        assert inputs[-1]["summary_through"] > 0

        compacted = [
            event for event in await events_of(stack, "s")
            if event.type is AgentEventType.CONTEXT_COMPACTED
        ]
        assert compacted and compacted[-1].payload["through_sequence"] == summary.through_sequence
        assert {event.payload["reason"] for event in compacted} == {"context"}
        assert [event.payload["generation"] for event in compacted] == list(
            range(1, summary.generation + 1)
        )
        # Chunks: no summarizer call saw more than its budget (500 tokens, 300 for messages).
        chunks = [name for kind, name in invocation_log(tmp_path).entries() if kind == "summarize"]
        assert len(chunks) == summary.generation
        history = await stack.read_step_history("s")
        executed = [e.step_type for e in history if e.event_type == EXECUTE_COMPLETED_EVENT]
        assert executed.count("CompactContext") == summary.generation
        # Each summarizer call is counted with the session's model calls and reported to the
        # observer with its own ID, like a RunModel call (issue 27: compaction is priced).
        assert snapshot.usage.requests == len(inputs) + summary.generation
        assert snapshot.usage.input_tokens == (
            len(inputs) * MODEL_USAGE.input_tokens + summary.generation * SUMMARY_USAGE.input_tokens
        )
        assert Decimal(snapshot.usage.cost_usd) == summary.generation * Decimal(
            SUMMARY_USAGE.cost_usd
        )
        lines = [json.loads(line) for line in changes_path(tmp_path).read_text().splitlines()]
        reported = {line["model_call_id"]: line["usage"] for line in lines if line["usage"]}
        assert len(reported) == len(inputs) + summary.generation
        assert sum(usage == SUMMARY_USAGE.as_dict() for usage in reported.values()) == (
            summary.generation
        )

        # The seed's read still pages from the oldest retained message.
        page = await sessions.list_agent_messages("s", after_sequence=0, limit=200)
        assert [m.sequence for m in page.messages] == [m.sequence for m in retained]
        assert not page.has_more
        page = await sessions.list_agent_messages("s", after_sequence=0, limit=2)
        assert len(page.messages) == 2 and page.has_more


async def test_reference_tiny_window(tmp_path: Path) -> None:
    """The AI Agent reference case: 80-token window, trigger 0.5, keep 0.1, retention 3."""
    config = {
        "context_window": 80,
        "compaction_trigger_fraction": 0.5,
        "compaction_keep_fraction": 0.1,
        "message_retention_limit": 3,
    }
    async with compacting_session(
        tmp_path, "hello there, this is turn one", config
    ) as (_, sessions, _):
        await wait_for_turn(sessions, "s", 1)
        texts = [f"and this is turn number {n} of the conversation" for n in range(2, 6)]
        snapshot = await run_turns(sessions, "s", texts, first_turn=2)
        assert snapshot.summary is not None and snapshot.summary.through_sequence > 0
        retained = await all_retained(sessions, "s")
        assert len(retained) <= 3
        assert retained[-1].role is MessageRole.ASSISTANT


async def test_worker_killed_mid_compaction_commits_the_summary_once(tmp_path: Path) -> None:
    config = {**SMALL_WINDOW, "summarize_gate": True}
    async with compacting_session(tmp_path, "big: 1", config) as (stack, sessions, worker):
        await wait_for_turn(sessions, "s", 1)
        await run_turns(sessions, "s", ["big: 1"] * 3, first_turn=2)
        assert await sessions.send_user_message("s", "after the kill")
        gate = FileGate(tmp_path, SUMMARIZE_GATE)
        await gate.wait_until_reached()
        worker.kill()
        await stack.start_worker()
        gate.release()
        snapshot = await wait_for_turn(sessions, "s", 5)

        assert snapshot.messages[-1].text == "echo: after the kill"
        summary = snapshot.summary
        assert summary is not None
        history = await stack.read_step_history("s")
        compactions = [
            entry for entry in history
            if entry.event_type == EXECUTE_COMPLETED_EVENT and entry.step_type == "CompactContext"
        ]
        # One committed Step (and one generation) per chunk, although the first ran twice.
        assert len(compactions) == summary.generation
        chunks = [name for kind, name in invocation_log(tmp_path).entries() if kind == "summarize"]
        assert len(chunks) == summary.generation + 1
        assert chunks[0] == chunks[1]
        compacted = [
            event.payload["generation"] for event in await events_of(stack, "s")
            if event.type is AgentEventType.CONTEXT_COMPACTED
        ]
        assert compacted == list(range(1, summary.generation + 1))
        # No message is lost: the summary names every summarized one, the map holds the rest.
        state = snapshot.state
        assert state is not None
        retained = await all_retained(sessions, "s")
        assert [m.sequence for m in retained] == list(
            range(summary.first_retained_sequence, state.message_count + 1)
        )
        for sequence in range(1, summary.through_sequence + 1):
            assert f"#{sequence}: " in summary.text


async def test_parallel_calls_one_rejected_then_compaction_keep_one_result_each(
    tmp_path: Path,
) -> None:
    async with compacting_session(tmp_path, "big: 1", SMALL_WINDOW) as (stack, sessions, _):
        await wait_for_turn(sessions, "s", 1)
        await run_turns(sessions, "s", ["big: 1", "big: 1"], first_turn=2)

        # Two parallel calls: one held at its gate, one waiting for approval and rejected.
        assert await sessions.send_user_message("s", "tools: gated_read, refund")
        gate = FileGate(tmp_path, "gated_read")
        await gate.wait_until_reached()
        interrupt = await wait_for_interrupt(sessions, "s")
        assert await sessions.resolve_interrupt(
            "s", interrupt.interrupt_id, approved=False, rejection_message="no refunds"
        )
        gate.release()
        await wait_for_turn(sessions, "s", 4)
        snapshot = await run_turns(sessions, "s", ["big: 1"] * 4, first_turn=5)
        assert snapshot.summary is not None
        assert snapshot.summary.through_sequence >= 10  # the tool turn is summarized

        for sent in model_inputs(tmp_path):
            assert_tool_results_paired(sent["messages"])
            ids = [result["tool_call_id"] for result in sent["turn_results"]]
            assert len(ids) == len(set(ids))
        finished = [
            event.payload["tool_call_id"] for event in await events_of(stack, "s")
            if event.type is AgentEventType.TOOL_CALL_FINISHED
        ]
        assert sorted(finished) == ["call-1", "call-2"]
        assert "no refunds" in snapshot.summary.text or any(
            "no refunds" in m.text for m in await all_retained(sessions, "s")
        )


async def test_nearly_full_small_window_with_a_300kb_tool_result_completes(
    tmp_path: Path,
) -> None:
    config = {"context_window": 2000, "record_inputs": True}
    # One answer of 7.5 KB leaves the stored context at about 98 % of the window.
    async with compacting_session(tmp_path, "big: 7.5", config) as (_, sessions, _):
        snapshot = await wait_for_turn(sessions, "s", 1)
        stored = sum(len(m.text) // 4 + 1 for m in snapshot.messages)
        assert 0.95 * 2000 <= stored < 2000

        assert await sessions.send_user_message("s", "tools: huge")
        snapshot = await wait_for_turn(sessions, "s", 2)
        assert snapshot.state is not None and snapshot.state.last_turn_error is None
        assert snapshot.messages[-1].text.startswith("huge=succeeded: xxx")
        results = [m for m in snapshot.messages if m.role is MessageRole.TOOL]
        assert [len(m.text) for m in results] == [len(HUGE_RESULT)]  # stored whole
        inputs = model_inputs(tmp_path)
        last = inputs[-1]
        assert [len(result["text"]) for result in last["turn_results"]] == [TOOL_RESULT_MAX_CHARS]
        assert last["tokens"] < 2000
        assert snapshot.summary is not None and snapshot.summary.through_sequence == 2


async def test_context_window_error_compacts_once_and_retries_once(tmp_path: Path) -> None:
    # Our count says 850 tokens is the trigger; the "provider" refuses more than 500.
    config = {**SMALL_WINDOW, "provider_window": 500}
    async with compacting_session(tmp_path, "big: 1", config) as (stack, sessions, _):
        await wait_for_turn(sessions, "s", 1)
        snapshot = await run_turns(sessions, "s", ["big: 1"], first_turn=2)
        assert snapshot.summary is None
        assert invocation_log(tmp_path).count("overflow") == 0
        snapshot = await run_turns(sessions, "s", ["overflow now"], first_turn=3)

        assert snapshot.messages[-1].text == "echo: overflow now"
        assert snapshot.summary is not None
        log = invocation_log(tmp_path)
        assert log.count("overflow") == 1
        compacted = [
            event.payload["reason"] for event in await events_of(stack, "s")
            if event.type is AgentEventType.CONTEXT_COMPACTED
        ]
        assert set(compacted) == {"overflow"}

        # A call still too long after its compaction fails the turn at once (issue 25: the
        # same input would be refused again): one compaction, no failed attempt.
        huge_message = "word " * 600
        assert await sessions.send_user_message("s", huge_message)
        snapshot = await wait_for_turn(sessions, "s", 4)
        assert snapshot.state is not None
        assert snapshot.state.last_turn_error is not None
        assert "exceeds 500 tokens" in snapshot.state.last_turn_error
        compacted_after = [
            event.payload["reason"] for event in await events_of(stack, "s")
            if event.type is AgentEventType.CONTEXT_COMPACTED
        ]
        assert len(compacted_after) - len(compacted) <= 1
        history = await stack.read_step_history("s")
        run_models = [entry for entry in history if entry.step_type == "RunModel"]
        assert run_models
        assert all(entry.event_type == EXECUTE_COMPLETED_EVENT for entry in run_models)
        assert invocation_log(tmp_path).count("overflow", "turn-4") == 2


async def test_snapshot_of_a_stopped_session_reads_its_last_page(tmp_path: Path) -> None:
    async with compacting_session(
        tmp_path, "many: 250", {"context_window": 100_000}
    ) as (_, sessions, _):
        snapshot = await wait_for_turn(sessions, "s", 1)
        assert [m.sequence for m in snapshot.messages] == list(range(52, 252))
        await sessions.stop_session("s")
        stopped = await sessions.get_agent_snapshot("s")
        assert [m.sequence for m in stopped.messages] == list(range(52, 252))
        page = await sessions.list_agent_messages_before("s", before=52, limit=200)
        assert [m.sequence for m in page.messages] == list(range(1, 52))
        assert page.next_before_sequence is None
        assert stopped.summary is None
        tool_status = [record.status for record in stopped.tool_calls]
        assert tool_status == [] or all(
            status is not ToolCallStatus.PENDING for status in tool_status
        )


async def test_a_plan_turn_without_a_user_message_compacts_and_completes(tmp_path: Path) -> None:
    """An ``execute_plan`` turn stores no user message; retention pressure (six unsummarized
    messages at most) compacts before its first model call, and the plan still completes."""
    config = {"context_window": 100_000, "message_retention_limit": 6, "record_inputs": True}
    async with compacting_session(tmp_path, "hello", config) as (stack, sessions, _):
        await wait_for_turn(sessions, "s", 1)
        await run_turns(sessions, "s", ["again"], first_turn=2)
        assert await sessions.send_user_message("s", "plan: gather, write", plan_mode=True)
        snapshot = await wait_for_turn(sessions, "s", 3)
        assert snapshot.summary is None and snapshot.plan is not None
        assert (await sessions.execute_plan("s", snapshot.plan.revision)).accepted
        snapshot = await wait_for_turn(sessions, "s", 4)

        assert snapshot.messages[-1].text == "plan complete"
        assert snapshot.plan is not None and snapshot.plan.status == "completed"
        summary = snapshot.summary
        assert summary is not None and summary.through_sequence == 2
        compacted = [
            event for event in await events_of(stack, "s")
            if event.type is AgentEventType.CONTEXT_COMPACTED
        ]
        assert [(e.turn_id, e.payload["reason"]) for e in compacted] == [("turn-4", "retention")]
        executing = [sent for sent in model_inputs(tmp_path) if sent["turn_id"] == "turn-4"]
        assert executing and all(sent["summary_through"] == 2 for sent in executing)


async def test_retention_deletes_a_stored_whole_result_with_its_message(tmp_path: Path) -> None:
    """A tool result stored in parts (about 3 MB) goes when retention deletes its message:
    before, the session reads it whole; after, neither the message nor a part is stored."""
    config = {"context_window": 100_000, "message_retention_limit": 4}
    async with compacting_session(tmp_path, "tools: whole", config) as (stack, sessions, _):
        snapshot = await wait_for_turn(sessions, "s", 1)
        tool = next(m for m in snapshot.messages if m.role is MessageRole.TOOL)
        assert tool.text_parts is not None and tool.text_parts.count >= 6
        assert len(stored_part_keys(stack)) == tool.text_parts.count
        assert await read_whole(sessions, "s", tool.sequence) == WHOLE_RESULT

        snapshot = await run_turns(sessions, "s", ["again", "and again"], first_turn=2)
        assert snapshot.summary is not None
        assert snapshot.summary.first_retained_sequence > tool.sequence
        assert stored_part_keys(stack) == []
        assert not (await sessions.read_message_text("s", tool.sequence)).found
