"""Settings of a minimal host project that installs dexagents (see docs/install-as-app.md).

Only ``DEX_SERVER_ADDRESS`` and ``DEMO_MODEL_PORT`` come from the environment here, so the
test can pick free ports; everything else the dexagents apps need is written out below.
"""

import os
from pathlib import Path

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = "host-project-test-key-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["127.0.0.1", "localhost"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "django_filters",
    "channels",
    "django_celery_beat",
    "mcp_registry",
    "agents_app",
]

MIDDLEWARE = [
    # Django's own error pages under the API prefix answer JSON.
    "agents_app.rest_errors.ApiJsonErrorsMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "hostsite.urls"
ASGI_APPLICATION = "hostsite.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# The web process and the Dex worker share the SQLite file: WAL and a busy timeout.
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": BASE_DIR / "db.sqlite3",
        "OPTIONS": {
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA busy_timeout=5000;",
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
        },
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
USE_TZ = True
TIME_ZONE = "UTC"
STATIC_URL = "static/"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "pages:portal"

REST_FRAMEWORK = {
    "EXCEPTION_HANDLER": "agents_app.rest_errors.api_exception_handler",
    "DEFAULT_PARSER_CLASSES": ["agents_app.rest_errors.BoundedJSONParser"],
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "agents_app.auth.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "agents_app.api.schema.ApiAutoSchema",
    "DEFAULT_PAGINATION_CLASS": "agents_app.api.pagination.StrictLimitOffsetPagination",
    "PAGE_SIZE": 50,
}
KNOX_TOKEN_MODEL = "agents_app.ApiToken"
REST_KNOX = {"TOKEN_PREFIX": "dxa_", "TOKEN_TTL": None, "AUTO_REFRESH": False}

# One process serves the websockets here; several web processes need channels-redis.
CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# Celery: kombu's filesystem transport needs no server (Redis in production).
_CELERY_DIR = BASE_DIR / "var" / "celery"
CELERY_BROKER_URL = "filesystem://localhost//"
CELERY_BROKER_TRANSPORT = "agents_app.dev.kombu_filesystem:Transport"
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "data_folder_in": str(_CELERY_DIR / "queue"),
    "data_folder_out": str(_CELERY_DIR / "queue"),
    "processed_folder": str(_CELERY_DIR / "processed"),
    "control_folder": str(_CELERY_DIR / "control"),
    "store_processed": False,
}
CELERY_TASK_IGNORE_RESULT = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"

# The dexagents apps' own knobs; every key left out keeps its default (agents_app.conf).
DEXAGENTS = {
    "DEX_SERVER_ADDRESS": os.environ.get("DEX_SERVER_ADDRESS", "127.0.0.1:8801"),
    "DEMO_MODEL_PORT": int(os.environ.get("DEMO_MODEL_PORT", "8811")),
    "VAR_DIR": BASE_DIR / "var",
    # Where urls.py mounts the REST API: Django's own error pages there answer JSON.
    "API_PATH_PREFIX": "/agents/api/",
}
