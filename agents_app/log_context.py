"""Request and session IDs on every log line (``DEXAGENTS_LOG_FORMAT=json``).

Two context variables travel with the code that serves one request, websocket or Step:

- ``request_id``: an HTTP request's ``X-Request-ID`` (when it is 1-128 characters of
  ``[A-Za-z0-9._:-]``), else a new UUID4 hex; the response echoes it in ``X-Request-ID``
  (``RequestIdMiddleware``). Websockets take the handshake's header the same way
  (``bind_websocket``); the Dex worker's Steps use ``step:<session ID>`` style IDs of their
  own (``bind_session`` with a request ID).
- ``session_id``: the agent session being served: ``/api/v1/sessions/<id>/...`` requests,
  ``/ws/sessions/<id>/events/`` sockets, and the worker's model and tool Steps.

``ContextFilter`` copies both onto each ``LogRecord`` (``-`` when unset), for the JSON
formatter (python-json-logger) and the plain one alike. Context variables are copied into
tasks and ``sync_to_async`` threads, so the IDs follow the work.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.core.signals import request_finished
from django.http import HttpRequest, HttpResponse

request_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dexagents_request_id", default=None
)
session_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "dexagents_session_id", default=None
)

_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
_SESSION_PATH = re.compile(r"^/api/v1/sessions/(?P<id>[A-Za-z0-9_-]{1,64})(?:/|$)")


def request_id_from(header: str | None) -> str:
    """The request ID to use: ``header`` when it is a safe token, else a new UUID4 hex."""
    if header and _VALID_REQUEST_ID.fullmatch(header):
        return header
    return uuid.uuid4().hex


@contextlib.contextmanager
def bind_session(session_id: str, *, request_id: str | None = None) -> Iterator[None]:
    """Log ``session_id`` (and ``request_id`` when given) on every line inside the block."""
    session_token = session_id_var.set(session_id)
    request_token = request_id_var.set(request_id) if request_id is not None else None
    try:
        yield
    finally:
        if request_token is not None:
            request_id_var.reset(request_token)
        session_id_var.reset(session_token)


def bind_websocket(scope: dict[str, Any], *, session_id: str | None) -> str:
    """Bind a request ID (the handshake's ``X-Request-ID`` or a new one) and ``session_id``
    for the rest of a websocket consumer's task; returns the request ID."""
    headers = dict(scope.get("headers") or [])
    raw = headers.get(b"x-request-id")
    request_id = request_id_from(raw.decode("latin-1") if raw else None)
    request_id_var.set(request_id)
    session_id_var.set(session_id)
    return request_id


class ContextFilter(logging.Filter):
    """Adds ``request_id`` and ``session_id`` (``"-"`` when unset) to every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get() or "-"
        record.session_id = session_id_var.get() or "-"
        return True


def _unbind_request(**kwargs: Any) -> None:
    """``request_finished``: the thread that served a sync request logs without its IDs."""
    request_id_var.set(None)
    session_id_var.set(None)


class RequestIdMiddleware:
    """Bind ``request_id`` (from ``X-Request-ID`` or new) and, under
    ``/api/v1/sessions/<id>/``, ``session_id`` for the request; echo ``X-Request-ID``.

    Sync and async capable, so it adds no thread hop in front of async views.
    """

    sync_capable = True
    async_capable = True

    def __init__(
        self, get_response: Callable[[HttpRequest], HttpResponse | Awaitable[HttpResponse]]
    ) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        request_finished.connect(_unbind_request, dispatch_uid="dexagents-log-context")
        if self._async:
            markcoroutinefunction(self)

    @staticmethod
    def _bind(request: HttpRequest) -> str:
        # Not reset on the way out: Django logs a 4xx/5xx (``django.request``) after the
        # middleware chain returns, and that line needs the IDs too. Under ASGI every request
        # runs in a task of its own, whose context ends with it; a WSGI thread clears them
        # when the response is closed (request_finished).
        request_id = request_id_from(request.headers.get("X-Request-ID"))
        request_id_var.set(request_id)
        match = _SESSION_PATH.match(request.path)
        session_id_var.set(match.group("id") if match else None)
        return request_id

    def __call__(self, request: HttpRequest) -> Any:
        if self._async:
            return self.__acall__(request)
        request_id = self._bind(request)
        response = self.get_response(request)
        response["X-Request-ID"] = request_id  # type: ignore[index]
        return response

    async def __acall__(self, request: HttpRequest) -> HttpResponse:
        request_id = self._bind(request)
        response = await self.get_response(request)  # type: ignore[misc]
        response["X-Request-ID"] = request_id
        return response
