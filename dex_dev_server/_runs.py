"""Runs as a whole: boot, start, sub-flows, flow retries and continue-as-new (spec section 2)."""

from __future__ import annotations

import functools
import logging
import math
import uuid
from typing import Any

import grpc
from dex.dexpb import dex_pb2 as pb

from ._blobs import BLOB_KINDS
from ._clock import duration, now
from ._dispatch import Dispatcher
from ._errors import ServiceError, invalid, not_found
from ._model import START_FROM, ChannelEntry, Run, StepExec
from ._store import RunWrite

_LOG = logging.getLogger("dex_dev_server")

#: Longest server-side wait of a long poll, in seconds.
MAX_LONG_POLL = 60.0
_RESERVED = ("/", "$", ":")


def check_name(value: str, what: str) -> None:
    """Reject an empty name or one with a reserved character (``INVALID_ARGUMENT``)."""
    if not value:
        raise invalid(f"{what} is required")
    if any(c in value for c in _RESERVED):
        raise invalid(f"{what} must not contain '/', '$' or ':'")


def check_value(value: pb.Value, what: str) -> None:
    """Reject a client value referencing a blob or a non-finite double (``INVALID_ARGUMENT``)."""
    kind = value.WhichOneof("kind")
    if kind in BLOB_KINDS:
        raise invalid(f"{what} must not reference a blob")
    if kind == "double_value" and not math.isfinite(value.double_value):
        raise invalid(f"{what} must be finite")


def long_poll_budget(context: grpc.aio.ServicerContext, cap: float) -> float:
    """Seconds a long poll may wait: ``cap``, cut to the call's deadline less 0.2 s."""
    remaining = context.time_remaining()
    if remaining is None:
        return cap
    return max(0.0, min(cap, remaining - 0.2))


def flow_result(run: Run) -> pb.FlowResult:
    """The ``FlowResult`` of a closed run."""
    return pb.FlowResult(
        flow_status=run.status,  # type: ignore[arg-type]
        results=run.results if run.status == pb.FLOW_STATUS_COMPLETED else [],
        error_type=run.error_type,  # type: ignore[arg-type]
        error_message=run.error_message,
    )


class RunEngine(Dispatcher):
    """Whole-run operations shared by the service handlers, on top of the dispatcher."""

    # Boot ---------------------------------------------------------------------------------------

    def load(self) -> None:
        """Rebuild all runs from SQLite and resume every open run (spec section 7 #2).

        Dispatched-but-uncommitted attempts are retried at once, overdue timers fire,
        waiting conditions are re-evaluated and locks are re-acquired.
        """
        for row in self.store.load_runs():
            run = Run.from_row(row)
            self.runs[run.run_id] = run
            self.flows.setdefault(run.flow_id, []).append(run.run_id)
            self.run_seq = max(self.run_seq, run.seq)
        for run_id, key, value in self.store.load_attributes():
            v = pb.Value()
            v.ParseFromString(value)
            if run_id in self.runs:
                self.runs[run_id].attributes[key] = v
        for run_id, seq, channel, message_id, value in self.store.load_channel_messages():
            owner = self.runs.get(run_id)
            if owner is None:
                continue
            run = owner
            v = pb.Value()
            v.ParseFromString(value)
            run.channels.setdefault(channel, []).append(
                ChannelEntry(seq, pb.ChannelMessage(channel_name=channel, value=v,
                                                    message_id=message_id))
            )
            run.chan_seq = max(run.chan_seq, seq)
        for run in self.runs.values():
            run.stored_refs = run.blob_ids()
        swept = self.store.sweep_blobs({run.run_id: run.stored_refs for run in self.runs.values()})
        if swept:
            _LOG.info("deleted %d blobs nothing references", swept)
        for run in list(self.runs.values()):
            if run.is_open:
                self._resume(run)
            elif run.retry_at:
                self.schedule(("flow-retry", run.run_id), run.retry_at,
                              functools.partial(self._retry_run, run))

    def _resume(self, run: Run) -> None:
        # Locks start empty after a restart; each method takes its own again when its task
        # is dispatched (spec section 7 #2).
        for st in sorted(run.steps.values(), key=lambda s: s.created_order):
            if st.mstate == "locking":
                # Written by engines that took locks before dispatch: ready now.
                st.mstate = "ready"
            if st.mstate == "dispatched":
                message = "engine restarted while the task was running"
                self.fail_attempt(
                    run, st, self.failure(st, backend_error=message), message, count=False
                )
            elif st.mstate == "ready":
                self.ready[(run.run_id, st.exe_id)] = None
            elif st.mstate == "backoff":
                self._arm_retry(run, st)
            elif st.phase == "waiting":
                self.schedule_timers(run, st)
        self.advance(run)
        self.flush(run)


    # Sub-flows and flow retries -----------------------------------------------------------------

    def start_sub_flow(
        self, run: Run, st: StepExec, position: int, condition: pb.SubFlowCondition
    ) -> None:
        """Start or attach ``SubFlow:<parent>-<exe>-<index>`` (spec section 2.11).

        The request ID derives from the parent run ID, so a parent re-run in a new run
        restarts children that the old run attached.
        """
        child_id = f"SubFlow:{run.flow_id}-{st.exe_id}-{condition.sub_flow_index}"
        request_id = f"{run.run_id}/{child_id}"
        opts = condition.options
        link = [run.run_id, st.exe_id, position]
        latest = self.latest_run(child_id)
        if latest is not None:
            policy = opts.reuse_policy
            finished = not latest.is_open and not latest.retry_at
            attach = (
                latest.request_id == request_id
                or policy == pb.SUB_FLOW_REUSE_POLICY_ATTACH
                or (
                    policy != pb.SUB_FLOW_REUSE_POLICY_ALWAYS_RESTART
                    and (not finished or latest.status == pb.FLOW_STATUS_COMPLETED)
                )
            )
            if attach:
                if finished:
                    st.subs[position] = flow_result(latest)
                elif link not in latest.parents:
                    latest.parents.append(link)
                    self.flush(latest)
                return
            if latest.is_open:
                self.close_run(latest, pb.FLOW_STATUS_TERMINATED)
                self.flush(latest)
        config = pb.FlowConfig()
        config.CopyFrom(run.config)
        config.MergeFrom(opts.flow_config_override)
        start_options = pb.FlowStartOptions(
            id_reuse_policy=pb.ID_REUSE_POLICY_ALLOW_TERMINATE_IF_RUNNING,
            flow_start_delay_seconds=opts.flow_start_delay_seconds,
            attributes=opts.attributes,
            flow_config_override=config,
            timeout_handler_options=opts.timeout_handler_options,
        )
        if opts.HasField("retry_policy"):
            start_options.retry_policy.CopyFrom(opts.retry_policy)
        request = pb.StartFlowRequest(
            flow_id=child_id,
            flow_type=condition.sub_flow_type,
            flow_timeout_seconds=opts.flow_timeout_seconds,
            flow_timeout_policy=opts.flow_timeout_policy,
            start_step_type=condition.start_step_type,
            step_input=condition.step_input,
            step_options=condition.step_options,
            flow_start_options=start_options,
            request_id=request_id,
        )
        child = self._new_run(request, first_run_id="", run_attempt=1, parents=[link])
        self.loop.call_soon(self.pump)
        _LOG.info("sub-flow %s started for %s", child.flow_id, st.exe_id)

    def after_close(self, run: Run) -> None:
        """Schedule a flow retry for a failed run, else report it to parent Steps."""
        req = run.start_request
        policy = req.flow_start_options.retry_policy
        if (
            run.status == pb.FLOW_STATUS_FAILED
            and run.error_type != pb.FLOW_ERROR_TYPE_CLIENT_API_FAILING_FLOW
            and req.flow_start_options.HasField("retry_policy")
            and (policy.maximum_attempts == 0 or run.run_attempt < policy.maximum_attempts)
        ):
            initial = policy.initial_interval_seconds or 1
            coefficient = policy.backoff_coefficient or 2.0
            maximum = policy.maximum_interval_seconds or 100
            delay = min(initial * coefficient ** (run.run_attempt - 1), maximum)
            run.retry_at = now() + delay
            self.schedule(("flow-retry", run.run_id), run.retry_at,
                          functools.partial(self._retry_run, run))
            return
        self._report_to_parents(run)

    def _retry_run(self, run: Run) -> None:
        if not run.retry_at or self.latest_run(run.flow_id) is not run:
            return
        run.retry_at = 0.0
        self.flush(run)
        self._new_run(
            run.start_request,
            first_run_id=run.first_run_id,
            run_attempt=run.run_attempt + 1,
            parents=run.parents,
        )
        self.pump()

    def _report_to_parents(self, run: Run) -> None:
        result = flow_result(run)
        for parent_run_id, exe_id, position in run.parents:
            parent = self.runs.get(parent_run_id)
            while parent is not None and parent.continued_to:
                parent = self.runs.get(parent.continued_to)
            if parent is None or not parent.is_open:
                continue
            st = parent.steps.get(exe_id)
            if st is None or st.phase != "waiting" or position in st.subs:
                continue
            st.subs[position] = result
            # The child's output blobs go with the parent's commit too (ids are content
            # hashes; storing one twice is a no-op): the child's own commit may come later,
            # and a crash in between must not leave the parent with an unknown blob id.
            for output in result.results:
                self.carry_blob(run, parent, output.completed_step_output)
            self.advance(parent)
            self.flush(parent)
        self.loop.call_soon(self.pump)


    # Start and lookup ---------------------------------------------------------------------------

    def start_flow(self, req: pb.StartFlowRequest) -> str:
        """Validate and start a run (spec section 2.2); returns its run ID."""
        check_name(req.flow_id, "flow_id")
        check_name(req.flow_type, "flow_type")
        if req.start_step_type:
            check_name(req.start_step_type, "start_step_type")
        if not req.request_id:
            raise invalid("request_id is required")
        opts = req.flow_start_options
        if opts.flow_start_delay_seconds < 0:
            raise invalid("flow_start_delay_seconds must not be negative")
        if req.flow_timeout_seconds < 0:
            raise invalid("flow_timeout_seconds must not be negative")
        if req.flow_timeout_policy not in pb.FlowTimeoutPolicy.values():
            raise invalid("unknown flow_timeout_policy")
        if opts.id_reuse_policy not in pb.IdReusePolicy.values():
            raise invalid("unknown id_reuse_policy")
        if req.flow_timeout_policy != pb.FLOW_TIMEOUT_POLICY_UNSPECIFIED and (
            req.flow_timeout_seconds <= 0
        ):
            raise invalid("a flow timeout policy needs a positive flow timeout")
        check_value(req.step_input, "step_input")
        for write in opts.attributes:
            if not write.key:
                raise invalid("attribute key is required")
            check_value(write.value, "attribute value")
        target = opts.flow_config_override.worker_target
        if target.address.startswith(("http://", "https://")):
            raise invalid("worker_target.address must be a gRPC target, not a URL")

        latest = self.latest_run(req.flow_id)
        if latest is not None:
            policy = opts.id_reuse_policy
            reject = False
            if latest.is_open:
                if policy == pb.ID_REUSE_POLICY_ALLOW_TERMINATE_IF_RUNNING:
                    self.close_run(latest, pb.FLOW_STATUS_TERMINATED)
                    self.flush(latest)
                else:
                    reject = True
            elif policy in (pb.ID_REUSE_POLICY_UNSPECIFIED, pb.ID_REUSE_POLICY_DISALLOW_REUSE):
                reject = True
            elif policy == pb.ID_REUSE_POLICY_ALLOW_IF_PREVIOUS_EXISTS_ABNORMALLY:
                reject = latest.status == pb.FLOW_STATUS_COMPLETED
            if reject:
                if (
                    opts.flow_already_started_options.ignore_already_started_error
                    and latest.request_id == req.request_id
                ):
                    return latest.run_id
                raise ServiceError(
                    grpc.StatusCode.ALREADY_EXISTS,
                    pb.ERROR_SUB_STATUS_FLOW_ALREADY_STARTED,
                    f"flow {req.flow_id!r} was already started",
                )
        run = self._new_run(req, first_run_id="", run_attempt=1)
        self.pump()
        return run.run_id

    def _new_run(
        self,
        req: pb.StartFlowRequest,
        first_run_id: str,
        run_attempt: int,
        parents: list[list[Any]] | None = None,
    ) -> Run:
        config = pb.FlowConfig(continue_as_new_threshold=100,
                               step_durability=pb.STEP_DURABILITY_ASYNC)
        override = req.flow_start_options.flow_config_override
        for name in (
            "active_step_search_mode",
            "continue_as_new_threshold",
            "continue_as_new_page_size_in_bytes",
            "step_durability",
            "worker_target",
            "attribute_store_names",
        ):
            if override.HasField(name):
                if name in ("worker_target", "attribute_store_names"):
                    getattr(config, name).CopyFrom(getattr(override, name))
                else:
                    setattr(config, name, getattr(override, name))
        self.run_seq += 1
        run_id = str(uuid.uuid4())
        run = Run(
            flow_id=req.flow_id,
            run_id=run_id,
            seq=self.run_seq,
            flow_type=req.flow_type,
            status=pb.FLOW_STATUS_RUNNING,
            request_id=req.request_id,
            start_ts=now(),
            first_run_id=first_run_id or run_id,
            config=config,
            start_request=req,
            run_attempt=run_attempt,
            parents=list(parents or []),
        )
        if override.HasField("continue_as_new_threshold"):
            # Only an explicitly configured threshold continues runs as new automatically.
            run.can_threshold = override.continue_as_new_threshold
        self.runs[run_id] = run
        self.flows.setdefault(req.flow_id, []).append(run_id)
        initial = []
        for write in req.flow_start_options.attributes:
            self.set_attribute(run, write.key, write.value, inline=write.is_hard_delete_on_null)
            self.index_attribute(run, write, by_key=True)
            recorded = not write.is_hard_delete_on_null
            if recorded and write.value.WhichOneof("kind") not in (None, "null_value"):
                initial.append(pb.KV(key=write.key, value=write.value))
        self.add_history(
            run,
            flow_started_or_continued=pb.FlowStartedOrContinuedHistoryEvent(
                flow_execution_id=pb.FlowExecutionID(flow_id=run.flow_id, run_id=run_id),
                flow_type=run.flow_type,
                flow_config=config,
                flow_timeout=duration(req.flow_timeout_seconds),
                flow_timeout_policy=req.flow_timeout_policy,
                timeout_handler_options=req.flow_start_options.timeout_handler_options,
                initial_start=pb.FlowInitialStart(
                    start_step_type=req.start_step_type,
                    step_input=req.step_input,
                    step_options=req.step_options,
                    initial_attributes=initial,
                ),
            ),
        )
        if req.flow_timeout_seconds > 0:
            self.create_timeout_step(run, req.flow_timeout_seconds)
        if req.start_step_type:
            delay = req.flow_start_options.flow_start_delay_seconds
            self.enqueue(
                run,
                pb.StepMovement(
                    step_type=req.start_step_type,
                    step_input=req.step_input,
                    step_options=req.step_options,
                ),
                START_FROM,
                not_before=run.start_ts + delay if delay > 0 else 0.0,
            )
        self.advance(run)
        self.flush(run)
        _LOG.info("flow %s (%s) started run %s", run.flow_id, run.flow_type, run_id)
        return run

    def _open_run(self, flow_id: str, run_id: str = "") -> Run:
        if not flow_id:
            raise invalid("flow_id is required")
        run = self.find_run(flow_id, run_id)
        if run is None or not run.is_open:
            raise not_found(flow_id)
        return run

    def _existing_run(self, flow_id: str, run_id: str = "") -> Run:
        if not flow_id:
            raise invalid("flow_id is required")
        run = self.find_run(flow_id, run_id)
        if run is None:
            raise not_found(flow_id, f"flow {flow_id!r} does not exist")
        return run


    # Continue-as-new ----------------------------------------------------------------------------

    def continue_as_new(self, live: Run) -> None:
        """Close the current run as CONTINUED_AS_NEW and carry all its state into a new run.

        Waiting and queued Steps, attributes, pending channel messages (same IDs), counters
        and outputs move over; in-flight attempts keep running and commit into the new run
        (spec section 2.12).
        """
        old_id = live.run_id
        new_id = str(uuid.uuid4())
        closed = Run(
            flow_id=live.flow_id,
            run_id=old_id,
            seq=live.seq,
            flow_type=live.flow_type,
            status=pb.FLOW_STATUS_CONTINUED_AS_NEW,
            request_id=live.request_id,
            start_ts=live.start_ts,
            first_run_id=live.first_run_id,
            config=live.config,
            start_request=live.start_request,
            close_ts=now(),
            run_attempt=live.run_attempt,
            attributes=dict(live.attributes),
            next_event_id=live.next_event_id,
            continued_to=new_id,
            parents=live.parents,
            search=dict(live.search),
            counters=dict(live.counters),
            can_threshold=live.can_threshold,
        )
        closed.write = live.write
        self.add_history(
            closed,
            flow_closed=pb.FlowClosedHistoryEvent(
                flow_status=pb.FLOW_STATUS_CONTINUED_AS_NEW,
                continued_to_run_id=new_id,
                sticky_app_worker_id=live.sticky,
            ),
        )
        self.run_seq += 1
        live.run_id = new_id
        live.seq = self.run_seq
        live.start_ts = now()
        live.next_event_id = 1
        live.write = RunWrite(channels_moved_from=old_id)
        for key, value in live.attributes.items():
            live.write.set_attribute(key, value.SerializeToString())
        self.runs[old_id] = closed
        self.runs[new_id] = live
        self.flows[live.flow_id].append(new_id)
        for ready_key in [k for k in self.ready if k[0] == old_id]:
            del self.ready[ready_key]
            self.ready[(new_id, ready_key[1])] = None
        for inflight in self.inflight.values():
            if inflight.run_id == old_id:
                inflight.run_id = new_id
        self.rekey_schedules(old_id, new_id)
        self.add_history(
            live,
            flow_started_or_continued=pb.FlowStartedOrContinuedHistoryEvent(
                flow_execution_id=pb.FlowExecutionID(flow_id=live.flow_id, run_id=new_id),
                flow_type=live.flow_type,
                flow_config=live.config,
                continued_start=pb.FlowContinuedStart(
                    previous_run_id=old_id,
                    steps_to_start=[mv for mv, _ in live.queue],
                    attributes=[pb.KV(key=k, value=v) for k, v in live.attributes.items()],
                    completed_steps=live.results,
                    sticky_app_worker_id=live.sticky,
                ),
            ),
        )
        closed_write = closed.write
        closed_header = closed.header_json()
        closed_write.run_row = closed.row(closed_header)
        # The old row's references were the live run's; the new row has none stored yet.
        closed.stored_refs, live.stored_refs = live.stored_refs, frozenset()
        closed_refs = self.row_refs(closed, closed_write)
        live_write = live.write
        live.write = RunWrite()
        live_header = live.header_json()
        live_write.run_row = live.row(live_header)
        live_refs = self.row_refs(live, live_write)
        self.store.commit_many([(old_id, closed_write), (new_id, live_write)])
        closed.stored_header = (old_id, closed_header)
        live.stored_header = (new_id, live_header)
        closed.stored_refs, live.stored_refs = closed_refs, live_refs
        closed.write = RunWrite()
        self.notifier.notify(("flow", live.flow_id))
        self.loop.call_soon(self.pump)
        _LOG.info("flow %s continued as new: %s -> %s", live.flow_id, old_id, new_id)
