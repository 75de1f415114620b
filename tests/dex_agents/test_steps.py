"""Step options, validation and the deadline rounding of the session's Steps (seed "Flow shape").

These are the parts of the Steps that a test against the engine cannot observe directly: the
StepOptions each Step and movement sends, and the pure checks RunModel applies to an outcome.
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path

import pytest
from dex import CodecRegistry, StepDurability, StepOptions

from dex_agents import (
    AGENT_TOOL_CALLS,
    AgentContractError,
    AgentSessionFlow,
    AgentSessionOptions,
    AgentStatus,
    AgentToolCall,
    CompactionOptions,
    CompactionPlan,
    ContextSummary,
    DeferredToolCall,
    FrameworkMessage,
    MessageRole,
    ToolCallsRequested,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
)
from dex_agents._approval_steps import approval_options
from dex_agents._builtin_steps import AwaitUserInput, DurableWait, builtin_movement
from dex_agents._contract import require_user_message
from dex_agents._step_base import deadline_timer_seconds
from dex_agents._steps import (
    RECORD_TURN_FAILURE_OPTIONS,
    RESUME_TURN_OPTIONS,
    STEERING_RESUME_TURN_OPTIONS,
    RecordTurnFailure,
    compact_movement,
    run_model_movement,
)
from dex_agents._tool_deferral import validate_tool_calls
from dex_agents._tool_steps import (
    CallSingleAttemptTool,
    CallTool,
    RecordToolFailure,
    RecordToolOutcomeUnknown,
    tool_movement,
    tool_options,
)
from dex_agents.testing import DEX_SERVER_ZD_BINARY_ENV, dex_server_zd_binary
from tests.dex_agents.scripted_agent import ScriptedRunner

SYNC = StepDurability.SYNC


def all_options(flow: AgentSessionFlow) -> dict[str, StepOptions]:
    found: dict[str, StepOptions] = {}
    for definition in flow.get_steps()._definitions:
        option = definition.step.get_step_options()
        assert option is not None, definition.step
        found[type(definition.step).__name__] = option
    found["movement AwaitToolApproval"] = approval_options("c1")
    for effect in ToolEffect:
        found[f"movement {effect}"] = tool_options("c1", effect)
    found["movement ResumeTurn"] = RESUME_TURN_OPTIONS
    found["movement steering ResumeTurn"] = STEERING_RESUME_TURN_OPTIONS
    for step in (DurableWait, AwaitUserInput):
        options = builtin_movement(step, "c1").options
        assert options is not None
        found[f"movement {step.__name__}"] = options
    if flow.options.compaction is not None:
        plan = CompactionPlan(chunk_ends=[2], reason="context")
        for movement in (
            run_model_movement(flow, 3, ContextSummary()),
            compact_movement(plan, ContextSummary()),
        ):
            assert movement.options is not None
            found[f"movement {movement.step.__name__}"] = movement.options
    return found


@pytest.mark.parametrize("compaction", [None, CompactionOptions()])
def test_every_step_and_failure_route_sets_sync_durability_explicitly(
    compaction: CompactionOptions | None,
) -> None:
    flow = AgentSessionFlow(ScriptedRunner(), options=AgentSessionOptions(compaction=compaction))
    options = all_options(flow)
    steps = len(flow.get_steps()._definitions)
    # Each Step type, the approval and 4 tool movements, 2 ResumeTurn and 2 built-in movements,
    # and with compaction the RunModel and CompactContext movements.
    assert len(options) == steps + 1 + 4 + 2 + 2 + (2 if compaction else 0)
    for name, option in options.items():
        for checked in (option, option._execute_failure_options):
            if checked is None:
                continue
            assert checked.wait_for_durability is SYNC, name
            assert checked.execute_durability is SYNC, name


def test_run_model_options() -> None:
    option = all_options(AgentSessionFlow(ScriptedRunner()))["RunModel"]
    assert option.execute_method_timeout == timedelta(minutes=15)
    assert option.heartbeat_timeout == timedelta(minutes=2)
    assert option.execute_retry is not None
    assert option.execute_retry.maximum_attempts == 3
    assert option.execute_retry.total_duration == timedelta(minutes=30)
    assert option._execute_failure_target is RecordTurnFailure
    assert option._execute_failure_options is RECORD_TURN_FAILURE_OPTIONS


@pytest.mark.parametrize(
    ("effect", "attempts", "route"),
    [
        (ToolEffect.READ, 3, RecordToolFailure),
        (ToolEffect.IDEMPOTENT_WRITE, 3, RecordToolFailure),
        (ToolEffect.NON_IDEMPOTENT_WRITE, 1, RecordToolOutcomeUnknown),
        (ToolEffect.UNCLASSIFIED, 1, RecordToolOutcomeUnknown),
    ],
)
def test_tool_movements_retry_route_and_load_only_their_own_record(
    effect: ToolEffect, attempts: int, route: type
) -> None:
    option = tool_options("c1", effect)
    assert option.execute_retry is not None
    assert option.execute_retry.maximum_attempts == attempts
    assert option._execute_failure_target is route
    own = (AGENT_TOOL_CALLS.load("c1"),)
    failure = option._execute_failure_options
    assert failure is not None
    for checked in (option, failure):
        assert checked.execute_load_attribute_map_instances == own
        assert checked.execute_load_attribute_maps == ()
    approval = approval_options("c1")
    assert approval.wait_for_load_attribute_map_instances == own
    assert approval.execute_load_attribute_map_instances == own


@pytest.mark.parametrize(
    ("effect", "retries", "attempts"),
    [
        (ToolEffect.READ, None, 3),
        (ToolEffect.READ, 0, 1),
        (ToolEffect.READ, 4, 5),
        (ToolEffect.IDEMPOTENT_WRITE, None, 3),
        (ToolEffect.IDEMPOTENT_WRITE, 0, 1),
        (ToolEffect.IDEMPOTENT_WRITE, 1, 2),
        # The seed's effect table wins: a write that may not be repeated runs once.
        (ToolEffect.NON_IDEMPOTENT_WRITE, None, 1),
        (ToolEffect.NON_IDEMPOTENT_WRITE, 5, 1),
        (ToolEffect.UNCLASSIFIED, None, 1),
        (ToolEffect.UNCLASSIFIED, 2, 1),
    ],
)
def test_a_policys_retries_set_the_attempts_of_a_retrying_effect_only(
    effect: ToolEffect, retries: int | None, attempts: int
) -> None:
    option = tool_options("c1", effect, retries=retries)
    assert option.execute_retry is not None
    assert option.execute_retry.maximum_attempts == attempts
    if effect.retries:
        # The seed's backoff stays whatever the attempt count.
        assert option.execute_retry.initial_interval == timedelta(seconds=1)
        assert option.execute_retry.backoff_coefficient == 2.0
        assert option.execute_retry.maximum_interval == timedelta(seconds=30)
    assert option._execute_failure_target is (
        RecordToolFailure if effect.retries else RecordToolOutcomeUnknown
    )
    assert option.execute_method_timeout is None
    assert option.heartbeat_timeout == timedelta(minutes=2)


@pytest.mark.parametrize("effect", list(ToolEffect))
@pytest.mark.parametrize(("timeout", "expected"), [(None, None), (40, 40), (12.2, 13)])
def test_a_policys_timeout_is_each_attempts_method_timeout_in_whole_seconds(
    effect: ToolEffect, timeout: float | None, expected: int | None
) -> None:
    option = tool_options("c1", effect, timeout_seconds=timeout)
    assert option.execute_method_timeout == (
        None if expected is None else timedelta(seconds=expected)
    )
    failure = option._execute_failure_options
    assert failure is not None and failure.execute_method_timeout is None


def test_the_tool_movement_takes_the_limits_its_record_kept() -> None:
    record = AgentToolCall(
        "c1",
        "t",
        "{}",
        ToolEffect.READ,
        True,
        ToolCallStatus.APPROVED,
        0,
        "turn-1",
        timeout_seconds=35.0,
        retries=0,
    )
    movement = tool_movement(record)
    assert movement.step is CallTool
    assert movement.options is not None
    assert movement.options.execute_retry is not None
    assert movement.options.execute_retry.maximum_attempts == 1
    assert movement.options.execute_method_timeout == timedelta(seconds=35)
    assert movement.options.execute_load_attribute_map_instances == (AGENT_TOOL_CALLS.load("c1"),)
    write = dataclasses.replace(record, effect=ToolEffect.NON_IDEMPOTENT_WRITE, retries=3)
    single = tool_movement(write)
    assert single.step is CallSingleAttemptTool
    assert single.options is not None and single.options.execute_retry is not None
    assert single.options.execute_retry.maximum_attempts == 1
    # A record stored before the limits existed: the seed's options.
    old = dataclasses.replace(record, timeout_seconds=None, retries=None)
    assert tool_movement(old).options == tool_options("c1", ToolEffect.READ)


@pytest.mark.parametrize(
    "limits",
    [
        {"timeout_seconds": 0},
        {"timeout_seconds": -1.5},
        {"timeout_seconds": float("inf")},
        {"timeout_seconds": float("nan")},
        {"timeout_seconds": True},
        {"timeout_seconds": "30"},
        {"retries": -1},
        {"retries": 1.5},
        {"retries": True},
    ],
)
def test_a_policy_refuses_limits_that_mean_nothing(limits: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(limits))):
        ToolPolicy(ToolEffect.READ, **limits)  # type: ignore[arg-type]


def test_tool_steps_own_options_carry_the_same_policy() -> None:
    options = all_options(AgentSessionFlow(ScriptedRunner()))
    call_tool, single = options["CallTool"], options["CallSingleAttemptTool"]
    assert call_tool.execute_retry is not None and call_tool.execute_retry.maximum_attempts == 3
    assert call_tool._execute_failure_target is RecordToolFailure
    assert single.execute_retry is not None and single.execute_retry.maximum_attempts == 1
    assert single._execute_failure_target is RecordToolOutcomeUnknown


def turn_record(tool_call_id: str) -> AgentToolCall:
    return AgentToolCall(
        tool_call_id, "t", "{}", ToolEffect.READ, False, ToolCallStatus.SUCCEEDED, 0, "turn-1"
    )


def request(*ids: str, state: str = "state") -> ToolCallsRequested:
    policy = ToolPolicy(ToolEffect.READ)
    return ToolCallsRequested(state, [DeferredToolCall(i, "t", "{}", policy) for i in ids])


@pytest.mark.parametrize(
    ("outcome", "recorded", "message"),
    [
        (request("a", state=""), {}, "framework_run_state"),
        (request(""), {}, "non-empty"),
        (request("a/b"), {}, "must not contain '/'"),
        (request("a", "a"), {}, "repeats within the turn"),
        (request("a"), {"a": turn_record("a")}, "repeats within the turn"),
    ],
)
def test_run_state_and_tool_call_ids_are_validated(
    outcome: ToolCallsRequested, recorded: dict[str, AgentToolCall], message: str
) -> None:
    with pytest.raises(AgentContractError, match=message):
        validate_tool_calls(outcome, recorded)


def test_ids_of_an_earlier_turn_may_repeat() -> None:
    validate_tool_calls(request("a", "b"), {})


@pytest.mark.parametrize("role", [MessageRole.ASSISTANT, MessageRole.TOOL, MessageRole.SYSTEM])
def test_a_user_message_with_another_role_fails_the_step(role: MessageRole) -> None:
    with pytest.raises(AgentContractError, match="role"):
        require_user_message(FrameworkMessage(role, {}, "hi"))
    assert require_user_message(FrameworkMessage(MessageRole.USER, {}, "hi")).text == "hi"


def test_deadline_timer_is_rounded_up_to_whole_seconds() -> None:
    now = datetime(2030, 1, 1, tzinfo=UTC)
    assert deadline_timer_seconds(now + timedelta(seconds=2, milliseconds=1), now) == 3
    assert deadline_timer_seconds(now + timedelta(seconds=2), now) == 2
    assert deadline_timer_seconds(now + timedelta(milliseconds=1), now) == 1
    assert deadline_timer_seconds(now - timedelta(seconds=5), now) == 0


def test_status_role_effect_and_record_status_are_str_enums_with_plain_wire_values() -> None:
    codecs = CodecRegistry()
    for enum_type in (AgentStatus, MessageRole, ToolEffect, ToolCallStatus):
        assert issubclass(enum_type, StrEnum)
        for member in enum_type:
            encoded = codecs.resolve(enum_type).encode(member)
            assert str(encoded.data) == f'"{member.value}"'


def test_agent_events_capacity_option() -> None:
    default = AgentSessionFlow(ScriptedRunner())
    assert default.agent_events.stream_capacity_bytes == 10 * 1024 * 1024
    small = AgentSessionFlow(
        ScriptedRunner(), options=AgentSessionOptions(agent_events_capacity_bytes=4096)
    )
    assert small.agent_events.stream_capacity_bytes == 4096


def test_dexcli_engine_needs_dex_server_zd(tmp_path: Path) -> None:
    dexcli = tmp_path / "dexcli"
    with pytest.raises(FileNotFoundError, match="dex-server-zd"):
        dex_server_zd_binary(str(dexcli), {})
    (tmp_path / "dex-server-zd").write_text("")
    assert dex_server_zd_binary(str(dexcli), {}) == str(tmp_path / "dex-server-zd")
    other = tmp_path / "elsewhere-zd"
    other.write_text("")
    assert dex_server_zd_binary(str(dexcli), {DEX_SERVER_ZD_BINARY_ENV: str(other)}) == str(other)
