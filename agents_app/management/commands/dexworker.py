"""``python manage.py dexworker``: the Dex AsyncWorker serving the shared agent session Flow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandParser

from agents_app.conf import dexagents_settings

if TYPE_CHECKING:
    from agents_app.worker.heartbeat import WorkerHeartbeat

#: Seconds between two beats; ``/healthz`` reads a beat older than
#: ``DEXAGENTS["WORKER_HEARTBEAT_MAX_AGE"]`` (4 s) as a dead worker.
_HEARTBEAT_SECONDS = 1.0

_log = logging.getLogger("agents_app.dexworker")

#: The start of dex-python-sdk's error when one LoadBlobs answer did not carry every blob a
#: task needs (the embedded engine's answers stop short of 4 MiB; dex_dev_server._blobs).
HYDRATION_SHORTFALL = "LoadBlobs omitted blob"


class HydrationShortfallFilter(logging.Filter):
    """Logs the SDK's "invocation failed" for a task whose blobs arrived in parts at INFO,
    without the traceback: nothing ran, the worker cached what it got, and the engine hands
    the task out again without counting an attempt. Other records pass unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, RuntimeError) and str(error).startswith(HYDRATION_SHORTFALL):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = "Task loaded part of its blobs (%s); it comes again", (
                str(error),)
            record.exc_info, record.exc_text = None, None
        return True


def _sweep_outbox() -> None:
    from agents_app import task_queue

    task_queue.outbox_sweep_schedule()


class Command(BaseCommand):
    help = (
        "Serve the AgentSession and AgentSchedule Flows in pull mode against "
        "DEX_SERVER_ADDRESS until SIGTERM or SIGINT; liveness is a per-worker heartbeat "
        "(Redis or a file) that /healthz and /readyz read."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--max-concurrent-tasks", type=int, default=32,
            help="Step slots of this worker (ARCHITECTURE.md, 'Worker slots').",
        )
        parser.add_argument(
            "--metrics-port", type=int, default=0,
            help="Serve this worker's Prometheus metrics on this port (0: off; with "
            "PROMETHEUS_MULTIPROC_DIR the web /metrics reports them already).",
        )
        parser.add_argument(
            "--metrics-host", default="127.0.0.1",
            help="Address --metrics-port binds (default loopback only).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        logging.getLogger("dex._pull_worker").addFilter(HydrationShortfallFilter())
        if options["metrics_port"]:
            from prometheus_client import start_http_server

            start_http_server(options["metrics_port"], addr=options["metrics_host"])
        asyncio.run(self._serve(max_concurrent_tasks=options["max_concurrent_tasks"]))

    async def _serve(self, *, max_concurrent_tasks: int) -> None:
        # Imported here: gRPC objects must be created inside the running event loop.
        from dex import (
            AsyncWorker,
            BlobCacheConfig,
            PullWorkerOptions,
            Registry,
            WorkerOptions,
            open_blob_cache,
        )

        from agents_app.gateway import engine_connection
        from agents_app.services.subagents import PlatformSubagents
        from agents_app.sessions.session_index import SessionIndexObserver
        from agents_app.worker.flow import build_flow
        from agents_app.worker.model_calls import model_calls_warm
        from dex_agents import AgentCodecRegistry
        from dex_agents._worker_tuning import cache_sdk_version
        from mcp_registry.client import McpClientPool
        from mcp_registry.tasks import (
            http_session_record,
            process_status_record,
            tools_list_changed_enqueue,
        )

        cache_sdk_version()
        knobs = dexagents_settings()
        address = knobs["DEX_SERVER_ADDRESS"]
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        # LiteLLM's import, tokenizer and first-call imports take seconds of CPU. Loaded
        # lazily, they ran inside the first RunModel Step on this event loop, and every RPC
        # sent meanwhile (the first message POST after `make run` said ready) waited for them,
        # past the web's 5 s engine timeout on a loaded machine. Loaded here, while the rest
        # is set up and before the worker registers with the engine, so the engine sends
        # nothing to a worker that is not warm.
        warming = asyncio.create_task(model_calls_warm())

        # A server that announces a changed tool list gets its catalogue rediscovered; stdio
        # server processes are reported to the admin (mcp_registry.McpServerProcess), HTTP
        # sessions recorded so a later worker can end what this one leaves if it is killed;
        # the connections of stopped sessions close.
        pool = McpClientPool(
            on_tools_list_changed=tools_list_changed_enqueue,
            on_process_status=process_status_record,
            on_http_session=http_session_record,
            sessions_ended=_sessions_ended,
            max_processes=knobs["MCP_MAX_PROCESSES"],
        )
        observer = SessionIndexObserver()
        flow = build_flow(
            pool=pool,
            observer=observer,
            session_client=engine_connection.session_client,
            subagents=PlatformSubagents(),
        )
        # Schedules (issue 29): one AgentSchedule Flow per enabled schedule, its database work
        # from services.schedule_runs.
        from agents_app.services.schedule_runs import SCHEDULE_WORK
        from agents_app.worker.schedule_flow import build_schedule_flow

        schedule_flow = build_schedule_flow(work=SCHEDULE_WORK)
        registry = Registry(
            [flow, schedule_flow], AgentCodecRegistry(), allow_async_handlers=True
        )
        cache_dir = Path(knobs["VAR_DIR"]) / "dex-cache" / "worker"
        cache_dir.mkdir(parents=True, exist_ok=True)
        cache = open_blob_cache(BlobCacheConfig(str(cache_dir), 64 * 1024 * 1024))
        worker_options = WorkerOptions(
            server_address=address,
            pull=PullWorkerOptions(max_concurrent_tasks=max_concurrent_tasks),
        )
        from agents_app.metrics import WORKER_TASK_SLOTS
        from agents_app.worker.heartbeat import WorkerHeartbeat

        heartbeat = WorkerHeartbeat()
        WORKER_TASK_SLOTS.set(max_concurrent_tasks)
        try:
            await warming
            if stop.is_set():  # SIGTERM while warming up: never register
                return
            async with AsyncWorker(registry, cache, worker_options) as worker:
                serving = asyncio.create_task(worker.start())
                registered = asyncio.create_task(worker.wait_pull_registered())
                await asyncio.wait({serving, registered}, return_when=asyncio.FIRST_COMPLETED)
                if serving.done():
                    registered.cancel()
                    await serving  # start() failed; its error explains why
                    return
                self.stdout.write(
                    f"dexworker ready: serving AgentSession from {address} "
                    f"(worker {heartbeat.worker})"
                )
                self.stdout.flush()
                beating = asyncio.create_task(_beat(heartbeat, worker))
                # Messages, decisions and turn cancels kept while no worker answered go out
                # now, not after their task's next backoff (up to 30 s) or the periodic sweep:
                # a cancel that waited out a restart must reach the turn it was meant for
                # before that turn finishes.
                sweeping = asyncio.create_task(asyncio.to_thread(_sweep_outbox))
                # Index writes a previous worker lost (killed between a Step and its write)
                # are repaired from Dex; the tasks it left are being redelivered meanwhile.
                # MCP sessions a killed predecessor on this host left open are ended.
                reconciling = asyncio.create_task(_reconcile_index())
                ending = asyncio.create_task(_end_orphaned_mcp_sessions())
                # Every enabled schedule keeps one running Flow (one saved while the engine
                # was down gets it here).
                scheduling = asyncio.create_task(_reconcile_schedules())
                await asyncio.wait({serving, asyncio.create_task(stop.wait())},
                                   return_when=asyncio.FIRST_COMPLETED)
                for task in (beating, reconciling, ending, sweeping, scheduling):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                await worker.stop()
                await serving
        finally:
            try:
                await heartbeat.forget()
            except Exception as error:  # Redis gone: the beat expires within the max age
                _log.warning("Could not remove the heartbeat of %s: %s", heartbeat.worker, error)
            WORKER_TASK_SLOTS.set(0)
            await observer.aclose()
            await pool.aclose()
            # The Dex client the tool Steps asked MCP servers' questions through.
            from agents_app.gateway.engine_connection import engine_connections_close

            await engine_connections_close()
        self.stdout.write("dexworker stopped")


async def _reconcile_index() -> None:
    """Reconcile the Django session and approvals index with Dex once, after start."""
    import logging

    from asgiref.sync import sync_to_async

    from agents_app.sessions.index_reconcile import session_index_reconcile

    log = logging.getLogger("agents_app.dexworker")
    try:
        result = await sync_to_async(session_index_reconcile, thread_sensitive=False)()
    except Exception as error:
        log.warning("Index reconciliation at start failed (%s); Celery beat retries it", error)
    else:
        log.info("Index reconciled at start: %s", result)


#: Seconds between two reconciliations of the schedules' Flows.
SCHEDULES_RECONCILE_SECONDS = 60.0


async def _reconcile_schedules() -> None:
    """Start the Flow of every enabled schedule that has none, at start and then every
    ``SCHEDULES_RECONCILE_SECONDS`` (``services.schedules.schedules_reconcile``)."""
    from asgiref.sync import sync_to_async

    from agents_app.services.schedules import schedules_reconcile

    while True:
        try:
            result = await sync_to_async(schedules_reconcile, thread_sensitive=False)()
        except Exception as error:
            _log.warning("Schedules' Flows could not be reconciled: %s", error)
        else:
            if result.started or result.failed:
                _log.info("Schedules reconciled: %s", result)
        await asyncio.sleep(SCHEDULES_RECONCILE_SECONDS)


async def _sessions_ended(session_ids: set[str]) -> set[str]:
    """Which of ``session_ids`` have stopped, per the Django index (the MCP pool closes their
    connections)."""
    from asgiref.sync import sync_to_async

    from agents_app.selectors.session_reads import sessions_stopped

    return await sync_to_async(sessions_stopped, thread_sensitive=False)(session_ids=session_ids)


async def _end_orphaned_mcp_sessions() -> None:
    """End the Streamable-HTTP MCP sessions that dead workers on this host left open."""
    import logging
    import socket

    from mcp_registry.services import http_sessions_orphaned_close

    log = logging.getLogger("agents_app.dexworker")
    try:
        ended = await http_sessions_orphaned_close(host=socket.gethostname())
    except Exception as error:
        log.warning("Could not end the MCP sessions dead workers left open: %s", error)
    else:
        if ended:
            log.info("Ended %d MCP HTTP session(s) that dead workers left open", ended)


def _slots_in_use(worker: Any) -> int | None:
    """Busy Step slots of ``worker``, or None when the SDK does not show them.

    dex-python-sdk 1.23.0 keeps the count in its pull runtime's private ``_busy_tasks``; there
    is no public accessor, so a missing attribute (another SDK version) reads as unknown.
    """
    busy = getattr(getattr(worker, "_pull", None), "_busy_tasks", None)
    return busy if isinstance(busy, int) else None


async def _beat(heartbeat: WorkerHeartbeat, worker: Any) -> None:
    """Beat every second while the worker serves (read by ``/healthz`` and ``/readyz``), and
    sample the busy Step slots for ``dexagents_worker_task_slots_in_use``.

    The beat runs on the event loop itself, not in a thread: a thread pool busy with index
    writes must not delay it, and a loop that stops turning should stop the beat. A beat that
    fails (Redis unreachable) is logged and tried again a second later.
    """
    from agents_app.metrics import WORKER_TASK_SLOTS_IN_USE

    failing = False
    while True:
        try:
            await heartbeat.beat()
        except Exception as error:
            if not failing:
                _log.warning("Heartbeat of %s failed: %s", heartbeat.worker, error)
            failing = True
        else:
            failing = False
        busy = _slots_in_use(worker)
        if busy is not None:
            WORKER_TASK_SLOTS_IN_USE.set(busy)
        await asyncio.sleep(_HEARTBEAT_SECONDS)
