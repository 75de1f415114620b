"""The one-command development stack behind ``python manage.py dev`` (and ``make run``).

Starts each part of the platform as its own supervised child process, in dependency order:

1. the embedded Dex engine (``python -m dex_dev_server``), unless ``DEX_SERVER_ADDRESS`` names
   another server;
2. the local demo model (``python -m agents_app.demo.model_server``);
3. the Dex workers (``python manage.py dexworker``, ``DEXAGENTS_WORKERS`` of them);
4. two Celery workers on the broker configured in settings (Redis when ``REDIS_URL`` is set,
   else kombu's filesystem transport, which needs no server): one on the default queue
   (outbox deliveries, housekeeping) and one on the ``discovery`` queue (MCP tool discovery,
   which may wait on a hanging server for its whole start-up timeout);
5. Celery beat, which queues the periodic tasks (MCP tool discovery, the outbox sweep);
6. the ASGI web servers (uvicorn serving ``dexagents_site.asgi``, ``DEXAGENTS_WEB_PROCESSES`` of
   them, all accepting on one listening socket that the supervisor opens and keeps).

A child counts as started once it prints its ready line. A child that exits while the stack runs
is restarted with a capped backoff. SIGINT or SIGTERM stops every child (SIGTERM to its process
group, then SIGKILL after a grace period) in reverse order. Each child also asks the kernel for
SIGTERM when the supervisor dies (``PR_SET_PDEATHSIG``), so even a SIGKILLed supervisor leaves
no orphans behind on Linux.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

_PR_SET_PDEATHSIG = 1
_STOP_GRACE_SECONDS = 10.0
_MAX_RESTART_DELAY_SECONDS = 10.0


def _die_with_parent() -> None:
    """Ask the kernel to send SIGTERM to this child when its parent exits (Linux only)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class ChildSpec:
    """One supervised process.

    Attributes:
        name: Short label used as the output prefix (at most 10 characters shown).
        argv: The command, run without a shell.
        ready_marker: Substring of an output line that says the child serves.
        ready_timeout: Seconds to wait for ``ready_marker`` before the start fails.
        env: Extra environment variables for the child.
        pass_fds: File descriptors the child inherits (the web processes' shared listening
            socket, which the supervisor keeps open across their restarts).
        start_with_next: Spawn the next child without waiting for this one's ready line
            (its readiness is still awaited before the stack counts as started). Children
            that need nothing from each other start side by side, so a stack of several
            workers and web processes starts in the time of its slowest child.
    """

    name: str
    argv: Sequence[str]
    ready_marker: str
    ready_timeout: float = 90.0
    env: dict[str, str] = field(default_factory=dict)
    pass_fds: tuple[int, ...] = ()
    start_with_next: bool = False


class StackStartError(RuntimeError):
    """A child exited or stayed silent before printing its ready line."""


class _Child:
    def __init__(self, spec: ChildSpec, out: TextIO) -> None:
        self.spec = spec
        self.out = out
        self.process: asyncio.subprocess.Process | None = None
        self.ready = asyncio.Event()
        self.started_at = 0.0
        self._reader: asyncio.Task[None] | None = None

    async def spawn(self, cwd: str) -> None:
        self.ready = asyncio.Event()
        env = {**os.environ, **self.spec.env, "PYTHONUNBUFFERED": "1"}
        self.process = await asyncio.create_subprocess_exec(
            *self.spec.argv,
            cwd=cwd,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
            pass_fds=self.spec.pass_fds,
        )
        self.started_at = time.monotonic()
        self._reader = asyncio.create_task(self._relay(self.process))

    async def _relay(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        prefix = f"{self.spec.name:>10} | "
        while True:
            raw = await process.stdout.readline()
            if not raw:
                return
            line = raw.decode(errors="replace").rstrip("\n")
            self.out.write(prefix + line + "\n")
            self.out.flush()
            if self.spec.ready_marker in line:
                self.ready.set()

    async def wait_ready(self) -> None:
        assert self.process is not None
        ready = asyncio.create_task(self.ready.wait())
        exited = asyncio.create_task(self.process.wait())
        done, pending = await asyncio.wait(
            {ready, exited},
            timeout=self.spec.ready_timeout,
            return_when=asyncio.FIRST_COMPLETED,
        )
        for task in pending:
            task.cancel()
        if ready in done:
            return
        if exited in done:
            raise StackStartError(
                f"{self.spec.name} exited with code {self.process.returncode} before it was ready"
            )
        raise StackStartError(
            f"{self.spec.name} printed no ready line within {self.spec.ready_timeout:.0f} s"
        )

    async def stop(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            await self._drain()
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), timeout=_STOP_GRACE_SECONDS)
        except TimeoutError:
            self.out.write(f"{self.spec.name:>10} | did not stop in time; killing it\n")
        # The group may hold grandchildren (MCP servers under the worker) even after the
        # leader exited, so the whole group is killed either way.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.wait()
        await self._drain()

    async def _drain(self) -> None:
        if self._reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait_for(self._reader, timeout=2)
            self._reader = None


class DevStack:
    """Start, supervise and stop a list of child processes.

    Args:
        specs: The children in start order; they are stopped in reverse order.
        cwd: Working directory of every child.
        out: Where child output (prefixed by its name) and supervisor notices go.
        on_ready: Called once, after every child printed its ready line.
    """

    def __init__(
        self,
        specs: Sequence[ChildSpec],
        *,
        cwd: str,
        out: TextIO = sys.stdout,
        on_ready: Callable[[], None] | None = None,
    ) -> None:
        self._children = [_Child(spec, out) for spec in specs]
        self._cwd = cwd
        self._out = out
        self._on_ready = on_ready
        self._stopping = asyncio.Event()

    def request_stop(self) -> None:
        """Ask :meth:`run` to stop every child and return; safe from a signal handler."""
        self._stopping.set()

    async def run(self) -> None:
        """Start every child, supervise until a stop is requested, then stop them all.

        Raises:
            StackStartError: A child failed to become ready; the others are stopped first.
        """
        try:
            starting: list[_Child] = []
            for child in self._children:
                if self._stopping.is_set():
                    return
                await child.spawn(self._cwd)
                starting.append(child)
                if not child.spec.start_with_next:
                    await asyncio.gather(*(started.wait_ready() for started in starting))
                    starting = []
            await asyncio.gather(*(started.wait_ready() for started in starting))
            if self._on_ready is not None:
                self._on_ready()
            await self._supervise()
        finally:
            for child in reversed(self._children):
                await child.stop()

    async def _supervise(self) -> None:
        restart_delays = {child.spec.name: 1.0 for child in self._children}
        stop_wait = asyncio.create_task(self._stopping.wait())
        # Children that died are restarted side by side: a web and a worker killed together
        # each come back after their own backoff and start-up, not one after the other.
        restarting: dict[str, asyncio.Task[None]] = {}
        try:
            while not self._stopping.is_set():
                waits: dict[asyncio.Future[Any], _Child] = {
                    asyncio.create_task(child.process.wait()): child
                    for child in self._children
                    if child.process is not None and child.spec.name not in restarting
                }
                done, pending = await asyncio.wait(
                    {*waits, *restarting.values(), stop_wait},
                    return_when=asyncio.FIRST_COMPLETED,
                )
                for task in pending:
                    if task in waits:
                        task.cancel()
                for name, task in list(restarting.items()):
                    if task.done():
                        del restarting[name]
                        if not task.cancelled() and task.exception() is not None:
                            self._out.write(f"{name:>10} | restart failed: {task.exception()}\n")
                for finished in done:
                    child = waits.get(finished)
                    if child is None or self._stopping.is_set():
                        continue
                    restarting[child.spec.name] = asyncio.create_task(
                        self._restart(child, restart_delays)
                    )
        finally:
            stop_wait.cancel()
            for task in restarting.values():
                task.cancel()
            await asyncio.gather(*restarting.values(), return_exceptions=True)

    async def _restart(self, child: _Child, delays: dict[str, float]) -> None:
        assert child.process is not None
        name = child.spec.name
        # A child that stayed up for a while earns a fresh, short backoff.
        if time.monotonic() - child.started_at > 60:
            delays[name] = 1.0
        delay = delays[name]
        self._out.write(
            f"{name:>10} | exited with code {child.process.returncode}; "
            f"restarting in {delay:.0f} s\n"
        )
        await child.stop()
        delays[name] = min(delay * 2, _MAX_RESTART_DELAY_SECONDS)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), timeout=delay)
        if self._stopping.is_set():
            return
        await child.spawn(self._cwd)
        try:
            await child.wait_ready()
        except StackStartError as error:
            self._out.write(f"{name:>10} | {error}\n")
