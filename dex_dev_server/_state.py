"""In-memory engine state shared by every layer: runs, worker streams, in-flight tasks.

:class:`EngineState` holds the runs and their primitive mutations (attributes, channels,
history, locks, schedules, the commit to SQLite). The Step lifecycle (``_steps``), the
dispatcher (``_dispatch``) and the service handlers build on it in that order, so imports
run one way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dex.dexpb import dex_pb2 as pb

from ._blobs import CONCRETE_KIND, DEFAULT_BLOB_THRESHOLD, RecentBlobs, blob_id_of, blob_reference
from ._clock import now, timestamp
from ._model import ChannelEntry, Run, has_kind, null_value, uuid7
from ._push import PushClient
from ._store import RunWrite, Store, StreamAppend

_LOG = logging.getLogger("dex_dev_server")

#: Longest a Step's Stream write waits for a commit to take it along (seconds).
STREAM_FLUSH_SECONDS = 0.005
DEFAULT_METHOD_TIMEOUT = 7200
DEFAULT_TOTAL_RETRY = 4 * 3600
#: Seconds a pull stream that declined a task (``NO_CAPACITY``) is passed over (spec section
#: 1.4's "short back-off"); ``python -m dex_dev_server --decline-backoff`` changes it.
NO_CAPACITY_BACKOFF = 0.2
#: Seconds the engine waits at most, after a pull stream's input ended with a task unanswered
#: on it, to learn whether the worker half-closed the stream or its connection dropped
#: (``WorkerTaskService._half_closed_by_worker``); usually a few milliseconds.
HALF_CLOSE_PROBE_TIMEOUT = 5.0
USER_CLOSED = (
    pb.FLOW_STATUS_COMPLETED,
    pb.FLOW_STATUS_FAILED,
    pb.FLOW_STATUS_CANCELED,
    pb.FLOW_STATUS_TERMINATED,
    pb.FLOW_STATUS_CONTINUED_AS_NEW,
)


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
    #: Tasks sent on this stream so far.
    served: int = 0

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
    """All runs, indexed by flow ID, plus the dispatcher's worker streams and tasks."""

    def __init__(self, store: Store) -> None:
        self.store = store
        #: See :data:`NO_CAPACITY_BACKOFF`.
        self.decline_backoff = NO_CAPACITY_BACKOFF
        #: See :data:`HALF_CLOSE_PROBE_TIMEOUT`.
        self.half_close_probe_timeout = HALF_CLOSE_PROBE_TIMEOUT
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
        # other idle streams can take the task at once. A stream that declined a Step may
        # still take RPCs (the SDK declines Steps to keep a slot for them); one that declined
        # an RPC takes neither.
        self.declined_until: dict[int, float] = {}
        self.rpc_declined_until: dict[int, float] = {}
        self.excluded: dict[tuple[str, str], set[str]] = {}
        #: Runs changed by a Step result or a dispatch, committed once at the end of the
        #: dispatcher's ``pump`` (before the event loop sends any task it queued).
        self.unflushed: dict[str, Run] = {}
        self.notifier = Notifier()
        self.index_types: dict[str, int] = {}
        #: Step Stream writes waiting for the next commit (``queue_stream_append``).
        self.pending_streams: list[StreamAppend] = []
        self._streams_flush: asyncio.TimerHandle | None = None
        # While replaying history for time travel, recorded message IDs are kept.
        self.replaying = False
        self._handles: dict[Any, asyncio.TimerHandle] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self.push = PushClient()
        #: Serialized size (bytes) above which string and object values go to blobs
        #: (``_blobs``); 0 keeps every value inline.
        self.blob_threshold = DEFAULT_BLOB_THRESHOLD
        self.recent_blobs = RecentBlobs()
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
        """Persist the run's pending changes and the queued Stream writes (one SQLite
        transaction) and wake long polls."""
        write = run.write
        run.write = RunWrite()
        header = run.header_json()
        stored = (run.run_id, header)
        if run.stored_header == stored:
            write.run_update = run.update_row()
        else:
            write.run_row = run.row(header)
        refs = self.row_refs(run, write)
        streams = self.take_stream_appends()
        self.store.commit(run.run_id, write, streams)
        run.stored_header = stored
        run.stored_refs = refs
        self.notify_streams(streams)
        self.notifier.notify(("flow", run.flow_id))
        if (
            run.is_open
            and run.can_threshold > 0
            and not self.replaying
            and run.next_event_id - 2 >= run.can_threshold
        ):
            self.continue_as_new(run)

    @staticmethod
    def row_refs(run: Run, write: RunWrite) -> frozenset[str]:
        """The blob ids ``run``'s row will reference once ``write`` commits; the difference
        from the stored ones goes into ``write`` (assign the result to ``run.stored_refs``
        after the commit)."""
        refs = run.blob_ids()
        if refs != run.stored_refs:
            write.row_refs_added = refs - run.stored_refs
            write.row_refs_dropped = run.stored_refs - refs
        return refs

    def queue_stream_append(self, item: StreamAppend) -> None:
        """Store a Step's Stream write with the next commit, or on its own within
        :data:`STREAM_FLUSH_SECONDS`.

        Step Stream writes are best effort (spec section 2.7) and no one waits for them, so
        they need no transaction each: a turn writes about 15 of them, each was a commit, and
        with ``--sync full`` an fsync (issue 13). They stay in their order, and a Step's result
        commit holds every write the Step made before it.
        """
        self.pending_streams.append(item)
        if self._streams_flush is None:
            self._streams_flush = self.loop.call_later(STREAM_FLUSH_SECONDS, self.flush_streams)

    def take_stream_appends(self) -> list[StreamAppend]:
        """The queued Stream writes, now the caller's to commit (cancels the timed flush)."""
        if self._streams_flush is not None:
            self._streams_flush.cancel()
            self._streams_flush = None
        taken, self.pending_streams = self.pending_streams, []
        return taken

    def flush_streams(self) -> None:
        """Commit the queued Stream writes on their own (best effort: a failure is logged)."""
        streams = self.take_stream_appends()
        if not streams:
            return
        try:
            self.store.append_streams(streams)
        except Exception as exc:
            _LOG.warning("%d step stream writes dropped: %s", len(streams), exc)
            return
        self.notify_streams(streams)

    def notify_streams(self, streams: list[StreamAppend]) -> None:
        """Wake the long polls of each Stream instance that got a message."""
        for key in {("stream", s.flow_type, s.stream, s.flow_id) for s in streams}:
            self.notifier.notify(key)

    def continue_as_new(self, live: Run) -> None:
        """Carry a run's state into a new run (see :class:`~dex_dev_server._runs.RunEngine`)."""

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

    # Blobs -------------------------------------------------------------------------------

    def offload(self, run: Run, value: pb.Value) -> pb.Value:
        """``value``, or a reference to the blob that now holds it when it is over the blob
        threshold (stored with the run's next commit; ``_blobs``)."""
        found = blob_reference(value, self.blob_threshold)
        if found is None:
            return value
        reference, blob_id, data = found
        run.write.blob_inserts[blob_id] = data
        self.recent_blobs.put(blob_id, data)
        return reference

    def carry_blob(self, source: Run, target: Run, value: pb.Value) -> None:
        """Store the blob ``value`` references with ``target``'s next commit as well, when it
        is still waiting for ``source``'s (a reference copied from one run to another)."""
        found = blob_id_of(value)
        if found is None:
            return
        data = source.write.blob_inserts.get(found[1])
        if data is not None:
            target.write.blob_inserts[found[1]] = data

    def load_blob(self, reference: pb.Value) -> pb.Value | None:
        """The concrete value a reference names, or None when the id is unknown or names a
        value of the other kind."""
        found = blob_id_of(reference)
        if found is None:
            return None
        kind, blob_id = found
        data = self.recent_blobs.get(blob_id)
        if data is None:
            for run in self.unflushed.values():
                data = run.write.blob_inserts.get(blob_id)
                if data is not None:
                    break
            else:
                data = self.store.load_blob(blob_id)
        if data is None:
            return None
        value = pb.Value.FromString(data)
        return value if value.WhichOneof("kind") == CONCRETE_KIND[kind] else None

    def set_attribute(self, run: Run, key: str, value: pb.Value, inline: bool = False) -> None:
        """Apply one attribute write (``null_value`` deletes); a large value is kept as a
        blob reference unless ``inline`` (``is_hard_delete_on_null`` writes)."""
        index = run._attribute_index
        if value.WhichOneof("kind") in (None, "null_value"):
            if run.attributes.pop(key, None) is not None and index is not None:
                index.discard(key)
            run.write.set_attribute(key, None)
        else:
            if not inline:
                value = self.offload(run, value)
            run.attributes[key] = value
            if index is not None:
                index.add(key)
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
        value = self.offload(run, value) if has_kind(value) else null_value()
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
            self.set_attribute(run, write.key, write.value, inline=write.is_hard_delete_on_null)
            self.index_attribute(run, write)
        return [
            self.publish(
                run, m.channel_name, m.value, m.message_id if self.replaying else ""
            )
            for m in publishes
        ]

    def attributes_for(self, run: Run, selectors: Iterable[str]) -> list[pb.KV]:
        """Singletons plus the selected AttributeMap instances (spec section 3.1): an exact
        ``<map>/<instance>`` key, or every instance under a selector ending in ``/``. Gathered
        through the run's ``AttributeIndex``, so the cost follows what is loaded, not how many
        instances the run holds; singletons first, then the selected instances, each map's in
        the order they were first written."""
        attributes = run.attributes
        index = run.attribute_index()
        out = [pb.KV(key=key, value=attributes[key]) for key in index.singletons]
        chosen: dict[str, None] = {}
        for selector in selectors:
            if selector.endswith("/"):
                chosen.update(dict.fromkeys(index.matching(selector)))
            elif "/" in selector and selector in attributes:
                chosen[selector] = None
        out.extend(pb.KV(key=key, value=attributes[key]) for key in chosen)
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
