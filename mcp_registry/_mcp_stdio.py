"""stdio MCP servers as child processes: the guard, the environment, stderr and exit status.

Part of the Django-free MCP client (``mcp_registry.client`` is its public face). A stdio server
runs under a small guard process in a new process group (the guard stops the group when the
worker dies, even by SIGKILL, and reports the server's exit status); its stderr is read by a
thread, echoed to the worker's stderr, kept as a tail with secret values replaced, and its end
marks the server gone. :class:`McpProcessStatus` is what a pool reports of each process.
Imports ``mcp_registry._mcp_spec`` only.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal, TextIO

from mcp import StdioServerParameters

from mcp_registry._mcp_spec import (
    McpServerSpec,
    McpTransportError,
    secret_values,
    server_environment,
)

logger = logging.getLogger("mcp_registry.client")

# Runs as ``python -I -c _GUARD_SOURCE <worker pid> <command> [args...]`` in the server's new
# process group. It starts the server with the inherited stdin/stdout, drops its own copies of
# those pipes, and stops the group when the worker is gone, when it is asked to stop (SIGTERM),
# or once the server exits, so no member of the group outlives the connection. When the server
# exits it first writes a marker line with the exit status (negative: killed by that signal).
_GUARD_SOURCE = """
import os, signal, subprocess, sys, threading, time
worker = int(sys.argv[1])
stopping = threading.Event()
def escalate():
    try:
        os.killpg(0, signal.SIGTERM)
    except OSError:
        pass
    time.sleep(2.0)
    os.killpg(0, signal.SIGKILL)
def stop(*_):
    if not stopping.is_set():
        stopping.set()
        threading.Thread(target=escalate, daemon=True).start()
def watch_worker():
    while os.getppid() == worker:
        time.sleep(0.2)
    stop()
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, signal.SIG_IGN)
try:
    server = subprocess.Popen(sys.argv[2:])
except OSError as error:
    sys.stderr.write("cannot start MCP server %r: %s\\n" % (sys.argv[2], error))
    sys.exit(127)
sys.stderr.write("\\0dexagents-mcp-pids %d %d\\n" % (os.getpid(), server.pid))
sys.stderr.flush()
devnull = os.open(os.devnull, os.O_RDWR)
os.dup2(devnull, 0)
os.dup2(devnull, 1)
threading.Thread(target=watch_worker, daemon=True).start()
code = server.wait()
sys.stderr.write("\\0dexagents-mcp-exit %d\\n" % code)
sys.stderr.flush()
os.killpg(0, signal.SIGKILL)
"""


def stdio_parameters(spec: McpServerSpec) -> StdioServerParameters:
    if not spec.command:
        raise McpTransportError(f"MCP server {spec.name!r}: no command configured")
    if sys.platform == "win32":  # the guard relies on POSIX process groups
        return StdioServerParameters(
            command=spec.command, args=list(spec.args), env=server_environment(spec), cwd=spec.cwd
        )
    return StdioServerParameters(
        command=sys.executable,
        args=["-I", "-c", _GUARD_SOURCE, str(os.getpid()), spec.command, *spec.args],
        env=server_environment(spec),
        cwd=spec.cwd,
    )


def server_errlog() -> TextIO:
    """Where a stdio server's stderr lines are echoed: this process's stderr when it is a real
    file, else the original one (Celery replaces ``sys.stderr`` with a logging proxy)."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None:
                stream.fileno()
                return stream
        except (AttributeError, OSError, ValueError):
            continue
    return _devnull()


@functools.cache
def _devnull() -> TextIO:
    return open(os.devnull, "w")  # kept open for the life of the process


STDERR_TAIL_LINES = 20
"""How many of a stdio server's last stderr lines are kept (errors, process status)."""
_STDERR_LINE_MAX_CHARS = 500
_STDERR_BUFFER_MAX_BYTES = 64 * 1024
_PID_MARKER = "\0dexagents-mcp-pids "
_EXIT_MARKER = "\0dexagents-mcp-exit "
STDERR_EOF_WAIT_SECONDS = 2.0


class StderrCapture:
    """The stderr of a stdio server, read through a pipe by a daemon thread.

    Each line is echoed to the worker's stderr prefixed with ``[mcp <server>]`` and the last
    :data:`STDERR_TAIL_LINES` are kept (at most 500 characters each), with the values of the
    server's secret references replaced by ``[NAME]``. The guard's PID line is consumed, not
    kept, nor is its exit-status line (:attr:`exit_code`). ``on_line`` and ``on_eof`` are
    called from the reading thread.
    """

    def __init__(
        self,
        spec: McpServerSpec,
        *,
        on_line: Callable[[], None] | None = None,
        on_eof: Callable[[], None] | None = None,
    ) -> None:
        read_fd, write_fd = os.pipe()
        self.writer: TextIO = os.fdopen(write_fd, "w")
        self.guard_pid: int | None = None
        self.server_pid: int | None = None
        #: The server's exit status as the guard reported it (negative: killed by that signal).
        self.exit_code: int | None = None
        self._read_fd = read_fd
        self._name = spec.name
        self._secrets = sorted(
            secret_values(spec).items(), key=lambda item: len(item[1]), reverse=True
        )
        self._lines: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self._lock = threading.Lock()
        self._on_line = on_line
        self._on_eof = on_eof
        self._echo = server_errlog()
        self._thread = threading.Thread(
            target=self._read, name=f"mcp-stderr-{spec.name}", daemon=True
        )
        self._thread.start()

    def tail(self) -> tuple[str, ...]:
        """The last lines read so far, oldest first."""
        with self._lock:
            return tuple(self._lines)

    def close_writer(self) -> None:
        """Close this process's copy of the pipe's write end (the child keeps its own)."""
        if not self.writer.closed:
            self.writer.close()

    def wait_eof(self, timeout: float) -> None:
        """Block up to ``timeout`` seconds until every writer has closed the pipe."""
        self._thread.join(timeout)

    def _read(self) -> None:
        buffer = b""
        try:
            while chunk := os.read(self._read_fd, 65536):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                if len(buffer) > _STDERR_BUFFER_MAX_BYTES:
                    complete.append(buffer)
                    buffer = b""
                for raw in complete:
                    self._line(raw)
            if buffer:
                self._line(buffer)
        except OSError:
            pass
        finally:
            os.close(self._read_fd)
            if self._on_eof is not None:
                self._on_eof()

    def _line(self, raw: bytes) -> None:
        text = raw.decode("utf-8", "replace").rstrip("\r")
        if text.startswith(_PID_MARKER):
            with contextlib.suppress(ValueError):
                guard, server = text[len(_PID_MARKER):].split()
                self.guard_pid, self.server_pid = int(guard), int(server)
        elif text.startswith(_EXIT_MARKER):
            with contextlib.suppress(ValueError):
                self.exit_code = int(text[len(_EXIT_MARKER):])
        else:
            for name, value in self._secrets:
                text = text.replace(value, f"[{name}]")
            text = text[:_STDERR_LINE_MAX_CHARS]
            with self._lock:
                self._lines.append(text)
            with contextlib.suppress(Exception):
                self._echo.write(f"[mcp {self._name}] {text}\n")
                self._echo.flush()
        if self._on_line is not None:
            self._on_line()


ProcessState = Literal["starting", "running", "stopped", "exited", "failed"]


def exit_status_text(code: int | None) -> str:
    """How a process ended, from its exit status: ``exited with code 3``, ``was killed by
    signal 9 (SIGKILL)``, or ``exited`` when the status is unknown (negative: signal number,
    as ``subprocess`` reports it)."""
    if code is None:
        return "exited"
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = f" ({signal.Signals(-code).name})"
    except ValueError:
        name = ""
    return f"was killed by signal {-code}{name}"


@dataclass(frozen=True)
class McpProcessStatus:
    """The state of one stdio server process a pool runs (for the admin's process view).

    Attributes:
        server: The server's registry name.
        state: ``starting`` (spawned, handshake not finished), ``running``, ``stopped`` (closed
            by the pool), ``exited`` (ended on its own while connected), ``failed`` (could not
            be started).
        guard_pid: PID of the guard process (the direct child, leader of the process group).
        server_pid: PID of the server command itself.
        restarts: How many times this pool reopened the server since its first start.
        started_at: When this process was spawned (UTC).
        ended_at: When it stopped, exited or failed (UTC); ``None`` while alive.
        stderr_tail: Its last stderr lines, secret values replaced by ``[NAME]``.
        error: Why it failed or exited; ``""`` otherwise.
        scope: The connection's scope key (``session <id>``, ``user <id>``, ``shared``).
        exit_code: The server's exit status once it exited on its own (negative: the
            signal that killed it); ``None`` while it runs, or when it was stopped.
    """

    server: str
    state: ProcessState
    guard_pid: int | None
    server_pid: int | None
    restarts: int
    started_at: datetime
    ended_at: datetime | None
    stderr_tail: tuple[str, ...]
    error: str = ""
    scope: str = "shared"
    exit_code: int | None = None


ProcessStatusCallback = Callable[[McpProcessStatus], Awaitable[None] | None]
"""``on_process_status(status)``: a stdio server process of the pool changed state, or wrote
to its stderr (at most twice a second). Calls are made one at a time, in order."""


def with_stderr(message: str, tail: Sequence[str]) -> str:
    if not tail:
        return message
    return f"{message}. Last lines of its stderr:\n" + "\n".join(tail[-10:])
