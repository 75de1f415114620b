"""Task dispatch: pull streams (spec section 1.4) and push calls (section 1.5).

Ready Step methods and RPCs are matched to idle worker streams (or sent to a listening
worker); worker frames are fed back to the Step reducer and committed.

One piece past 600 lines because it is one of the engine's mixins (``_steps`` -> ``_dispatch``
-> ``_runs``): the pull and push paths share the in-flight bookkeeping (tasks, deadlines,
redelivery, rejects), which a split would make two modules reach into.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterable

import grpc
from dex.dexpb import dex_pb2 as pb

from ._blobs import (
    MAX_HYDRATION_REDELIVERIES,
    is_hydration_shortfall,
    oversized_detail,
    oversized_value,
)
from ._clock import now, timestamp
from ._commit import commit_execute, commit_wait_for
from ._errors import ServiceError, WorkerFailed, WorkerLost, uncategorized
from ._model import Run, StepExec
from ._push import is_push, run_step
from ._requests import build_rpc_request, build_step_task
from ._state import DEFAULT_METHOD_TIMEOUT, Inflight, RpcCall, WorkerStream
from ._steps import StepMachine
from ._streams import write_step_stream


def idle_per_queue(idle: Iterable[WorkerStream]) -> dict[tuple[str, str], int]:
    """How many of the ``idle`` streams each worker has on each queue:
    ``{(app_worker_id, queue): count}``. A pull Worker retires all but one of a queue's idle
    streams (``Dispatcher._pick_stream``)."""
    counts: dict[tuple[str, str], int] = {}
    for stream in idle:
        group = (stream.app_worker_id, stream.queue)
        counts[group] = counts.get(group, 0) + 1
    return counts


class Dispatcher(StepMachine):
    """Routes tasks to pull streams and push workers and applies their answers."""

    # Pull dispatch ---------------------------------------------------------------------------

    def pump(self) -> None:
        """Match ready tasks (RPCs first, then Steps in readiness order) to idle streams, then
        commit every run a Step result or a dispatch changed (``unflushed``): one commit per
        run, before any queued task leaves (the stream writers run after this returns)."""
        try:
            self._match_tasks()
        finally:
            while self.unflushed:
                self.flush(self.unflushed.pop(next(iter(self.unflushed))))

    def _match_tasks(self) -> None:
        if not self.streams and not any(
            is_push(self.runs[k[0]]) for k in self.ready if k[0] in self.runs
        ):
            return
        t = now()
        # The idle streams, newest first, gathered once: a saturated worker leaves few or
        # none, and each ready task is matched against these only (not every stream), so a
        # pump stays cheap with many runs waiting for a slot.
        idle = [stream for stream in reversed(self.streams.values()) if stream.idle]
        # Counted before this pump gives any a task: what the worker has seen (_pick_stream).
        idle_peers = idle_per_queue(idle)
        for call in list(self.rpc_queue):
            if not idle:
                break
            stream = self._pick_stream(call.run, call.excluded, rpc=True, t=t, candidates=idle,
                                       idle_peers=idle_peers)
            if stream is not None:
                self.rpc_queue.remove(call)
                self._send_rpc(stream, call)
                if not stream.idle:
                    idle.remove(stream)
        for key in list(self.ready):
            run = self.runs.get(key[0])
            st = run.steps.get(key[1]) if run is not None else None
            if run is None or st is None or not run.is_open or st.mstate != "ready":
                self.ready.pop(key, None)
                continue
            if is_push(run):
                if not self.lock_for_dispatch(run, st):
                    continue
                self.ready.pop(key, None)
                if self._push_step(run, st):
                    self.unflushed[run.run_id] = run
                continue
            if not idle:
                continue
            stream = self._pick_stream(
                run, self.excluded.get(key, set()), rpc=False, t=t, candidates=idle,
                idle_peers=idle_peers,
            )
            if stream is None or not self.lock_for_dispatch(run, st):
                continue
            self.ready.pop(key, None)
            if self._send_step(stream, run, st):
                self.unflushed[run.run_id] = run
            if not stream.idle:
                idle.remove(stream)

    def serves_flow_type(self, flow_type: str) -> bool:
        """Whether any registered stream serves ``flow_type``."""
        return any(s.serves(flow_type) and not s.half_closed for s in self.streams.values())

    def _pick_stream(
        self, run: Run, excluded: set[str], rpc: bool, t: float,
        candidates: Iterable[WorkerStream], idle_peers: dict[tuple[str, str], int] | None = None,
    ) -> WorkerStream | None:
        """The idle stream for a task of ``run``: a stream of its sticky worker (the one that
        served the Flow's previous task, spec "Routing") before any other worker's; within
        that, a stream the worker keeps before one it may be retiring, then one that never
        carried a task, then the worker's own queue before the Flow type's queue, newest first
        among equals. (So the sticky worker's stream on the Flow type's queue can win over its
        own-queue stream: both reach the same worker, which is what stickiness is for.)

        Stickiness comes first because a worker keeps per-session state a task of the same
        session should find again (the MCP connections of an agent session, one per worker):
        a Flow-type stream of another worker is used only when the sticky worker has no idle
        stream.

        A pull Worker (dex-python-sdk 1.23.0) keeps one idle stream per queue: it opens a
        replacement when a task lands on the idle one, and as soon as a queue has two idle
        streams (a task ended, or a replacement registered) it half-closes one of them, which
        one depending on timing inside the worker. A task sent to that one comes back
        unanswered at the half-close and is sent again, a round trip and a commit on the
        Flow's path (spec section 1.4, "Stream churn"). So a stream that is its worker's only
        idle stream on its queue (``idle_peers``: idle streams per ``(app_worker_id, queue)``
        when the pump began) comes first; among a queue's surplus streams, one that never
        carried a task (the worker checks a stream right after its task, so that one is the
        likelier to go).

        ``candidates``: the idle streams to choose from, newest first (``_match_tasks``).
        """
        best: WorkerStream | None = None
        best_rank = -1
        for stream in candidates:
            if not stream.idle or not stream.serves(run.flow_type):
                continue
            if stream.app_worker_id in excluded:
                continue
            if (self.rpc_declined_until if rpc else self.declined_until).get(stream.sid, 0) > t:
                continue
            own_queue = stream.queue == stream.app_worker_id
            if own_queue and stream.app_worker_id != run.sticky:
                continue
            kept = (idle_peers or {}).get((stream.app_worker_id, stream.queue), 1) <= 1
            rank = (
                (8 if run.sticky and stream.app_worker_id == run.sticky else 0)
                + (4 if kept else 0)
                + (2 if stream.served == 0 else 0)
                + (1 if own_queue else 0)
            )
            if rank > best_rank:
                best, best_rank = stream, rank
                if rank == 15:
                    break
        return best

    def _failed_too_large(self, run: Run, st: StepExec, task: pb.PollWorkerTask) -> bool:
        """Fail the attempt of a Step whose task is larger than a worker accepts, and say so.

        Sending it would break the worker's task stream (and every task on it) again on each
        retry; failing the attempt here keeps the failure to this Step. Called from ``pump``,
        which must not re-enter itself: the run advances and commits now and the next
        dispatch happens on the next loop turn.
        """
        detail = task_too_large(pb.PollWorkerTaskResponse(task=task))
        if not detail:
            return False
        code: int = grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        error = pb.WorkerErrorResponse(detail=detail, error_type="TaskTooLarge", grpc_status=code)
        self.fail_attempt(run, st, self.failure(st, worker=error), detail)
        self.advance(run)
        self.flush(run)
        self.loop.call_soon(self.pump)
        return True

    def _new_task_id(self) -> str:
        return uuid.uuid4().hex

    def _send_rpc(self, stream: WorkerStream, call: RpcCall) -> None:
        task_id = self._new_task_id()
        deadline = now() + call.budget
        task = pb.PollWorkerTask(
            task_id=task_id,
            deadline=timestamp(deadline),
            rpc=build_rpc_request(self, call.run, call.request),
        )
        refused = rpc_too_large(call.run, call.request.rpc_name, task.rpc)
        if refused is not None:
            call.dispatched.set()
            call.future.set_exception(refused)
            return
        stream.task_id = task_id
        stream.served += 1
        self.inflight[task_id] = Inflight(task_id, stream, call.run.run_id, rpc=call)
        call.dispatched.set()
        stream.out.put_nowait(pb.PollWorkerTaskResponse(task=task))

    def _send_step(self, stream: WorkerStream, run: Run, st: StepExec) -> bool:
        """Queue ``st``'s task on ``stream``; the caller commits ``run`` before it yields to
        the event loop (which sends it). Returns False when the task was too large (the attempt
        failed and was committed instead)."""
        task_id = self._new_task_id()
        if st.first_attempt_ts == 0.0:
            st.first_attempt_ts = now()
        timeout = self._method_timeout(st)
        deadline = now() + timeout
        task = build_step_task(self, run, st, task_id, deadline)
        if self._failed_too_large(run, st, task):
            return False
        st.mstate = "dispatched"
        st.task_id = task_id
        if st.phase == "wait_for":
            st.wait_for_served_by = stream.app_worker_id
        else:
            st.served_by = stream.app_worker_id
        stream.task_id = task_id
        stream.served += 1
        inflight = Inflight(task_id, stream, run.run_id, exe_id=st.exe_id)
        inflight.deadline_handle = self.loop.call_later(
            timeout, lambda: self._on_deadline(task_id, timeout)
        )
        self.inflight[task_id] = inflight
        stream.out.put_nowait(pb.PollWorkerTaskResponse(task=task))
        return True

    def _push_step(self, run: Run, st: StepExec) -> bool:
        """Start ``st``'s call on its listening worker, as :meth:`_send_step` (the caller
        commits; the call starts after the caller yields)."""
        task_id = self._new_task_id()
        if st.first_attempt_ts == 0.0:
            st.first_attempt_ts = now()
        timeout = self._method_timeout(st)
        task = build_step_task(self, run, st, task_id, now() + timeout)
        if self._failed_too_large(run, st, task):
            return False
        st.mstate = "dispatched"
        st.task_id = task_id
        inflight = Inflight(task_id, None, run.run_id, exe_id=st.exe_id)
        inflight.deadline_handle = self.loop.call_later(
            timeout + 1, lambda: self._on_deadline(task_id, timeout)
        )
        self.inflight[task_id] = inflight
        inflight.push_task = asyncio.ensure_future(
            run_step(
                self.push.stub(run.config.worker_target.address),
                task,
                float(timeout),
                functools.partial(self.push_frame, inflight),
                functools.partial(self.push_failed, inflight),
            )
        )
        return True

    @staticmethod
    def _method_timeout(st: StepExec) -> int:
        return (
            st.options.wait_for_timeout_seconds
            if st.phase == "wait_for"
            else st.options.execute_timeout_seconds
        ) or DEFAULT_METHOD_TIMEOUT

    def push_frame(self, inflight: Inflight, tf: pb.PollWorkerTaskFrame) -> None:
        """Handle one output of a push call (same meaning as a pull task frame)."""
        if not inflight.valid:
            return
        inflight.frames += 1
        out = tf.WhichOneof("output")
        final = out in ("wait_for", "execute") and (
            getattr(tf, out).WhichOneof("output") == "result"
        )
        if final:
            inflight.valid = False
            self.inflight.pop(inflight.task_id, None)
            if inflight.deadline_handle is not None:
                inflight.deadline_handle.cancel()
        self._deliver(inflight, tf, final)
        if final:
            self.pump()

    def redeliver_after_shortfall(
        self, run: Run, st: StepExec, error: pb.WorkerErrorResponse, push: bool = False
    ) -> bool:
        """Hand a task out again at the same attempt when its worker failed only to load all
        its blobs in one ``LoadBlobs`` answer (nothing of the method ran; the worker cached
        what it got, so the next delivery loads the rest). False once the task had
        ``MAX_HYDRATION_REDELIVERIES`` of them, or for any other error."""
        if not is_hydration_shortfall(error.detail):
            return False
        if st.hydration_redeliveries >= MAX_HYDRATION_REDELIVERIES:
            return False
        st.hydration_redeliveries += 1
        if not push:
            self.requeue_undelivered(run, st)
            self.loop.call_soon(self.pump)
        return True

    def push_failed(
        self,
        inflight: Inflight,
        message: str,
        worker: pb.WorkerErrorResponse | None,
        retry_free: bool,
    ) -> None:
        """A push call failed: fail the attempt (or retry at once without counting)."""
        if not inflight.valid:
            return
        inflight.valid = False
        self.inflight.pop(inflight.task_id, None)
        if inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != inflight.task_id or not run.is_open:
            return
        if retry_free or (
            worker is not None and self.redeliver_after_shortfall(run, st, worker, push=True)
        ):
            st.task_id = ""
            st.mstate = "backoff"
            if st.attempt <= 1:
                # Not run: as requeue_undelivered, a first attempt waits without its locks.
                self.release_locks(run, st)
            st.retry_at = now() + self.decline_backoff
            self._arm_retry(run, st)
        else:
            if worker is not None:
                failure = self.failure(st, worker=worker)
                retry_after = worker.retry_after_seconds
                message = worker.detail or message
            else:
                failure = self.failure(st, backend_error=message)
                retry_after = 0
            self.fail_attempt(run, st, failure, message, retry_after=retry_after)
            self.advance(run)
        self.flush(run)
        self.pump()

    def _on_deadline(self, task_id: str, timeout: int) -> None:
        inflight = self.inflight.get(task_id)
        if inflight is None or not inflight.valid:
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != task_id:
            return
        if inflight.stream is None:
            self.inflight.pop(task_id, None)
        method = "wait_for" if st.phase == "wait_for" else "execute"
        self._cancel_inflight(st)
        message = f"{method} method timeout after {timeout}s"
        self.fail_attempt(run, st, self.failure(st, backend_error=message), message)
        self.settle(run)

    # Stream events -----------------------------------------------------------------------------

    def register_stream(
        self, queue: str, app_worker_id: str, flow_types: Iterable[str]
    ) -> WorkerStream:
        """Add a registered pull stream."""
        self.stream_seq += 1
        stream = WorkerStream(
            sid=self.stream_seq,
            queue=queue,
            app_worker_id=app_worker_id,
            flow_types=frozenset(flow_types),
            out=asyncio.Queue(),
        )
        self.streams[stream.sid] = stream
        self.loop.call_soon(self.pump)
        return stream

    def stream_input_ended(self, stream: WorkerStream) -> bool:
        """The worker's side of ``stream`` ended (its ``PollWorkerTask`` read EOF): either the
        worker half-closed it or its connection dropped, and gRPC may report the drop's cancel
        only a moment later. Either way no task goes to the stream from now on (spec section
        9.1 #5), so new tasks go to other streams at once.

        Returns whether a task is in flight on the stream whose fate turns on which of the two
        it was: unanswered and silent (no heartbeat, no stream write), it was not delivered if
        the worker half-closed, but may be running if the worker was lost
        (:meth:`stream_ended`). The caller then finds out which it was before it calls
        :meth:`stream_ended` (``WorkerTaskService._half_closed_by_worker``).
        """
        stream.half_closed = True
        inflight = self.inflight.get(stream.task_id) if stream.task_id else None
        return inflight is not None and inflight.valid and not inflight.frames

    def stream_ended(self, stream: WorkerStream, clean: bool) -> None:
        """A stream ended while a task may be in flight on it.

        A task the worker never answered on a cleanly closed stream was not delivered
        (spec sections 8 and 9.1 #5) and is re-routed at the same attempt. A task on a stream
        lost to a transport error or cancel, or one that already produced output (heartbeat,
        stream write), was running: its attempt fails with ``WORKER_DISCONNECTED``.
        """
        self.streams.pop(stream.sid, None)
        self.declined_until.pop(stream.sid, None)
        self.rpc_declined_until.pop(stream.sid, None)
        stream.half_closed = True
        task_id = stream.task_id
        stream.task_id = ""
        inflight = self.inflight.pop(task_id, None) if task_id else None
        if inflight is None or not inflight.valid:
            return
        if inflight.frames:
            clean = False
        if inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        inflight.valid = False
        if inflight.rpc is not None:
            call = inflight.rpc
            if clean:
                call.dispatched.clear()
                self.rpc_queue.insert(0, call)
            elif not call.future.done():
                call.future.set_exception(
                    WorkerLost(pb.DISPATCH_TASK_ERROR_REASON_WORKER_DISCONNECTED)
                )
            self.pump()
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != task_id:
            return
        if clean:
            # Committed by the pump below, with the task's next dispatch when there is one
            # (a requeue and its dispatch were two commits).
            self.requeue_undelivered(run, st)
            self.unflushed[run.run_id] = run
        else:
            message = "worker stream disconnected while the task was running"
            self.fail_attempt(
                run,
                st,
                self.failure(
                    st,
                    backend_error=message,
                    reason=pb.DISPATCH_TASK_ERROR_REASON_WORKER_DISCONNECTED,
                ),
                message,
            )
            self.advance(run)
            self.flush(run)
        self.pump()

    def on_frame(self, stream: WorkerStream, frame: pb.PollWorkerTaskRequest) -> None:
        """Handle one worker frame after registration."""
        kind = frame.WhichOneof("frame")
        if kind == "pong" or kind == "register":
            return
        if kind == "reject":
            self._on_reject(stream, frame.reject)
            return
        if kind != "task_frame":
            return
        tf = frame.task_frame
        if tf.task_id != stream.task_id:
            return
        inflight = self.inflight.get(tf.task_id)
        if inflight is not None:
            inflight.frames += 1
        out = tf.WhichOneof("output")
        final = out in ("rpc", "worker_error") or (
            out in ("wait_for", "execute")
            and getattr(tf, out).WhichOneof("output") == "result"
        )
        if final:
            stream.task_id = ""
            self.inflight.pop(tf.task_id, None)
            self.declined_until.pop(stream.sid, None)
            self.rpc_declined_until.pop(stream.sid, None)
        if inflight is not None and inflight.valid:
            if final:
                inflight.valid = False
                if inflight.deadline_handle is not None:
                    inflight.deadline_handle.cancel()
            self._deliver(inflight, tf, final)
        if final:
            self.pump()

    def _on_reject(self, stream: WorkerStream, reject: pb.PollWorkerTaskReject) -> None:
        if reject.task_id != stream.task_id:
            return
        stream.task_id = ""
        inflight = self.inflight.pop(reject.task_id, None)
        if inflight is not None and inflight.deadline_handle is not None:
            inflight.deadline_handle.cancel()
        unknown = reject.reason in (
            pb.POLL_WORKER_TASK_REJECT_REASON_UNKNOWN_STEP,
            pb.POLL_WORKER_TASK_REJECT_REASON_UNKNOWN_RPC,
        )
        if inflight is None or not inflight.valid:
            self.pump()
            return
        if inflight.rpc is not None:
            call = inflight.rpc
            call.dispatched.clear()
            if unknown:
                call.excluded.add(stream.app_worker_id)
                if not any(
                    s.serves(call.run.flow_type) and s.app_worker_id not in call.excluded
                    for s in self.streams.values()
                ):
                    if not call.future.done():
                        call.future.set_exception(
                            WorkerLost(pb.DISPATCH_TASK_ERROR_REASON_UNKNOWN_NAME)
                        )
                    call.dispatched.set()
                    return
            if not unknown:
                # As for a Step below: the stream that declined is usually retiring (the SDK's
                # pull worker retires whichever idle stream it finds surplus, the fresh one
                # too), so the RPC goes to another idle stream now. It used to wait for the
                # next pump, up to the whole back-off: the caller's 100-200 ms tail (issue 13).
                until = now() + self.decline_backoff
                self.declined_until[stream.sid] = self.rpc_declined_until[stream.sid] = until
                self.loop.call_later(self.decline_backoff + 0.01, self.pump)
            self.rpc_queue.insert(0, call)
            self.pump()
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != reject.task_id:
            self.pump()
            return
        st.mstate = "ready"
        st.task_id = ""
        key = (run.run_id, st.exe_id)
        if unknown:
            excluded = self.excluded.setdefault(key, set())
            excluded.add(stream.app_worker_id)
            if not any(
                s.serves(run.flow_type) and s.app_worker_id not in excluded
                for s in self.streams.values()
            ):
                # Every connected worker rejected the name: that costs an attempt.
                self.excluded.pop(key, None)
                message = f"no worker knows step {st.step_type!r} of flow {run.flow_type!r}"
                self.fail_attempt(
                    run,
                    st,
                    self.failure(
                        st,
                        backend_error=message,
                        reason=pb.DISPATCH_TASK_ERROR_REASON_UNKNOWN_NAME,
                    ),
                    message,
                )
                self.settle(run)
                return
        else:
            self.declined_until[stream.sid] = now() + self.decline_backoff
            self.loop.call_later(self.decline_backoff + 0.01, self.pump)
        self.requeue_undelivered(run, st)
        self.unflushed[run.run_id] = run
        self.pump()

    def _deliver(self, inflight: Inflight, tf: pb.PollWorkerTaskFrame, final: bool) -> None:
        out = tf.WhichOneof("output")
        if inflight.rpc is not None:
            call = inflight.rpc
            if call.future.done():
                return
            if out == "rpc":
                served = inflight.stream.app_worker_id if inflight.stream is not None else ""
                call.future.set_result((tf.rpc, served))
            elif out == "worker_error":
                call.future.set_exception(WorkerFailed(tf.worker_error))
            return
        run = self.runs.get(inflight.run_id)
        st = run.steps.get(inflight.exe_id) if run is not None else None
        if run is None or st is None or st.task_id != inflight.task_id or not run.is_open:
            return
        if out == "worker_error" and self.redeliver_after_shortfall(run, st, tf.worker_error):
            self.unflushed[run.run_id] = run
            return
        if out == "worker_error":
            we = tf.worker_error
            message = we.detail or "worker error"
            self.fail_attempt(
                run, st, self.failure(st, worker=we), message, retry_after=we.retry_after_seconds
            )
        else:
            output = tf.wait_for if out == "wait_for" else tf.execute
            which = output.WhichOneof("output")
            if which == "heartbeat":
                # Its liveness part (the task has produced output) is ``inflight.frames``; only
                # a changed heartbeat value is state to store (the next attempt reads it).
                hb = output.heartbeat
                value = hb.value if hb.HasField("value") else None
                if value != st.heartbeat:
                    st.heartbeat = value
                    self.flush(run)
                return
            if which == "stream_write":
                write_step_stream(self, run, st, output.stream_write)
                return
            if which != "result":
                return
            oversized = oversized_value(output.result)
            if oversized:
                # Refused before anything of it is applied: no worker could load it again.
                detail = oversized_detail(oversized)
                failure = self.failure(st, worker=pb.WorkerErrorResponse(
                    detail=detail, error_type="ValueTooLarge",
                    grpc_status=grpc.StatusCode.RESOURCE_EXHAUSTED.value[0],
                ))
                self.fail_attempt(run, st, failure, detail)
                self.advance(run)
                self.unflushed[run.run_id] = run
                return
            st.task_id = ""
            if out == "wait_for" and st.phase == "wait_for":
                commit_wait_for(self, run, st, tf.wait_for.result)
            elif out == "execute" and st.phase == "execute":
                commit_execute(self, run, st, tf.execute.result)
        # A final frame: the caller pumps next, which commits the run with the dispatches the
        # result led to.
        self.advance(run)
        self.unflushed[run.run_id] = run

    def shutdown_streams(self) -> None:
        """Ask every stream to drain and reconnect (engine shutdown)."""
        for stream in list(self.streams.values()):
            stream.out.put_nowait(
                pb.PollWorkerTaskResponse(
                    reconnect=pb.PollWorkerTaskReconnect(reason="engine shutting down")
                )
            )


#: Largest task frame sent to a worker: gRPC's default receive limit (4 MiB), which the SDK's
#: worker keeps, less room for framing. Values over the blob threshold travel as blob ids
#: (``_blobs``), so only a task whose inline part passes this (many values under the
#: threshold) fails, on its own, instead of breaking the worker's task stream (and every task
#: on it). RPC outputs, which stay inline, are held to the same bound.
MAX_TASK_FRAME_BYTES = 4 * 1024 * 1024 - 16 * 1024


def task_too_large(frame: pb.PollWorkerTaskResponse) -> str:
    """Why ``frame`` cannot go to a worker, or ``""`` when it fits."""
    size = frame.ByteSize()
    if size <= MAX_TASK_FRAME_BYTES:
        return ""
    return (
        f"task too large for a worker message: its loaded state is {size} bytes, more than "
        f"{MAX_TASK_FRAME_BYTES} (gRPC's 4 MiB limit; values over the blob threshold are "
        "sent as blob ids, the rest inline)"
    )


def rpc_too_large(
    run: Run, rpc_name: str, request: pb.InvokeWorkerRPCRequest
) -> ServiceError | None:
    """The ``RESOURCE_EXHAUSTED`` error for an RPC task too large for a worker, or ``None``
    when it fits (``task_too_large``)."""
    detail = task_too_large(pb.PollWorkerTaskResponse(task=pb.PollWorkerTask(rpc=request)))
    if not detail:
        return None
    return uncategorized(
        grpc.StatusCode.RESOURCE_EXHAUSTED, f"rpc {rpc_name!r} of flow {run.flow_id!r}: {detail}"
    )
