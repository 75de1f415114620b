"""The Dex execution core: runs, Step lifecycles, conditions, attempts and pull dispatch.

Every mutation happens synchronously on the asyncio loop thread, so a run's reducer never
interleaves with another change; each externally triggered change ends with
:meth:`Engine.flush`, which writes the run's changes to SQLite in one transaction before
anything is acknowledged (spec sections 2, 3 and 7).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb
from google.protobuf import duration_pb2, timestamp_pb2

from ._errors import ServiceError, uncategorized
from ._model import (
    START_FROM,
    TIMEOUT_HANDLER_ID,
    TIMEOUT_HANDLER_TYPE,
    TIMER_FIRED,
    TIMER_PENDING,
    TIMER_SKIPPED,
    ChannelEntry,
    Run,
    StepExec,
    has_kind,
    null_value,
    uuid7,
)
from ._push import is_push
from ._store import RunWrite, Store

_LOG = logging.getLogger("dex_dev_server")

DEFAULT_METHOD_TIMEOUT = 7200
DEFAULT_TOTAL_RETRY = 4 * 3600
NO_CAPACITY_BACKOFF = 0.2
USER_CLOSED = (
    pb.FLOW_STATUS_COMPLETED,
    pb.FLOW_STATUS_FAILED,
    pb.FLOW_STATUS_CANCELED,
    pb.FLOW_STATUS_TERMINATED,
    pb.FLOW_STATUS_CONTINUED_AS_NEW,
)


def now() -> float:
    """Wall-clock seconds (persisted timestamps use the same clock)."""
    return time.time()


def timestamp(t: float) -> timestamp_pb2.Timestamp:
    """A protobuf Timestamp for unix seconds ``t``."""
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(t * 1e9))
    return ts


def duration(seconds: float) -> duration_pb2.Duration:
    """A protobuf Duration."""
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


class Notifier:
    """Keyed wake-ups for long polls: ``wait(key, timeout)`` returns after ``notify(key)``."""

    def __init__(self) -> None:
        self._events: dict[Any, asyncio.Event] = {}

    def notify(self, key: Any) -> None:
        """Wake every waiter of ``key``."""
        event = self._events.pop(key, None)
        if event is not None:
            event.set()

    async def wait(self, key: Any, seconds: float) -> None:
        """Wait for the next ``notify(key)`` or ``seconds``, whichever comes first."""
        event = self._events.get(key)
        if event is None:
            event = self._events[key] = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(0.0, seconds))


@dataclass
class WorkerStream:
    """One open ``PollWorkerTask`` call (at most one task at a time, spec section 1.4)."""

    sid: int
    queue: str
    app_worker_id: str
    flow_types: frozenset[str]
    out: asyncio.Queue[pb.PollWorkerTaskResponse | None]
    task_id: str = ""
    half_closed: bool = False

    @property
    def idle(self) -> bool:
        """Whether the stream can take a task now."""
        return not self.task_id and not self.half_closed

    def serves(self, flow_type: str) -> bool:
        """Whether tasks of ``flow_type`` may be routed to this stream."""
        if self.queue == self.app_worker_id:
            return flow_type in self.flow_types
        return self.queue == flow_type


@dataclass
class RpcCall:
    """An InvokeRPC waiting for (or running on) a worker."""

    run: Run
    request: pb.InvokeRPCRequest
    future: asyncio.Future[tuple[pb.InvokeWorkerRPCResponse, str]]
    dispatched: asyncio.Event = field(default_factory=asyncio.Event)
    excluded: set[str] = field(default_factory=set)
    budget: float = 60.0


@dataclass
class Inflight:
    """A task sent to a stream (or a push call) not yet answered with a final frame."""

    task_id: str
    stream: WorkerStream | None
    run_id: str
    exe_id: str = ""
    rpc: RpcCall | None = None
    valid: bool = True
    deadline_handle: asyncio.TimerHandle | None = None
    frames: int = 0
    push_task: asyncio.Task[None] | None = None


class EngineState:
    """All runs, indexed by flow ID, plus the pull dispatcher."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.runs: dict[str, Run] = {}
        self.flows: dict[str, list[str]] = {}
        self.run_seq = 0
        self.streams: dict[int, WorkerStream] = {}
        self.stream_seq = 0
        self.inflight: dict[str, Inflight] = {}
        self.ready: dict[tuple[str, str], None] = {}
        self.rpc_queue: list[RpcCall] = []
        # Streams (by sid) that answered NO_CAPACITY, benched until the given time. Only
        # that stream is benched: it is usually about to retire, while the same worker's
        # other idle streams can take the task at once.
        self.declined_until: dict[int, float] = {}
        self.excluded: dict[tuple[str, str], set[str]] = {}
        self.notifier = Notifier()
        self.index_types: dict[str, int] = {}
        self.stream_totals: dict[tuple[str, str], int] = {}
        # While replaying history for time travel, recorded message IDs are kept.
        self.replaying = False
        self._handles: dict[Any, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        from ._push import PushClient

        self.push = PushClient()

    # Basics -------------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop running the engine."""
        if self._loop is None:
            self._loop = asyncio.get_running_loop()
        return self._loop

    def latest_run(self, flow_id: str) -> Run | None:
        """The newest run of a flow (``None`` if the flow was never started)."""
        ids = self.flows.get(flow_id)
        return self.runs[ids[-1]] if ids else None

    def find_run(self, flow_id: str, run_id: str = "") -> Run | None:
        """The given run of a flow, or its latest run when ``run_id`` is empty."""
        if run_id:
            run = self.runs.get(run_id)
            return run if run is not None and run.flow_id == flow_id else None
        return self.latest_run(flow_id)

    def schedule(self, key: Any, at: float, fn: Callable[[], None]) -> None:
        """Call ``fn`` at wall time ``at`` (replacing any earlier schedule under ``key``)."""
        old = self._handles.pop(key, None)
        if old is not None:
            old.cancel()

        def fire() -> None:
            self._handles.pop(key, None)
            try:
                fn()
            except Exception:
                _LOG.exception("scheduled engine action failed")

        self._handles[key] = self.loop.call_later(max(0.0, at - now()), fire)

    def rekey_schedules(self, old_run_id: str, new_run_id: str) -> None:
        """Move schedules keyed by a run ID to the run's new ID (continue-as-new)."""
        for key in list(self._handles):
            if isinstance(key, tuple) and len(key) > 1 and key[1] == old_run_id:
                self._handles[(key[0], new_run_id, *key[2:])] = self._handles.pop(key)

    def unschedule(self, key: Any) -> None:
        """Cancel a schedule made with :meth:`schedule`."""
        old = self._handles.pop(key, None)
        if old is not None:
            old.cancel()

    def flush(self, run: Run) -> None:
        """Persist the run's pending changes (one SQLite transaction) and wake long polls."""
        write = run.write
        run.write = RunWrite()
        write.run_row = run.row()
        self.store.commit(run.run_id, write)
        self.notifier.notify(("flow", run.flow_id))
        if (
            run.is_open
            and run.can_threshold > 0
            and not self.replaying
            and run.next_event_id - 2 >= run.can_threshold
        ):
            self.continue_as_new(run)

    def continue_as_new(self, live: Run) -> None:
        """Carry a run's state into a new run (see :class:`Engine`)."""

    def add_history(self, run: Run, **payload: Any) -> None:
        """Append a history event to the run (written at the next flush)."""
        event = pb.FlowHistoryEvent(
            event_id=run.next_event_id,
            event_time=timestamp(now()),
            run_attempt=run.run_attempt,
            **payload,
        )
        run.write.history.append((run.next_event_id, event.SerializeToString()))
        run.next_event_id += 1

    # Attributes and channels -------------------------------------------------------------------

    def set_attribute(self, run: Run, key: str, value: pb.Value) -> None:
        """Apply one attribute write (``null_value`` deletes)."""
        if value.WhichOneof("kind") in (None, "null_value"):
            run.attributes.pop(key, None)
            run.write.set_attribute(key, None)
        else:
            run.attributes[key] = value
            run.write.set_attribute(key, value.SerializeToString())

    def index_attribute(self, run: Run, write: pb.AttributeWrite, by_key: bool = False) -> None:
        """Update the run's search field for an indexed write (spec section 9.1 #12).

        ``by_key`` also indexes writes without ``index_config`` whose key is a synced
        index key (used for StartFlow's initial attributes).
        """
        cfg = write.index_config
        if cfg.enable:
            name = cfg.index_key or write.key
        elif by_key and write.key in self.index_types:
            name = write.key
        else:
            return
        if write.value.WhichOneof("kind") in (None, "null_value"):
            run.search.pop(name, None)
        else:
            run.search[name] = write.value

    def publish(
        self, run: Run, channel: str, value: pb.Value, message_id: str = ""
    ) -> pb.ChannelMessage:
        """Append a message to a channel of the run (a new UUIDv7 unless re-applied)."""
        if not has_kind(value):
            value = null_value()
        message = pb.ChannelMessage(
            channel_name=channel, value=value, message_id=message_id or uuid7()
        )
        run.chan_seq += 1
        run.channels.setdefault(channel, []).append(ChannelEntry(run.chan_seq, message))
        run.write.channel_inserts.append(
            (run.chan_seq, channel, message.message_id, value.SerializeToString())
        )
        return message

    def delete_message(self, run: Run, channel: str, message_id: str) -> bool:
        """Delete one pending message by ID; ``False`` when it does not exist."""
        entries = run.channels.get(channel, [])
        for i, entry in enumerate(entries):
            if entry.message.message_id == message_id:
                del entries[i]
                run.write.channel_deletes.append(entry.seq)
                if not entries:
                    run.channels.pop(channel, None)
                return True
        return False

    def consume(self, run: Run, channel: str, count: int) -> list[pb.Value]:
        """Remove and return the ``count`` oldest messages of a channel."""
        entries = run.channels.get(channel, [])
        taken, rest = entries[:count], entries[count:]
        for entry in taken:
            run.write.channel_deletes.append(entry.seq)
        if rest:
            run.channels[channel] = rest
        else:
            run.channels.pop(channel, None)
        return [entry.message.value for entry in taken]

    def apply_effects(
        self,
        run: Run,
        writes: Iterable[pb.AttributeWrite],
        publishes: Iterable[pb.ChannelMessage],
        deletes: Iterable[pb.ChannelMessageDeletion],
    ) -> list[pb.ChannelMessage]:
        """Apply deletions, then attribute writes, then publications (spec section 3.2)."""
        for deletion in deletes:
            self.delete_message(run, deletion.channel_name, deletion.message_id)
        for write in writes:
            self.set_attribute(run, write.key, write.value)
            self.index_attribute(run, write)
        return [
            self.publish(
                run, m.channel_name, m.value, m.message_id if self.replaying else ""
            )
            for m in publishes
        ]

    def attributes_for(self, run: Run, selectors: Iterable[str]) -> list[pb.KV]:
        """Singletons plus the selected AttributeMap instances (spec section 3.1)."""
        selected = set(selectors)
        prefixes = tuple(s for s in selected if s.endswith("/"))
        out = []
        for key, value in run.attributes.items():
            if "/" in key and key not in selected and not (prefixes and key.startswith(prefixes)):
                continue
            out.append(pb.KV(key=key, value=value))
        return out

    def channel_view(
        self, run: Run, names: Iterable[str], map_selectors: Iterable[str]
    ) -> tuple[dict[str, pb.ChannelInfo], dict[str, pb.ChannelValues]]:
        """``channel_infos`` for all non-empty channels and the selected pending messages."""
        infos = {
            name: pb.ChannelInfo(size=len(entries))
            for name, entries in run.channels.items()
            if entries
        }
        loaded: dict[str, pb.ChannelValues] = {}
        exact = set(names)
        prefixes = []
        for sel in map_selectors:
            if sel.endswith("/"):
                prefixes.append(sel)
            else:
                exact.add(sel)
        for name, entries in run.channels.items():
            if name in exact or any(name.startswith(p) for p in prefixes):
                loaded[name] = pb.ChannelValues(messages=[e.message for e in entries])
        return infos, loaded

    # Locks ---------------------------------------------------------------------------------

    def try_lock(self, run: Run, keys: Iterable[str], owner: str) -> bool:
        """Take all ``keys`` for ``owner`` or none of them."""
        keys = list(keys)
        if any(run.locks.get(k, owner) != owner for k in keys):
            return False
        for k in keys:
            run.locks[k] = owner
        return True

    def unlock(self, run: Run, owner: str) -> None:
        """Release every lock held by ``owner``."""
        for k in [k for k, o in run.locks.items() if o == owner]:
            del run.locks[k]

    # Step executions -------------------------------------------------------------------------

    def enqueue(
        self,
        run: Run,
        movement: pb.StepMovement,
        from_id: str,
        recovery: pb.RecoveryErrorInfo | None = None,
        not_before: float = 0.0,
    ) -> None:
        """Queue a movement (a Step execution is created when it is dequeued)."""
        mv = pb.StepMovement()
        mv.CopyFrom(movement)
        mv.from_step_execution_id_internal_only = from_id
        if recovery is not None:
            mv.recovery_error_internal_only.CopyFrom(recovery)
        if not has_kind(mv.step_input):
            mv.step_input.CopyFrom(null_value())
        run.queue.append((mv, not_before))

    def user_step_count(self, run: Run) -> int:
        """Queued plus executing user Steps (the timeout Step is excluded)."""
        return len(run.queue) + sum(1 for s in run.steps.values() if not s.system)

    def settle(self, run: Run) -> None:
        """After a change to ``run``: move it as far as it can go, commit, and dispatch."""
        self.advance(run)
        self.flush(run)
        self.pump()

    def advance(self, run: Run) -> None:
        """Dequeue movements, take locks, evaluate waits and check graceful completion."""
        progressed = True
        while progressed and run.is_open:
            progressed = False
            t = now()
            remaining: list[tuple[pb.StepMovement, float]] = []
            for mv, at in run.queue:
                if at > t:
                    remaining.append((mv, at))
                    continue
                self._create_step(run, mv)
                progressed = True
            run.queue = remaining
            if remaining:
                self.schedule(
                    ("queue", run.run_id),
                    min(at for _, at in remaining),
                    functools.partial(self._tick, run),
                )
            for st in sorted(run.steps.values(), key=lambda s: s.created_order):
                if st.mstate == "locking" and st.phase != "waiting":
                    self._try_start_method(run, st)
            waiting = sorted(
                (s for s in run.steps.values() if s.phase == "waiting"),
                key=lambda s: s.wait_order,
            )
            for st in waiting:
                if st.exe_id in run.steps and self._evaluate_wait(run, st):
                    progressed = True
        if run.is_open and run.graceful and self.user_step_count(run) == 0:
            self.close_run(run, pb.FLOW_STATUS_COMPLETED)

    def _tick(self, run: Run) -> None:
        if run.is_open:
            self.settle(run)

    def _create_step(self, run: Run, mv: pb.StepMovement) -> None:
        n = run.counters.get(mv.step_type, 0) + 1
        run.counters[mv.step_type] = n
        st = StepExec(
            exe_id=f"{mv.step_type}-{n}",
            step_type=mv.step_type,
            movement=mv,
            phase="execute" if mv.step_options.skip_wait_for else "wait_for",
            created_order=run.next_order(),
        )
        run.steps[st.exe_id] = st
        self.start_method(run, st, st.phase)

    def start_method(self, run: Run, st: StepExec, method: str) -> None:
        """Begin a fresh method (attempt 1) of a Step execution."""
        st.phase = method
        st.mstate = "locking"
        st.attempt = 1
        st.first_attempt_ts = 0.0
        st.method_started = now()
        st.heartbeat = None
        st.last_failure = None
        self._try_start_method(run, st)

    def lock_keys(self, st: StepExec) -> list[str]:
        """Physical attribute keys the current method must hold."""
        opts = st.options
        keys = (
            opts.wait_for_lock_attribute_keys
            if st.phase == "wait_for"
            else opts.execute_lock_attribute_keys
        )
        return sorted(set(keys))

    def _try_start_method(self, run: Run, st: StepExec) -> None:
        keys = self.lock_keys(st)
        if keys and not st.locks_held:
            if not self.try_lock(run, keys, st.exe_id):
                st.mstate = "locking"
                return
            st.locks_held = True
        st.mstate = "ready"
        self.ready[(run.run_id, st.exe_id)] = None

    def release_locks(self, run: Run, st: StepExec) -> None:
        """Release the current method's locks (and let blocked Steps retry)."""
        if st.locks_held:
            self.unlock(run, st.exe_id)
            st.locks_held = False

    def finish_step(self, run: Run, st: StepExec) -> None:
        """Remove a finished (or canceled) execution from the run."""
        self.release_locks(run, st)
        self.ready.pop((run.run_id, st.exe_id), None)
        self.unschedule(("retry", run.run_id, st.exe_id))
        for i in range(len(st.timers)):
            self.unschedule(("timer", run.run_id, st.exe_id, i))
        run.steps.pop(st.exe_id, None)

    def cancel_step(self, run: Run, st: StepExec) -> None:
        """Cancel an execution in any phase: cancel its task and discard its results."""
        self._cancel_inflight(st)
        self.finish_step(run, st)

    def _cancel_inflight(self, st: StepExec) -> None:
        if st.mstate == "dispatched" and st.task_id:
            inflight = self.inflight.get(st.task_id)
            if inflight is not None and inflight.valid:
                inflight.valid = False
                if inflight.deadline_handle is not None:
                    inflight.deadline_handle.cancel()
                if inflight.stream is not None:
                    inflight.stream.out.put_nowait(
                        pb.PollWorkerTaskResponse(
                            cancel_task=pb.PollWorkerTaskCancelTask(task_id=st.task_id)
                        )
                    )
                if inflight.push_task is not None:
                    inflight.push_task.cancel()
                    self.inflight.pop(st.task_id, None)
        st.task_id = ""

    # Waiting conditions -----------------------------------------------------------------------

    def enter_waiting(self, run: Run, st: StepExec, condition: pb.WaitingCondition) -> None:
        """Commit a wait_for's condition: set absolute timer due times and start waiting."""
        st.phase = "waiting"
        st.mstate = "waiting"
        st.waiting = condition
        st.wait_order = run.next_order()
        t = now()
        st.timers = []
        for timer in condition.timer_conditions:
            fire_at = float(
                timer.firing_unix_timestamp_seconds or math.ceil(t + timer.duration_seconds)
            )
            if timer.duration_seconds <= 0 and not timer.firing_unix_timestamp_seconds:
                fire_at = t
            st.timers.append([float(fire_at), float(TIMER_PENDING)])
        self.schedule_timers(run, st)
        for i, sub in enumerate(condition.sub_flow_conditions):
            self.start_sub_flow(run, st, i, sub)

    def start_sub_flow(
        self, run: Run, st: StepExec, position: int, condition: pb.SubFlowCondition
    ) -> None:
        """Start or attach the child Flow of a sub-flow condition (see :class:`Engine`)."""

    def after_close(self, run: Run) -> None:
        """Hook run after a run closed: flow retries and sub-flow result delivery."""

    def schedule_timers(self, run: Run, st: StepExec) -> None:
        """(Re)arm the pending timers of a waiting execution."""
        for i, (fire_at, status) in enumerate(st.timers):
            if status == TIMER_PENDING:
                self.schedule(
                    ("timer", run.run_id, st.exe_id, i),
                    fire_at,
                    functools.partial(self._fire_timer, run, st.exe_id, i),
                )

    def _fire_timer(self, run: Run, exe_id: str, index: int) -> None:
        st = run.steps.get(exe_id)
        if not run.is_open or st is None or st.phase != "waiting" or index >= len(st.timers):
            return
        if st.timers[index][1] == TIMER_PENDING:
            st.timers[index][1] = float(TIMER_FIRED)
        self.settle(run)

    def skip_timer(self, run: Run, st: StepExec, index: int) -> None:
        """Mark a pending timer SKIPPED (counts as fired)."""
        st.timers[index][1] = float(TIMER_SKIPPED)
        self.unschedule(("timer", run.run_id, st.exe_id, index))

    def _evaluate_wait(self, run: Run, st: StepExec) -> bool:
        cond = st.waiting
        assert cond is not None
        timers = list(cond.timer_conditions)
        chans = list(cond.channel_conditions)
        subs = list(cond.sub_flow_conditions)
        ids: dict[str, tuple[str, int]] = {}
        for i, c in enumerate(timers):
            ids.setdefault(c.condition_id, ("t", i))
        for i, cc in enumerate(chans):
            ids.setdefault(cc.condition_id, ("c", i))
        for i, sc in enumerate(subs):
            ids.setdefault(sc.condition_id, ("s", i))
        all_refs = (
            [("t", i) for i in range(len(timers))]
            + [("c", i) for i in range(len(chans))]
            + [("s", i) for i in range(len(subs))]
        )
        kind = cond.waiting_condition_type
        if kind == pb.WAITING_CONDITION_TYPE_ANY_COMPLETED:
            candidates = [[ref] for ref in all_refs]
        elif kind == pb.WAITING_CONDITION_TYPE_ANY_COMBINATION_COMPLETED:
            candidates = [
                [ids[i] for i in combo.condition_ids if i in ids]
                for combo in cond.condition_combinations
            ]
        else:
            candidates = [all_refs]
        if not all_refs:
            candidates = [[]]
        for candidate in candidates:
            take = self._match(run, st, candidate, chans)
            if take is not None:
                self._promote(run, st, take, chans)
                return True
        return False

    @staticmethod
    def _bounds(cc: pb.ChannelCondition) -> tuple[int, float]:
        has_min, has_max = cc.HasField("at_least"), cc.HasField("at_most")
        if not has_min and not has_max:
            return 1, 1
        if has_max and not has_min:
            return 0, cc.at_most
        if has_min and not has_max:
            return cc.at_least, math.inf
        return cc.at_least, cc.at_most

    def _match(
        self, run: Run, st: StepExec, candidate: list[tuple[str, int]], chans: list[Any]
    ) -> dict[int, int] | None:
        for ref_kind, i in candidate:
            if ref_kind == "t" and st.timers[i][1] == TIMER_PENDING:
                return None
            if ref_kind == "s" and i not in st.subs:
                return None
        chan_idx = sorted(i for k, i in candidate if k == "c")
        available = {name: len(entries) for name, entries in run.channels.items()}
        take: dict[int, int] = {}
        for i in chan_idx:
            lo, _ = self._bounds(chans[i])
            name = chans[i].channel_name
            if available.get(name, 0) < lo:
                return None
            available[name] = available.get(name, 0) - lo
            take[i] = lo
        for i in chan_idx:
            _, hi = self._bounds(chans[i])
            name = chans[i].channel_name
            extra = min(available.get(name, 0), hi - take[i])
            extra = int(extra) if extra != math.inf else available.get(name, 0)
            take[i] += extra
            available[name] = available.get(name, 0) - extra
        return take

    def _promote(self, run: Run, st: StepExec, take: dict[int, int], chans: list[Any]) -> None:
        results = pb.ConditionResults()
        cond = st.waiting
        assert cond is not None
        for i, timer in enumerate(cond.timer_conditions):
            done = st.timers[i][1] != TIMER_PENDING
            results.timer_results.add(
                condition_id=timer.condition_id,
                condition_status=(
                    pb.CONDITION_STATUS_COMPLETED if done else pb.CONDITION_STATUS_WAITING
                ),
            )
            self.unschedule(("timer", run.run_id, st.exe_id, i))
        for i, cc in enumerate(chans):
            if i in take:
                results.channel_results.add(
                    condition_id=cc.condition_id,
                    channel_name=cc.channel_name,
                    condition_status=pb.CONDITION_STATUS_COMPLETED,
                    values=self.consume(run, cc.channel_name, take[i]),
                )
            else:
                results.channel_results.add(
                    condition_id=cc.condition_id,
                    channel_name=cc.channel_name,
                    condition_status=pb.CONDITION_STATUS_WAITING,
                )
        for i, _ in enumerate(cond.sub_flow_conditions):
            if i in st.subs:
                results.sub_flow_results.append(st.subs[i])
            else:
                results.sub_flow_results.add(flow_status=pb.FLOW_STATUS_RUNNING)
        st.cond_results = results
        if st.system:
            self._fire_flow_timeout(run, st)
            return
        self.start_method(run, st, "execute")

    # Flow timeout ---------------------------------------------------------------------------

    def create_timeout_step(self, run: Run, timeout_seconds: int) -> None:
        """Create ``sys:timeout_handler-1`` waiting on one timer (spec section 2.9)."""
        req = run.start_request
        opts = pb.StepOptions()
        h = req.flow_start_options.timeout_handler_options
        opts.execute_timeout_seconds = h.method_timeout_seconds
        opts.heartbeat_timeout_seconds = h.heartbeat_timeout_seconds
        if h.HasField("retry_policy"):
            opts.execute_retry_policy.CopyFrom(h.retry_policy)
        opts.execute_failure_policy = h.failure_policy
        opts.execute_failure_proceed_step_type = h.failure_proceed_step_type
        if h.HasField("failure_proceed_step_options"):
            opts.execute_failure_proceed_step_options.CopyFrom(h.failure_proceed_step_options)
        opts.execute_durability_override = h.durability_override
        opts.execute_lock_attribute_keys.extend(h.lock_attribute_keys)
        opts.execute_load_attribute_map_instances.extend(h.load_attribute_map_instances)
        opts.execute_load_channel_names.extend(h.load_channel_names)
        opts.execute_load_channel_map_instances.extend(h.load_channel_map_instances)
        mv = pb.StepMovement(
            step_type=TIMEOUT_HANDLER_TYPE,
            step_options=opts,
            from_step_execution_id_internal_only=START_FROM,
        )
        st = StepExec(
            exe_id=TIMEOUT_HANDLER_ID,
            step_type=TIMEOUT_HANDLER_TYPE,
            movement=mv,
            phase="waiting",
            system=True,
            created_order=run.next_order(),
        )
        run.counters[TIMEOUT_HANDLER_TYPE] = 1
        run.steps[st.exe_id] = st
        cond = pb.WaitingCondition(
            waiting_condition_type=pb.WAITING_CONDITION_TYPE_ANY_COMPLETED,
            timer_conditions=[
                pb.TimerCondition(
                    condition_id="flow-timeout",
                    duration_seconds=timeout_seconds,
                    firing_unix_timestamp_seconds=math.ceil(run.start_ts + timeout_seconds),
                )
            ],
        )
        self.enter_waiting(run, st, cond)

    def _fire_flow_timeout(self, run: Run, st: StepExec) -> None:
        req = run.start_request
        policy = req.flow_timeout_policy
        if policy == pb.FLOW_TIMEOUT_POLICY_CANCEL:
            self.close_run(run, pb.FLOW_STATUS_CANCELED)
        elif policy == pb.FLOW_TIMEOUT_POLICY_HANDLER:
            st.cond_results = None
            self.start_method(run, st, "execute")
        else:
            self.close_run(
                run,
                pb.FLOW_STATUS_FAILED,
                pb.FLOW_ERROR_TYPE_FLOW_TIMEOUT,
                f"Flow timed out after {req.flow_timeout_seconds} seconds",
            )

    # Closing --------------------------------------------------------------------------------

    def close_run(
        self, run: Run, status: int, error_type: int = 0, message: str = "", continued_to: str = ""
    ) -> None:
        """Close a run: cancel in-flight methods, drop queued/waiting Steps, record history."""
        if not run.is_open:
            return
        for st in list(run.steps.values()):
            if not st.system:
                run.unfinished_at_close.append(st.exe_id)
            self.cancel_step(run, st)
        run.queue.clear()
        run.locks.clear()
        self.unschedule(("queue", run.run_id))
        run.status = status
        run.error_type = error_type
        run.error_message = message
        run.close_ts = now()
        run.continued_to = continued_to
        if status != pb.FLOW_STATUS_COMPLETED:
            results: list[pb.StepCompletionOutput] = []
        else:
            results = run.results
        self.add_history(
            run,
            flow_closed=pb.FlowClosedHistoryEvent(
                flow_status=status,  # type: ignore[arg-type]
                results=results,
                error_type=error_type,  # type: ignore[arg-type]
                error_message=message,
                continued_to_run_id=continued_to,
                sticky_app_worker_id=run.sticky,
            ),
        )
        _LOG.info("flow %s run %s closed with status %s", run.flow_id, run.run_id,
                  pb.FlowStatus.Name(status))
        self.after_close(run)

    def add_output(self, run: Run, st: StepExec, output: pb.Value) -> None:
        """Collect a completion output (absent or ``null_value`` outputs are not collected)."""
        if output.WhichOneof("kind") in (None, "null_value"):
            return
        run.results.append(
            pb.StepCompletionOutput(
                completed_step_type=st.step_type,
                completed_step_execution_id=st.exe_id,
                completed_step_output=output,
            )
        )

    # Pull dispatch ---------------------------------------------------------------------------

    def pump(self) -> None:
        """Match ready tasks (RPCs first, then Steps in readiness order) to idle streams."""
        if not self.streams and not any(
            is_push(self.runs[k[0]]) for k in self.ready if k[0] in self.runs
        ):
            return
        t = now()
        for call in list(self.rpc_queue):
            stream = self._pick_stream(call.run, call.excluded, rpc=True, t=t)
            if stream is not None:
                self.rpc_queue.remove(call)
                self._send_rpc(stream, call)
        for key in list(self.ready):
            run = self.runs.get(key[0])
            st = run.steps.get(key[1]) if run is not None else None
            if run is None or st is None or not run.is_open or st.mstate != "ready":
                self.ready.pop(key, None)
                continue
            if is_push(run):
                self.ready.pop(key, None)
                self._push_step(run, st)
                continue
            stream = self._pick_stream(run, self.excluded.get(key, set()), rpc=False, t=t)
            if stream is None:
                continue
            self.ready.pop(key, None)
            self._send_step(stream, run, st)

    def serves_flow_type(self, flow_type: str) -> bool:
        """Whether any registered stream serves ``flow_type``."""
        return any(s.serves(flow_type) and not s.half_closed for s in self.streams.values())

    def _pick_stream(
        self, run: Run, excluded: set[str], rpc: bool, t: float
    ) -> WorkerStream | None:
        fallback: WorkerStream | None = None
        for stream in self.streams.values():
            if not stream.idle or not stream.serves(run.flow_type):
                continue
            if stream.app_worker_id in excluded:
                continue
            if not rpc and self.declined_until.get(stream.sid, 0) > t:
                continue
            if stream.queue == stream.app_worker_id and stream.app_worker_id == run.sticky:
                return stream
            if stream.queue != stream.app_worker_id and fallback is None:
                fallback = stream
        return fallback

    def _failed_too_large(self, run: Run, st: StepExec, task: pb.PollWorkerTask) -> bool:
        """Fail the attempt of a Step whose task is larger than a worker accepts, and say so.

        Sending it would break the worker's task stream (and every task on it) again on each
        retry; failing the attempt here keeps the failure to this Step. Called from ``pump``,
        which must not re-enter itself: the run advances and commits now and the next
        dispatch happens on the next loop turn.
        """
        detail = task_too_large(pb.PollWorkerTaskResponse(task=task))
        if not detail:
            return False
        code: int = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        error = pb.WorkerErrorResponse(detail=detail, error_type="TaskTooLarge", grpc_status=code)
        self.fail_attempt(run, st, self.failure(st, worker=error), detail)
        self.advance(run)
        self.flush(run)
        self.loop.call_soon(self.pump)
        return True

    def _new_task_id(self) -> str:
        return uuid.uuid4().hex

    def _send_rpc(self, stream: WorkerStream, call: RpcCall) -> None:
        from ._requests import build_rpc_request

        task_id = self._new_task_id()
        deadline = now() + call.budget
        task = pb.PollWorkerTask(
            task_id=task_id,
            deadline=timestamp(deadline),
            rpc=build_rpc_request(self, call.run, call.request),
        )
        refused = rpc_too_large(call.run, call.request.rpc_name, task.rpc)
        if refused is not None:
            call.dispatched.set()
            call.future.set_exception(refused)
            return
        stream.task_id = task_id
        self.inflight[task_id] = Inflight(task_id, stream, call.run.run_id, rpc=call)
        call.dispatched.set()
        stream.out.put_nowait(pb.PollWorkerTaskResponse(task=task))

    def _send_step(self, stream: WorkerStream, run: Run, st: StepExec) -> None:
        from ._requests import build_step_task

        task_id = self._new_task_id()
        if st.first_attempt_ts == 0.0:
            st.first_attempt_ts = now()
        timeout = self._method_timeout(st)
        deadline = now() + timeout
        task = build_step_task(self, run, st, task_id, deadline)
        if self._failed_too_large(run, st, task):
            return
        st.mstate = "dispatched"
        st.task_id = task_id
        if st.phase == "wait_for":
            st.wait_for_served_by = stream.app_worker_id
        else:
            st.served_by = stream.app_worker_id
        stream.task_id = task_id
        inflight = Inflight(task_id, stream, run.run_id, exe_id=st.exe_id)
        inflight.deadline_handle = self.loop.call_later(
            timeout, lambda: self._on_deadline(task_id, timeout)
        )
        self.inflight[task_id] = inflight
        stream.out.put_nowait(pb.PollWorkerTaskResponse(task=task))
        self.flush(run)

    def _push_step(self, run: Run, st: StepExec) -> None:
        from ._push import run_step
        from ._requests import build_step_task

        task_id = self._new_task_id()
        if st.first_attempt_ts == 0.0:
            st.first_attempt_ts = now()
        timeout = self._method_timeout(st)
        task = build_step_task(self, run, st, task_id, now() + timeout)
        if self._failed_too_large(run, st, task):
            return
        st.mstate = "dispatched"
        st.task_id = task_id
        inflight = Inflight(task_id, None, run.run_id, exe_id=st.exe_id)
        inflight.deadline_handle = self.loop.call_later(
            timeout + 1, lambda: self._on_deadline(task_id, timeout)
        )
        self.inflight[task_id] = inflight
        inflight.push_task = asyncio.ensure_future(
            run_step(self, run, st, inflight, task, float(timeout))
        )
        self.flush(run)

    @staticmethod
    def _method_timeout(st: StepExec) -> int:
        return (
            st.options.wait_for_timeout_seconds
            if st.phase == "wait_for"
            else st.options.execute_timeout_seconds
        ) or DEFAULT_METHOD_TIMEOUT

    def push_frame(self, inflight: Inflight, tf: pb.PollWorkerTaskFrame) -> None:
        """Handle one output of a push call (same meaning as a pull task frame)."""
        if not inflight.valid:
            return
        inflight.frames += 1
        out = tf.WhichOneof("output")
        final = out in ("wait_for", "execute") and (
            getattr(tf, out).WhichOneof("output") == "result"
        )
        if final:
            inflight.valid = False
            self.inflight.pop(inflight.task_id, None)
            if inflight.deadline_handle is not None:
                inflight.deadline_handle.cancel()
        self._deliver(inflight, tf, final)
        if final:
            self.pump()

    def push_failed(
        self,
        inflight: Inflight,
        message: str,
        worker: pb.WorkerErrorResponse | None,
        retry_free: bool,
    ) -> None:
        """A push call failed: fail the attempt (or retry at once without counting)."""
        if not inflight.valid:
            return
        inflight.valid = False
        self.inflight.pop(inflight.task_id, None)
        if inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != inflight.task_id or not run.is_open:
            return
        if retry_free:
            st.task_id = ""
            st.mstate = "backoff"
            st.retry_at = now() + NO_CAPACITY_BACKOFF
            self._arm_retry(run, st)
        else:
            if worker is not None:
                failure = self.failure(st, worker=worker)
                retry_after = worker.retry_after_seconds
                message = worker.detail or message
            else:
                failure = self.failure(st, backend_error=message)
                retry_after = 0
            self.fail_attempt(run, st, failure, message, retry_after=retry_after)
            self.advance(run)
        self.flush(run)
        self.pump()

    def _on_deadline(self, task_id: str, timeout: int) -> None:
        inflight = self.inflight.get(task_id)
        if inflight is None or not inflight.valid:
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != task_id:
            return
        if inflight.stream is None:
            self.inflight.pop(task_id, None)
        method = "wait_for" if st.phase == "wait_for" else "execute"
        self._cancel_inflight(st)
        message = f"{method} method timeout after {timeout}s"
        self.fail_attempt(run, st, self.failure(st, backend_error=message), message)
        self.settle(run)

    def failure(
        self,
        st: StepExec,
        backend_error: str = "",
        worker: pb.WorkerErrorResponse | None = None,
        reason: int = 0,
    ) -> pb.StepMethodFailure:
        """Build the StepMethodFailure of the current attempt."""
        details = pb.ServiceErrorResponse(
            detail=backend_error,
            sub_status=pb.ERROR_SUB_STATUS_WORKER_API_ERROR,
            dispatch_task_error_reason=reason,  # type: ignore[arg-type]
        )
        if worker is not None:
            details.original_worker_error_detail = worker.detail
            details.original_worker_error_type = worker.error_type
            details.original_worker_error_status = worker.grpc_status or 2
            details.original_worker_error_stack_trace = worker.stack_trace
        served = st.wait_for_served_by if st.phase == "wait_for" else st.served_by
        return pb.StepMethodFailure(
            backend_error=backend_error,
            details=details,
            attempt=st.attempt,
            pull_routing=pb.PullRouting(served_by_app_worker_id=served),
        )

    def fail_attempt(
        self,
        run: Run,
        st: StepExec,
        failure: pb.StepMethodFailure,
        message: str,
        retry_after: int = 0,
        count: bool = True,
    ) -> None:
        """Record a failed attempt and schedule a retry, or apply the failure route."""
        st.last_failure = failure
        st.task_id = ""
        opts = st.options
        policy = opts.wait_for_retry_policy if st.phase == "wait_for" else opts.execute_retry_policy
        initial = policy.initial_interval_seconds or 1
        coefficient = policy.backoff_coefficient or 2.0
        maximum = policy.maximum_interval_seconds or 100
        total = policy.total_duration_seconds or DEFAULT_TOTAL_RETRY
        delay = float(min(initial * coefficient ** (st.attempt - 1), maximum))
        if retry_after > 0:
            delay = float(retry_after)
        elapsed = now() - (st.first_attempt_ts or now())
        exhausted = count and (
            (policy.maximum_attempts > 0 and st.attempt >= policy.maximum_attempts)
            or elapsed + delay >= total
        )
        if exhausted:
            self._method_exhausted(run, st, failure, message)
            return
        st.attempt += 1
        if not count:
            delay = 0.0
        st.mstate = "backoff"
        st.retry_at = now() + delay
        self._arm_retry(run, st)

    def _arm_retry(self, run: Run, st: StepExec) -> None:
        def retry() -> None:
            current = run.steps.get(st.exe_id)
            if current is st and run.is_open and st.mstate == "backoff":
                st.mstate = "ready"
                self.ready[(run.run_id, st.exe_id)] = None
                self.pump()

        self.schedule(("retry", run.run_id, st.exe_id), st.retry_at, retry)

    def _method_exhausted(
        self, run: Run, st: StepExec, failure: pb.StepMethodFailure, message: str
    ) -> None:
        from ._requests import method_context

        opts = st.options
        detail = failure.details.original_worker_error_detail or message
        recovery = pb.RecoveryErrorInfo(
            detail=detail, error_type=failure.details.original_worker_error_type
        )
        if st.phase == "wait_for":
            if opts.wait_for_failure_policy == pb.WAIT_FOR_METHOD_FAILURE_POLICY_PROCEED_ON_FAILURE:
                self.add_history(
                    run,
                    step_wait_for_failed=pb.StepWaitForFailedEvent(
                        input=pb.StepMethodEventInput(step_input=st.movement.step_input),
                        output=pb.StepMethodFailedOutput(failure=failure),
                        context=method_context(run, st),
                    ),
                )
                self.release_locks(run, st)
                st.cond_results = pb.ConditionResults(wait_for_failed=True)
                st.recovery = recovery
                self.start_method(run, st, "execute")
                return
        elif (
            opts.execute_failure_policy
            == pb.EXECUTE_METHOD_FAILURE_POLICY_PROCEED_TO_CONFIGURED_STEP
            and opts.execute_failure_proceed_step_type
        ):
            self.add_history(
                run,
                step_execute_failed=pb.StepExecuteFailedEvent(
                    input=pb.StepMethodEventInput(step_input=st.movement.step_input),
                    output=pb.StepMethodFailedOutput(failure=failure),
                    context=method_context(run, st),
                ),
            )
            self.finish_step(run, st)
            mv = pb.StepMovement(
                step_type=opts.execute_failure_proceed_step_type,
                step_input=st.movement.step_input if not st.system else null_value(),
                step_options=opts.execute_failure_proceed_step_options,
            )
            self.enqueue(run, mv, st.exe_id, recovery=recovery)
            return
        self.close_run(run, pb.FLOW_STATUS_FAILED, pb.FLOW_ERROR_TYPE_WORKER_API_FAIL, detail)

    # Stream events -----------------------------------------------------------------------------

    def register_stream(
        self, queue: str, app_worker_id: str, flow_types: Iterable[str]
    ) -> WorkerStream:
        """Add a registered pull stream."""
        self.stream_seq += 1
        stream = WorkerStream(
            sid=self.stream_seq,
            queue=queue,
            app_worker_id=app_worker_id,
            flow_types=frozenset(flow_types),
            out=asyncio.Queue(),
        )
        self.streams[stream.sid] = stream
        self.loop.call_soon(self.pump)
        return stream

    def stream_ended(self, stream: WorkerStream, clean: bool) -> None:
        """A stream ended while a task may be in flight on it.

        A task the worker never answered on a cleanly closed stream was not delivered
        (spec sections 8 and 9.1 #5) and is re-routed at the same attempt. A task on a stream
        lost to a transport error or cancel, or one that already produced output (heartbeat,
        stream write), was running: its attempt fails with ``WORKER_DISCONNECTED``.
        """
        self.streams.pop(stream.sid, None)
        self.declined_until.pop(stream.sid, None)
        stream.half_closed = True
        task_id = stream.task_id
        stream.task_id = ""
        inflight = self.inflight.pop(task_id, None) if task_id else None
        if inflight is None or not inflight.valid:
            return
        if inflight.frames:
            clean = False
        if inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        inflight.valid = False
        if inflight.rpc is not None:
            call = inflight.rpc
            if clean:
                call.dispatched.clear()
                self.rpc_queue.insert(0, call)
            elif not call.future.done():
                call.future.set_exception(
                    WorkerLost(pb.DISPATCH_TASK_ERROR_REASON_WORKER_DISCONNECTED)
                )
            self.pump()
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != task_id:
            return
        if clean:
            st.mstate = "ready"
            st.task_id = ""
            self.ready[(run.run_id, st.exe_id)] = None
        else:
            message = "worker stream disconnected while the task was running"
            self.fail_attempt(
                run,
                st,
                self.failure(
                    st,
                    backend_error=message,
                    reason=pb.DISPATCH_TASK_ERROR_REASON_WORKER_DISCONNECTED,
                ),
                message,
            )
            self.advance(run)
        self.flush(run)
        self.pump()

    def on_frame(self, stream: WorkerStream, frame: pb.PollWorkerTaskRequest) -> None:
        """Handle one worker frame after registration."""
        kind = frame.WhichOneof("frame")
        if kind == "pong" or kind == "register":
            return
        if kind == "reject":
            self._on_reject(stream, frame.reject)
            return
        if kind != "task_frame":
            return
        tf = frame.task_frame
        if tf.task_id != stream.task_id:
            return
        inflight = self.inflight.get(tf.task_id)
        if inflight is not None:
            inflight.frames += 1
        out = tf.WhichOneof("output")
        final = out in ("rpc", "worker_error") or (
            out in ("wait_for", "execute")
            and getattr(tf, out).WhichOneof("output") == "result"
        )
        if final:
            stream.task_id = ""
            self.inflight.pop(tf.task_id, None)
            self.declined_until.pop(stream.sid, None)
        if inflight is not None and inflight.valid:
            if final:
                inflight.valid = False
                if inflight.deadline_handle is not None:
                    inflight.deadline_handle.cancel()
            self._deliver(inflight, tf, final)
        if final:
            self.pump()

    def _on_reject(self, stream: WorkerStream, reject: pb.PollWorkerTaskReject) -> None:
        if reject.task_id != stream.task_id:
            return
        stream.task_id = ""
        inflight = self.inflight.pop(reject.task_id, None)
        if inflight is not None and inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        unknown = reject.reason in (
            pb.POLL_WORKER_TASK_REJECT_REASON_UNKNOWN_STEP,
            pb.POLL_WORKER_TASK_REJECT_REASON_UNKNOWN_RPC,
        )
        if inflight is None or not inflight.valid:
            self.pump()
            return
        if inflight.rpc is not None:
            call = inflight.rpc
            call.dispatched.clear()
            if unknown:
                call.excluded.add(stream.app_worker_id)
                if not any(
                    s.serves(call.run.flow_type) and s.app_worker_id not in call.excluded
                    for s in self.streams.values()
                ):
                    if not call.future.done():
                        call.future.set_exception(
                            WorkerLost(pb.DISPATCH_TASK_ERROR_REASON_UNKNOWN_NAME)
                        )
                    call.dispatched.set()
                    return
            self.rpc_queue.insert(0, call)
            self.loop.call_later(NO_CAPACITY_BACKOFF if not unknown else 0, self.pump)
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != reject.task_id:
            self.pump()
            return
        st.mstate = "ready"
        st.task_id = ""
        key = (run.run_id, st.exe_id)
        if unknown:
            excluded = self.excluded.setdefault(key, set())
            excluded.add(stream.app_worker_id)
            if not any(
                s.serves(run.flow_type) and s.app_worker_id not in excluded
                for s in self.streams.values()
            ):
                # Every connected worker rejected the name: that costs an attempt.
                self.excluded.pop(key, None)
                message = f"no worker knows step {st.step_type!r} of flow {run.flow_type!r}"
                self.fail_attempt(
                    run,
                    st,
                    self.failure(
                        st,
                        backend_error=message,
                        reason=pb.DISPATCH_TASK_ERROR_REASON_UNKNOWN_NAME,
                    ),
                    message,
                )
                self.settle(run)
                return
        else:
            self.declined_until[stream.sid] = now() + NO_CAPACITY_BACKOFF
            self.loop.call_later(NO_CAPACITY_BACKOFF + 0.01, self.pump)
        self.ready[key] = None
        self.flush(run)
        self.pump()

    def _deliver(self, inflight: Inflight, tf: pb.PollWorkerTaskFrame, final: bool) -> None:
        out = tf.WhichOneof("output")
        if inflight.rpc is not None:
            call = inflight.rpc
            if call.future.done():
                return
            if out == "rpc":
                served = inflight.stream.app_worker_id if inflight.stream is not None else ""
                call.future.set_result((tf.rpc, served))
            elif out == "worker_error":
                call.future.set_exception(WorkerFailed(tf.worker_error))
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != inflight.task_id or not run.is_open:
            return
        from ._commit import commit_execute, commit_wait_for

        if out == "worker_error":
            we = tf.worker_error
            message = we.detail or "worker error"
            self.fail_attempt(
                run, st, self.failure(st, worker=we), message, retry_after=we.retry_after_seconds
            )
        else:
            output = tf.wait_for if out == "wait_for" else tf.execute
            which = output.WhichOneof("output")
            if which == "heartbeat":
                hb = output.heartbeat
                st.heartbeat = hb.value if hb.HasField("value") else None
                self.flush(run)
                return
            if which == "stream_write":
                from ._streams import write_step_stream

                write_step_stream(self, run, st, output.stream_write)
                return
            if which != "result":
                return
            st.task_id = ""
            if out == "wait_for" and st.phase == "wait_for":
                commit_wait_for(self, run, st, tf.wait_for.result)
            elif out == "execute" and st.phase == "execute":
                commit_execute(self, run, st, tf.execute.result)
        self.advance(run)
        self.flush(run)

    def shutdown_streams(self) -> None:
        """Ask every stream to drain and reconnect (engine shutdown)."""
        for stream in list(self.streams.values()):
            stream.out.put_nowait(
                pb.PollWorkerTaskResponse(
                    reconnect=pb.PollWorkerTaskReconnect(reason="engine shutting down")
                )
            )


#: Largest task frame sent to a worker: gRPC's default receive limit (4 MiB), which the SDK's
#: worker keeps, less room for framing. A real Dex server offloads large values to blobs (spec
#: section 3.5); this engine sends values inline, so a Step or RPC that loads more state than
#: this fails on its own instead of breaking the worker's task stream (and every task on it).
MAX_TASK_FRAME_BYTES = 4 * 1024 * 1024 - 16 * 1024


def task_too_large(frame: pb.PollWorkerTaskResponse) -> str:
    """Why ``frame`` cannot go to a worker, or ``""`` when it fits."""
    size = frame.ByteSize()
    if size <= MAX_TASK_FRAME_BYTES:
        return ""
    return (
        f"task too large for a worker message: its loaded state is {size} bytes, more than "
        f"{MAX_TASK_FRAME_BYTES} (gRPC's 4 MiB limit; the embedded engine does not offload "
        "large values to blobs)"
    )


def rpc_too_large(
    run: Run, rpc_name: str, request: pb.InvokeWorkerRPCRequest
) -> ServiceError | None:
    """The ``RESOURCE_EXHAUSTED`` error for an RPC task too large for a worker, or ``None``
    when it fits (``task_too_large``)."""
    detail = task_too_large(pb.PollWorkerTaskResponse(task=pb.PollWorkerTask(rpc=request)))
    if not detail:
        return None
    return uncategorized(
        grpc.StatusCode.RESOURCE_EXHAUSTED, f"rpc {rpc_name!r} of flow {run.flow_id!r}: {detail}"
    )


class WorkerFailed(Exception):
    """The worker answered an RPC task with a ``WorkerErrorResponse``."""

    def __init__(self, error: pb.WorkerErrorResponse) -> None:
        super().__init__(error.detail)
        self.error = error


class WorkerLost(Exception):
    """No worker ran an RPC task to the end (``reason`` is a DispatchTaskErrorReason)."""

    def __init__(self, reason: int) -> None:
        super().__init__("worker unavailable")
        self.reason = reason

