"""The long session of ``bench.engine --long-session`` (``bench/long_session.py``) on the real
engine and a real Worker child: ``seed_messages`` stores messages the platform's snapshot read
returns, in blobs exactly when the engine's threshold says so."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from dex import DexServiceError

from bench.long_session import SeedBatch, build_flow, seeded_message
from dex_agents.testing import AgentTestStack
from dex_dev_server._blobs import DEFAULT_BLOB_THRESHOLD

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]


def _blob_count(database: Path) -> int:
    with sqlite3.connect(database) as connection:
        (count,) = connection.execute("SELECT COUNT(*) FROM blobs").fetchone()
    return int(count)


@pytest.mark.parametrize(
    ("threshold", "stored_as_blobs"), [(DEFAULT_BLOB_THRESHOLD, True), (64 * 1024, False)]
)
async def test_seeded_messages_read_back_through_the_platforms_snapshot_path(
    tmp_path: Path, threshold: int, stored_as_blobs: bool
) -> None:
    flow = build_flow()
    async with AgentTestStack(
        tmp_path, [flow], "bench.long_session", worker_cwd=REPOSITORY_ROOT,
        engine_args=["--blob-threshold", str(threshold)],
    ) as stack:
        await stack.start_worker()
        sessions = stack.sessions(flow)
        await sessions.start_session("long")
        blobs_before = _blob_count(tmp_path / "dex.sqlite3")
        for first in (1, 151):
            stored = await stack.client.invoke_rpc(
                flow.seed_messages, "long", SeedBatch(first, 150, 1000)
            )
            assert stored == first + 149
        snapshot = await sessions.get_agent_snapshot("long")
        # The newest 200 of 300, each as stored, and the state counts all of them.
        assert [message.sequence for message in snapshot.messages] == list(range(101, 301))
        assert snapshot.messages[-1] == seeded_message(300, 1000)
        assert snapshot.state is not None and snapshot.state.message_count == 300
        # Every message is unique, so at the default (1024) each is a blob of its own; at
        # 64 KiB none is.
        added = _blob_count(tmp_path / "dex.sqlite3") - blobs_before
        assert added == (300 if stored_as_blobs else 0)


async def test_a_batch_that_does_not_follow_the_stored_messages_is_refused(
    tmp_path: Path,
) -> None:
    flow = build_flow()
    async with AgentTestStack(
        tmp_path, [flow], "bench.long_session", worker_cwd=REPOSITORY_ROOT
    ) as stack:
        await stack.start_worker()
        await stack.sessions(flow).start_session("long")
        await stack.client.invoke_rpc(flow.seed_messages, "long", SeedBatch(1, 10, 100))
        with pytest.raises(DexServiceError, match="next sequence is 11, not 5"):
            await stack.client.invoke_rpc(flow.seed_messages, "long", SeedBatch(5, 10, 100))
        snapshot = await stack.sessions(flow).get_agent_snapshot("long")
        assert [message.sequence for message in snapshot.messages] == list(range(1, 11))


def test_seeded_messages_are_unique_and_as_long_as_asked() -> None:
    messages = [seeded_message(sequence, 1000) for sequence in range(1, 7)]
    assert {len(message.text) for message in messages} == {1000}
    assert len({message.text for message in messages}) == 6
    assert [str(message.role) for message in messages[:3]] == ["user", "assistant", "tool"]


@pytest.mark.parametrize(("threshold", "readable"), [(65536, False), (16384, True), (1024, True)])
async def test_a_snapshot_of_200_large_messages_reads_only_under_a_low_enough_threshold(
    tmp_path: Path, threshold: int, readable: bool
) -> None:
    # 200 messages of 15,000 characters (about 30 KB stored each, as a long tool result is):
    # inline, the snapshot page's 200 instances pass one gRPC message; as blobs they do not.
    flow = build_flow()
    async with AgentTestStack(
        tmp_path, [flow], "bench.long_session", worker_cwd=REPOSITORY_ROOT,
        engine_args=["--blob-threshold", str(threshold)],
    ) as stack:
        await stack.start_worker()
        sessions = stack.sessions(flow)
        await sessions.start_session("long")
        for first in range(1, 201, 25):
            await stack.client.invoke_rpc(
                flow.seed_messages, "long", SeedBatch(first, 25, 15_000)
            )
        if not readable:
            with pytest.raises(DexServiceError, match="task too large"):
                await sessions.get_agent_snapshot("long")
            return
        snapshot = await sessions.get_agent_snapshot("long")
        # The newest that fit the snapshot's 1 MiB budget.
        assert snapshot.messages[-1] == seeded_message(200, 15_000)
        assert 20 < len(snapshot.messages) < 200
