"""The SQLite store: what one commit writes is what a restarted engine loads."""

from __future__ import annotations

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


@pytest.mark.parametrize(("mode", "pragma"), [("normal", 1), ("full", 2)])
def test_the_sync_mode_sets_the_synchronous_pragma(tmp_path: Path, mode: str, pragma: int) -> None:
    store = Store(tmp_path / "engine.sqlite3", synchronous=mode)
    try:
        assert store.db.execute("PRAGMA synchronous").fetchone()[0] == pragma
        assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        store.commit("run-1", RunWrite(history=[(1, b"event")]))
        store.commit("run-1", RunWrite(history=[(2, b"event")]))
        assert store.stats.commits == 2
        assert store.stats.seconds > 0
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
