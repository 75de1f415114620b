# mypy: disable-error-code="union-attr,arg-type"
# (descriptor lookups on generated messages are typed Optional; the fields exist.)
"""Property test: malformed and boundary requests get a spec status and harm nothing.

Hypothesis builds FlowService requests field by field from the generated message
descriptors (empty and oversized IDs, unknown enum numbers, kind-less or non-finite Values,
huge or negative page sizes and timeouts, unknown flows, garbage tokens, ...), sends them
over raw gRPC and checks that every answer is either OK or one of the codes of the spec's
error table, with consistent ``ServiceErrorResponse`` details. A bystander flow that no
request names must come through unchanged, also across an engine restart.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from dex.dexpb import dex_pb2 as pb
from dex.dexpb import dex_pb2_grpc
from google.protobuf import empty_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from google.rpc import status_pb2
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .conftest import EngineProcess

TARGET = "fuzz-target"
BYSTANDER = "fuzz-bystander"
# Codes listed in the spec's error table (section 5); INTERNAL / UNKNOWN are engine bugs.
SPEC_CODES = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.ABORTED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
CALL_TIMEOUT = 0.5
# (method, status code name) of every request sent, to show the fuzzing reached the engine.
SEEN: Counter[tuple[str, str]] = Counter()

STRINGS = [
    "",
    TARGET,
    "no-such-flow",
    "x" * 5000,
    "Idle",
    "S",
    "S-1",
    "S-0",
    "S-",
    "-",
    "#S-1",
    "S-99999999999999999999999",
    "sys:timeout_handler-1",
    "map/inst%2Fance",
    "a/b",
    "\x00",
    "\u00fc\U0001f642",
    " ",
    "-1",
    "CustomKeywordField = 'x' AND (",
    "2026-13-45T99:99:99",
]
BYTES = [b"", b"garbage", b"\xff" * 16, b"-5", b"99999999999999999999", b"0"]
SIGNED = [0, 1, -1, 2, 3, 100, 1001, 2**31 - 1, -(2**31)]
SIGNED64 = [*SIGNED, 2**63 - 1, -(2**63), 10**12]
UNSIGNED = [0, 1, 2, 100, 2**32 - 1]
UNSIGNED64 = [*UNSIGNED, 2**64 - 1]
DOUBLES = [0.0, -1.0, 1e308, float("inf"), float("-inf"), float("nan")]


def _values() -> st.SearchStrategy[pb.Value]:
    return st.sampled_from(
        [
            pb.Value(),
            pb.Value(string_value="s"),
            pb.Value(int_value=-(2**63)),
            pb.Value(double_value=float("nan")),
            pb.Value(bool_value=True),
            pb.Value(null_value=0),
            pb.Value(obj_value=pb.EncodedObject(encoding="no-such-encoding", payload=b"\x00")),
            pb.Value(obj_value=pb.EncodedObject(encoding="json", payload=b"{not json")),
            pb.Value(internal_blob_id_for_string_value="blob-1"),
            pb.Value(string_value="y" * 5000),
        ]
    )


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    cpp = field.cpp_type
    if cpp == FieldDescriptor.CPPTYPE_STRING:
        if field.type == FieldDescriptor.TYPE_BYTES:
            return st.sampled_from(BYTES)
        return st.sampled_from(STRINGS)
    if cpp == FieldDescriptor.CPPTYPE_INT32:
        return st.sampled_from(SIGNED)
    if cpp == FieldDescriptor.CPPTYPE_INT64:
        return st.sampled_from(SIGNED64)
    if cpp == FieldDescriptor.CPPTYPE_UINT32:
        return st.sampled_from(UNSIGNED)
    if cpp == FieldDescriptor.CPPTYPE_UINT64:
        return st.sampled_from(UNSIGNED64)
    if cpp in (FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT):
        return st.sampled_from(DOUBLES)
    if cpp == FieldDescriptor.CPPTYPE_BOOL:
        return st.booleans()
    if cpp == FieldDescriptor.CPPTYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return st.sampled_from([*known, -1, 99, 2**31 - 1])
    raise AssertionError(f"unexpected field type {field.full_name}")


def _fill(data: st.DataObject, message: Message, depth: int) -> None:
    """Set a random subset of ``message``'s fields to boundary or malformed values."""
    descriptor: Any = message.DESCRIPTOR
    for field in descriptor.fields:
        if field.name == "flow_id" and field.cpp_type == FieldDescriptor.CPPTYPE_STRING:
            # Mostly a real flow, so that requests get past the lookup.
            message.flow_id = data.draw(  # type: ignore[attr-defined]
                st.sampled_from([TARGET, TARGET, TARGET, "no-such-flow", "", "x" * 5000]),
                label="flow_id",
            )
            continue
        if data.draw(st.booleans(), label=field.name):
            continue  # about half of the fields are set
        is_repeated = field.is_repeated
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            if field.message_type.GetOptions().map_entry:
                if depth > 0:
                    continue
                container = getattr(message, field.name)
                key = data.draw(_scalar(field.message_type.fields_by_name["key"]))
                value_field = field.message_type.fields_by_name["value"]
                if value_field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
                    _fill(data, container[key], depth + 1)
                else:
                    container[key] = data.draw(_scalar(value_field))
                continue
            if field.message_type.full_name == "dex.Value":
                values = [data.draw(_values())] if not is_repeated else data.draw(
                    st.lists(_values(), max_size=3)
                )
                if is_repeated:
                    getattr(message, field.name).extend(values)
                else:
                    getattr(message, field.name).CopyFrom(values[0])
                continue
            if depth >= 2:
                continue
            if is_repeated:
                for _ in range(data.draw(st.integers(0, 2))):
                    _fill(data, getattr(message, field.name).add(), depth + 1)
            else:
                child = getattr(message, field.name)
                child.SetInParent()
                _fill(data, child, depth + 1)
            continue
        strategy = _scalar(field)
        try:
            if is_repeated:
                getattr(message, field.name).extend(data.draw(st.lists(strategy, max_size=3)))
            else:
                setattr(message, field.name, data.draw(strategy))
        except (ValueError, TypeError):
            continue  # a value the Python runtime itself refuses cannot be sent anyway


METHODS = [
    m
    for m in pb.DESCRIPTOR.services_by_name["FlowService"].methods
    if m.name not in ("GetServerInfo", "HealthCheck")
]


def _start(name: str, flow_id: str, step: str = "S") -> pb.StartFlowRequest:
    return pb.StartFlowRequest(
        flow_id=flow_id,
        flow_type="Idle",
        request_id=f"r-{name}",
        start_step_type=step,
        step_input=pb.Value(string_value=name),
        flow_start_options=pb.FlowStartOptions(
            attributes=[pb.AttributeWrite(key="note", value=pb.Value(string_value=name))]
        ),
    )


def _snapshot(stub: dex_pb2_grpc.FlowServiceStub) -> tuple[Any, ...]:
    summary = stub.GetFlowSummary(pb.GetFlowSummaryRequest(flow_id=BYSTANDER), timeout=5)
    history = stub.GetHistoryEvents(pb.GetHistoryEventsRequest(flow_id=BYSTANDER), timeout=5)
    attrs = stub.GetAttributes(
        pb.GetAttributesRequest(flow_id=BYSTANDER, keys=["note"]), timeout=5
    )
    state = stub.GetFlowState(pb.GetFlowStateRequest(flow_id=BYSTANDER), timeout=5)
    return (
        summary.SerializeToString(deterministic=True),
        [e.SerializeToString(deterministic=True) for e in history.events],
        attrs.SerializeToString(deterministic=True),
        state.SerializeToString(deterministic=True),
    )


@pytest.fixture
def channel(engine: EngineProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(
        engine.address, options=[("grpc.max_send_message_length", 64 << 20)]
    ) as chan:
        yield chan


def _check_status(method: str, err: grpc.RpcError) -> None:
    code = err.code()
    assert code in SPEC_CODES, f"{method}: {code} {err.details()}"
    trailer = dict(err.trailing_metadata() or ()).get(
        "grpc-status-details-bin"
    )
    if trailer is None:
        # Only a deadline the client itself enforced comes without engine details.
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED, f"{method}: {code} without details"
        return
    status = status_pb2.Status.FromString(trailer)
    assert status.code == code.value[0]
    assert status.message == err.details()
    detail = pb.ServiceErrorResponse()
    assert status.details and status.details[0].Unpack(detail)
    assert detail.sub_status != pb.ERROR_SUB_STATUS_UNSPECIFIED, f"{method}: no sub_status"


@settings(
    max_examples=100,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(data=st.data())
def _fuzz(channel: grpc.Channel, data: st.DataObject) -> None:
    method = data.draw(st.sampled_from(METHODS), label="method")
    request_class = pb.__dict__.get(method.input_type.name) or empty_pb2.Empty
    request = request_class()
    _fill(data, request, 0)
    call = channel.unary_unary(
        f"/dex.FlowService/{method.name}",
        request_serializer=lambda m: m.SerializeToString(),
        response_deserializer=lambda b: b,
    )
    try:
        call(request, timeout=CALL_TIMEOUT)
        SEEN[method.name, "OK"] += 1
    except grpc.RpcError as err:
        SEEN[method.name, err.code().name] += 1
        _check_status(method.name, err)
    health = dex_pb2_grpc.FlowServiceStub(channel).HealthCheck(empty_pb2.Empty(), timeout=5)
    assert health.condition == "OK"


def test_malformed_and_boundary_requests_get_spec_statuses(
    engine: EngineProcess, channel: grpc.Channel
) -> None:
    stub = dex_pb2_grpc.FlowServiceStub(channel)
    stub.StartFlow(_start("bystander", BYSTANDER), timeout=5)
    stub.StartFlow(_start("target", TARGET), timeout=5)
    before = _snapshot(stub)

    SEEN.clear()
    _fuzz(channel)
    print(sorted(SEEN.items()))
    assert len({name for name, _ in SEEN}) >= 15
    assert {code for _, code in SEEN} >= {"OK", "INVALID_ARGUMENT", "NOT_FOUND"}

    assert _snapshot(stub) == before
    # What the fuzzing committed must load again after a crash.
    engine.kill()
    engine.start()
    with grpc.insecure_channel(engine.address) as fresh:
        assert _snapshot(dex_pb2_grpc.FlowServiceStub(fresh)) == before


def test_errors_about_oversized_ids_stay_deliverable(channel: grpc.Channel) -> None:
    """An error quoting a huge flow ID still fits the client's metadata limit."""
    stub = dex_pb2_grpc.FlowServiceStub(channel)
    huge = "\u00fc" * 20_000
    for call, request in (
        (stub.GetFlowSummary, pb.GetFlowSummaryRequest(flow_id=huge)),
        (stub.StopFlow, pb.StopFlowRequest(flow_id=huge)),
    ):
        try:
            call(request, timeout=5)
        except grpc.RpcError as err:
            assert err.code() == grpc.StatusCode.NOT_FOUND
            _check_status("oversized", err)
        else:
            raise AssertionError("an unknown flow was found")
