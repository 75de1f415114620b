"""Blob storage of large values (spec section 3.5).

A string or object ``Value`` whose serialized size passes the engine's blob threshold is
stored once in the ``blobs`` table and replaced by a reference, ``Value{
internal_blob_id_for_string_value | internal_blob_id_for_obj_value: <blob id>}``, wherever
the engine keeps it for delivery to workers: Attributes (map instances included), Channel
messages, Step inputs, Step execution locals and completion outputs. Workers and clients
hydrate references with ``FlowService.LoadBlobs`` and keep the bytes in their BlobCache
(``dex-python-sdk``'s ``ValueHydrator``).

A blob id is a content hash (BLAKE2b, 160 bits, hex) of the serialized concrete ``Value``,
so the same content is stored once and an id never names other content: the SDK caches a
blob under ``(flow id, blob id)`` for good. The SDK hydrates a sub-flow's output under its
parent's flow ID, so ids resolve across Flows; an id only reveals content to a caller that
already has it.

Values stay inline where the spec or the SDK needs them concrete: Attributes written with
``is_hard_delete_on_null`` (delivered inline, never recorded), Stream messages (clients do
not hydrate ``ReadStream``), search fields, the Attribute writes of history events, and RPC
outputs (not stored). History events record Step inputs, locals, published messages and
completion outputs as the engine holds them, so a reader of ``GetHistoryEvents`` may see
references, which it loads with ``LoadBlobs`` as a worker would.

Collection. A blob is deleted when nothing stored references it, in the transaction that
removed the last reference (``Store.commit``). The ``blob_refs`` table names every holder of
a reference, written in the same transaction as the reference: an Attribute or map instance
(``a:<key>``), a pending channel message (``c:<seq>``), the run's history (``h``), and the
run's row (``r``: queued and running Steps' inputs, locals and condition results, sub-flow
results, collected outputs; ``Run.blob_ids``). History references are found in the event's
serialized bytes (``blob_ids_in``), so no field that holds a Value is missed. What that
collects in this engine, which keeps every run and its history for the Flow's life (it has no
Flow deletion and no retention):

- an Attribute's blob when the Attribute is overwritten or deleted, a map instance's when the
  instance is deleted (history records Attribute writes inline, not as references), unless
  another Attribute, message, run row or history event, of this Flow or another, still
  references the same content;
- the blob of a value replaced before its commit (an Attribute written twice by one result);
- the input or locals of a Step that ended (cancelled, or closed with its run) before a
  history event recorded them (its ``execute`` commit records the locals).

A consumed channel message keeps its blob: the event that published it (a Step's, an RPC's or
an external publish) references it. So do Step inputs, locals recorded at ``execute`` and
completion outputs, and the Attributes a continue-as-new event carried over.

Crash safety: references, their ``blob_refs`` rows, new blobs and deletions commit together,
so a SIGKILL at any point leaves no reference without its blob. The engine's start is a
mark-and-sweep (``Store.sweep_blobs``): it rebuilds ``blob_refs`` from the stored rows
(Attributes, messages, the runs it loads, and the history events stored since the previous
start: history rows never change) and deletes every blob it does not name, so no blob stays
that nothing references, and a reference a commit failed to index keeps its blob.

A worker or client may hold a reference whose blob was just collected (an Attribute
overwritten between a task's dispatch and its ``LoadBlobs``): the engine still answers it
while its recent-blob memory keeps it; otherwise the answer leaves it out: a worker's task
then goes out again, with the current values, without counting an attempt, and a client
reading through the SDK gets its "LoadBlobs omitted blob" error and reads again.

A value is stored only if one ``LoadBlobs`` answer can carry it (``MAX_VALUE_BYTES``): a
Step or RPC result holding a larger one is refused before anything of it is applied.
"""

from __future__ import annotations

import hashlib
import re
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from dex.dexpb import dex_pb2 as pb

#: ``Value`` kinds that reference a blob.
BLOB_KINDS = ("internal_blob_id_for_string_value", "internal_blob_id_for_obj_value")
#: The concrete kind each reference kind hydrates to.
CONCRETE_KIND = {
    "internal_blob_id_for_string_value": "string_value",
    "internal_blob_id_for_obj_value": "obj_value",
}
_REFERENCE_KIND = {concrete: reference for reference, concrete in CONCRETE_KIND.items()}

#: ``python -m dex_dev_server --blob-threshold``'s default, in bytes of a serialized Value:
#: larger string and object values go to blobs. 0 keeps every value inline. 1024, the Dex
#: server's, chosen by ``bench.turn`` and ``bench.engine --long-session`` against 16 KiB and
#: 64 KiB (docs/performance.md, "The blob threshold"): a task's inline part grows with the
#: values it loads, and at 64 KiB 200 messages of 30 KB already passed 4 MiB, failing every
#: snapshot read of the session; 1024 costs 6-10 % more CPU where every value is small.
DEFAULT_BLOB_THRESHOLD = 1024
#: Bytes of recently written blobs the engine keeps in memory for the ``LoadBlobs`` that
#: usually follows at once (the Worker that gets the Step).
RECENT_BLOB_BYTES = 32 * 1024 * 1024


#: Most bytes of values one ``LoadBlobs`` answer carries: gRPC's default receive limit
#: (4 MiB), which the SDK's channels keep, less room for framing. Values past it are left out
#: of the answer; the SDK caches the ones it got and fails the task, and the engine hands the
#: task out again without counting an attempt (``HYDRATION_SHORTFALL``), so each delivery
#: loads the next part.
LOAD_BLOBS_BUDGET = 4 * 1024 * 1024 - 64 * 1024
#: The start of the SDK's error when a ``LoadBlobs`` answer left a requested blob out.
HYDRATION_SHORTFALL = "LoadBlobs omitted blob"
#: Free redeliveries of one task after a hydration shortfall. What a task loads in parts is
#: bounded by its worker's BlobCache too (the parts loaded first must still be cached when the
#: last arrives: the dexworker keeps 64 MiB).
MAX_HYDRATION_REDELIVERIES = 64


#: Bytes counted for each value of a ``LoadBlobs`` answer besides the value: its map entry's
#: key (the 40-character id) and framing.
LOAD_BLOBS_ENTRY_OVERHEAD = 64
#: The largest serialized value the engine stores: one ``LoadBlobs`` answer must carry it
#: whole. A Step or RPC result holding a larger one is refused (``oversized_value``).
MAX_VALUE_BYTES = LOAD_BLOBS_BUDGET - LOAD_BLOBS_ENTRY_OVERHEAD


def is_hydration_shortfall(detail: str) -> bool:
    """Whether a worker's error says a ``LoadBlobs`` answer left blobs out (nothing ran):
    the SDK's hydrator raises it before any handler code, so its text starts the detail."""
    return detail.startswith(HYDRATION_SHORTFALL)


def result_values(result: Any) -> Iterator[pb.Value]:
    """The values a worker's wait_for, execute or RPC result asks the engine to store:
    Attribute writes (hard-delete ones included), published messages, Step locals, next Step
    inputs and the close input."""
    for write in result.upsert_attributes:
        yield write.value
    for message in result.publish_to_channel:
        yield message.value
    for kv in getattr(result, "upsert_step_exe_locals", ()):
        yield kv.value
    decision = getattr(result, "step_decision", None)
    if decision is not None:
        for movement in decision.next_steps:
            yield movement.step_input
        if decision.HasField("close_decision"):
            yield decision.close_decision.close_input


def oversized_value(result: Any) -> int:
    """The serialized size of the first value of ``result`` (``result_values``) larger than
    ``MAX_VALUE_BYTES``, or 0 (the common case is answered from the result's own size)."""
    if result.ByteSize() <= MAX_VALUE_BYTES:
        return 0
    for value in result_values(result):
        size = value.ByteSize()
        if size > MAX_VALUE_BYTES:
            return int(size)
    return 0


def oversized_detail(size: int) -> str:
    """Why a result holding a ``size``-byte value is refused."""
    return (
        f"a value of {size} bytes is more than the {MAX_VALUE_BYTES} bytes one value may take "
        "(a worker or client loads it in one message under gRPC's 4 MiB limit); store it in "
        "smaller parts"
    )


def blob_reference(value: pb.Value, threshold: int) -> tuple[pb.Value, str, bytes] | None:
    """``(reference, blob id, serialized value)`` when ``value`` belongs in a blob, else None.

    Only ``string_value`` and ``obj_value`` values whose serialized size is over
    ``threshold`` bytes (``threshold`` > 0) go to blobs.
    """
    if threshold <= 0:
        return None
    kind = value.WhichOneof("kind")
    reference_kind = _REFERENCE_KIND.get(kind or "")
    if reference_kind is None or value.ByteSize() <= threshold:
        return None
    data = value.SerializeToString(deterministic=True)
    blob_id = hashlib.blake2b(data, digest_size=20).hexdigest()
    reference = pb.Value()
    setattr(reference, reference_kind, blob_id)
    return reference, blob_id, data


#: A serialized reference: the tag of ``internal_blob_id_for_string_value`` (field 1) or
#: ``internal_blob_id_for_obj_value`` (field 2), the length 40, and the id. Protobuf embeds a
#: nested message's bytes verbatim, so these bytes appear inside any serialized message that
#: holds the reference, however deep.
_SERIALIZED_REFERENCES = (
    re.compile(rb"\n\(([0-9a-f]{40})"),
    re.compile(rb"\x12\(([0-9a-f]{40})"),
)


def blob_ids_in(data: bytes) -> set[str]:
    """Blob ids referenced anywhere in serialized protobuf ``data`` (a Value, a history event).

    Conservative: text that happens to hold a reference's bytes counts as one, which can only
    keep a blob longer, never drop one that is referenced. Linear in ``len(data)`` (about
    1 GB/s: each pattern starts with a literal).
    """
    found: set[str] = set()
    for pattern in _SERIALIZED_REFERENCES:
        found.update(match.decode("ascii") for match in pattern.findall(data))
    return found


def blob_id_of(value: pb.Value) -> tuple[str, str] | None:
    """``(reference kind, blob id)`` of a reference, or None for a concrete value."""
    kind = value.WhichOneof("kind")
    if kind not in BLOB_KINDS:
        return None
    return kind, getattr(value, kind)


class RecentBlobs:
    """The newest blobs by id, up to ``capacity`` bytes (least recently used go first)."""

    def __init__(self, capacity: int = RECENT_BLOB_BYTES) -> None:
        self.capacity = capacity
        self.size = 0
        self._items: OrderedDict[str, bytes] = OrderedDict()

    def put(self, blob_id: str, data: bytes) -> None:
        """Remember a blob (one larger than the capacity is not kept)."""
        if blob_id in self._items:
            self._items.move_to_end(blob_id)
            return
        if len(data) > self.capacity:
            return
        self._items[blob_id] = data
        self.size += len(data)
        while self.size > self.capacity:
            _, dropped = self._items.popitem(last=False)
            self.size -= len(dropped)

    def get(self, blob_id: str) -> bytes | None:
        """The blob's bytes if kept."""
        data = self._items.get(blob_id)
        if data is not None:
            self._items.move_to_end(blob_id)
        return data
