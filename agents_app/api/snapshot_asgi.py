"""The snapshot read's short path: ``GET /api/v1/sessions/<id>/`` answered from the snapshot
cache without Django's request cycle, for an API client whose session has not changed.

Served through Django and DRF, a read that the snapshot cache answers still cost ~4 ms of
web CPU and ~12 thread hops (each of Django's sync-only middlewares, DRF's ``initial``, the
session lookup, the answer's database work, rendering), most of it spent outside the read
itself. ``SnapshotShortPath`` wraps the Django ASGI application and answers such a read in
one thread hop (the database work: token, throttles, session row, outbox; on a lane of
``snapshot_db``, which keeps its connection between reads) and no engine read while this
process's shared reader of the session's Stream knows its newest token
(``session_feed.known_tail``; the first read of a session reads it from the engine and
starts that reader); everything else goes to Django unchanged.

What it answers (everything else, and every doubt, goes to Django, which answers as before):

- ``GET`` of the path Django resolves to ``SessionDetailApi``, with no query string and no
  ``Cookie``, ``Authorization: Bearer <key>`` or ``Token <key>``, an ``Accept`` that DRF
  would answer with compact JSON (none, ``*/*``, ``application/*`` or ``application/json``,
  without parameters), a ``Host`` that
  ``ALLOWED_HOSTS`` allows, a request that ``SECURE_SSL_REDIRECT`` would not redirect, and
  ``MIDDLEWARE`` made only of ``KNOWN_MIDDLEWARE`` (whose effects on such a request it
  reproduces: ``X-Request-ID``, the security headers, ``X-Frame-Options``);
- a valid, unexpired token of an active user, within the user's read budget (the same DRF
  throttles and cache as the view; a refused request goes to Django, which answers 429), of
  a session that user owns or, as staff, reads (else Django answers 401 or 404);
- a session whose snapshot cache entry was made under the stamp read now
  (``snapshot_cache``), whose Flow was checked less than ``FLOW_CHECK_SECONDS`` ago, whose
  index status needs no update from the snapshot, and whose running turn's start token (if
  any) this process knows already.

A request it started and handed to Django carries ``COUNTED_SCOPE_KEY`` in its ASGI scope,
so the throttles do not count it twice. The answer is the view's, byte for byte
(``snapshot.session_detail_body``, DRF's ``JSONRenderer``), with the same headers except
uvicorn's own. Staleness is the snapshot cache's (``snapshot_cache``), with the stamp's
token as ``known_tail`` knows it: a change whose event the engine is delivering to this
process at that moment may be answered on the next read, with the ``events_after`` that goes
with the older answer. Turn it off with ``DEXAGENTS["SNAPSHOT_SHORT_PATH"] = False``
(env ``DEXAGENTS_SNAPSHOT_SHORT_PATH``).
"""

from __future__ import annotations

import contextvars
import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.http.request import split_domain_port, validate_host
from django.urls import Resolver404, resolve
from django.utils import timezone

from agents_app.api.snapshot_db import PreparedQuery, lane
from agents_app.api.throttling import COUNTED_SCOPE_KEY
from agents_app.conf import dexagents_setting
from agents_app.selectors import session_reads
from agents_app.services import session_lifecycle

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
#: Django's ASGIHandler, or any ASGI application.
ASGIApp = Any


#: Middleware whose effect on a token-authenticated JSON ``GET`` of the snapshot is either
#: none (sessions, CSRF, messages, static files, the JSON error pages: this path answers no
#: error) or reproduced here; any other middleware in ``MIDDLEWARE`` turns the path off.
KNOWN_MIDDLEWARE = frozenset(
    {
        "agents_app.log_context.RequestIdMiddleware",
        "agents_app.rest_errors.ApiJsonErrorsMiddleware",
        "django.middleware.security.SecurityMiddleware",
        "whitenoise.middleware.WhiteNoiseMiddleware",
        # Sends nothing under /api/v1/ (CONTENT_SECURITY_POLICY["EXCLUDE_URL_PREFIXES"]).
        "agents_app.pages.content_security.ContentSecurityPolicyMiddleware",
        "django.contrib.sessions.middleware.SessionMiddleware",
        "django.middleware.common.CommonMiddleware",
        "django.middleware.csrf.CsrfViewMiddleware",
        "django.contrib.auth.middleware.AuthenticationMiddleware",
        "django.contrib.messages.middleware.MessageMiddleware",
        "django.middleware.clickjacking.XFrameOptionsMiddleware",
    }
)

#: ``Accept`` values DRF answers with ``JSONRenderer`` for this view (its first renderer).
_JSON_ACCEPTS = frozenset({b"", b"*/*", b"application/*", b"application/json"})

#: For this long after this process sent a session a write (seconds), its reads take the
#: stamp's token from the engine, not from ``session_feed.known_tail``.
WRITE_GUARD_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class _Request:
    """What the short path reads from an eligible request's scope."""

    session_id: str
    key: str
    request_id: str
    secure: bool


@dataclasses.dataclass
class _Reader:
    """The database side of one read: the session's index values and what the answer adds."""

    session_id: str
    status: str
    updated_at: Any
    agent_slug: str
    kept: list[Any]
    extras: dict[str, Any]


class _User:
    """The caller as DRF's ``UserRateThrottle`` reads it."""

    is_authenticated = True

    def __init__(self, pk: Any) -> None:
        self.pk = pk


class _HandOver(Exception):
    """Django answers this request (``counted``: the throttles already counted it)."""

    def __init__(self, *, counted: bool) -> None:
        super().__init__()
        self.counted = counted


class _ThrottleRequest:
    """The part of a DRF ``Request`` that ``UserRateThrottle`` reads."""

    method = "GET"

    def __init__(self, user: _User, scope: Scope) -> None:
        self.user = user
        self.META = {"REMOTE_ADDR": (scope.get("client") or ("",))[0]}


def _header_values(scope: Scope) -> dict[bytes, bytes]:
    headers: dict[bytes, bytes] = {}
    for name, value in scope.get("headers", ()):
        # A repeated header is one Django would join or pick from: leave it to Django.
        headers[name] = b"\0" if name in headers else value
    return headers


def _is_secure(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """``HttpRequest.is_secure`` for this scope (``SECURE_PROXY_SSL_HEADER`` included)."""
    proxy = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy:
        name, secure_value = proxy
        wanted = name.removeprefix("HTTP_").lower().replace("_", "-").encode("latin-1")
        value = headers.get(wanted)
        if value is not None:
            return value.decode("latin-1").split(",", 1)[0].strip() == secure_value
    return scope.get("scheme") == "https"


def _host_allowed(scope: Scope, headers: dict[bytes, bytes]) -> bool:
    """Whether Django's ``HttpRequest.get_host`` would accept this request's host."""
    if getattr(settings, "USE_X_FORWARDED_HOST", False) and b"x-forwarded-host" in headers:
        return False
    raw = headers.get(b"host")
    if raw is None:
        return False
    domain, _port = split_domain_port(raw.decode("latin-1"))
    allowed = list(settings.ALLOWED_HOSTS)
    if settings.DEBUG and not allowed:
        allowed = [".localhost", "127.0.0.1", "[::1]"]
    return bool(domain) and validate_host(domain, allowed)


def _eligible(scope: Scope) -> _Request | None:
    """The request's parts when the short path may answer it (module docstring), else None."""
    from agents_app.auth import token_key_from_authorization
    from agents_app.log_context import request_id_from

    if scope.get("method") != "GET" or scope.get("query_string"):
        return None
    if not _path_enabled():
        return None
    headers = _header_values(scope)
    authorization = headers.get(b"authorization")
    if authorization is None:
        return None
    key = token_key_from_authorization(authorization)
    if key is None:
        return None
    # Parameters (``; indent=4``, ``; version=...``) change DRF's rendering: Django answers.
    accept = headers.get(b"accept", b"").strip().lower()
    if accept not in _JSON_ACCEPTS:
        return None
    # A cookie may be one the session or CSRF middleware answers (``Vary: Cookie``, a
    # ``Set-Cookie`` clearing a stale one): Django answers.
    if b"cookie" in headers:
        return None
    if not _host_allowed(scope, headers):
        return None
    secure = _is_secure(scope, headers)
    if settings.SECURE_SSL_REDIRECT and not secure:
        return None
    path: str = scope.get("path", "")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root):]
    session_id = _snapshot_session_of(path)
    if session_id is None:
        return None
    request_id_header = headers.get(b"x-request-id")
    request_id = request_id_from(
        request_id_header.decode("latin-1") if request_id_header else None
    )
    return _Request(session_id, key, request_id, secure)


@functools.cache
def _path_enabled() -> bool:
    """Whether the settings let the short path answer at all (module docstring); cached until
    a setting changes (``_settings_changed``)."""
    return bool(
        dexagents_setting("SNAPSHOT_SHORT_PATH")
        and KNOWN_MIDDLEWARE.issuperset(settings.MIDDLEWARE)
        and not getattr(settings, "DISALLOWED_USER_AGENTS", None)
        and not getattr(settings, "PREPEND_WWW", False)
    )


@functools.lru_cache(maxsize=4096)
def _snapshot_session_of(path: str) -> str | None:
    """The session id when Django resolves ``path`` (without the root path) to
    ``SessionDetailApi``, else None; the last 4,096 paths are remembered until a setting
    changes (``ROOT_URLCONF`` among them)."""
    from agents_app.api.sessions import SessionDetailApi

    try:
        match = resolve(path)
    except Resolver404:
        return None
    if getattr(match.func, "view_class", None) is not SessionDetailApi:
        return None
    return str(match.kwargs["session_id"])




def _token_query(key_prefix: str) -> Any:
    from agents_app.models import ApiToken

    return ApiToken.objects.filter(token_key=key_prefix).values_list(
        "digest", "expiry", "user_id", "user__is_active", "user__is_staff"
    )


def _session_query(session_id: str) -> Any:
    from django.contrib.auth import get_user_model
    from django.db.models import Exists, OuterRef

    from agents_app.models import AgentSession, Delivery, OutboxMessage

    username = f"owner__{get_user_model().USERNAME_FIELD}"
    pending = OutboxMessage.objects.filter(session=OuterRef("pk"), delivery=Delivery.PENDING)
    return (
        AgentSession.objects.filter(pk=session_id)
        .annotate(has_pending=Exists(pending))
        .values_list(
            "status", "updated_at", "title", "owner_id", "agent__slug", "agent__model",
            username, "has_pending",
        )
    )


_TOKENS = PreparedQuery(_token_query)
_SESSIONS = PreparedQuery(_session_query)


def _reader(request: _Request, scope: Scope) -> _Reader:
    """The database work of one read, on a ``snapshot_db.Lane``'s thread: the token's user,
    the throttles (counted here), the session, the outbox's pending messages and the answer's
    extras. Two queries (token and user; session, agent, owner and whether the outbox keeps
    a message), a third only when it does.

    Raises:
        _HandOver: Django must answer (an unknown, revoked or expired token, an inactive user,
            a throttle that refuses, an unknown or foreign session).
    """
    from rest_framework.throttling import BaseThrottle

    from agents_app.api.sessions import SessionDetailApi
    from agents_app.auth import ApiTokenExpiredError, token_key_prefix, token_match
    from agents_app.models import SESSION_STATUS_STOPPED, AgentSession
    from agents_app.sessions import outbox

    candidates = _TOKENS.rows(token_key_prefix(request.key))
    try:
        holder = token_match(
            request.key, ((row[0], row[1], row[2:]) for row in candidates)
        )
    except ApiTokenExpiredError:
        holder = None
    if holder is None or not holder[1]:
        raise _HandOver(counted=False)
    user_id, _active, user_is_staff = holder
    throttle_request = _ThrottleRequest(_User(user_id), scope)
    throttles: list[BaseThrottle] = [
        throttle() for throttle in SessionDetailApi.throttle_classes
    ]
    for number, throttle in enumerate(throttles):
        if not throttle.allow_request(throttle_request, None):  # type: ignore[arg-type]
            raise _HandOver(counted=number > 0)
    found = _SESSIONS.rows(request.session_id)
    if not found:
        raise _HandOver(counted=True)
    status, updated_at, title, owner_id, slug, model, username, pending = found[0]
    if not session_reads.session_readable(
        owner_id=owner_id, user_id=user_id, user_is_staff=user_is_staff
    ):
        raise _HandOver(counted=True)
    kept = (
        outbox.outbox_message_pending(session=AgentSession(id=request.session_id))
        if pending and status != SESSION_STATUS_STOPPED else []
    )
    extras = session_reads.session_detail_extras_of(
        model=model, title=title, owner_username=username, owner_id=owner_id,
        status=status, user_id=user_id, user_is_staff=bool(user_is_staff),
    )
    return _Reader(request.session_id, status, updated_at, slug, kept, extras)


async def _answer(request: _Request, scope: Scope) -> bytes:
    """The JSON body of the read, from the snapshot cache.

    Raises:
        _HandOver: Django must answer (``_reader``'s cases, a cache miss, a Flow check or an
            index status update due, a running turn's start token not known here, an engine
            that did not answer).
    """
    from rest_framework.renderers import JSONRenderer

    from agents_app.api.snapshot import flow_check_due, session_detail_body
    from agents_app.gateway import dex_gateway, event_stream, snapshot_cache
    from agents_app.live import session_feed
    from agents_app.models import SESSION_STATUS_STOPPED

    work = functools.partial(contextvars.copy_context().run, _reader, request, scope)
    reader = await lane().run(work)
    # Shortly after this process sent the session a write, the stamp's token comes from the
    # engine: a Django read that began before the write may have put an older entry back, and
    # this process's reader of the Stream may not have read the write's event yet.
    events_after = (
        None if snapshot_cache.written_within(reader.session_id, WRITE_GUARD_SECONDS)
        else session_feed.known_tail(reader.session_id)
    )
    if events_after is None:
        try:
            events_after = await dex_gateway.call_here(
                event_stream.session_events_tail_token(session_id=reader.session_id)
            )
        except Exception:
            raise _HandOver(counted=True) from None
        session_feed.follow_tail(reader.session_id, events_after)
    stamp = snapshot_cache.stamp_of(
        events_after=events_after, status=reader.status, updated_at=reader.updated_at
    )
    cached = await snapshot_cache.get(reader.session_id, stamp)
    stopped = reader.status == SESSION_STATUS_STOPPED
    if cached is None or flow_check_due(cached, stopped=stopped, now=timezone.now()):
        raise _HandOver(counted=True)
    snapshot = cached.snapshot
    if session_lifecycle.session_status_record_needed(
        indexed=reader.status, status=snapshot["status"]
    ):
        raise _HandOver(counted=True)
    if stopped:
        snapshot = session_reads.snapshot_as_stopped(snapshot=snapshot)
    snapshot = session_reads.snapshot_with_kept_messages(snapshot=snapshot, kept=reader.kept)
    live_events_after = session_reads.session_live_events_after_known(
        session_id=reader.session_id, snapshot=snapshot, events_after=events_after
    )
    if live_events_after is None:
        raise _HandOver(counted=True)
    body = session_detail_body(
        session_id=reader.session_id,
        agent_slug=reader.agent_slug,
        extras=reader.extras,
        snapshot=snapshot,
        events_after=events_after,
        live_events_after=live_events_after,
    )
    return JSONRenderer().render(body)


class _Secure(HttpRequest):
    def __init__(self, secure: bool) -> None:
        super().__init__()
        self._secure = secure

    def is_secure(self) -> bool:
        return self._secure


def response_headers(*, secure: bool, request_id: str, length: int) -> list[tuple[bytes, bytes]]:
    """The headers of the view's 200 answer: DRF's (``Content-Type``, ``Vary``, ``Allow``),
    ``SecurityMiddleware``'s and ``XFrameOptionsMiddleware``'s (run on an empty response, so
    their settings apply as in Django), ``Content-Length`` and ``X-Request-ID``."""
    headers = [*_fixed_headers(secure), (b"Content-Length", str(length).encode("latin-1"))]
    if "agents_app.log_context.RequestIdMiddleware" in settings.MIDDLEWARE:
        headers.append((b"X-Request-ID", request_id.encode("latin-1")))
    return headers


@functools.cache
def _fixed_headers(secure: bool) -> tuple[tuple[bytes, bytes], ...]:
    """The answer's headers that depend on settings only (``response_headers``), made once
    per ``secure`` until a setting changes."""
    from django.middleware.clickjacking import XFrameOptionsMiddleware
    from django.middleware.security import SecurityMiddleware

    response = HttpResponse(content_type="application/json")
    response["Vary"] = "Accept"
    # DRF's Allow: the methods the detail view has handlers for, in its order.
    from agents_app.api.sessions import SessionDetailApi

    view = SessionDetailApi()
    view.head = view.get  # type: ignore[attr-defined]  # View.setup adds it for a GET handler
    response["Allow"] = ", ".join(view.allowed_methods)
    request = _Secure(secure)
    names = set(settings.MIDDLEWARE)
    if "django.middleware.clickjacking.XFrameOptionsMiddleware" in names:
        XFrameOptionsMiddleware(lambda _: response).process_response(request, response)
    if "django.middleware.security.SecurityMiddleware" in names:
        SecurityMiddleware(lambda _: response).process_response(request, response)
    return tuple(
        (name.encode("latin-1"), value.encode("latin-1"))
        for name, value in response.items()
    )


@receiver(setting_changed)
def _settings_changed(**_kwargs: Any) -> None:
    """Forget what was derived from settings (``override_settings`` in tests)."""
    _path_enabled.cache_clear()
    _snapshot_session_of.cache_clear()
    _fixed_headers.cache_clear()


class SnapshotShortPath:
    """ASGI middleware around the Django application: answers eligible snapshot reads from
    the snapshot cache (module docstring), passes everything else to ``inner`` unchanged."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = _eligible(scope) if scope.get("type") == "http" else None
        if request is None:
            return await self.inner(scope, receive, send)
        from agents_app.log_context import request_id_var, session_id_var

        request_id_var.set(request.request_id)
        session_id_var.set(request.session_id)
        try:
            body = await _answer(request, scope)
        except _HandOver as hand_over:
            if hand_over.counted:
                scope = {**scope, COUNTED_SCOPE_KEY: True}
            return await self.inner(scope, receive, send)
        except Exception:
            # Django answers, with its own error handling, whatever went wrong here.
            logger.exception("Snapshot short path failed; Django answers")
            return await self.inner(scope, receive, send)
        headers = response_headers(
            secure=request.secure, request_id=request.request_id, length=len(body)
        )
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
