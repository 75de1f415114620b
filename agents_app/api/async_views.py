"""Async DRF views: the API's Dex-reading endpoints without a thread held per Dex call.

DRF 3.x dispatches synchronously. ``AsyncAPIView`` keeps everything DRF does around the
handler (authentication, permissions, throttles, content negotiation, the project's
exception handler, ``finalize_response``) and only awaits the handler itself, so its Dex
calls (``dex_gateway.call``) wait on an event loop instead of blocking a thread.

What stays synchronous runs through ``asgiref.sync.sync_to_async`` (thread-sensitive: under
Django's ASGI handler, the request's own thread, where its database connection lives and is
closed by ``request_finished``): ``initial`` (authentication reads tokens and sessions),
``handle_exception`` (the Dex error mapping reads the index and may ask Dex), and whatever
ORM work a handler hands to ``db``.

adrf (PyPI) offers the same dispatch, but runs ``handle_exception`` on the event loop, where
``DexErrorsMixin`` cannot read the database.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from asgiref.sync import sync_to_async
from django.db import connections
from django.http import HttpRequest
from rest_framework.generics import ListAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

P = ParamSpec("P")
R = TypeVar("R")


def db(function: Callable[P, R]) -> Callable[P, Any]:
    """``function`` (sync, ORM or blocking) as a coroutine function run on the request's thread.

    Usage: ``session = await db(session_reads.session_get_for_staff)(session_id=...)``.
    """
    return sync_to_async(function, thread_sensitive=True)


class AsyncAPIView(APIView):
    """An ``APIView`` whose HTTP handlers are ``async def`` (all of them: Django refuses a
    class that mixes sync and async handlers)."""

    async def dispatch(  # type: ignore[override]
        self, request: HttpRequest, *args: Any, **kwargs: Any
    ) -> Response:
        """DRF's ``APIView.dispatch``, awaiting the handler (rest_framework/views.py)."""
        self.args = args
        self.kwargs = kwargs
        drf_request = self.initialize_request(request, *args, **kwargs)
        self.request = drf_request
        self.headers = self.default_response_headers
        try:
            await db(self.initial)(drf_request, *args, **kwargs)
            method = (drf_request.method or "").lower()
            if method in self.http_method_names:
                handler = getattr(self, method, self.http_method_not_allowed)
            else:
                handler = self.http_method_not_allowed
            response = handler(drf_request, *args, **kwargs)
            # OPTIONS (DRF's metadata) and 405 stay synchronous.
            if inspect.isawaitable(response):
                response = await response
        except Exception as exc:
            response = await db(self.handle_exception)(exc)
        self.response = self.finalize_response(drf_request, response, *args, **kwargs)
        return self.response


class AsyncListAPIView(AsyncAPIView, ListAPIView):
    """DRF's ``ListAPIView`` under ``AsyncAPIView``'s dispatch: a subclass writes ``async def``
    handlers and runs the list (ORM, pagination) with ``await db(self.list)(request)``."""


async def release_database() -> None:
    """Close this request's database connections before a long wait, so a waiting request
    holds none (the next ORM call opens one again)."""
    await db(connections.close_all)()
