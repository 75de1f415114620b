"""``RunningModelCalls`` (``dex_agents._turn_cancel``): the in-process wake-up of a cancelled
turn's model call, including a call that starts after the cancel reached this process."""

from __future__ import annotations

import asyncio

import pytest

from dex_agents._turn_cancel import ModelCallCancelled, RunningModelCalls, unless_cancelled


async def test_a_running_call_is_woken_and_abandoned() -> None:
    calls = RunningModelCalls()
    with calls.running("flow-1", "turn-1") as cancelled:
        call = asyncio.ensure_future(asyncio.sleep(60, result="answer"))
        outcome = asyncio.ensure_future(unless_cancelled(call, cancelled))
        await asyncio.sleep(0)
        assert calls.signal("flow-1", "turn-1") is True
        assert isinstance(await asyncio.wait_for(outcome, 5), ModelCallCancelled)
        assert call.cancelled()


async def test_a_cancel_before_the_call_starts_wakes_it_at_once() -> None:
    # A retried attempt (after a Worker restart) reads the attributes of its first scheduling
    # and so misses the durable cancel: the process that accepted it remembers it.
    calls = RunningModelCalls()
    assert calls.signal("flow-1", "turn-1") is False
    with calls.running("flow-1", "turn-2") as other:
        assert not other.is_set()
    with calls.running("flow-1", "turn-1") as cancelled:
        assert cancelled.is_set()
    # Applied once: a later call of that turn is not woken by the same cancel again.
    with calls.running("flow-1", "turn-1") as again:
        assert not again.is_set()


async def test_remembered_cancels_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = RunningModelCalls()
    monkeypatch.setattr(RunningModelCalls, "REMEMBER_MAX", 3)
    for n in range(5):
        calls.signal("flow-1", f"turn-{n}")
    with calls.running("flow-1", "turn-0") as oldest:
        assert not oldest.is_set()
    with calls.running("flow-1", "turn-4") as newest:
        assert newest.is_set()
    monkeypatch.setattr(RunningModelCalls, "REMEMBER_SECONDS", 0.0)
    with calls.running("flow-1", "turn-3") as expired:
        assert not expired.is_set()
