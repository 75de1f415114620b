"""The host project's ASGI app: Django for HTTP, the dexagents websocket routes under their
token-or-session auth for websockets."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hostsite.settings")

from django.core.asgi import get_asgi_application

# Django is set up before the routing below imports models.
django_asgi_app = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402

from agents_app.auth import BrowserOriginValidator, TokenAuthMiddlewareStack  # noqa: E402
from agents_app.live.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": BrowserOriginValidator(
            TokenAuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
