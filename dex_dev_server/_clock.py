"""Time helpers: the engine's wall clock and its protobuf Timestamp / Duration forms."""

from __future__ import annotations

import time

from google.protobuf import duration_pb2, timestamp_pb2


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
