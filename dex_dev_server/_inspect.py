"""Read-only views of an engine database for the ``list`` and ``inspect`` commands."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from typing import Any

from dex.dexpb import dex_pb2 as pb
from google.protobuf import json_format

from ._model import Run


def _ts(value: float | None) -> str | None:
    return None if value is None else datetime.fromtimestamp(value, UTC).isoformat()


def _status(value: int) -> str:
    return pb.FlowStatus.Name(value).removeprefix("FLOW_STATUS_")


def _connect(db: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True)


def list_flows(db: str) -> list[dict[str, Any]]:
    """The latest run of every flow, newest first."""
    with _connect(db) as conn:
        rows = conn.execute(
            "SELECT flow_id, flow_type, status, run_id, start_ts, close_ts FROM runs r "
            "WHERE seq = (SELECT MAX(seq) FROM runs WHERE flow_id = r.flow_id) "
            "ORDER BY seq DESC"
        ).fetchall()
    return [
        {
            "flow_id": f,
            "flow_type": t,
            "status": _status(s),
            "run_id": r,
            "start_time": _ts(st),
            "close_time": _ts(ct),
        }
        for f, t, s, r, st, ct in rows
    ]


def _value(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "obj_value":
        if value.obj_value.encoding == "json":
            try:
                return json.loads(value.obj_value.payload)
            except ValueError:
                return None
        return f"<{len(value.obj_value.payload)} raw bytes>"
    if kind == "null_value" or kind is None:
        return None
    return getattr(value, kind)


def inspect_flow(db: str, flow_id: str) -> dict[str, Any] | None:
    """Runs, current steps, attributes, pending channel messages and history of a flow."""
    with _connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, flow_id, seq, flow_type, status, request_id, start_ts, close_ts, "
            "header, core FROM runs WHERE flow_id=? ORDER BY seq",
            (flow_id,),
        ).fetchall()
        if not rows:
            return None
        runs = [Run.from_row(r) for r in rows]
        latest = runs[-1]
        attrs = conn.execute(
            "SELECT key, value FROM attributes WHERE run_id=? ORDER BY key", (latest.run_id,)
        ).fetchall()
        chans = conn.execute(
            "SELECT channel, message_id, value FROM channel_messages WHERE run_id=? ORDER BY seq",
            (latest.run_id,),
        ).fetchall()
        hist = conn.execute(
            "SELECT event FROM history WHERE run_id=? ORDER BY event_id", (latest.run_id,)
        ).fetchall()

    def parse_value(data: bytes) -> Any:
        v = pb.Value()
        v.ParseFromString(data)
        return _value(v)

    history = []
    for (data,) in hist:
        ev = pb.FlowHistoryEvent()
        ev.ParseFromString(data)
        kind = ev.WhichOneof("payload") or ""
        payload = getattr(ev, kind) if kind else None
        ctx = getattr(payload, "context", None)
        history.append(
            {
                "event_id": ev.event_id,
                "time": ev.event_time.ToJsonString(),
                "type": kind,
                "step_execution_id": ctx.step_execution_id if ctx is not None else None,
                "final_attempt": ctx.final_attempt if ctx is not None else None,
                "payload": json_format.MessageToDict(payload) if payload is not None else None,
            }
        )
    return {
        "flow_id": flow_id,
        "flow_type": latest.flow_type,
        "runs": [
            {
                "run_id": r.run_id,
                "status": _status(r.status),
                "start_time": _ts(r.start_ts),
                "close_time": _ts(r.close_ts),
                "error": r.error_message or None,
                "results": [_value(o.completed_step_output) for o in r.results],
            }
            for r in runs
        ],
        "steps": [
            {
                "step_execution_id": s.exe_id,
                "phase": s.phase,
                "state": s.mstate,
                "attempt": s.attempt,
                "from": s.from_id,
                "timers": [
                    {"fire_at": _ts(t[0]), "status": int(t[1])} for t in s.timers
                ],
            }
            for s in latest.steps.values()
        ],
        "queued": [mv.step_type for mv, _ in latest.queue],
        "attributes": {k: parse_value(v) for k, v in attrs},
        "channels": [
            {"channel": c, "message_id": m, "value": parse_value(v)} for c, m, v in chans
        ],
        "history": history,
    }
