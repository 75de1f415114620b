"""API-token authentication for REST and websockets (ARCHITECTURE.md "Auth").

Clients send ``Authorization: Bearer <key>`` (RFC 6750); DRF's ``Token <key>`` keeps working.
Browsers use the Django session cookie instead. The key is looked up in exactly one place,
``user_for_token_key``, so the token storage can change without touching its callers.

Tokens are ``agents_app.models.ApiToken`` rows in django-rest-knox's format: only the
SHA-512 digest of a key and its first 15 characters are stored, so a database dump yields no
usable key. A token may expire; an expired one is refused (REST: 401 with a message that says
so; websockets: 4401).

- REST: ``BearerTokenAuthentication`` (``REST_FRAMEWORK["DEFAULT_AUTHENTICATION_CLASSES"]``).
- Websockets: ``TokenAuthMiddlewareStack`` sets ``scope["user"]`` from the header, or from the
  session cookie when there is no token header; ``BrowserOriginValidator`` applies Channels'
  ``AllowedHostsOriginValidator`` to every handshake that comes from a browser.

Keys are credentials: nothing here logs them.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from hmac import compare_digest
from typing import Any, TypeVar

from channels.auth import AuthMiddleware, get_user
from channels.security.websocket import AllowedHostsOriginValidator
from channels.sessions import CookieMiddleware, SessionMiddleware
from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from knox.crypto import hash_token
from knox.settings import CONSTANTS
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.request import Request

#: ``Authorization`` schemes that carry an API token key, compared case-insensitively.
TOKEN_SCHEMES = ("bearer", "token")
#: Longer than any key this platform hands out ("dxa_" + 64 hex, or a moved 40-hex DRF key);
#: longer keys are refused without hashing them.
TOKEN_KEY_MAX_CHARS = 128

INVALID_TOKEN_DETAIL = "Invalid token: no active API token has this key (was it revoked?)."

ASGIApp = Any
T = TypeVar("T")


class ApiTokenExpiredError(Exception):
    """The key belongs to an API token whose expiry has passed.

    Attributes:
        expired_at: When it expired (aware datetime).
    """

    def __init__(self, expired_at: datetime.datetime) -> None:
        super().__init__(f"The API token expired at {expired_at.isoformat()}.")
        self.expired_at = expired_at


def user_for_token_key(key: str) -> AbstractBaseUser | None:
    """Return the active user whose API token has the key ``key``, or None.

    ``key`` is the whole key as the client sends it. Unknown and revoked keys, keys of
    inactive users and over-long keys give None. Sync (ORM): async callers run it on a thread
    (websocket handshakes: ``agents_app.websocket_db``).

    Raises:
        ApiTokenExpiredError: The key is right but its token expired; the token is kept (so
            its owner sees it in the list and knows why clients fail) until revoked.
    """
    from agents_app.models import ApiToken

    if not key or len(key) > TOKEN_KEY_MAX_CHARS:
        return None
    candidates = ApiToken.objects.filter(token_key=token_key_prefix(key)).select_related("user")
    user: AbstractBaseUser | None = token_match(
        key, ((token.digest, token.expiry, token.user) for token in candidates)
    )
    return user if user is not None and user.is_active else None


def token_key_prefix(key: str) -> str:
    """The stored lookup prefix of ``key`` (``ApiToken.token_key``: its first 15 characters)."""
    return key[: CONSTANTS.TOKEN_KEY_LENGTH]


def token_match(
    key: str, candidates: Iterable[tuple[str, datetime.datetime | None, T]]
) -> T | None:
    """The holder of the candidate token whose digest is ``key``'s, or None.

    ``candidates`` are ``(digest, expiry, holder)`` of the stored tokens that share ``key``'s
    prefix (``token_key_prefix``); digests are compared in constant time. The holder is
    returned as given (``user_for_token_key`` checks that the user is active).

    Raises:
        ApiTokenExpiredError: The matching token's expiry has passed.
    """
    if not key or len(key) > TOKEN_KEY_MAX_CHARS:
        return None
    digest = hash_token(key)
    for stored, expiry, holder in candidates:
        if not compare_digest(digest, stored):
            continue
        if expiry is not None and expiry <= timezone.now():
            raise ApiTokenExpiredError(expiry)
        return holder
    return None


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


class BearerTokenAuthentication(BaseAuthentication):
    """DRF authentication for ``Authorization: Bearer <key>`` and ``Token <key>``.

    ``request.auth`` is None (the key is not kept on the request); ``request.
    successful_authenticator`` tells views that a token authenticated the call. Answers 401
    with ``WWW-Authenticate: Bearer realm="api"`` when a token is malformed, unknown, revoked
    or expired (each with its own ``detail``); other schemes are left to the next
    authentication class.
    """

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AbstractBaseUser, None] | None:
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

    def authenticate_credentials(self, key: str) -> tuple[AbstractBaseUser, None]:
        try:
            user = user_for_token_key(key)
        except ApiTokenExpiredError as expired:
            raise exceptions.AuthenticationFailed(
                f"This API token expired at {expired.expired_at.isoformat()}: create a new "
                "one (POST /api/v1/tokens/ or manage.py createtoken) and revoke this one.",
                code="token_expired",
            ) from None
        if user is None:
            raise exceptions.AuthenticationFailed(INVALID_TOKEN_DETAIL)
        return user, None

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


#: Set in a websocket scope whose authentication lookup missed its deadline.
DATABASE_TIMEOUT_KEY = "dexagents_database_timeout"


def _session_user(scope: dict[str, Any]) -> Any:
    """Channels' session-cookie user lookup (``channels.auth.get_user``), run synchronously
    (it is a ``database_sync_to_async`` wrapper around a sync function)."""
    lookup = getattr(get_user, "func", None)
    if lookup is None:  # pragma: no cover - a Channels without the wrapper attribute
        raise RuntimeError("channels.auth.get_user has no sync function to call")
    return lookup(scope)


class TokenAuthMiddleware(AuthMiddleware):
    """Channels' ``AuthMiddleware`` that prefers an ``Authorization`` token header.

    With a Bearer/Token header the key alone decides (an unknown, revoked or expired key is
    ``AnonymousUser``, never the cookie's user); without one the session cookie does, as in
    Channels.
    Needs Channels' ``SessionMiddleware`` outside it (``TokenAuthMiddlewareStack``).
    """

    async def resolve_scope(self, scope: dict[str, Any]) -> None:
        """Look the user up on the websocket lookup pool (``agents_app.websocket_db``); a
        lookup past its deadline leaves ``AnonymousUser`` and ``scope[DATABASE_TIMEOUT_KEY]``
        set, for the consumer to close with 4503."""
        from agents_app.websocket_db import WebsocketDatabaseTimeout, websocket_db

        key = scope_token_key(scope)
        user: Any = None
        try:
            if key is None:
                user = await websocket_db(_session_user, scope)
            else:
                user = await websocket_db(user_for_token_key, key)
        except ApiTokenExpiredError:
            user = None
        except WebsocketDatabaseTimeout:
            scope[DATABASE_TIMEOUT_KEY] = True
            user = None
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


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """Documents ``BearerTokenAuthentication`` in the OpenAPI schema as HTTP bearer auth."""

    target_class = "agents_app.auth.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token: `Authorization: Bearer <key>` (`Token <key>` also "
            "works). Create one with POST /api/v1/tokens/ or `manage.py createtoken`.",
        }
