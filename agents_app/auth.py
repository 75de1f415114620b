"""API-token authentication for REST and websockets (ARCHITECTURE.md "Auth").

Clients send ``Authorization: Bearer <key>`` (RFC 6750); DRF's ``Token <key>`` keeps working.
Browsers use the Django session cookie instead. The key is looked up in exactly one place,
``user_for_token_key``, so the token storage can change without touching its callers.

- REST: ``BearerTokenAuthentication`` (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``).
- Websockets: ``TokenAuthMiddlewareStack`` sets ``scope["user"]`` from the header, or from the
  session cookie when there is no token header; ``BrowserOriginValidator`` applies Channels'
  ``AllowedHostsOriginValidator`` to every handshake that comes from a browser.

Keys are credentials: nothing here logs them.
"""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddleware
from channels.db import database_sync_to_async
from channels.security.websocket import AllowedHostsOriginValidator
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from rest_framework import exceptions
from rest_framework.authentication import TokenAuthentication, get_authorization_header
from rest_framework.request import Request

#: ``Authorization`` schemes that carry an API token key, compared case-insensitively.
TOKEN_SCHEMES = ("bearer", "token")

ASGIApp = Any


def user_for_token_key(key: str) -> AbstractBaseUser | None:
    """Return the active user whose API token is ``key``, or None.

    Today the key is a DRF ``rest_framework.authtoken`` ``Token``; this is the only function
    that knows it. Sync (ORM): async callers wrap it in ``database_sync_to_async``.
    """
    from rest_framework.authtoken.models import Token

    try:
        token = Token.objects.select_related("user").get(key=key)
    except Token.DoesNotExist:
        return None
    user: AbstractBaseUser = token.user
    return user if user.is_active else None


def token_key_from_authorization(value: bytes) -> str | None:
    """The key of an ``Authorization`` value in a token scheme, else None.

    ``b"Bearer abc"`` and ``b"Token abc"`` give ``"abc"``; another scheme, a missing key, or
    extra words give None.
    """
    parts = value.split()
    if len(parts) != 2 or parts[0].lower().decode("latin-1") not in TOKEN_SCHEMES:
        return None
    try:
        return parts[1].decode("ascii")
    except UnicodeDecodeError:
        return None


class BearerTokenAuthentication(TokenAuthentication):
    """DRF authentication for ``Authorization: Bearer <key>`` and ``Token <key>``.

    Answers 401 with ``WWW-Authenticate: Bearer realm="api"`` when a token is malformed or
    unknown; other schemes are left to the next authentication class.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, str] | None:
        header = get_authorization_header(request)
        parts = header.split()
        if not parts or parts[0].lower().decode("latin-1") not in TOKEN_SCHEMES:
            return None
        key = token_key_from_authorization(header)
        if key is None:
            raise exceptions.AuthenticationFailed(
                "Invalid token header: give exactly one token key, without spaces."
            )
        return self.authenticate_credentials(key)

    def authenticate_credentials(self, key: str) -> tuple[AbstractBaseUser, str]:
        user = user_for_token_key(key)
        if user is None:
            raise exceptions.AuthenticationFailed("Invalid token.")
        return user, key

    def authenticate_header(self, request: Request) -> str:
        return f'{self.keyword} realm="api"'


def _header(scope: dict[str, Any], name: bytes) -> bytes | None:
    """The first value of header ``name`` (lowercase) in an ASGI scope."""
    for header_name, value in scope.get("headers", ()):
        if header_name == name:
            return bytes(value)
    return None


def scope_token_key(scope: dict[str, Any]) -> str | None:
    """The API token key of a websocket scope's ``Authorization`` header, if it has one."""
    value = _header(scope, b"authorization")
    return None if value is None else token_key_from_authorization(value)


class TokenAuthMiddleware(AuthMiddleware):
    """Channels' ``AuthMiddleware`` that prefers an ``Authorization`` token header.

    With a Bearer/Token header the key alone decides (an unknown key is ``AnonymousUser``,
    never the cookie's user); without one the session cookie does, as in Channels.
    Needs Channels' ``SessionMiddleware`` outside it (``TokenAuthMiddlewareStack``).
    """

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        key = scope_token_key(scope)
        if key is None:
            await super().resolve_scope(scope)
            return
        user = await database_sync_to_async(user_for_token_key)(key)
        scope["user"]._wrapped = user if user is not None else AnonymousUser()


def TokenAuthMiddlewareStack(inner: ASGIApp) -> ASGIApp:
    """Cookies, sessions and ``TokenAuthMiddleware`` around ``inner``, like Channels'
    ``AuthMiddlewareStack``."""
    return CookieMiddleware(SessionMiddleware(TokenAuthMiddleware(inner)))


class BrowserOriginValidator:
    """Channels' ``AllowedHostsOriginValidator`` for every handshake that carries ``Origin``.

    Browsers send ``Origin`` on every websocket handshake (Fetch standard) and authenticate
    with ambient cookies, which is what cross-site websocket hijacking abuses; those
    handshakes must come from an allowed host. A handshake without ``Origin`` is not a
    browser's: an API client with its own credentials (a token header, or a cookie it holds
    itself). Channels refuses those with HTTP 403 by default; here they go on to
    authentication, so an API client gets the protocol's close codes (4401, ...).
    """

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner
        self.checked = AllowedHostsOriginValidator(inner)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        if _header(scope, b"origin") is None:
            return await self.inner(scope, receive, send)
        return await self.checked(scope, receive, send)
