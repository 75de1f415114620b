"""SQLite (WAL) persistence for runs, attributes, channel messages, history and Streams.

Every engine commit is one ``BEGIN IMMEDIATE`` transaction written before the effect is
acknowledged (spec section 3.6). The database is opened by exactly one engine process.

Blobs (``_blobs``) are stored, referenced (``blob_refs``, one row per holder of a reference)
and deleted once unreferenced in the same transaction as the references that need them.

Durability (``synchronous``, SQLite's "PRAGMA synchronous" in WAL mode):

- ``normal`` (the default): a commit is written to the WAL without an fsync; the WAL is synced
  at each checkpoint. A killed engine process (SIGKILL, a crash) loses nothing it acknowledged,
  because the written pages are in the operating system's cache. A power loss or a kernel
  crash can lose the last commits before the checkpoint (never corrupts the database).
- ``full``: every commit also fsyncs the WAL before it is acknowledged, so acknowledged state
  survives a power loss too, at the cost of one fsync per commit.

One module (past 600 lines) because ``Store`` is the engine's one writer: every table's
reads and writes share its connection, its lock and the one-transaction-per-commit rule, and
the schema, the commit path and the checkpointer read best side by side.
"""

from __future__ import annotations

import fcntl
import logging
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from ._blobs import blob_ids_in
from ._crash import crash_point

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    flow_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    flow_type TEXT NOT NULL,
    status INTEGER NOT NULL,
    request_id TEXT NOT NULL,
    start_ts REAL NOT NULL,
    close_ts REAL,
    header TEXT NOT NULL,
    core TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS runs_flow ON runs (flow_id, seq);
CREATE TABLE IF NOT EXISTS attributes (
    run_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (run_id, key)
);
CREATE TABLE IF NOT EXISTS channel_messages (
    run_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    channel TEXT NOT NULL,
    message_id TEXT NOT NULL,
    value BLOB NOT NULL,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS history (
    run_id TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    event BLOB NOT NULL,
    PRIMARY KEY (run_id, event_id)
);
CREATE TABLE IF NOT EXISTS stream_messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    flow_type TEXT NOT NULL,
    stream TEXT NOT NULL,
    flow_id TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    source TEXT NOT NULL,
    value BLOB NOT NULL,
    charged INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS stream_scope ON stream_messages (flow_type, stream, id);
CREATE INDEX IF NOT EXISTS stream_instance ON stream_messages (flow_type, stream, flow_id, id);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS blobs (blob_id TEXT PRIMARY KEY, value BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS blob_refs (
    run_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    blob_id TEXT NOT NULL,
    PRIMARY KEY (run_id, holder, blob_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS blob_refs_blob ON blob_refs (blob_id);
"""

#: ``blob_refs.holder`` of the references in a run's history events (kept for the run's life).
HOLDER_HISTORY = "h"
#: ``blob_refs.holder`` of the references in a run's ``runs`` row (``Run.blob_ids``).
HOLDER_RUN = "r"
#: ``blob_refs.holder`` prefix of an Attribute's reference (``a:<key>``).
HOLDER_ATTRIBUTE = "a:"
#: ``blob_refs.holder`` prefix of a pending channel message's reference (``c:<seq>``).
HOLDER_CHANNEL = "c:"
#: The ``meta`` key holding the rowid of the last history event the engine's start marked
#: (``Store.sweep_blobs``): history rows are immutable, so each start reads only newer ones.
_HISTORY_MARKED = "blob_refs_history_rowid"
#: A serialized reference ``Value`` is this long (tag, length, 40-character id): the only
#: Attribute or channel message values that can be references.
_REFERENCE_BYTES = 42


@dataclass
class RunWrite:
    """One run's pending changes, written atomically by :meth:`Store.commit`."""

    run_row: tuple[Any, ...] | None = None
    #: ``(status, close_ts, core, run_id)`` of a stored row whose other columns are unchanged
    #: (written instead of ``run_row``).
    run_update: tuple[Any, ...] | None = None
    attr_upserts: dict[str, bytes] = field(default_factory=dict)
    attr_deletes: set[str] = field(default_factory=set)
    channel_inserts: list[tuple[int, str, str, bytes]] = field(default_factory=list)
    channel_deletes: list[int] = field(default_factory=list)
    history: list[tuple[int, bytes]] = field(default_factory=list)
    channels_moved_from: str = ""
    #: Blobs first referenced by this write: ``{blob_id: serialized concrete Value}``,
    #: stored (once: ids are content hashes) in the same transaction as the references.
    blob_inserts: dict[str, bytes] = field(default_factory=dict)
    #: Blob ids the run's row references since this write and not before, and the reverse
    #: (``Run.blob_ids`` against ``Run.stored_refs``).
    row_refs_added: frozenset[str] = frozenset()
    row_refs_dropped: frozenset[str] = frozenset()

    def set_attribute(self, key: str, value: bytes | None) -> None:
        """Record an upsert (``value``) or a delete (``None``) of one attribute."""
        if value is None:
            self.attr_upserts.pop(key, None)
            self.attr_deletes.add(key)
        else:
            self.attr_deletes.discard(key)
            self.attr_upserts[key] = value


@dataclass(frozen=True)
class StreamAppend:
    """One Stream message to store: its scope ``(flow_type, stream)``, instance ``flow_id``,
    creation time in Unix milliseconds, source, serialized ``Value``, the bytes it is charged
    against the scope's budget, and that budget (``capacity``, bytes)."""

    flow_type: str
    stream: str
    flow_id: str
    created_ms: int
    source: str
    payload: bytes
    charged: int
    capacity: int


#: The accepted values of ``Store(synchronous=...)`` and the CLI's ``--sync``.
SYNC_MODES = ("normal", "full")


@dataclass
class CommitStats:
    """Transactions committed by one :class:`Store`, their wall time in seconds, the longest
    one, and how many took longer than :data:`SLOW_COMMIT_SECONDS`."""

    commits: int = 0
    seconds: float = 0.0
    longest: float = 0.0
    slow: int = 0


#: A commit slower than this counts in :attr:`CommitStats.slow` (the Step transition goal is
#: a p99 under 10 ms, issue 13).
SLOW_COMMIT_SECONDS = 0.005


_LOG = logging.getLogger("dex_dev_server")


def _prefix_end(prefix: str) -> str:
    """The smallest string after every string starting with ``prefix`` (a range bound)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)

#: Seconds between two checkpoints of the WAL into the database file.
CHECKPOINT_INTERVAL_SECONDS = 1.0


class _Checkpointer(threading.Thread):
    """Copies committed WAL pages into the database file from its own connection and thread.

    ``PRAGMA wal_checkpoint(PASSIVE)`` never waits for the engine's writer, and SQLite releases
    the GIL while it copies and syncs, so the event loop keeps committing meanwhile. The WAL
    restarts from its beginning once a checkpoint has copied all of it.
    """

    def __init__(self, path: str, synchronous: str) -> None:
        super().__init__(name="dex_dev_server-checkpointer", daemon=True)
        self.path = path
        self.synchronous = synchronous
        self._stopping = threading.Event()

    def run(self) -> None:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            db.execute(f"PRAGMA synchronous={self.synchronous.upper()}")
            while not self._stopping.wait(CHECKPOINT_INTERVAL_SECONDS):
                try:
                    db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except sqlite3.Error as exc:
                    _LOG.warning("WAL checkpoint failed (retried in %ss): %s",
                                 CHECKPOINT_INTERVAL_SECONDS, exc)
        finally:
            db.close()

    def stop(self) -> None:
        """Stop and wait for the thread (at most one checkpoint's time)."""
        self._stopping.set()
        self.join()


class Store:
    """Thin synchronous wrapper over one SQLite connection in WAL mode."""

    def __init__(self, path: str | Path, synchronous: str = "normal") -> None:
        """Open (creating if needed) the database at ``path``.

        Args:
            path: The SQLite file, or ``":memory:"``.
            synchronous: ``"normal"`` or ``"full"`` (see the module docstring).

        Raises:
            RuntimeError: if another engine process already uses this database.
            ValueError: if ``synchronous`` is not one of :data:`SYNC_MODES`.
        """
        if synchronous not in SYNC_MODES:
            raise ValueError(f"synchronous must be one of {', '.join(SYNC_MODES)}")
        self.path = str(path)
        self.synchronous = synchronous
        self.stats = CommitStats()
        #: Blobs deleted since the store was opened (at commits and by :meth:`sweep_blobs`).
        self.blobs_collected = 0
        #: Bytes charged per Stream scope ``(flow_type, stream)``, read from the table once.
        self.stream_totals: dict[tuple[str, str], int] = {}
        self._lock: IO[bytes] | None = None
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            # One engine per database: a second engine would dispatch the same Steps.
            lock = Path(self.path + ".lock").open("ab")  # noqa: SIM115 (held until close())
            try:
                fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                lock.close()
                raise RuntimeError(f"database {self.path} is in use by another engine") from exc
            self._lock = lock
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(f"PRAGMA synchronous={synchronous.upper()}")
        self.db.execute("PRAGMA busy_timeout=5000")
        self.db.executescript(_SCHEMA)
        self._checkpointer: _Checkpointer | None = None
        if self.path != ":memory:":
            # A commit that crosses SQLite's automatic checkpoint threshold would copy the WAL
            # into the database and fsync both on the event loop: tens of milliseconds, a
            # Step transition's whole tail. A thread does it instead (issue 13).
            self.db.execute("PRAGMA wal_autocheckpoint=0")
            self._checkpointer = _Checkpointer(self.path, synchronous)
            self._checkpointer.start()

    def close(self) -> None:
        """Close the connection (checkpointing the WAL) and release the database lock."""
        if self._checkpointer is not None:
            self._checkpointer.stop()
            self._checkpointer = None
        self.db.close()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    @contextmanager
    def transaction(self, timed: bool = True) -> Iterator[sqlite3.Connection]:
        """Run a block inside ``BEGIN IMMEDIATE`` … ``COMMIT`` (rollback on error); counted
        in :attr:`stats` unless not ``timed`` (the engine's own start-up work)."""
        started = time.perf_counter()
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        if not timed:
            return
        took = time.perf_counter() - started
        stats = self.stats
        stats.commits += 1
        stats.seconds += took
        if took > stats.longest:
            stats.longest = took
        if took > SLOW_COMMIT_SECONDS:
            stats.slow += 1

    def commit(
        self, run_id: str, write: RunWrite, streams: Sequence[StreamAppend] = ()
    ) -> None:
        """Write one run's changes, and ``streams`` first, in a single transaction (which
        also deletes the blobs the write left unreferenced)."""
        released: set[str] = set()
        with self.transaction() as db:
            totals = self._append_streams(db, streams)
            self._apply(db, run_id, write, released)
            stored = self._collect(db, released, bool(write.blob_inserts))
        self.stream_totals.update(totals)
        if stored:
            crash_point("blob-committed")

    def append_streams(self, streams: Sequence[StreamAppend]) -> list[int]:
        """Store Stream messages in one transaction, trimming each scope's oldest messages to
        its budget; returns their sequence numbers, in order."""
        ids: list[int] = []
        with self.transaction() as db:
            totals = self._append_streams(db, streams, ids)
        self.stream_totals.update(totals)
        return ids

    def _append_streams(
        self,
        db: sqlite3.Connection,
        streams: Sequence[StreamAppend],
        ids: list[int] | None = None,
    ) -> dict[tuple[str, str], int]:
        """Insert ``streams`` (appending their IDs to ``ids``); returns the scopes' new totals,
        for the caller to keep once the transaction committed."""
        totals: dict[tuple[str, str], int] = {}
        for item in streams:
            scope = (item.flow_type, item.stream)
            total = totals.get(scope, self.stream_totals.get(scope))
            if total is None:
                (total,) = db.execute(
                    "SELECT COALESCE(SUM(charged), 0) FROM stream_messages "
                    "WHERE flow_type=? AND stream=?",
                    scope,
                ).fetchone()
            if total + item.charged > item.capacity:
                excess = total + item.charged - item.capacity
                drop = []
                for row_id, size in db.execute(
                    "SELECT id, charged FROM stream_messages WHERE flow_type=? AND stream=? "
                    "ORDER BY id",
                    scope,
                ):
                    if excess <= 0:
                        break
                    drop.append((row_id,))
                    excess -= size
                    total -= size
                db.executemany("DELETE FROM stream_messages WHERE id=?", drop)
            cursor = db.execute(
                "INSERT INTO stream_messages (flow_type, stream, flow_id, created_ms, source, "
                "value, charged) VALUES (?,?,?,?,?,?,?)",
                (item.flow_type, item.stream, item.flow_id, item.created_ms, item.source,
                 item.payload, item.charged),
            )
            if ids is not None:
                ids.append(int(cursor.lastrowid or 0))
            totals[scope] = total + item.charged
        return totals

    def commit_many(self, writes: Iterable[tuple[str, RunWrite]]) -> None:
        """Write several runs' changes in a single transaction (see :meth:`commit`)."""
        released: set[str] = set()
        inserted = False
        with self.transaction() as db:
            for run_id, write in writes:
                self._apply(db, run_id, write, released)
                inserted = inserted or bool(write.blob_inserts)
            stored = self._collect(db, released, inserted)
        if stored:
            crash_point("blob-committed")

    def _collect(self, db: sqlite3.Connection, released: set[str], inserted: bool) -> bool:
        """Delete the blobs among ``released`` that no ``blob_refs`` row names any more, in
        the transaction that removed their last reference. Returns whether the transaction
        stored or deleted blobs (for the crash points)."""
        collected = 0
        for blob_id in released:
            collected += db.execute(
                "DELETE FROM blobs WHERE blob_id=? AND NOT EXISTS "
                "(SELECT 1 FROM blob_refs WHERE blob_id=?)",
                (blob_id, blob_id),
            ).rowcount
        self.blobs_collected += collected
        if inserted:
            crash_point("blob-write")
        if collected:
            crash_point("blob-collect")
        return inserted or collected > 0

    @staticmethod
    def _apply(db: sqlite3.Connection, run_id: str, write: RunWrite, released: set[str]) -> None:
        """Apply one run's write and its ``blob_refs`` rows; adds to ``released`` the blob
        ids that lost a reference (or were stored by it), for :meth:`_collect`."""
        if write.blob_inserts:
            db.executemany(
                "INSERT OR IGNORE INTO blobs (blob_id, value) VALUES (?,?)",
                list(write.blob_inserts.items()),
            )
            # A value the write replaced before its commit (an Attribute written twice)
            # leaves its blob unreferenced: collected with the rest.
            released.update(write.blob_inserts)
        refs: list[tuple[str, str, str]] = []
        if write.row_refs_dropped:
            db.executemany(
                "DELETE FROM blob_refs WHERE run_id=? AND holder=? AND blob_id=?",
                [(run_id, HOLDER_RUN, blob_id) for blob_id in write.row_refs_dropped],
            )
            released.update(write.row_refs_dropped)
        refs.extend((run_id, HOLDER_RUN, blob_id) for blob_id in write.row_refs_added)
        if write.run_row is not None:
            db.execute(
                "INSERT OR REPLACE INTO runs (run_id, flow_id, seq, flow_type, status, "
                "request_id, start_ts, close_ts, header, core) VALUES (?,?,?,?,?,?,?,?,?,?)",
                write.run_row,
            )
        elif write.run_update is not None:
            db.execute("UPDATE runs SET status=?, close_ts=?, core=? WHERE run_id=?",
                       write.run_update)
        if write.attr_upserts:
            db.executemany(
                "INSERT OR REPLACE INTO attributes (run_id, key, value) VALUES (?,?,?)",
                [(run_id, k, v) for k, v in write.attr_upserts.items()],
            )
        if write.attr_deletes:
            db.executemany(
                "DELETE FROM attributes WHERE run_id=? AND key=?",
                [(run_id, k) for k in write.attr_deletes],
            )
        for key in (*write.attr_upserts, *write.attr_deletes):
            # The value this write overwrote or deleted, if it was a reference.
            released.update(row[0] for row in db.execute(
                "DELETE FROM blob_refs WHERE run_id=? AND holder=? RETURNING blob_id",
                (run_id, HOLDER_ATTRIBUTE + key),
            ))
        for key, value in write.attr_upserts.items():
            if len(value) == _REFERENCE_BYTES:
                refs.extend((run_id, HOLDER_ATTRIBUTE + key, blob_id)
                            for blob_id in blob_ids_in(value))
        if write.channels_moved_from:
            db.execute(
                "UPDATE channel_messages SET run_id=? WHERE run_id=?",
                (run_id, write.channels_moved_from),
            )
            db.execute(
                "UPDATE blob_refs SET run_id=? WHERE run_id=? AND holder>=? AND holder<?",
                (run_id, write.channels_moved_from, HOLDER_CHANNEL, _prefix_end(HOLDER_CHANNEL)),
            )
        # A message published and consumed by the same commit (a wait that was already
        # satisfied) must never be stored, or a restart would deliver it again.
        consumed = set(write.channel_deletes)
        if consumed:
            db.executemany(
                "DELETE FROM channel_messages WHERE run_id=? AND seq=?",
                [(run_id, s) for s in consumed],
            )
            for seq in consumed:
                released.update(row[0] for row in db.execute(
                    "DELETE FROM blob_refs WHERE run_id=? AND holder=? RETURNING blob_id",
                    (run_id, f"{HOLDER_CHANNEL}{seq}"),
                ))
        inserts = [row for row in write.channel_inserts if row[0] not in consumed]
        if inserts:
            db.executemany(
                "INSERT INTO channel_messages (run_id, seq, channel, message_id, value) "
                "VALUES (?,?,?,?,?)",
                [(run_id, *row) for row in inserts],
            )
            for seq, _, _, value in inserts:
                if len(value) == _REFERENCE_BYTES:
                    refs.extend((run_id, f"{HOLDER_CHANNEL}{seq}", blob_id)
                                for blob_id in blob_ids_in(value))
        if write.history:
            db.executemany(
                "INSERT INTO history (run_id, event_id, event) VALUES (?,?,?)",
                [(run_id, eid, ev) for eid, ev in write.history],
            )
            for _, event in write.history:
                refs.extend((run_id, HOLDER_HISTORY, blob_id) for blob_id in blob_ids_in(event))
        if refs:
            db.executemany(
                "INSERT OR IGNORE INTO blob_refs (run_id, holder, blob_id) VALUES (?,?,?)", refs
            )

    # Blob collection at start ----------------------------------------------------------

    def sweep_blobs(self, row_refs: dict[str, frozenset[str]]) -> int:
        """Mark every blob the database references, then delete every other one; returns
        how many were deleted. Called once at the engine's start, in one transaction.

        The mark rebuilds ``blob_refs`` from the rows themselves, not from what commits
        recorded: the Attribute and channel message holders from their tables (only values
        of a reference's length are read), the run-row holders from ``row_refs``
        (``{run_id: Run.blob_ids()}`` of every stored run), and the history holders from
        the events stored since the previous start's mark (history rows are never changed
        or deleted, so older ones were marked then; a database that was never marked has
        all of its history read once). So a reference that a commit did not index (a bug,
        an older engine that wrote the database meanwhile) keeps its blob, and a blob
        nothing references goes, whatever wrote it.
        """
        with self.transaction(timed=False) as db:
            row = db.execute("SELECT value FROM meta WHERE key=?", (_HISTORY_MARKED,)).fetchone()
            marked = int(row[0]) if row is not None else 0
            if row is None:
                db.execute("DELETE FROM blob_refs")
            else:
                db.execute("DELETE FROM blob_refs WHERE holder<>?", (HOLDER_HISTORY,))
            refs: list[tuple[str, str, str]] = []
            for run_id, key, value in db.execute(
                "SELECT run_id, key, value FROM attributes WHERE length(value)=?",
                (_REFERENCE_BYTES,),
            ):
                refs.extend((run_id, HOLDER_ATTRIBUTE + key, b) for b in blob_ids_in(value))
            for run_id, seq, value in db.execute(
                "SELECT run_id, seq, value FROM channel_messages WHERE length(value)=?",
                (_REFERENCE_BYTES,),
            ):
                refs.extend((run_id, f"{HOLDER_CHANNEL}{seq}", b) for b in blob_ids_in(value))
            refs.extend((run_id, HOLDER_RUN, blob_id)
                        for run_id, ids in row_refs.items() for blob_id in ids)
            for rowid, run_id, event in db.execute(
                "SELECT rowid, run_id, event FROM history WHERE rowid>? ORDER BY rowid",
                (marked,),
            ):
                refs.extend((run_id, HOLDER_HISTORY, b) for b in blob_ids_in(event))
                marked = rowid
            db.executemany(
                "INSERT OR IGNORE INTO blob_refs (run_id, holder, blob_id) VALUES (?,?,?)", refs
            )
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (_HISTORY_MARKED, str(marked)))
            swept = db.execute(
                "DELETE FROM blobs WHERE NOT EXISTS "
                "(SELECT 1 FROM blob_refs WHERE blob_refs.blob_id = blobs.blob_id)"
            ).rowcount
        self.blobs_collected += swept
        return int(swept)

    def delete_flow(self, flow_id: str, run_ids: Sequence[str]) -> int:
        """Delete everything stored for ``flow_id`` (its runs ``run_ids``): run rows,
        Attributes, channel messages, history, Stream messages and ``blob_refs``, and the
        blobs nothing else references, in one transaction (``FlowRetention.DeleteFlow``).

        Returns:
            The number of history events deleted.
        """
        released: set[str] = set()
        with self.transaction() as db:
            marks = ",".join("?" * len(run_ids))
            released.update(
                row[0]
                for row in db.execute(
                    f"SELECT blob_id FROM blob_refs WHERE run_id IN ({marks})", run_ids
                )
            )
            events = db.execute(
                f"DELETE FROM history WHERE run_id IN ({marks})", run_ids
            ).rowcount
            for table in ("blob_refs", "attributes", "channel_messages", "runs"):
                db.execute(f"DELETE FROM {table} WHERE run_id IN ({marks})", run_ids)
            scopes = db.execute(
                "SELECT DISTINCT flow_type, stream FROM stream_messages WHERE flow_id=?",
                (flow_id,),
            ).fetchall()
            db.execute("DELETE FROM stream_messages WHERE flow_id=?", (flow_id,))
            self._collect(db, released, False)
        for flow_type, stream in scopes:
            # Recounted from the table on the scope's next append.
            self.stream_totals.pop((flow_type, stream), None)
        return int(events)

    # Reads -------------------------------------------------------------------------------

    def load_runs(self) -> list[tuple[Any, ...]]:
        """All run rows ordered by creation."""
        return self.db.execute(
            "SELECT run_id, flow_id, seq, flow_type, status, request_id, start_ts, close_ts, "
            "header, core FROM runs ORDER BY seq"
        ).fetchall()

    def load_attributes(self) -> list[tuple[str, str, bytes]]:
        """``(run_id, key, value)`` for every stored attribute."""
        return self.db.execute("SELECT run_id, key, value FROM attributes").fetchall()

    def load_channel_messages(self) -> list[tuple[str, int, str, str, bytes]]:
        """``(run_id, seq, channel, message_id, value)`` in publication order."""
        return self.db.execute(
            "SELECT run_id, seq, channel, message_id, value FROM channel_messages "
            "ORDER BY run_id, seq"
        ).fetchall()

    def load_blob(self, blob_id: str) -> bytes | None:
        """The serialized concrete ``Value`` stored under ``blob_id``, or None."""
        row = self.db.execute("SELECT value FROM blobs WHERE blob_id=?", (blob_id,)).fetchone()
        return None if row is None else bytes(row[0])

    def history_page(self, run_id: str, start: int, limit: int) -> list[tuple[int, bytes]]:
        """History events of a run with ``event_id >= start``, ascending."""
        return self.db.execute(
            "SELECT event_id, event FROM history WHERE run_id=? AND event_id>=? "
            "ORDER BY event_id LIMIT ?",
            (run_id, start, limit),
        ).fetchall()
