"""The SQLite store: what one commit writes is what a restarted engine loads."""

from __future__ import annotations

from pathlib import Path

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
