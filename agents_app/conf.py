"""The apps' own settings: one namespaced dict, ``settings.DEXAGENTS``, with defaults.

A host project sets only the keys it wants to change; every key it omits takes the default
below, so ``INSTALLED_APPS`` plus an empty (or missing) ``DEXAGENTS`` is a working set-up on one
machine: the embedded Dex engine on ``127.0.0.1:8801``, the demo model on ``127.0.0.1:8811``,
state under ``<BASE_DIR>/var`` (``BASE_DIR`` of the host's settings, else the working
directory). The dexagents project itself (``dexagents_site/settings.py``) fills the dict from
the environment; these defaults are the same as its zero-setup ones.

Keys (units in the names' comments):
    DEX_SERVER_ADDRESS (str, ``host:port`` of the Dex FlowService), EMBEDDED_ENGINE (bool,
    ``manage.py dev`` starts the engine), DEX_PORT (int), DEX_DB_PATH (path), ENGINE_SYNC
    (``"normal"`` or ``"full"``, the embedded engine's ``--sync``), WEB_PORT (int),
    ENGINE_TIMEOUT (seconds a request waits for one Dex call before a 503), VAR_DIR (path of
    the apps' run-time files), BLOB_CACHE_DIR (path), BLOB_CACHE_BYTES (int),
    DEMO_MODEL_PORT (int), DEMO_MODEL_API_BASE (URL of the demo model's ``/v1``),
    WORKER_HEARTBEAT_DIR (path of the per-worker beat files when there is no Redis),
    WORKER_HEARTBEAT_MAX_AGE (seconds), WORKER_NAME (this worker's heartbeat ID; host-pid when
    empty), WEB_PROCESSES and WORKERS (process counts of ``manage.py dev``), METRICS_TOKEN
    (bearer token for ``/metrics``; loopback only when empty), LOG_FORMAT (``plain`` or
    ``json``), REDIS_URL (the Redis that carries worker heartbeats; none when empty),
    EVENTS_STREAM_CAPACITY_BYTES, EVENTS_SEND_QUEUE_FRAMES, EVENTS_SEND_QUEUE_BYTES,
    MAX_QUEUED_MESSAGES, MAX_API_TOKENS_PER_USER (ints), API_PATH_PREFIX (the URL prefix
    whose error answers are JSON, ``/api/``), MCP_MAX_PROCESSES (stdio MCP server processes
    one Dex worker runs at once), TOOL_IMAGE_MAX_BYTES and TOOL_RESULT_IMAGES_MAX_BYTES (the
    largest image, and the most image bytes, one tool result sends to a model that accepts
    images; decoded bytes), ELICITATION_TIMEOUT (seconds a user may take to answer an MCP
    server's question during a tool call, unless the agent sets its own),
    SUBAGENT_MAX_DEPTH and SUBAGENT_MAX_CHILDREN_PER_TURN (how deep subagents nest, and how
    many subagent calls one turn may start; issue 29), MAX_WAIT_SECONDS
    (the longest ``?wait=`` a request may ask for: send-and-wait and the snapshot's long-poll),
    THROTTLE_READS and THROTTLE_WRITES (per-user REST rates, ``agents_app.api.throttling``),
    MAX_ACTIVE_SESSIONS_PER_USER (running turns per user; a message over it waits in the
    outbox, ``agents_app.sessions.outbox_holds.active_limit_reached``; 0: no cap),
    SNAPSHOT_SHORT_PATH (bool: unchanged sessions' snapshot reads skip Django's request cycle,
    ``agents_app.api.snapshot_asgi``), WEBSOCKET_DB_TIMEOUT (seconds a websocket handshake's
    database lookup may take before that socket closes with 4503,
    ``agents_app.websocket_db``), PUBLIC_URL (the site's address as people reach it, used
    for links in emails and webhooks), WEBHOOKS_ALLOW_PRIVATE (bool: webhooks may call
    private, loopback and link-local addresses), APPROVAL_REMINDER_BEFORE (seconds before an
    approval's deadline its reminder email goes; 0: none).

Keys the apps do not know are kept as given (the dexagents project keeps knobs of its own
development stack in the same dict).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

#: Keys whose default does not depend on another key.
_FIXED_DEFAULTS: dict[str, Any] = {
    "DEX_SERVER_ADDRESS": "127.0.0.1:8801",
    "EMBEDDED_ENGINE": True,
    "DEX_PORT": 8801,
    "ENGINE_SYNC": "normal",
    "WEB_PORT": 8000,
    "ENGINE_TIMEOUT": 5,
    "BLOB_CACHE_BYTES": 64 * 1024 * 1024,
    "DEMO_MODEL_PORT": 8811,
    "WORKER_HEARTBEAT_MAX_AGE": 4,
    "EVENTS_STREAM_CAPACITY_BYTES": 10 * 1024 * 1024,
    "EVENTS_SEND_QUEUE_FRAMES": 1000,
    "EVENTS_SEND_QUEUE_BYTES": 1024 * 1024,
    "MAX_QUEUED_MESSAGES": 20,
    "MAX_API_TOKENS_PER_USER": 50,
    "MCP_MAX_PROCESSES": 32,
    "TOOL_IMAGE_MAX_BYTES": 1024 * 1024,
    "TOOL_RESULT_IMAGES_MAX_BYTES": 1024 * 1024,
    "ELICITATION_TIMEOUT": 600,
    "SUBAGENT_MAX_DEPTH": 3,
    "SUBAGENT_MAX_CHILDREN_PER_TURN": 5,
    "MAX_WAIT_SECONDS": 300,
    "WEBSOCKET_DB_TIMEOUT": 10,
    "THROTTLE_READS": "3000/min",
    "THROTTLE_WRITES": "600/min",
    "MAX_ACTIVE_SESSIONS_PER_USER": 10,
    "API_PATH_PREFIX": "/api/",
    "WEB_PROCESSES": 1,
    "WORKERS": 1,
    "WORKER_NAME": "",
    "METRICS_TOKEN": "",
    "LOG_FORMAT": "plain",
    "REDIS_URL": "",
    "SNAPSHOT_SHORT_PATH": True,
    "GENERATE_TITLES": True,
    "PUBLIC_URL": "http://127.0.0.1:8000",
    "WEBHOOKS_ALLOW_PRIVATE": False,
    "APPROVAL_REMINDER_BEFORE": 600,
}

#: Keys whose default is derived from the keys already resolved (in this order).
_DERIVED_DEFAULTS: dict[str, Callable[[Mapping[str, Any]], Any]] = {
    "VAR_DIR": lambda _: Path(getattr(settings, "BASE_DIR", None) or Path.cwd()) / "var",
    "DEX_DB_PATH": lambda knobs: Path(knobs["VAR_DIR"]) / "dex_dev_server.sqlite3",
    "BLOB_CACHE_DIR": lambda knobs: Path(knobs["VAR_DIR"]) / "dex-cache" / "web",
    "DEMO_MODEL_API_BASE": lambda knobs: f"http://127.0.0.1:{knobs['DEMO_MODEL_PORT']}/v1",
    "WORKER_HEARTBEAT_DIR": lambda knobs: Path(knobs["VAR_DIR"]) / "run" / "workers",
}

#: Every key the apps read.
KNOWN_KEYS = frozenset(_FIXED_DEFAULTS) | frozenset(_DERIVED_DEFAULTS)


def dexagents_settings() -> dict[str, Any]:
    """The host's ``settings.DEXAGENTS`` merged over the defaults; a new dict on every call.

    Read on every call (not cached), so ``override_settings(DEXAGENTS=...)`` in tests and a
    settings change between processes are seen.

    Raises:
        ImproperlyConfigured: ``DEXAGENTS`` is not a dict.
    """
    given = getattr(settings, "DEXAGENTS", None) or {}
    if not isinstance(given, Mapping):
        raise ImproperlyConfigured("settings.DEXAGENTS must be a dict.")
    knobs: dict[str, Any] = {**_FIXED_DEFAULTS, **given}
    for key, derive in _DERIVED_DEFAULTS.items():
        if key not in knobs:
            knobs[key] = derive(knobs)
    return knobs


def dexagents_setting(name: str) -> Any:
    """One key of ``dexagents_settings()``.

    Raises:
        ImproperlyConfigured: ``name`` has no default (see ``KNOWN_KEYS``) and the host did
            not set it, or ``settings.DEXAGENTS`` is invalid.
    """
    knobs = dexagents_settings()
    if name not in knobs:
        raise ImproperlyConfigured(f"settings.DEXAGENTS[{name!r}] is not set and has no default.")
    return knobs[name]
