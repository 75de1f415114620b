"""How the engine tells a worker's half-close of its task stream from a dropped connection
(``dex_dev_server._worker_service.half_closed_by_worker``): a call reported cancelled a moment
after the end of its input was dropped, so its running task is not handed out again at the
same attempt (a single-attempt write would run twice)."""

from __future__ import annotations

import asyncio

from dex_dev_server._worker_service import half_closed_by_worker


class _Call:
    """The two questions the engine asks of a gRPC server call, answered on a schedule."""

    def __init__(self, cancelled_after: float | None) -> None:
        self._cancelled_at = (
            None if cancelled_after is None
            else asyncio.get_running_loop().time() + cancelled_after
        )

    def cancelled(self) -> bool:
        return (
            self._cancelled_at is not None
            and asyncio.get_running_loop().time() >= self._cancelled_at
        )

    def done(self) -> bool:
        return False


async def test_a_call_that_stays_live_was_half_closed_by_its_worker() -> None:
    assert await half_closed_by_worker(_Call(cancelled_after=None), grace=0.2)


async def test_a_call_cancelled_just_after_its_input_ended_was_dropped() -> None:
    assert not await half_closed_by_worker(_Call(cancelled_after=0.1), grace=0.5)


async def test_a_call_already_cancelled_was_dropped() -> None:
    assert not await half_closed_by_worker(_Call(cancelled_after=0), grace=0.5)
