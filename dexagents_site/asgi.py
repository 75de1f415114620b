"""ASGI entry point: Django for HTTP, Channels for websockets.

Websocket routes come from ``agents_app.live.routing.websocket_urlpatterns``, behind
``agents_app.auth``: API-token or session-cookie auth, and Channels' allowed-hosts origin
check for every handshake from a browser (channels sample project ``config/asgi.py``;
reference/django-notes.md G2).
"""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dexagents_site.settings")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
os.environ.setdefault("LITELLM_OFFLINE_MODE", "true")
os.environ.setdefault("LITELLM_MODE", "PRODUCTION")

from django.core.asgi import get_asgi_application

# Django must be set up before anything imports models (the routing below does).
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agents_app.api.snapshot_asgi import SnapshotShortPath  # noqa: E402
from agents_app.auth import BrowserOriginValidator, TokenAuthMiddlewareStack  # noqa: E402
from agents_app.live.lifespan import WebWarmUp  # noqa: E402
from agents_app.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        # Snapshot reads of unchanged sessions skip Django's request cycle (an API client's
        # GET /api/v1/sessions/<id>/ served from the snapshot cache); the rest is Django's.
        "http": SnapshotShortPath(django_asgi_app),
        # AllowedHostsOriginValidator for browsers (handshakes with an Origin header).
        "websocket": BrowserOriginValidator(
            TokenAuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
        # Loads the URLconf and connects to the engine before the server says it serves, so
        # the first request costs what the later ones do.
        "lifespan": WebWarmUp(),
    }
)
