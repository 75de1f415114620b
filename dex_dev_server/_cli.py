"""Command line: serve the engine, or inspect a database.

``python -m dex_dev_server [--host H] [--port P] [--db PATH] [--sync full|normal]
[--log-level L] [--profile PATH]`` serves and prints ``dex_dev_server ready on <host>:<port>``
once it accepts calls. ``--sync`` picks the store's durability (``normal``, the default, is
safe across a killed process but not across a power loss; ``full`` acknowledges a commit only
after an fsync of the WAL, grouped across concurrent commits; see
``docs/engine-durability.md``); ``--profile`` writes per-method timings on SIGUSR1
(``_profile``).
``python -m dex_dev_server list [--db PATH] [--table]`` and
``python -m dex_dev_server inspect FLOW_ID [--db PATH] [--table]`` print JSON (or a table)
read straight from the SQLite file; they work while the engine runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from ._blobs import DEFAULT_BLOB_THRESHOLD

DEFAULT_DB = "var/dex_dev_server.sqlite3"
#: The environment variable giving ``--blob-threshold``'s default (so a test run or
#: ``manage.py dev`` can set it for every engine it starts).
BLOB_THRESHOLD_ENV = "DEX_DEV_SERVER_BLOB_THRESHOLD"


_N = TypeVar("_N", int, float)


def _bounded(convert: Callable[[str], _N], low: _N, high: _N, unit: str) -> Callable[[str], _N]:
    """An argparse ``type`` reading ``convert(text)`` within ``[low, high]`` (NaN refused)."""

    def parse(text: str) -> _N:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be {unit}, not {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be {low} to {high}, not {text}")
        return value

    return parse


_port = _bounded(int, 0, 65535, "a port number")
_bytes = _bounded(int, 0, 1 << 30, "a number of bytes")
# Not 0: a stream that declined a task would be offered it again at once, in a loop.
_seconds = _bounded(float, 0.01, 3600.0, "a number of seconds")


def _serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dex_dev_server", description="Embedded Dex engine.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=_port, default=8801, help="0 picks a free port (default 8801)")
    p.add_argument("--db", default=DEFAULT_DB,
                   help=f"SQLite database path (default {DEFAULT_DB}, from the current directory)")
    p.add_argument("--sync", default="normal", choices=["normal", "full"],
                   help="SQLite synchronous mode: normal (default) survives a killed process, "
                        "full also a power loss (nothing is acknowledged before its fsync; "
                        "concurrent commits share one)")
    p.add_argument("--log-level", default="info",
                   choices=["debug", "info", "warning", "error", "critical"])
    p.add_argument("--profile", default=None, metavar="PATH",
                   help="write calls and time per gRPC method and worker frame, commits, GC "
                        "pauses, CPU and a recent trace as JSON to PATH on SIGUSR1 and at exit")
    p.add_argument("--decline-backoff", type=_seconds, default=None, metavar="SECONDS",
                   help="how long a pull stream that declined a task (NO_CAPACITY) is passed "
                        "over; the task goes to another idle stream at once (default 0.2)")
    p.add_argument("--blob-threshold", type=_bytes,
                   default=os.environ.get(BLOB_THRESHOLD_ENV) or None, metavar="BYTES",
                   help="string and object values whose serialized size passes BYTES are "
                        "stored once as blobs and sent as blob ids that workers and clients "
                        f"load with LoadBlobs; 0 keeps every value inline (default "
                        f"${BLOB_THRESHOLD_ENV}, else {DEFAULT_BLOB_THRESHOLD}; 1024 behaves "
                        "like the Dex server)")
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("list", "inspect"):
        return _inspect_main(args)
    ns = _serve_parser().parse_args(args)
    logging.basicConfig(
        level=getattr(logging, ns.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    from ._server import serve

    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(
                serve(ns.db, ns.host, ns.port, synchronous=ns.sync, profile_path=ns.profile,
                      decline_backoff=ns.decline_backoff, blob_threshold=ns.blob_threshold)
            )
    except RuntimeError as exc:
        print(f"dex_dev_server: {exc}", file=sys.stderr, flush=True)
        return 2
    return 0


def _ts(value: float | None) -> str | None:
    if value is None:
        return None
    return datetime.fromtimestamp(value, UTC).isoformat()


def _inspect_main(args: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m dex_dev_server")
    sub = p.add_subparsers(dest="cmd", required=True)
    lp = sub.add_parser("list", help="list flows (latest run of each)")
    lp.add_argument("--db", default=DEFAULT_DB)
    lp.add_argument("--table", action="store_true")
    ip = sub.add_parser("inspect", help="show one flow's runs, steps, attributes and history")
    ip.add_argument("flow_id")
    ip.add_argument("--db", default=DEFAULT_DB)
    ip.add_argument("--table", action="store_true")
    ns = p.parse_args(args)
    from ._inspect import inspect_flow, list_flows

    if ns.cmd == "list":
        rows = list_flows(ns.db)
        if ns.table:
            _print_table(rows, ["flow_id", "flow_type", "status", "run_id", "start_time"])
        else:
            print(json.dumps(rows, indent=2))
        return 0
    data = inspect_flow(ns.db, ns.flow_id)
    if data is None:
        print(json.dumps({"error": f"flow {ns.flow_id!r} not found"}))
        return 1
    if ns.table:
        _print_table(data["runs"], ["run_id", "status", "start_time", "close_time", "error"])
        print()
        _print_table(data["steps"], ["step_execution_id", "phase", "attempt", "from"])
        print()
        _print_table(data["history"], ["event_id", "type", "step_execution_id", "final_attempt"])
    else:
        print(json.dumps(data, indent=2))
    return 0


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "") if r.get(c) is not None else "").ljust(widths[c])
                        for c in columns))
