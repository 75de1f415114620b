"""Dex Streams: best-effort append-only logs per ``(flow_type, stream, flow_id)``.

Streams live outside run state and history; a scope ``(flow_type, stream)`` shares one byte
budget and is trimmed oldest-first to make room for a new message (spec section 3.3).
"""

from __future__ import annotations

import base64
import json
import logging

import grpc
from dex.dexpb import dex_pb2 as pb
from google.protobuf import timestamp_pb2

from ._clock import now
from ._errors import ServiceError, invalid, uncategorized
from ._model import Run, StepExec
from ._state import EngineState
from ._store import StreamAppend

_LOG = logging.getLogger("dex_dev_server")

MAX_MESSAGE_BYTES = 1024 * 1024
DEFAULT_CAPACITY = 64 * 1024 * 1024
_OVERHEAD = 64


def make_token(flow_type: str, stream: str, flow_id: str, seq: int) -> str:
    """An opaque resume token bound to one stream instance."""
    raw = json.dumps({"v": 1, "t": flow_type, "s": stream, "f": flow_id, "q": seq})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def parse_token(token: str, flow_type: str, stream: str, flow_id: str) -> int:
    """The sequence number in a token; ``INVALID_ARGUMENT`` if malformed or foreign."""
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        if (data["t"], data["s"], data["f"]) != (flow_type, stream, flow_id):
            raise invalid("resume token belongs to another stream")
        return int(data["q"])
    except ServiceError:
        raise
    except Exception as exc:
        raise invalid("malformed resume token") from exc


def prepare(
    flow_type: str,
    stream: str,
    flow_id: str,
    value: pb.Value,
    source: str,
    capacity: int,
) -> StreamAppend:
    """Check one message against the limits and the scope's budget (``capacity`` bytes, 0 for
    the default); returns what to store.

    Raises:
        ServiceError: ``RESOURCE_EXHAUSTED`` if the message alone exceeds 1 MiB or the budget.
    """
    payload = value.SerializeToString()
    charged = len(payload) + len(flow_id) + len(source) + _OVERHEAD
    capacity = capacity if capacity > 0 else DEFAULT_CAPACITY
    if len(payload) > MAX_MESSAGE_BYTES or charged > capacity:
        raise uncategorized(
            grpc.StatusCode.RESOURCE_EXHAUSTED, "stream message exceeds the stream capacity"
        )
    return StreamAppend(
        flow_type, stream, flow_id, int(now() * 1000), source, payload, charged, capacity
    )


def append(
    engine: EngineState,
    flow_type: str,
    stream: str,
    flow_id: str,
    value: pb.Value,
    source: str,
    capacity: int,
) -> int:
    """Append one message now (after any Step writes still queued, so the order holds),
    trimming the scope's oldest messages to fit; returns its seq.

    Raises:
        ServiceError: ``RESOURCE_EXHAUSTED`` (see :func:`prepare`).
    """
    item = prepare(flow_type, stream, flow_id, value, source, capacity)
    queued = engine.take_stream_appends()
    ids = engine.store.append_streams([*queued, item])
    engine.notify_streams([*queued, item])
    return ids[-1]


def to_message(
    flow_type: str, stream: str, flow_id: str, row: tuple[int, int, str, bytes]
) -> pb.StreamMessage:
    """A ``StreamMessage`` from a ``(id, created_ms, source, value)`` row."""
    seq, created_ms, source, payload = row
    value = pb.Value()
    value.ParseFromString(payload)
    created = timestamp_pb2.Timestamp()
    created.FromMilliseconds(created_ms)
    return pb.StreamMessage(
        value=value,
        resume_token=make_token(flow_type, stream, flow_id, seq),
        created_time=created,
        source=source,
    )


def read_after(
    engine: EngineState, flow_type: str, stream: str, flow_id: str, after: int
) -> pb.StreamMessage | None:
    """The first retained message with a sequence greater than ``after``."""
    row = engine.store.db.execute(
        "SELECT id, created_ms, source, value FROM stream_messages WHERE flow_type=? AND "
        "stream=? AND flow_id=? AND id>? ORDER BY id LIMIT 1",
        (flow_type, stream, flow_id, after),
    ).fetchone()
    return to_message(flow_type, stream, flow_id, row) if row else None


def list_before(
    engine: EngineState, flow_type: str, stream: str, flow_id: str, before: int, limit: int
) -> list[pb.StreamMessage]:
    """Up to ``limit`` messages older than ``before`` (0 = newest), newest first."""
    rows = engine.store.db.execute(
        "SELECT id, created_ms, source, value FROM stream_messages WHERE flow_type=? AND "
        "stream=? AND flow_id=? AND (?=0 OR id<?) ORDER BY id DESC LIMIT ?",
        (flow_type, stream, flow_id, before, before, limit),
    ).fetchall()
    return [to_message(flow_type, stream, flow_id, row) for row in rows]


def write_step_stream(
    engine: EngineState, run: Run, st: StepExec, write: pb.StepStreamWrite
) -> None:
    """Append a Step's ``stream_write`` output with source ``#<step_execution_id>``.

    Best effort: errors are logged and ignored, and the message stays even if the
    attempt later fails (spec section 2.7). The message is queued, not committed at once: the
    engine's next commit takes it (a Step's result comes after its writes, so its commit holds
    them), or a commit of its own a few milliseconds later (``EngineState.queue_stream_append``).
    """
    try:
        item = prepare(
            run.flow_type,
            write.stream_name,
            run.flow_id,
            write.value,
            f"#{st.exe_id}",
            write.stream_capacity_bytes,
        )
    except Exception as exc:
        _LOG.warning("step stream write dropped: %s", exc)
        return
    engine.queue_stream_append(item)
