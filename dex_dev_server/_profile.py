"""Where the engine's time goes: calls and wall time per gRPC method, and SQLite commits.

Off by default. ``python -m dex_dev_server --profile PATH`` installs a gRPC server interceptor
and writes the figures as JSON to ``PATH`` each time the process receives ``SIGUSR1`` (and once
when it stops), so a benchmark can take a reading before and after the work it measures and
subtract. ``bench/turn.py`` uses it for its per-turn cost breakdown.

The file's shape::

    {"methods": {"<gRPC method>": {"calls": int, "seconds": float}, ...},
     "commits": int, "commit_seconds": float, "commit_longest_seconds": float,
     "slow_commits": int, "gc_pauses": int, "gc_seconds": float, "gc_longest_seconds": float,
     "cpu_seconds": float, "trace": [[unix time, seconds, label], ...]}

A unary method's seconds run from the call reaching the engine to its answer, long-poll waits
included (``ReadStream``); a streaming method counts calls only, and the frames a worker
sends on ``PollWorkerTask`` are timed one by one as ``frame:<kind>``.
"""

from __future__ import annotations

import gc
import inspect
import json
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc

from ._store import CommitStats

_TRACE_EVENTS = 5000


class EngineProfile:
    """Per-method call counts and wall time, plus the store's :class:`CommitStats`."""

    def __init__(self, path: str | Path, commits: CommitStats) -> None:
        self.path = Path(path)
        self.commits = commits
        self.calls: dict[str, list[float]] = {}
        self.gc_pauses = 0
        self.gc_seconds = 0.0
        self.gc_longest = 0.0
        self._gc_started = 0.0
        gc.callbacks.append(self._on_gc)
        #: The last events as ``(unix time at the end, seconds, label)``, for a timeline.
        self.trace: deque[tuple[float, float, str]] = deque(maxlen=_TRACE_EVENTS)

    def reset_gc(self) -> None:
        """Forget the collections so far (the process's start-up collection)."""
        self.gc_pauses = 0
        self.gc_seconds = 0.0
        self.gc_longest = 0.0

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
            return
        took = time.perf_counter() - self._gc_started
        self.gc_pauses += 1
        self.gc_seconds += took
        self.gc_longest = max(self.gc_longest, took)
        if took > 0.002:
            self.trace.append((time.time(), took, f"gc generation {info.get('generation')}"))

    def record(self, method: str, seconds: float, detail: str = "") -> None:
        """Add one call of ``method`` that took ``seconds`` (``detail`` goes to the trace)."""
        entry = self.calls.setdefault(method, [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        self.trace.append((time.time(), seconds, f"{method} {detail}".rstrip()))

    def snapshot(self) -> dict[str, Any]:
        """The figures so far, in the module docstring's shape."""
        times = os.times()
        return {
            "methods": {
                name: {"calls": int(calls), "seconds": seconds}
                for name, (calls, seconds) in sorted(self.calls.items())
            },
            "commits": self.commits.commits,
            "commit_seconds": self.commits.seconds,
            "commit_longest_seconds": self.commits.longest,
            "slow_commits": self.commits.slow,
            "gc_pauses": self.gc_pauses,
            "gc_seconds": self.gc_seconds,
            "gc_longest_seconds": self.gc_longest,
            "cpu_seconds": times.user + times.system,
            "trace": list(self.trace),
        }

    def dump(self) -> None:
        """Write :meth:`snapshot` to the profile path (replacing it atomically)."""
        partial = self.path.with_name(self.path.name + ".partial")
        partial.write_text(json.dumps(self.snapshot()))
        partial.replace(self.path)

    def instrument(self, engine: Any) -> None:
        """Time the engine's handling of each frame a worker sends on ``PollWorkerTask``,
        recorded as ``frame:<oneof name>`` (task results, heartbeats, RPC answers...); count
        tasks sent (``send:<kind>``), streams registered (``register_stream``) and streams that
        ended with a task unanswered (``closed_with_task``)."""
        handle = engine.on_frame
        register = engine.register_stream
        ended = engine.stream_ended

        def timed(stream: Any, frame: Any) -> Any:
            started = time.perf_counter()
            try:
                return handle(stream, frame)
            finally:
                detail = f"s{stream.sid} {frame.task_frame.task_id[-12:]}"
                if frame.WhichOneof("frame") == "reject":
                    detail = f"s{stream.sid} reason {frame.reject.reason}"
                self.record(_frame_label(frame), time.perf_counter() - started, detail)

        def registered(queue: str, app_worker_id: str, flow_types: Any) -> Any:
            stream = register(queue, app_worker_id, flow_types)
            put = stream.out.put_nowait

            def sent(frame: Any) -> None:
                if frame is not None and frame.WhichOneof("frame") == "task":
                    task = frame.task
                    kind = task.WhichOneof("request")
                    name = getattr(getattr(task, kind), "step_type", "") or getattr(
                        getattr(task, kind), "rpc_name", ""
                    )
                    self.record(f"send:{kind}", 0.0, f"s{stream.sid} {name}")
                put(frame)

            stream.out.put_nowait = sent
            self.record("register_stream", 0.0, f"s{stream.sid} {queue[:20]}")
            return stream

        def stream_ended(stream: Any, clean: bool) -> Any:
            if stream.task_id:
                # A task the worker had not answered when its stream ended: sent to a stream
                # the worker was retiring (clean), or lost with it.
                self.record("closed_with_task", 0.0, f"s{stream.sid} clean={clean}")
            return ended(stream, clean)

        engine.on_frame = timed
        engine.register_stream = registered
        engine.stream_ended = stream_ended

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        """A server interceptor that times every unary method into this profile."""
        return _TimingInterceptor(self)


class _TimingInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method.rsplit("/", 1)[-1]
        if handler is None:
            return handler
        if handler.unary_unary is None:
            self.profile.record(method, 0.0)
            return handler
        inner = handler.unary_unary
        profile = self.profile

        async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
            started = time.perf_counter()
            try:
                answer = inner(request, context)
                if inspect.isawaitable(answer):
                    answer = await answer
                return answer
            finally:
                profile.record(method, time.perf_counter() - started)

        return grpc.unary_unary_rpc_method_handler(
            timed,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _frame_label(frame: Any) -> str:
    """``frame:<kind>``; a task frame adds its outputs (``frame:task_frame.execute.result``)."""
    parts = [frame.WhichOneof("frame") or "empty"]
    if parts[0] == "task_frame":
        output = frame.task_frame.WhichOneof("output") or "empty"
        parts.append(output)
        if output in ("wait_for", "execute"):
            parts.append(getattr(frame.task_frame, output).WhichOneof("output") or "empty")
    return "frame:" + ".".join(parts)
