"""Abandoning a running model call when the user cancels the turn (platform addition).

``cancel_turn`` records the cancel durably (``TURN_CANCEL``) and, when the turn's model call is
running in this Worker process, ends it at once through ``RunningModelCalls``: the RPC runs on
the Worker's event loop, the RunModel Step awaits the runner and this registry's event
together, and on the event it cancels the runner's task and keeps the text it had streamed.

A Dex Step cannot read a value committed after it started, and a Step the engine cancels
(``RPCResult.with_canceling_steps``) has its writes discarded (Dex engine spec §2.10), so the
streamed text would be lost; the in-process signal lets the Step itself commit the partial
answer. A model call in another Worker process (or one restarted after a crash) sees the
durable ``TURN_CANCEL`` instead: at its start it makes no call; one that already runs in
another process finishes, and the turn ends at the next boundary (before a tool call or the
next model call).

A retried attempt reads the attributes of its first scheduling (Dex engine spec §2.7), so an
attempt that restarts the call after a Worker crash does not see a cancel committed after the
call was first scheduled. The process that accepted such a cancel remembers it
(``RunningModelCalls.signal`` when no call runs here) and a call of that turn that starts here
later is woken at once; a restart in another Worker process ends at the next boundary.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import TypeVar

from dex_agents._wire_types import resolve_annotations

T = TypeVar("T")


@dataclass(frozen=True)
class ModelCallCancelled:
    """What RunModel gets instead of an outcome when the user cancelled its call."""


class RunningModelCalls:
    """The model calls running in this process, keyed by ``(flow_id, turn_id)``.

    One per ``AgentSessionFlow``; only touched on the Worker's event loop (RPCs and Steps both
    run there), but ``signal`` hands the wake-up to the call's own loop in any case.
    """

    #: Seconds a cancel of a turn whose call does not run here is remembered for a retried
    #: attempt of that call (one started after a Worker restart) to find.
    REMEMBER_SECONDS = 3600.0
    #: Most remembered cancels; the oldest go first.
    REMEMBER_MAX = 10_000

    def __init__(self) -> None:
        self._calls: dict[tuple[str, str], tuple[asyncio.AbstractEventLoop, asyncio.Event]] = {}
        # (flow_id, turn_id) -> time.monotonic() of a cancel that found no call here.
        self._cancelled: dict[tuple[str, str], float] = {}

    @contextmanager
    def running(self, flow_id: str, turn_id: str) -> Iterator[asyncio.Event]:
        """Register the call for the duration of the block; yields the event ``signal`` sets,
        already set when a cancel of this turn reached this process before the call started."""
        event = asyncio.Event()
        key = (flow_id, turn_id)
        remembered = self._cancelled.pop(key, None)
        if remembered is not None and time.monotonic() - remembered < self.REMEMBER_SECONDS:
            event.set()
        self._calls[key] = (asyncio.get_running_loop(), event)
        try:
            yield event
        finally:
            if self._calls.get(key, (None, None))[1] is event:
                del self._calls[key]

    def signal(self, flow_id: str, turn_id: str) -> bool:
        """Wake the call of ``turn_id`` if it runs here; ``True`` when one was found. Otherwise
        remember the cancel for a call of that turn that starts here later (``running``)."""
        key = (flow_id, turn_id)
        found = self._calls.get(key)
        if found is None:
            self._cancelled.pop(key, None)
            self._cancelled[key] = time.monotonic()
            while len(self._cancelled) > self.REMEMBER_MAX:
                del self._cancelled[next(iter(self._cancelled))]
            return False
        loop, event = found
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:
            return False  # its loop is closed: the call is gone
        return True


async def unless_cancelled(call: Awaitable[T], cancelled: asyncio.Event) -> T | ModelCallCancelled:
    """Await ``call`` unless ``cancelled`` is set first; then cancel it and return
    ``ModelCallCancelled()``. Exceptions of ``call`` propagate as raised."""
    task = asyncio.ensure_future(call)
    waiter = asyncio.ensure_future(cancelled.wait())
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        task.cancel()  # the Step itself was cancelled or timed out
        raise
    finally:
        waiter.cancel()
        with suppress(asyncio.CancelledError):
            await waiter
    if task.done():
        return task.result()
    task.cancel()
    with suppress(asyncio.CancelledError, Exception):
        # The runner's own clean-up (closing the provider stream) runs before the Step commits.
        await task
    return ModelCallCancelled()


resolve_annotations(globals())
