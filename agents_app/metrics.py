"""Prometheus metrics of the platform (``/metrics``), all named ``dexagents_*``.

Metrics (prometheus_client adds ``_total`` to counters):

- ``dexagents_turns_started_total``, ``dexagents_turns_completed_total``,
  ``dexagents_turns_failed_total``: turns, counted by the Dex worker's RunModel Step (started:
  a turn's first model call, first attempt; completed: a model call that ended the turn;
  failed: the last allowed attempt of a model call failed, so the turn failed).
- ``dexagents_tool_calls_total{effect, status}``: tool calls the worker ran, by effect
  (``read``, ``idempotent_write``, ...) and status (``succeeded``, ``failed``: the tool said
  it failed, ``error``: transport or server error, an attempt the Step may retry).
- ``dexagents_approvals_pending``: tool calls waiting for approval now (the Django approvals
  index, read at scrape time).
- ``dexagents_event_relay_lag_seconds``: histogram of the time from an AgentEvent's write to
  the Stream to the websocket relay reading it for a client (events replayed on a resume
  count too, with their age).
- ``dexagents_event_stream_reads_total``: ``ReadStream`` long polls the process made on
  sessions' AgentEvents Streams for its readers (websockets, SSE, waits). Each session's
  Stream is read once per web process however many clients follow it
  (``agents_app.live.session_feed``), plus the reads of a client catching up from an old token.
- ``dexagents_worker_task_slots_in_use`` / ``dexagents_worker_task_slots``: Dex Step slots
  busy / configured, summed over live worker processes, sampled every second.

Several processes (web, Dex worker, Celery) each count their own. With
``PROMETHEUS_MULTIPROC_DIR`` set (``manage.py dev`` sets it to ``VAR_DIR/run/prometheus`` and
empties it at start) every process writes its values there and ``/metrics`` on any web process
reports the sum of all processes of the host; without it ``/metrics`` reports only the web
process that answers, and the Dex worker can serve its own on ``--metrics-port``. The variable
must be set before the process starts (prometheus_client reads it at import).
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
from collections.abc import Iterable
from pathlib import Path

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agents_app.conf import dexagents_setting

TURNS_STARTED = Counter("dexagents_turns_started", "Turns started (first model call).")
TURNS_COMPLETED = Counter("dexagents_turns_completed", "Turns completed by the model.")
TURNS_FAILED = Counter("dexagents_turns_failed", "Turns failed (model call out of attempts).")
TOOL_CALLS = Counter(
    "dexagents_tool_calls", "Tool calls run by the Dex worker.", ["effect", "status"]
)
EVENT_RELAY_LAG = Histogram(
    "dexagents_event_relay_lag_seconds",
    "Seconds from an AgentEvent's Stream write to the websocket relay reading it.",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
)
EVENT_STREAM_READS = Counter(
    "dexagents_event_stream_reads",
    "ReadStream long polls made on sessions' AgentEvents Streams for their readers.",
)
WORKER_TASK_SLOTS_IN_USE = Gauge(
    "dexagents_worker_task_slots_in_use", "Dex Step slots busy in the Dex workers.",
    multiprocess_mode="livesum",
)
WORKER_TASK_SLOTS = Gauge(
    "dexagents_worker_task_slots", "Dex Step slots configured in the Dex workers.",
    multiprocess_mode="livesum",
)


class ApprovalsPendingCollector(Collector):
    """``dexagents_approvals_pending``: pending rows of the approvals index, read per scrape."""

    def collect(self) -> Iterable[Metric]:
        from agents_app.models import ApprovalRequest

        try:
            count = ApprovalRequest.objects.filter(state=ApprovalRequest.State.PENDING).count()
        except DatabaseError:
            return  # the database is down (/readyz says so); the other metrics still answer
        yield GaugeMetricFamily(
            "dexagents_approvals_pending", "Tool calls waiting for approval.", value=count
        )


_LIVE_GAUGE_FILE = re.compile(r"^gauge_live\w*_(?P<pid>\d+)\.db$")


def _forget_dead_processes(directory: Path) -> None:
    """Drop the live-gauge files of processes that no longer run (a killed Dex worker).

    prometheus_client keeps a process's ``livesum`` gauges until ``mark_process_dead(pid)``;
    nothing calls it for a SIGKILLed process, so the scrape does. The directory is per host
    (process IDs name its files), so the IDs are this host's.
    """
    for entry in directory.glob("gauge_live*.db"):
        match = _LIVE_GAUGE_FILE.match(entry.name)
        if match is None:
            continue
        pid = int(match["pid"])
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            multiprocess.mark_process_dead(pid, str(directory))
        except PermissionError:
            continue  # alive, under another user


def metrics_registry() -> CollectorRegistry:
    """The registry a scrape reads: every process's files in multiprocess mode, else this
    process's default registry; plus the approvals gauge (read from the database)."""
    registry = CollectorRegistry()
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        _forget_dead_processes(Path(directory))
        multiprocess.MultiProcessCollector(registry)
    else:
        for collector in list(REGISTRY._collector_to_names):
            registry.register(collector)
    registry.register(ApprovalsPendingCollector())
    return registry


def _loopback(address: str) -> bool:
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def metrics_access_allowed(*, request: HttpRequest) -> bool:
    """Whether ``request`` may read ``/metrics``.

    With ``DEXAGENTS["METRICS_TOKEN"]`` set: only ``Authorization: Bearer <that token>``
    (compared in constant time), from anywhere. Without it: only a direct loopback peer
    (``REMOTE_ADDR`` 127.0.0.0/8 or ::1) whose request carries no ``X-Forwarded-For`` (a
    reverse proxy on the same host would otherwise make every client look local).
    """
    token = str(dexagents_setting("METRICS_TOKEN") or "")
    if token:
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(given.strip(), token)
    if "X-Forwarded-For" in request.headers:
        return False
    return _loopback(str(request.META.get("REMOTE_ADDR", "")))


def metrics_view(request: HttpRequest) -> HttpResponse:
    """``GET /metrics``: the Prometheus text format; 404 to callers not allowed
    (``metrics_access_allowed``), so the endpoint's existence is not advertised."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD"})
    if not metrics_access_allowed(request=request):
        return HttpResponse("Not found.\n", status=404, content_type="text/plain")
    return HttpResponse(generate_latest(metrics_registry()), content_type=CONTENT_TYPE_LATEST)
