"""In-memory shapes of runs and Step executions, and their JSON form for SQLite.

Proto messages are kept as messages in memory and stored as base64 of their wire bytes,
so every Value is echoed bit-exactly (spec section 1.3).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from dex.dexpb import dex_pb2 as pb
from google.protobuf.message import Message

from ._blobs import blob_id_of
from ._store import RunWrite

M = TypeVar("M", bound=Message)

TIMEOUT_HANDLER_TYPE = "sys:timeout_handler"
TIMEOUT_HANDLER_ID = "sys:timeout_handler-1"
START_FROM = "__start__"

TIMER_PENDING = pb.INTERNAL_TIMER_STATUS_PENDING
TIMER_FIRED = pb.INTERNAL_TIMER_STATUS_FIRED
TIMER_SKIPPED = pb.INTERNAL_TIMER_STATUS_SKIPPED

RUNNING = pb.FLOW_STATUS_RUNNING


def enc(message: Message | None) -> str | None:
    """Base64 of a message's wire bytes (``None`` stays ``None``)."""
    if message is None:
        return None
    return base64.b64encode(message.SerializeToString()).decode("ascii")


def dec(cls: type[M], data: str | None) -> M | None:
    """Inverse of :func:`enc`."""
    if data is None:
        return None
    message = cls()
    message.ParseFromString(base64.b64decode(data))
    return message


def dec_req(cls: type[M], data: str) -> M:
    """Like :func:`dec` for fields that are always present."""
    message = cls()
    message.ParseFromString(base64.b64decode(data))
    return message


_UUID7_STATE = [0, 0]  # last millisecond, 12-bit sequence


def uuid7() -> str:
    """A UUIDv7 string (RFC 9562), monotonic within this process.

    48-bit unix milliseconds, version 7, a 12-bit sequence in ``rand_a`` that increments
    within one millisecond, variant 10, then 62 random bits.
    """
    ms = int(time.time() * 1000)
    last_ms, seq = _UUID7_STATE
    if ms <= last_ms:
        ms, seq = last_ms, seq + 1
        if seq > 0xFFF:
            ms, seq = ms + 1, 0
    else:
        seq = int.from_bytes(os.urandom(2), "big") & 0x3FF
    _UUID7_STATE[0], _UUID7_STATE[1] = ms, seq
    rand = int.from_bytes(os.urandom(8), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= seq << 64
    value |= 0b10 << 62
    value |= rand & ((1 << 62) - 1)
    h = f"{value:032x}"
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def null_value() -> pb.Value:
    """``Value{null_value}``."""
    return pb.Value(null_value="NULL_VALUE")


def has_kind(value: pb.Value) -> bool:
    """Whether a Value carries a concrete kind."""
    return value.WhichOneof("kind") is not None


def history_writes(writes: Iterable[pb.AttributeWrite]) -> list[pb.AttributeWrite]:
    """Attribute writes as recorded in history: hard-delete values are left out.

    A write flagged ``is_hard_delete_on_null`` keeps its key but loses its value, so such
    values (e.g. credentials) never enter history and are not restored by time travel
    (spec section 3.1).
    """
    out = []
    for write in writes:
        if write.is_hard_delete_on_null:
            stripped = pb.AttributeWrite()
            stripped.CopyFrom(write)
            stripped.ClearField("value")
            out.append(stripped)
        else:
            out.append(write)
    return out


def replayable_writes(writes: Iterable[pb.AttributeWrite]) -> list[pb.AttributeWrite]:
    """History writes that time travel may re-apply (hard-delete writes are skipped)."""
    return [w for w in writes if not w.is_hard_delete_on_null]


@dataclass
class StepExec:
    """One Step execution: its movement, phase and the state of its current method."""

    exe_id: str
    step_type: str
    movement: pb.StepMovement
    phase: str  # "wait_for" | "waiting" | "execute"
    mstate: str = "ready"  # "ready" | "backoff" | "dispatched" | "waiting"
    attempt: int = 1
    first_attempt_ts: float = 0.0
    method_started: float = 0.0
    retry_at: float = 0.0
    heartbeat: pb.Value | None = None
    last_failure: pb.StepMethodFailure | None = None
    waiting: pb.WaitingCondition | None = None
    timers: list[list[float]] = field(default_factory=list)  # [fire_at, status]
    wait_order: int = 0
    locals: dict[str, pb.Value] = field(default_factory=dict)
    cond_results: pb.ConditionResults | None = None
    recovery: pb.RecoveryErrorInfo | None = None
    system: bool = False
    served_by: str = ""
    wait_for_served_by: str = ""
    created_order: int = 0
    subs: dict[int, pb.FlowResult] = field(default_factory=dict)
    # Transient (not persisted): the task of the current attempt and lock ownership.
    task_id: str = ""
    locks_held: bool = False
    #: Transient: deliveries handed out again because the worker could not load all their
    #: blobs at once (``_blobs.HYDRATION_SHORTFALL``).
    hydration_redeliveries: int = 0

    @property
    def options(self) -> pb.StepOptions:
        """The per-movement StepOptions."""
        return self.movement.step_options

    @property
    def from_id(self) -> str:
        """``from_step_execution_id`` of this execution."""
        return self.movement.from_step_execution_id_internal_only

    def to_json(self) -> dict[str, Any]:
        """JSON-safe form for the run's core row."""
        return {
            "id": self.exe_id,
            "type": self.step_type,
            "mv": enc(self.movement),
            "phase": self.phase,
            "mstate": self.mstate,
            "attempt": self.attempt,
            "first": self.first_attempt_ts,
            "mstart": self.method_started,
            "retry_at": self.retry_at,
            "hb": enc(self.heartbeat),
            "lf": enc(self.last_failure),
            "wc": enc(self.waiting),
            "timers": self.timers,
            "order": self.wait_order,
            "locals": [[k, enc(v)] for k, v in self.locals.items()],
            "cr": enc(self.cond_results),
            "rec": enc(self.recovery),
            "sys": self.system,
            "served": self.served_by,
            "wserved": self.wait_for_served_by,
            "corder": self.created_order,
            "subs": [[i, enc(r)] for i, r in self.subs.items()],
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> StepExec:
        """Inverse of :meth:`to_json`."""
        return cls(
            exe_id=d["id"],
            step_type=d["type"],
            movement=dec_req(pb.StepMovement, d["mv"]),
            phase=d["phase"],
            mstate=d["mstate"],
            attempt=d["attempt"],
            first_attempt_ts=d["first"],
            method_started=d["mstart"],
            retry_at=d["retry_at"],
            heartbeat=dec(pb.Value, d["hb"]),
            last_failure=dec(pb.StepMethodFailure, d["lf"]),
            waiting=dec(pb.WaitingCondition, d["wc"]),
            timers=d["timers"],
            wait_order=d["order"],
            locals={k: dec_req(pb.Value, v) for k, v in d["locals"]},
            cond_results=dec(pb.ConditionResults, d["cr"]),
            recovery=dec(pb.RecoveryErrorInfo, d["rec"]),
            system=d["sys"],
            served_by=d["served"],
            wait_for_served_by=d.get("wserved", ""),
            created_order=d.get("corder", 0),
            subs={int(i): dec_req(pb.FlowResult, r) for i, r in d.get("subs", [])},
        )


@dataclass
class ChannelEntry:
    """One pending channel message with its storage sequence number."""

    seq: int
    message: pb.ChannelMessage


class AttributeIndex:
    """A run's attribute keys by kind, so that a task's attributes are gathered from what it
    loads instead of a walk over every map instance of the run (a session of 20,000 messages
    made each task of it walk 20,000 keys).

    Attributes:
        singletons: Keys without ``/``, as an ordered set.
        maps: Per AttributeMap name, its instance keys (``<map>/<instance>``), as ordered sets.
    """

    __slots__ = ("maps", "singletons")

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self.singletons: dict[str, None] = {}
        self.maps: dict[str, dict[str, None]] = {}
        for key in keys:
            self.add(key)

    def add(self, key: str) -> None:
        """Record ``key`` (already present: no change, as a dict keeps its place)."""
        name, slash, _ = key.partition("/")
        if slash:
            self.maps.setdefault(name, {})[key] = None
        else:
            self.singletons[key] = None

    def discard(self, key: str) -> None:
        name, slash, _ = key.partition("/")
        if not slash:
            self.singletons.pop(key, None)
            return
        instances = self.maps.get(name)
        if instances is not None:
            instances.pop(key, None)
            if not instances:
                del self.maps[name]

    def matching(self, prefix: str) -> Iterator[str]:
        """The instance keys that start with ``prefix`` (``<map>/...``), in order."""
        name = prefix.partition("/")[0]
        for key in self.maps.get(name, ()):
            if key.startswith(prefix):
                yield key


@dataclass
class Run:
    """One run of a Flow with all its durable state."""

    flow_id: str
    run_id: str
    seq: int
    flow_type: str
    status: int
    request_id: str
    start_ts: float
    first_run_id: str
    config: pb.FlowConfig
    start_request: pb.StartFlowRequest
    close_ts: float | None = None
    run_attempt: int = 1
    error_type: int = 0
    error_message: str = ""
    results: list[pb.StepCompletionOutput] = field(default_factory=list)
    queue: list[tuple[pb.StepMovement, float]] = field(default_factory=list)
    steps: dict[str, StepExec] = field(default_factory=dict)
    counters: dict[str, int] = field(default_factory=dict)
    graceful: bool = False
    order_seq: int = 0
    sticky: str = ""
    next_event_id: int = 1
    chan_seq: int = 0
    unfinished_at_close: list[str] = field(default_factory=list)
    attributes: dict[str, pb.Value] = field(default_factory=dict)
    #: ``attribute_index()``: the singleton keys and, per AttributeMap, its instance keys, in
    #: ``attributes``' order; built on first use and kept up to date by ``EngineState
    #: .set_attribute`` (the only writer of ``attributes`` once the run is loaded).
    _attribute_index: AttributeIndex | None = field(default=None, repr=False, compare=False)
    channels: dict[str, list[ChannelEntry]] = field(default_factory=dict)
    write: RunWrite = field(default_factory=RunWrite)
    locks: dict[str, str] = field(default_factory=dict)
    continued_to: str = ""
    retry_at: float = 0.0
    search: dict[str, pb.Value] = field(default_factory=dict)
    can_threshold: int = 0
    parents: list[list[Any]] = field(default_factory=list)  # [run_id, exe_id, index]
    #: ``(config, start_request, their enc())``: both are set once and never changed in place,
    #: so every commit of the run reuses their encoding (issue 13: the run row's JSON is a
    #: tenth of the engine's CPU in an agent turn).
    _fixed_enc: tuple[Any, Any, str | None, str | None] | None = field(
        default=None, repr=False, compare=False
    )
    #: ``(run_id, header JSON)`` of the row as last committed: while both stay the same, a
    #: commit updates the row's changing columns in place (``Run.update_row``) instead of
    #: replacing the row, its header and its two index entries.
    stored_header: tuple[str, str] | None = field(default=None, repr=False, compare=False)
    #: Blob ids the run's row references as last committed (:meth:`blob_ids`): a commit
    #: records only the difference in the ``blob_refs`` table.
    stored_refs: frozenset[str] = field(default=frozenset(), repr=False, compare=False)

    def attribute_index(self) -> AttributeIndex:
        """The run's :class:`AttributeIndex`, built from ``attributes`` on first use."""
        if self._attribute_index is None:
            self._attribute_index = AttributeIndex(self.attributes)
        return self._attribute_index

    def blob_ids(self) -> frozenset[str]:
        """Blob ids the run's ``runs`` row references: inputs of queued and running Steps,
        their locals, the messages and sub-flow results of their condition results, the
        sub-flow results they wait on, and the collected completion outputs. Every other
        value of the row (the start request, waiting conditions, search fields, heartbeats)
        is held inline."""
        ids: set[str] = set()

        def add(value: pb.Value) -> None:
            found = blob_id_of(value)
            if found is not None:
                ids.add(found[1])

        def add_results(result: pb.FlowResult) -> None:
            for output in result.results:
                add(output.completed_step_output)

        for movement, _ in self.queue:
            add(movement.step_input)
        for st in self.steps.values():
            add(st.movement.step_input)
            for value in st.locals.values():
                add(value)
            if st.cond_results is not None:
                for channel in st.cond_results.channel_results:
                    for value in channel.values:
                        add(value)
                for result in st.cond_results.sub_flow_results:
                    add_results(result)
            for result in st.subs.values():
                add_results(result)
        for output in self.results:
            add(output.completed_step_output)
        return frozenset(ids)

    @property
    def is_open(self) -> bool:
        """Whether the run is RUNNING."""
        return self.status == RUNNING

    def next_order(self) -> int:
        """A run-local increasing sequence number (FIFO ordering of waits and locks)."""
        self.order_seq += 1
        return self.order_seq

    def header_json(self) -> str:
        """JSON of the run's fixed and close fields."""
        fixed = self._fixed_enc
        if fixed is None or fixed[0] is not self.config or fixed[1] is not self.start_request:
            fixed = (self.config, self.start_request, enc(self.config), enc(self.start_request))
            self._fixed_enc = fixed
        return json.dumps(
            {
                "first_run_id": self.first_run_id,
                "run_attempt": self.run_attempt,
                "config": fixed[2],
                "start": fixed[3],
                "error_type": self.error_type,
                "error_message": self.error_message,
                "results": [enc(r) for r in self.results],
                "continued_to": self.continued_to,
                "retry_at": self.retry_at,
                "parents": self.parents,
                "search": {k: enc(v) for k, v in self.search.items()},
                "can_threshold": self.can_threshold,
            }
        )

    def core_json(self) -> str:
        """JSON of the run's evolving execution state."""
        return json.dumps(
            {
                "queue": [[enc(mv), at] for mv, at in self.queue],
                "steps": [s.to_json() for s in self.steps.values()],
                "counters": self.counters,
                "graceful": self.graceful,
                "order_seq": self.order_seq,
                "sticky": self.sticky,
                "next_event_id": self.next_event_id,
                "chan_seq": self.chan_seq,
                "unfinished": self.unfinished_at_close,
            }
        )

    def row(self, header: str | None = None) -> tuple[Any, ...]:
        """The ``runs`` table row (``header``: its :meth:`header_json`, when at hand)."""
        return (
            self.run_id,
            self.flow_id,
            self.seq,
            self.flow_type,
            self.status,
            self.request_id,
            self.start_ts,
            self.close_ts,
            self.header_json() if header is None else header,
            self.core_json(),
        )

    def update_row(self) -> tuple[Any, ...]:
        """``(status, close_ts, core, run_id)``: the columns a commit changes while the row's
        header stays as stored (:attr:`stored_header`)."""
        return (self.status, self.close_ts, self.core_json(), self.run_id)

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> Run:
        """Rebuild a run (without attributes and channels) from its ``runs`` row."""
        run_id, flow_id, seq, flow_type, status, request_id, start_ts, close_ts, h, c = row
        header = json.loads(h)
        core = json.loads(c)
        run = cls(
            flow_id=flow_id,
            run_id=run_id,
            seq=seq,
            flow_type=flow_type,
            status=status,
            request_id=request_id,
            start_ts=start_ts,
            close_ts=close_ts,
            first_run_id=header["first_run_id"],
            run_attempt=header["run_attempt"],
            config=dec_req(pb.FlowConfig, header["config"]),
            start_request=dec_req(pb.StartFlowRequest, header["start"]),
            error_type=header["error_type"],
            error_message=header["error_message"],
            results=[dec_req(pb.StepCompletionOutput, r) for r in header["results"]],
            continued_to=header.get("continued_to", ""),
            retry_at=header.get("retry_at", 0.0),
            parents=header.get("parents", []),
            search={k: dec_req(pb.Value, v) for k, v in header.get("search", {}).items()},
            can_threshold=header.get("can_threshold", 0),
        )
        run.queue = [(dec_req(pb.StepMovement, mv), at) for mv, at in core["queue"]]
        run.steps = {d["id"]: StepExec.from_json(d) for d in core["steps"]}
        run.counters = core["counters"]
        run.graceful = core["graceful"]
        run.order_seq = core["order_seq"]
        run.sticky = core["sticky"]
        run.next_event_id = core["next_event_id"]
        run.chan_seq = core["chan_seq"]
        run.unfinished_at_close = core["unfinished"]
        run.stored_header = (run_id, h)
        return run
