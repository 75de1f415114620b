"""``AgentCodecRegistry`` writes and reads exactly what the SDK's automatic codec does (issue 13).

Every dataclass of ``dex_agents`` gets generated values (hypothesis, from the type hints): the
compiled codec's JSON text must equal the SDK's, and each must decode the other's text to the
same value. Wrong values must fail the same way.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping
from datetime import UTC, datetime

import pytest
from dex.codec import CodecRegistry, Value, WireKind
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dex_agents._codecs import AgentCodecRegistry
from dex_agents._records import (
    AgentMessage,
    AgentSessionConfig,
    AgentToolCall,
    MessageRole,
    ToolCallStatus,
    ToolEffect,
    ToolPolicy,
)
from dex_agents._rpc_records import AgentQueuedMessage
from tests.dex_agents.test_wire_types import _package_dataclasses

SDK = CodecRegistry()
OURS = AgentCodecRegistry()

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.text(max_size=8)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)


def _values(hint: object, depth: int = 0) -> st.SearchStrategy[typing.Any]:
    """Values of ``hint`` as an application would hold them."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if depth > 3:
            return st.nothing()
        hints = typing.get_type_hints(hint)
        generated = (
            st.fixed_dictionaries(
                {
                    f.name: _values(hints[f.name], depth + 1)
                    for f in dataclasses.fields(hint)
                    if f.init
                }
            )
            .map(lambda kwargs: _build(hint, kwargs))
            .filter(lambda value: value is not None)
        )
        default = _build(hint, {})  # where its own validation refuses most generated values
        return generated if default is None else st.just(default) | generated
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return st.sampled_from(list(hint))
    if hint is datetime:
        return st.datetimes(timezones=st.just(UTC))
    if hint is str:
        return st.text(max_size=12)
    if hint is bool:
        return st.booleans()
    if hint is int:
        return st.integers(-(2**53), 2**53)
    if hint is float:
        return st.floats(allow_nan=False, allow_infinity=False)
    if hint is type(None):
        return st.none()
    if origin in (typing.Union, types.UnionType):
        return st.one_of(*(_values(option, depth) for option in arguments))
    if origin is list:
        return st.lists(_values(arguments[0], depth + 1), max_size=2)
    if origin is tuple:
        item = arguments[0] if arguments else typing.Any
        return st.lists(_values(item, depth + 1), max_size=2).map(tuple)
    if origin in (dict, Mapping):
        return st.dictionaries(st.text(max_size=5), _values(arguments[1], depth + 1), max_size=2)
    return _json


def _build(cls: type, kwargs: dict[str, object]) -> object | None:
    """``cls(**kwargs)``, or ``None`` where the class refuses them (its own validation)."""
    try:
        return cls(**kwargs)
    except (ValueError, TypeError):
        return None


CLASSES = sorted(
    (cls for cls in _package_dataclasses() if cls.__module__ != "dex_agents._codecs"),
    key=lambda cls: cls.__qualname__,
)


def test_the_package_has_dataclasses_to_compare() -> None:
    assert AgentMessage in CLASSES
    assert len(CLASSES) > 30


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: cls.__qualname__)
def test_each_dataclass_encodes_and_decodes_as_the_sdk_does(cls: type) -> None:
    ours, sdk = OURS.resolve(cls), SDK.resolve(cls)
    assert OURS.resolve(cls) is ours  # resolved once

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
    @given(_values(cls))
    def check(value: object) -> None:
        text = sdk.encode(value)
        assert ours.encode(value) == text
        assert ours.decode(text) == sdk.decode(text)

    check()


def test_containers_and_enums_match_the_sdk() -> None:
    message = AgentMessage(3, MessageRole.TOOL, "ok", {"tool_call_id": "c-1"}, "turn-2")
    created = datetime(2026, 12, 2, tzinfo=UTC)
    queued = AgentQueuedMessage("m-1", "hello", created_at=created)
    cases: list[tuple[object, object]] = [
        (list[AgentMessage], [message, message]),
        (tuple[AgentMessage, ...], (message,)),
        (dict[str, AgentQueuedMessage], {"m-1": queued}),
        (ToolEffect, ToolEffect.NON_IDEMPOTENT_WRITE),
    ]
    for hint, value in cases:
        text = SDK.resolve(hint).encode(value)
        assert OURS.resolve(hint).encode(value) == text
        assert OURS.resolve(hint).decode(text) == SDK.resolve(hint).decode(text)


def _failure(registry: CodecRegistry, method: str, hint: object, value: object) -> tuple[type, str]:
    """The error type and message of ``registry.resolve(hint).<method>(value)``."""
    with pytest.raises(Exception) as caught:
        getattr(registry.resolve(hint), method)(value)
    return type(caught.value), str(caught.value)


def test_wrong_values_fail_as_in_the_sdk() -> None:
    bad_values: list[tuple[object, object]] = [
        (AgentMessage, "not a message"),
        (AgentMessage, AgentQueuedMessage("m", "t")),
        (list[AgentMessage], ["x"]),
        (dict[str, int], {"a": "b"}),
    ]
    for hint, value in bad_values:
        assert _failure(OURS, "encode", hint, value) == _failure(SDK, "encode", hint, value)
    bad_texts: list[tuple[object, str]] = [
        (AgentMessage, "[]"),  # not an object
        (AgentMessage, '{"sequence": 1}'),  # a field missing
        (
            AgentMessage,
            '{"sequence": "1", "role": "user", "text": "", "framework_item": {}, "turn_id": ""}',
        ),  # a string where an int belongs
        (
            AgentMessage,
            '{"sequence": 1, "role": "robot", "text": "", "framework_item": {}, "turn_id": ""}',
        ),  # no such role
        (list[int], '["1"]'),
        (ToolEffect, '"nope"'),
        (datetime, "3"),
    ]
    for hint, text in bad_texts:
        wire = Value(WireKind.JSON, text)
        if hint is datetime:  # the SDK's datetime codec is not a JSON codec
            hint, wire = list[datetime], Value(WireKind.JSON, f"[{text}]")
        assert _failure(OURS, "decode", hint, wire) == _failure(SDK, "decode", hint, wire)


def test_registered_and_builtin_codecs_are_kept() -> None:
    custom = SDK.resolve(AgentMessage)
    registry = AgentCodecRegistry({AgentMessage: custom})
    assert registry.resolve(AgentMessage) is custom
    assert registry.resolve(str) is SDK.resolve(str)
    assert registry.resolve(datetime) is SDK.resolve(datetime)
    for hint in (object, Mapping[str, int]):  # as the SDK: no automatic codec
        with pytest.raises(TypeError, match="no codec"):
            registry.resolve(hint)


def test_a_hint_that_does_not_compile_is_left_to_the_sdk_and_poisons_nothing() -> None:
    import dataclasses as dc

    @dc.dataclass
    class Outer:
        name: str = ""
        inner: Later | None = None  # type: ignore[name-defined]  # noqa: F821 - defined below
        count: int = 0

    @dc.dataclass
    class Bare:
        steps: typing.List = dc.field(default_factory=list)  # noqa: UP006
        owner: str = ""

    text = Value(WireKind.JSON, '{"count":7,"inner":{"x":1},"name":"kept"}')
    # Resolving before ``Later`` exists: the SDK's codec, which fails only when decoding.
    early = AgentCodecRegistry().resolve(Outer)
    assert type(early) is type(SDK.resolve(Outer))
    with pytest.raises(NameError):
        early.decode(text)
    globals()["Later"] = dict
    try:
        assert AgentCodecRegistry().resolve(Outer).decode(text) == Outer("kept", {"x": 1}, 7)
        assert AgentCodecRegistry().resolve(Outer).decode(text) == SDK.resolve(Outer).decode(text)
    finally:
        del globals()["Later"]
    bare = Value(WireKind.JSON, '{"owner":"alice","steps":[]}')
    for _ in range(2):  # the SDK decodes an empty bare List; nothing is left cached wrong
        assert AgentCodecRegistry().resolve(Bare).decode(bare) == Bare([], "alice")


def test_a_record_stored_before_a_defaulted_field_existed_decodes_with_its_default() -> None:
    """Wire compatibility of the per-tool limits (issue 23): ``AgentToolCall``, ``ToolPolicy``
    and the session config as an older Worker stored them, without ``timeout_seconds`` and
    ``retries``. The SDK's codec refuses them; a required field missing still fails as there."""
    old_call = Value(
        WireKind.JSON,
        '{"arguments":"{}","deferral_order":0,"effect":"read","error":null,'
        '"output":null,"rejection_message":null,"requires_approval":false,'
        '"status":"pending","tool_call_id":"c1","tool_name":"lookup","turn_id":"turn-1"}',
    )
    decoded = OURS.resolve(AgentToolCall).decode(old_call)
    assert decoded == AgentToolCall(
        "c1", "lookup", "{}", ToolEffect.READ, False, ToolCallStatus.PENDING, 0, "turn-1"
    )
    assert (decoded.timeout_seconds, decoded.retries) == (None, None)
    with pytest.raises(KeyError, match="timeout_seconds"):
        SDK.resolve(AgentToolCall).decode(old_call)

    old_config = Value(
        WireKind.JSON,
        '{"agent_config":{"model":"m"},"tool_policies":{"files__write":'
        '{"approval_deadline_seconds":90,"effect":"idempotent_write","requires_approval":true}}}',
    )
    config = OURS.resolve(AgentSessionConfig).decode(old_config)
    assert config.tool_policies == {
        "files__write": ToolPolicy(ToolEffect.IDEMPOTENT_WRITE, True, 90)
    }
    assert config.tool_policies["files__write"].retries is None

    # What a newer Worker writes, an older reader (extra keys ignored) and this one both read.
    new = ToolPolicy(ToolEffect.READ, timeout_seconds=40.0, retries=0)
    text = OURS.resolve(ToolPolicy).encode(new)
    assert text == SDK.resolve(ToolPolicy).encode(new)
    assert OURS.resolve(ToolPolicy).decode(text) == new

    missing_required = Value(WireKind.JSON, '{"requires_approval":true}')
    assert _failure(OURS, "decode", ToolPolicy, missing_required) == _failure(
        SDK, "decode", ToolPolicy, missing_required
    )
