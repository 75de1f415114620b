"""The SQLite store: what one commit writes is what a restarted engine loads."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from dex_dev_server._store import RunWrite, Store


def test_a_message_published_and_consumed_in_one_commit_is_never_stored(tmp_path: Path) -> None:
    store = Store(tmp_path / "engine.sqlite3")
    try:
        write = RunWrite(
            channel_inserts=[(1, "QUEUED_USER_MESSAGES", "m-1", b"hello"),
                             (2, "QUEUED_USER_MESSAGES", "m-2", b"later")],
            channel_deletes=[1],
        )
        store.commit("run-1", write)
        stored = [(seq, message_id) for _, seq, _, message_id, _ in store.load_channel_messages()]
        assert stored == [(2, "m-2")]

        store.commit("run-1", RunWrite(channel_deletes=[2]))
        assert store.load_channel_messages() == []
    finally:
        store.close()


def test_normal_commits_are_durable_as_they_return(tmp_path: Path) -> None:
    store = Store(tmp_path / "engine.sqlite3", synchronous="normal")
    try:
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert not store.group_commit
        store.commit("run-1", RunWrite(history=[(1, b"event")]))
        store.commit("run-1", RunWrite(history=[(2, b"event")]))
        assert store.stats.commits == 2
        assert store.stats.seconds > 0
        assert store.committed == store.synced == 2
    finally:
        store.close()


def test_full_commits_become_durable_through_one_grouped_fsync(tmp_path: Path) -> None:
    """At ``full`` the connection commits without syncing (``NORMAL``) and the syncer thread
    fsyncs the WAL when asked, once for every commit made before it started."""
    store = Store(tmp_path / "engine.sqlite3", synchronous="full")
    woken = threading.Event()
    store.on_synced = woken.set
    try:
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert store.group_commit
        for event_id in range(1, 4):
            store.commit("run-1", RunWrite(history=[(event_id, b"event")]))
        assert (store.committed, store.synced, store.stats.fsyncs) == (3, 0, 0)
        store.request_sync()
        assert woken.wait(30)
        assert store.synced == 3
        assert store.stats.fsyncs == 1
        store.request_sync()  # nothing new to sync: no fsync
        store.commit("run-1", RunWrite(history=[(4, b"event")]))
        store.sync()
        assert (store.committed, store.synced, store.stats.fsyncs) == (4, 4, 1)
    finally:
        store.close()


def test_an_unknown_sync_mode_is_refused_before_the_database_is_opened(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="normal, full"):
        Store(tmp_path / "engine.sqlite3", synchronous="off")
    assert not (tmp_path / "engine.sqlite3").exists()


def test_the_wal_is_checkpointed_by_the_background_thread_not_by_commits(tmp_path: Path) -> None:
    path = tmp_path / "engine.sqlite3"
    store = Store(path)
    try:
        assert store.db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
        before = path.stat().st_size
        for event_id in range(1, 51):
            store.commit("run-1", RunWrite(history=[(event_id, b"x" * 4000)]))
        # The commits went to the WAL only; the thread copies them into the database file.
        deadline = time.monotonic() + 10
        while path.stat().st_size < before + 50 * 4000:
            assert time.monotonic() < deadline, "no checkpoint within 10 s"
            time.sleep(0.05)
        assert [event_id for event_id, _ in store.history_page("run-1", 1, 100)] == list(
            range(1, 51)
        )
    finally:
        store.close()
