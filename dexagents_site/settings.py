"""Django settings for dexagents, driven by the environment.

Every value has a safe zero-setup default: ``DEBUG`` off, a random secret key kept under
``var/``, SQLite in WAL mode under ``var/``, the in-memory channel layer, kombu's filesystem
transport as the Celery broker, and the embedded Dex engine on ``127.0.0.1:8801``.
Production sets ``SECRET_KEY``, ``ALLOWED_HOSTS``, ``DATABASE_URL``, ``REDIS_URL`` and
``DEX_SERVER_ADDRESS``.

Parsing is strict: a boolean or integer that does not parse raises
``ImproperlyConfigured`` instead of silently falling back (Healthchecks ``hc/settings.py``).

One module past 600 lines because Django reads one settings module, and every setting sits
beside the environment variable and comment that explain it.

Environment variables:
    DEBUG (bool, default false), SECRET_KEY (default: a random key generated once and kept in
    ``DEXAGENTS_VAR_DIR/secret_key``), ALLOWED_HOSTS (comma list, default the localhost
    names), PORT (web, 8000),
    CSRF_TRUSTED_ORIGINS (comma list), DATABASE_URL, REDIS_URL, DEX_SERVER_ADDRESS,
    DEX_PORT (default 8801), DEXAGENTS_ENGINE_SYNC (normal|full, default normal),
    DEMO_MODEL_PORT (default 8811), DEXAGENTS_VAR_DIR,
    DEXAGENTS_WEB_PROCESSES and DEXAGENTS_WORKERS (processes ``manage.py dev`` runs, 1-64,
    default 1),
    DEXAGENTS_ENGINE_TIMEOUT (seconds, default 5), DEXAGENTS_BLOB_CACHE_BYTES,
    DEXAGENTS_EVENTS_STREAM_CAPACITY_BYTES, DEXAGENTS_EVENTS_SEND_QUEUE_FRAMES,
    DEXAGENTS_EVENTS_SEND_QUEUE_BYTES, DEXAGENTS_MAX_QUEUED_MESSAGES (default 20),
    DEXAGENTS_SUBAGENT_MAX_DEPTH (default 3), DEXAGENTS_SUBAGENT_MAX_CHILDREN_PER_TURN (5),
    DEXAGENTS_MAX_API_TOKENS_PER_USER (default 50), DEXAGENTS_ELICITATION_TIMEOUT (seconds a
    user may take to answer an MCP server's question, default 600),
    DEXAGENTS_MAX_WAIT_SECONDS (the longest ?wait= of a request, default 300),
    DEXAGENTS_THROTTLE_READS / DEXAGENTS_THROTTLE_WRITES (per-user REST rates, default
    3000/min and 600/min; "off" for none), DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER (running
    turns per user, default 10; 0 for no cap),
    LOG_LEVEL (default INFO), DEXAGENTS_LOG_FORMAT (plain|json, default plain),
    DEXAGENTS_METRICS_TOKEN (bearer token for /metrics; unset: loopback callers only),
    DEXAGENTS_WORKER_NAME (heartbeat ID of a Dex worker; default host-pid),
    PROMETHEUS_MULTIPROC_DIR (read by prometheus_client); with DEBUG=false also
    SESSION_COOKIE_SECURE, CSRF_COOKIE_SECURE (default true), SECURE_SSL_REDIRECT,
    SECURE_HSTS_SECONDS, SECURE_PROXY_SSL_HEADER (default off).
"""

import contextlib
import os
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import environ
from csp.constants import NONE, SELF
from django.core.exceptions import ImproperlyConfigured
from kombu import Exchange, Queue

from agents_app.rates import rate_or_none

BASE_DIR = Path(__file__).resolve().parent.parent

env = environ.Env()

_TRUE_STRINGS = frozenset({"1", "true", "yes", "on"})
_FALSE_STRINGS = frozenset({"0", "false", "no", "off"})


def env_bool(name: str, default: bool) -> bool:
    """Read a boolean variable; raise ImproperlyConfigured for anything but a known word."""
    raw = env.str(name, default="").strip().lower()
    if raw == "":
        return default
    if raw in _TRUE_STRINGS:
        return True
    if raw in _FALSE_STRINGS:
        return False
    raise ImproperlyConfigured(f"{name} must be one of true/false/1/0/yes/no/on/off, not {raw!r}")


def env_int(name: str, default: int, *, minimum: int = 0, maximum: int = 2**31 - 1) -> int:
    """Read an integer variable within [minimum, maximum]; raise ImproperlyConfigured."""
    raw = env.str(name, default="").strip()
    if raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be an integer, not {raw!r}") from None
    if not minimum <= value <= maximum:
        raise ImproperlyConfigured(f"{name} must be between {minimum} and {maximum}, not {value}")
    return value


def env_rate(name: str, default: str) -> str:
    """Read a per-user request rate (``<count>/<s|min|hour|day>`` or ``off``); raise
    ImproperlyConfigured."""
    raw = env.str(name, default=default).strip() or default
    try:
        rate_or_none(raw)
    except ValueError as error:
        raise ImproperlyConfigured(f"{name}: {error}") from None
    return raw


def env_list(name: str, default: list[str]) -> list[str]:
    """Read a comma-separated list; blank items are dropped."""
    raw = env.str(name, default="")
    if raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


VAR_DIR = Path(env.str("DEXAGENTS_VAR_DIR", default=str(BASE_DIR / "var"))).resolve()
VAR_DIR.mkdir(parents=True, exist_ok=True)

# Off unless asked for (DEBUG=true): the zero-setup run is safe to expose as it is.
DEBUG = env_bool("DEBUG", False)

# Once a published default; refused so a copied .env cannot bring it back.
_DEV_SECRET_KEY = "django-insecure-dexagents-development-key-never-use-in-production"
_SECRET_KEY_BYTES = 48


def secret_key_from_file(path: Path) -> str:
    """Return the secret key stored in ``path``, creating it first when it is missing.

    The key is random (``secrets.token_urlsafe``, 48 bytes) and written once, readable by its
    owner only (mode 0600). Processes starting together agree on one key: each writes a
    private file and links it into place, and whoever loses the race reads the winner's.
    The key is never printed.

    Raises:
        ImproperlyConfigured: The file exists but is empty.
    """
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = tempfile.mkstemp(prefix=".secret_key.", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_urlsafe(_SECRET_KEY_BYTES) + "\n")
            with contextlib.suppress(FileExistsError):
                os.link(scratch, path)
        finally:
            os.unlink(scratch)
    key = path.read_text().strip()
    if not key:
        raise ImproperlyConfigured(f"{path} is empty: delete it or set SECRET_KEY.")
    return key


# A deployment with several hosts sets SECRET_KEY; one host shares the key file in VAR_DIR.
SECRET_KEY = env.str("SECRET_KEY", default="").strip() or secret_key_from_file(
    VAR_DIR / "secret_key"
)
if SECRET_KEY == _DEV_SECRET_KEY:
    raise ImproperlyConfigured(
        "SECRET_KEY is the old published development key: set another, or unset it so a "
        "random key is kept in DEXAGENTS_VAR_DIR/secret_key."
    )

ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    # Hashed API tokens (django-rest-knox); the model is agents_app.ApiToken (KNOX_TOKEN_MODEL).
    "knox",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "django_filters",
    "channels",
    # django-csp: the Content-Security-Policy header and its settings checks.
    "csp",
    "django_celery_beat",
    "mcp_registry",
    "agents_app",
]

MIDDLEWARE = [
    # First, so Django's own HTML error pages under /api/ (no route, 500) become JSON.
    "agents_app.rest_errors.ApiJsonErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    # Static files from the ASGI app itself, so `make run` needs no proxy (issue 9).
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # After WhiteNoise: the header is for pages, not for the static files it answers.
    "agents_app.pages.content_security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

# A strict Content-Security-Policy on every page (django-csp 4): scripts, styles, fonts and
# fetches only from this site; no inline script or style, no plugins, no framing. The
# middleware adds the page's own ws:// and wss:// origin to connect-src. img-src allows data:
# for Django admin's and the pages' inline SVG icons in CSS. The API docs pages send their own
# wider policy (agents_app.api.schema.DOCS_CONTENT_SECURITY_POLICY), which is kept.
CONTENT_SECURITY_POLICY = {
    # The JSON API is not a page: no policy there, which also keeps its answers the same as
    # the snapshot short path's (agents_app.api.snapshot_asgi), which sends none.
    "EXCLUDE_URL_PREFIXES": ["/api/v1/"],
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF],
        "img-src": [SELF, "data:"],
        "font-src": [SELF],
        "connect-src": [SELF],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    },
}

ROOT_URLCONF = "dexagents_site.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "agents_app.pages.context_processors.pending_approvals",
            ],
        },
    },
]

WSGI_APPLICATION = "dexagents_site.wsgi.application"
ASGI_APPLICATION = "dexagents_site.asgi.application"

# Database: SQLite in WAL mode with IMMEDIATE transactions by default, so the web
# process, the Dex worker and Celery can share it (reference/django-notes.md G4).
_SQLITE_OPTIONS = {
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=5000;",
    "transaction_mode": "IMMEDIATE",
    "timeout": 20,
}
if env.str("DATABASE_URL", default=""):
    # Checked before django-environ parses it: an unknown scheme would otherwise surface later
    # as Django's "isn't an available database backend". Only the scheme is named in the
    # error, since the rest may hold a password.
    _scheme = urlsplit(env.str("DATABASE_URL")).scheme
    if _scheme not in environ.Env.DB_SCHEMES:
        raise ImproperlyConfigured(
            "DATABASE_URL must be a database URL such as "
            "postgres://user:password@host:5432/name or sqlite:////path/db.sqlite3; "
            + (f"the scheme {_scheme!r} is not one" if _scheme else "it has no scheme")
        )
    _database: dict[str, Any] = env.db_url("DATABASE_URL")
else:
    _database = {"ENGINE": "django.db.backends.sqlite3", "NAME": VAR_DIR / "db.sqlite3"}
if _database["ENGINE"] == "django.db.backends.sqlite3":
    # Also for sqlite:/// URLs: several processes share the file.
    _database["OPTIONS"] = {**_SQLITE_OPTIONS, **_database.get("OPTIONS", {})}
# No persistent connections: under ASGI each request (and each sync_to_async call) may run on
# another thread, and a connection kept per thread outlives its thread's work (Django ticket
# #33497), so an ASGI process would hold connections it no longer uses. One connection per unit
# of work is cheap on a local Postgres; a busy deployment puts PgBouncer (transaction mode) in
# front instead of persistent connections.
_database.setdefault("CONN_MAX_AGE", 0)
_database["CONN_HEALTH_CHECKS"] = True
DATABASES = {"default": _database}

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "static"
# WhiteNoise warns about a missing STATIC_ROOT on every start.
STATIC_ROOT.mkdir(exist_ok=True)
# WhiteNoise serves straight from the app and vendor folders, so no collectstatic step is
# needed before `make run` (or a deployment that skips it).
WHITENOISE_USE_FINDERS = True
# WhiteNoise 6.12 answers with a sync file iterator, which Django under ASGI consumes with a
# warning that changes nothing (reference/django-notes.md G7).
warnings.filterwarnings(
    "ignore", message="StreamingHttpResponse must consume synchronous iterators"
)

LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "pages:portal"
LOGOUT_REDIRECT_URL = "login"

# Redis is optional. When set it carries the channel layer (approval notices between processes),
# the Celery broker and result backend, and the Django cache, all in the one logical database the
# URL names (their keys do not collide: "asgi:*", "celery*"/"_kombu*", "dexagents:*").
REDIS_URL = env.str("REDIS_URL", default="").strip()
if REDIS_URL and not REDIS_URL.startswith(("redis://", "rediss://", "unix://")):
    raise ImproperlyConfigured(
        f"REDIS_URL must start with redis://, rediss:// or unix://, not {REDIS_URL[:10]!r}"
    )

if REDIS_URL:
    # Django's own backend (redis-py underneath); no extra package needed.
    CACHES: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "dexagents",
        }
    }
else:
    # Per process, like Django's default; the zero-setup run needs no shared cache.
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}

if REDIS_URL:
    CHANNEL_LAYERS: dict[str, dict[str, Any]] = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # No read timeout: a consumer waits on its channel for as long as it is idle, and
            # with redis-py 8 the default 5 s read timeout raised TimeoutError and closed every
            # websocket that had heard nothing for 5 s.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},
        }
    }
else:
    # Per process only: events from the worker reach websockets through the Dex
    # Stream, not through this layer (ARCHITECTURE.md "Live events").
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# MCP tool discovery waits on third-party servers, for up to a server's start-up and call
# timeouts when one hangs: it has a queue of its own, consumed by a worker of its own
# (`manage.py dev` starts one, deploy/ runs one), so the worker of the default queue (outbox
# deliveries, notices, housekeeping) never waits behind it. `discover_all_servers` only queues
# and stays on the default queue. A worker started without -Q consumes both queues.
CELERY_TASK_DEFAULT_QUEUE = "celery"
_discovery_queue = "discovery"
CELERY_TASK_QUEUES = tuple(
    Queue(name, Exchange(name), routing_key=name)
    for name in (CELERY_TASK_DEFAULT_QUEUE, _discovery_queue)
)
CELERY_TASK_ROUTES = {"mcp_registry.discover_server_tools": {"queue": _discovery_queue}}
if REDIS_URL:
    CELERY_BROKER_URL = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {}
    # Results of the few tasks that keep one (CELERY_TASK_IGNORE_RESULT is the default), kept
    # a day; with several hosts the filesystem is not shared, Redis is.
    CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_RESULT_EXPIRES = 24 * 3600
else:
    _celery_queue_dir = VAR_DIR / "celery" / "queue"
    _celery_processed_dir = VAR_DIR / "celery" / "processed"
    # Fanout state (worker control messages); kombu's default is ./control in the cwd.
    _celery_control_dir = VAR_DIR / "celery" / "control"
    for _celery_dir in (_celery_queue_dir, _celery_processed_dir, _celery_control_dir):
        _celery_dir.mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_URL = "filesystem://localhost//"
    # kombu's transport, writing each message file whole (agents_app/dev/kombu_filesystem.py).
    CELERY_BROKER_TRANSPORT = "agents_app.dev.kombu_filesystem:Transport"
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_celery_queue_dir),
        "data_folder_out": str(_celery_queue_dir),
        "processed_folder": str(_celery_processed_dir),
        "control_folder": str(_celery_control_dir),
        "store_processed": False,
        "polling_interval": 0.2,
    }

REST_FRAMEWORK = {
    "EXCEPTION_HANDLER": "agents_app.rest_errors.api_exception_handler",
    # DRF's parsers, with a nesting bound on JSON bodies (a deep body is a 400, not a 500).
    # JSON only (anything else is 415), refusing bodies nested past 64 levels with a 400.
    "DEFAULT_PARSER_CLASSES": ["agents_app.rest_errors.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # `Authorization: Bearer <key>`, and DRF's `Token <key>` (ARCHITECTURE.md "Auth").
        "agents_app.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # Per-user budgets for reads and writes (agents_app.api.throttling; DEXAGENTS_THROTTLE_*).
    "DEFAULT_THROTTLE_CLASSES": [
        "agents_app.api.throttling.UserReadRateThrottle",
        "agents_app.api.throttling.UserWriteRateThrottle",
    ],
    # Request bodies are JSON only (any other Content-Type answers 415): a form field is text,
    # so "0" or "" would not mean what the schema's types say.
    "DEFAULT_FILTER_BACKENDS": [
        "django_filters.rest_framework.DjangoFilterBackend",
        # A misspelt query parameter on a list endpoint answers 400 (agents_app.api.query).
        "agents_app.api.query.KnownQueryParametersFilter",
    ],
    "DEFAULT_SCHEMA_CLASS": "agents_app.api.schema.ApiAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "agents_app.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
}

# API tokens: django-rest-knox's storage (SHA-512 digest of the key, never the key) in
# agents_app.ApiToken, which adds a name and a public ID. Keys look like "dxa_" + 64 hex
# characters, so secret scanners can spot them; tokens never expire unless asked to.
KNOX_TOKEN_MODEL = "agents_app.ApiToken"
REST_KNOX = {
    "TOKEN_PREFIX": "dxa_",
    "TOKEN_TTL": None,
    "AUTO_REFRESH": False,
}

SPECTACULAR_SETTINGS = {
    "TITLE": "dexagents API",
    "DESCRIPTION": "Durable AI agent sessions on Dex.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    # Operations are tagged by the first path segment after /api/v1 (agents, approvals,
    # sessions) and their IDs read sessions_create, not v1_sessions_create.
    "SCHEMA_PATH_PREFIX": r"/api/v1",
    # Swagger UI and Redoc from drf-spectacular-sidecar's static files, never a CDN.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # validatorUrl null: Swagger UI would otherwise send the schema's URL to
    # validator.swagger.io for a badge.
    "SWAGGER_UI_SETTINGS": {"deepLinking": True, "validatorUrl": None},
    # The outbox's delivery states, one enum per choice set.
    "ENUM_NAME_OVERRIDES": {
        "MessageDeliveryEnum": ["delivered", "pending"],
        "DecisionDeliveryEnum": ["delivered", "pending", "refused"],
        "UndeliveredDeliveryEnum": ["pending"],
        # A stored message's role keeps the name generated clients know (a search match has
        # a role field of its own, user or assistant, which would otherwise rename both).
        "RoleEnum": ["user", "assistant", "tool", "system"],
        "SearchMatchRoleEnum": ["user", "assistant"],
    },
}

_DEX_PORT = env_int("DEX_PORT", 8801, minimum=1, maximum=65535)
_DEMO_MODEL_PORT = env_int("DEMO_MODEL_PORT", 8811, minimum=1, maximum=65535)
_DEX_SERVER_ADDRESS = env.str("DEX_SERVER_ADDRESS", default="").strip()
_ENGINE_SYNC = env.str("DEXAGENTS_ENGINE_SYNC", default="normal").strip().lower() or "normal"
if _ENGINE_SYNC not in ("normal", "full"):
    raise ImproperlyConfigured(
        f"DEXAGENTS_ENGINE_SYNC must be normal or full, not {_ENGINE_SYNC!r}"
    )

# The project's own knobs, in one namespaced dict.
DEXAGENTS: dict[str, Any] = {
    # host:port of the Dex FlowService (the embedded engine or a real Dex server).
    "DEX_SERVER_ADDRESS": _DEX_SERVER_ADDRESS or f"127.0.0.1:{_DEX_PORT}",
    # `manage.py dev` starts the embedded engine only when no server address is given.
    "EMBEDDED_ENGINE": not _DEX_SERVER_ADDRESS,
    "DEX_PORT": _DEX_PORT,
    "DEX_DB_PATH": VAR_DIR / "dex_dev_server.sqlite3",
    # The embedded engine's SQLite durability: normal survives a killed process, full also a
    # power loss (an fsync per commit); docs/engine-durability.md.
    "ENGINE_SYNC": _ENGINE_SYNC,
    # Port of the ASGI web server that `manage.py dev` starts.
    "WEB_PORT": env_int("PORT", 8000, minimum=1, maximum=65535),
    # Web (uvicorn) processes `manage.py dev` runs on that one port, sharing its socket.
    "WEB_PROCESSES": env_int("DEXAGENTS_WEB_PROCESSES", 1, minimum=1, maximum=64),
    # `manage.py dexworker` processes `manage.py dev` runs (worker-1..N).
    "WORKERS": env_int("DEXAGENTS_WORKERS", 1, minimum=1, maximum=64),
    # Seconds a web request waits for one Dex call before answering 503.
    "ENGINE_TIMEOUT": env_int("DEXAGENTS_ENGINE_TIMEOUT", 5, minimum=1, maximum=300),
    "BLOB_CACHE_DIR": VAR_DIR / "dex-cache" / "web",
    "BLOB_CACHE_BYTES": env_int(
        "DEXAGENTS_BLOB_CACHE_BYTES", 64 * 1024 * 1024, minimum=1024 * 1024
    ),
    "DEMO_MODEL_PORT": _DEMO_MODEL_PORT,
    "DEMO_MODEL_API_BASE": f"http://127.0.0.1:{_DEMO_MODEL_PORT}/v1",
    # Each `manage.py dexworker` beats every second under its own ID (Redis with REDIS_URL,
    # else a file per worker in this directory); older than the max age (seconds) means
    # down, so /healthz sees a killed worker within 4 s (agents_app.worker.heartbeat).
    "WORKER_HEARTBEAT_DIR": VAR_DIR / "run" / "workers",
    "WORKER_HEARTBEAT_MAX_AGE": 4,
    "VAR_DIR": VAR_DIR,
    # AgentEvents Stream budget the worker writes with (dex_agents' default, 10 MiB); Dex
    # trims a flow type's oldest events past it, across all its sessions.
    "EVENTS_STREAM_CAPACITY_BYTES": env_int(
        "DEXAGENTS_EVENTS_STREAM_CAPACITY_BYTES", 10 * 1024 * 1024, minimum=1024
    ),
    # Seconds a websocket handshake's database lookup (token, session cookie, session row)
    # may take; past it that socket closes with 4503 and nobody else waits
    # (agents_app.websocket_db).
    "WEBSOCKET_DB_TIMEOUT": env_int("DEXAGENTS_WEBSOCKET_DB_TIMEOUT", 10, minimum=1,
                                    maximum=300),
    # Per-websocket send queue of /ws/sessions/<id>/events/: frames read from the Stream but
    # not yet taken by the client. Past either bound the socket closes with 4408.
    "EVENTS_SEND_QUEUE_FRAMES": env_int(
        "DEXAGENTS_EVENTS_SEND_QUEUE_FRAMES", 1000, minimum=1, maximum=1_000_000
    ),
    "EVENTS_SEND_QUEUE_BYTES": env_int(
        "DEXAGENTS_EVENTS_SEND_QUEUE_BYTES", 1024 * 1024, minimum=1024
    ),
    # Messages that may wait in one session's queue (queued and steered together); a message
    # is at most 100,000 characters, so the default keeps a queue well inside the 4 MiB one
    # RPC can load on the embedded engine.
    "MAX_QUEUED_MESSAGES": env_int(
        "DEXAGENTS_MAX_QUEUED_MESSAGES", 20, minimum=1, maximum=10_000
    ),
    "SUBAGENT_MAX_DEPTH": env_int("DEXAGENTS_SUBAGENT_MAX_DEPTH", 3, minimum=0, maximum=20),
    "SUBAGENT_MAX_CHILDREN_PER_TURN": env_int(
        "DEXAGENTS_SUBAGENT_MAX_CHILDREN_PER_TURN", 5, minimum=0, maximum=100
    ),
    # API tokens one user may hold at once (expired ones included until revoked).
    "MAX_API_TOKENS_PER_USER": env_int(
        "DEXAGENTS_MAX_API_TOKENS_PER_USER", 50, minimum=1, maximum=10_000
    ),
    # stdio MCP server processes one Dex worker runs at once (one per agent session and
    # server under the default isolation); past it the least recently used idle one closes.
    "MCP_MAX_PROCESSES": env_int(
        "DEXAGENTS_MCP_MAX_PROCESSES", 32, minimum=1, maximum=10_000
    ),
    # Images of a tool result sent to a model that accepts images: the largest one and the
    # most one result attaches (decoded bytes). They stay in the tool call's Dex record for
    # the rest of the turn, inside the 4 MiB a worker can load at once.
    "TOOL_IMAGE_MAX_BYTES": env_int(
        "DEXAGENTS_TOOL_IMAGE_MAX_BYTES", 1024 * 1024, minimum=0, maximum=3 * 1024 * 1024
    ),
    "TOOL_RESULT_IMAGES_MAX_BYTES": env_int(
        "DEXAGENTS_TOOL_RESULT_IMAGES_MAX_BYTES", 1024 * 1024, minimum=0,
        maximum=3 * 1024 * 1024,
    ),
    # Seconds a user may take to answer a question an MCP server asks during a tool call
    # (an agent definition may set its own); unanswered, the server is told "cancel".
    "ELICITATION_TIMEOUT": env_int(
        "DEXAGENTS_ELICITATION_TIMEOUT", 600, minimum=1, maximum=30 * 24 * 3600
    ),
    # Per-user REST budgets (agents_app.api.throttling): DRF rates "<count>/<s|min|hour|day>" or
    # "off". Over one: 429 with Retry-After.
    "THROTTLE_READS": env_rate("DEXAGENTS_THROTTLE_READS", "3000/min"),
    "THROTTLE_WRITES": env_rate("DEXAGENTS_THROTTLE_WRITES", "600/min"),
    # Running turns per user; a message that would start one more waits in the outbox until
    # one ends (agents_app.sessions.outbox_holds.active_limit_reached). 0: no cap.
    "MAX_ACTIVE_SESSIONS_PER_USER": env_int(
        "DEXAGENTS_MAX_ACTIVE_SESSIONS_PER_USER", 10, minimum=0, maximum=100_000
    ),
    # The longest ?wait= a request may ask for (send-and-wait, the snapshot's long-poll).
    "MAX_WAIT_SECONDS": env_int("DEXAGENTS_MAX_WAIT_SECONDS", 300, minimum=1, maximum=3600),
    # Snapshot reads of unchanged sessions answered without Django's request cycle
    # (agents_app.api.snapshot_asgi); off: every read goes through the DRF view.
    "SNAPSHOT_SHORT_PATH": env_bool("DEXAGENTS_SNAPSHOT_SHORT_PATH", True),
    # After a session's first turn, its agent's model writes a short title
    # (agents_app.worker.titles; per agent: AgentDefinition.generate_titles). false: sessions
    # keep their first line.
    "GENERATE_TITLES": env_bool("DEXAGENTS_GENERATE_TITLES", True),
    # The site's address as people reach it: links in approval emails and webhook bodies.
    "PUBLIC_URL": env.str("DEXAGENTS_PUBLIC_URL", default="").strip().rstrip("/")
    or f"http://127.0.0.1:{env_int('PORT', 8000, minimum=1, maximum=65535)}",
    # Webhooks may call private, loopback and link-local addresses (a receiver on the LAN,
    # tests); off, such a URL is refused when saved and before every send.
    "WEBHOOKS_ALLOW_PRIVATE": env_bool("DEXAGENTS_WEBHOOKS_ALLOW_PRIVATE", False),
    # Seconds before an approval's deadline its reminder email goes (once); 0: no reminders.
    "APPROVAL_REMINDER_BEFORE": env_int(
        "DEXAGENTS_APPROVAL_REMINDER_BEFORE", 600, minimum=0, maximum=30 * 24 * 3600
    ),
}

# Outgoing email (approval notifications): EMAIL_URL in django-environ's form, e.g.
# smtp+tls://user:password@smtp.example.com:587, filemail:///path/to/dir, or the default
# consolemail:// (printed by the process that sends: the Celery worker under `make run`).
_email = env.email_url("EMAIL_URL", default="consolemail://")
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="") or _email["EMAIL_BACKEND"]
for _email_key in ("EMAIL_HOST", "EMAIL_PORT", "EMAIL_HOST_USER", "EMAIL_HOST_PASSWORD",
                   "EMAIL_USE_TLS", "EMAIL_USE_SSL", "EMAIL_FILE_PATH"):
    if _email.get(_email_key) not in (None, ""):
        globals()[_email_key] = _email[_email_key]
if env.str("EMAIL_FILE_PATH", default=""):
    EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH")
EMAIL_TIMEOUT = env_int("EMAIL_TIMEOUT", 10, minimum=1, maximum=300)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="dexagents <dexagents@localhost>")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    # LiteLLM logs every call at INFO (twice, through its own handler too); the worker
    # reports model calls through Dex history and AgentEvents instead.
    "loggers": {
        "LiteLLM": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # Django's default configuration gives "django" a console handler of its own (under
        # DEBUG) and lets it propagate to the root one too, so each line was printed twice.
        "django": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}

if not DEBUG:
    SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", True)
    CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", True)
    SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
    SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
    if env_bool("SECURE_PROXY_SSL_HEADER", False):
        # Only behind a proxy that sets X-Forwarded-Proto itself.
        SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Operations (issue 12): request IDs, JSON logs, metrics access, worker IDs ------------
# Kept in one block: agents_app.log_context, agents_app.metrics, agents_app.worker.heartbeat.

_LOG_FORMATS = ("plain", "json")
DEXAGENTS_LOG_FORMAT = env.str("DEXAGENTS_LOG_FORMAT", default="plain").strip().lower() or "plain"
if DEXAGENTS_LOG_FORMAT not in _LOG_FORMATS:
    raise ImproperlyConfigured(
        f"DEXAGENTS_LOG_FORMAT must be plain or json, not {DEXAGENTS_LOG_FORMAT!r}"
    )
DEXAGENTS["LOG_FORMAT"] = DEXAGENTS_LOG_FORMAT
# Unset: /metrics answers loopback callers only (no proxy header); set: bearer token only.
DEXAGENTS["METRICS_TOKEN"] = env.str("DEXAGENTS_METRICS_TOKEN", default="").strip()
DEXAGENTS["WORKER_NAME"] = env.str("DEXAGENTS_WORKER_NAME", default="").strip()
DEXAGENTS["REDIS_URL"] = REDIS_URL

# First, so every later middleware's and view's log lines carry the request ID.
MIDDLEWARE.insert(0, "agents_app.log_context.RequestIdMiddleware")

LOGGING["filters"] = {"context": {"()": "agents_app.log_context.ContextFilter"}}
_logging_formatters: dict[str, Any] = LOGGING["formatters"]  # type: ignore[assignment]
_logging_formatters["json"] = {
    "()": "pythonjsonlogger.json.JsonFormatter",
    "format": "%(levelname)s %(name)s %(message)s %(request_id)s %(session_id)s",
    "rename_fields": {"levelname": "level", "name": "logger"},
    # "time": ISO 8601 in UTC with microseconds (2026-12-02T02:15:00.664715+00:00).
    "timestamp": "time",
}
_logging_handlers: dict[str, Any] = LOGGING["handlers"]  # type: ignore[assignment]
_logging_handlers["console"] = {
    "class": "logging.StreamHandler",
    "formatter": DEXAGENTS_LOG_FORMAT,
    "filters": ["context"],
}
