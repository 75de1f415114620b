"""Error answers of the REST API: always JSON ``{"detail": ...}``, never an HTML page.

Three pieces keep every ``/api/`` answer JSON:

- ``api_exception_handler`` (DRF's ``EXCEPTION_HANDLER``): DRF's own handler, plus a JSON 413
  for Django's ``RequestDataTooBig`` (raised while DRF parses a body larger than
  ``DATA_UPLOAD_MAX_MEMORY_SIZE``), which would otherwise reach Django's HTML 400 page.
- ``BoundedJSONParser`` (DRF's JSON parser): a body nested deeper than
  ``JSON_MAX_NESTING_DEPTH`` is a 400 ``ParseError`` instead of Python's ``RecursionError``
  (a 500).
- ``ApiJsonErrorsMiddleware``: whatever Django itself answers under ``/api/`` (the
  ``DEXAGENTS["API_PATH_PREFIX"]``) outside DRF's
  views (a path no route matches, such as ``/api/v1/sessions/a%2Fb/``; a 500 page, also the
  technical one under ``DEBUG``; a CSRF or bad-request page) becomes
  ``{"detail": ...}`` with the same status and headers.

``ServiceUnavailable`` is the one 503 shape of every endpoint:
``{"detail": str, "unavailable": "engine" | "worker" | "model"}`` names the part that is down.
"""

from __future__ import annotations

import codecs
import json
import logging
from collections.abc import Mapping
from http import HTTPStatus
from typing import IO, Any, Literal

from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.utils.deprecation import MiddlewareMixin
from rest_framework import status
from rest_framework.exceptions import APIException, ParseError
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.settings import api_settings
from rest_framework.utils import json as drf_json

from agents_app.conf import dexagents_setting

logger = logging.getLogger(__name__)

#: Deepest nesting of arrays and objects a request body may have. No API body nests more than
#: a few levels; the bound stays far below Python's recursion limit (about 1,000 frames).
JSON_MAX_NESTING_DEPTH = 64

#: The parts a 503 may name, in the order a request needs them.
UnavailablePart = Literal["engine", "worker", "model"]
UNAVAILABLE_PARTS: tuple[UnavailablePart, ...] = ("engine", "worker", "model")



def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, plus a JSON 413 ``{"detail"}`` for request bodies over the size limit.

    Returns:
        The error response, or ``None`` for exceptions Django should handle (server errors,
        which ``ApiJsonErrorsMiddleware`` then answers as JSON).
    """
    # Imported here: rest_framework.views reads DEFAULT_PARSER_CLASSES, which name this module.
    from rest_framework.views import exception_handler as drf_exception_handler

    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is larger than the limit of {limit} bytes."},
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    return drf_exception_handler(exc, context)


class ServiceUnavailable(APIException):
    """503 ``{"detail": str, "unavailable": part}``: a part of the platform is down.

    Args:
        part: What is down: ``"engine"`` (the Dex engine does not answer), ``"worker"``
            (no Dex worker serves the session's Flow, so its RPCs cannot run) or
            ``"model"`` (the model provider).
        detail: A sentence for people; defaults to one naming ``part``.
    """

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "service_unavailable"

    def __init__(self, part: UnavailablePart, detail: str | None = None) -> None:
        if part not in UNAVAILABLE_PARTS:
            raise ValueError(f"unknown platform part {part!r}")
        self.part = part
        super().__init__({"detail": detail or unavailable_detail(part), "unavailable": part})


def unavailable_detail(part: UnavailablePart) -> str:
    """The default sentence of a 503 that names ``part``."""
    return {
        "engine": "The Dex engine is not reachable; try again shortly.",
        "worker": (
            "No Dex worker is running, so the session cannot be reached; try again once the "
            "worker is back."
        ),
        "model": "The model provider is not reachable; try again shortly.",
    }[part]


def _nesting_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether a parsed JSON value nests arrays/objects deeper than ``limit`` (no recursion)."""
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return True
        pending.extend((child, depth + 1) for child in children)
    return False


class BoundedJSONParser(JSONParser):
    """DRF's ``JSONParser`` with a nesting bound.

    Raises:
        ParseError: (400 ``{"detail"}``) the body is not JSON, or nests arrays and objects
            deeper than ``JSON_MAX_NESTING_DEPTH`` levels.
    """

    def parse(
        self,
        stream: IO[Any],
        media_type: str | None = None,
        parser_context: Mapping[str, Any] | None = None,
    ) -> Any:
        encoding = (parser_context or {}).get("encoding", settings.DEFAULT_CHARSET)
        parse_constant = drf_json.strict_constant if api_settings.STRICT_JSON else None
        try:
            data = json.load(codecs.getreader(encoding)(stream), parse_constant=parse_constant)
        except RecursionError:
            raise ParseError(self.too_deep) from None
        except (ValueError, LookupError) as error:
            raise ParseError(f"JSON parse error - {error}") from None
        if _nesting_depth_exceeds(data, JSON_MAX_NESTING_DEPTH):
            raise ParseError(self.too_deep)
        return data

    too_deep = (
        f"JSON parse error - arrays and objects nest deeper than {JSON_MAX_NESTING_DEPTH} levels."
    )


def _is_api_path(request: HttpRequest) -> bool:
    # DEXAGENTS["API_PATH_PREFIX"] (default "/api/"): where the host project mounts the API.
    return request.path_info.startswith(str(dexagents_setting("API_PATH_PREFIX")))


def _error_detail(request: HttpRequest, status_code: int) -> str:
    if status_code == HTTPStatus.NOT_FOUND:
        return f"Not found: no API endpoint or object at {request.path_info}."
    if status_code >= HTTPStatus.INTERNAL_SERVER_ERROR:
        return "Internal server error; it was logged."
    try:
        phrase = HTTPStatus(status_code).phrase
    except ValueError:
        phrase = "Error"
    return f"{phrase}."


def _missing_slash_answer(request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
    """A path under ``/api/`` without its trailing slash (Django's ``APPEND_SLASH`` redirect).

    GET and HEAD keep the 301, with a JSON body; any other method answers 404 JSON naming the
    right path, since a client following a 301 would resend the request as a GET, without its
    body."""
    target = request.path + "/"
    if request.method in ("GET", "HEAD"):
        moved = HttpResponse(
            json.dumps({"detail": f"Moved to {target}"}),
            status=HTTPStatus.MOVED_PERMANENTLY,
            content_type="application/json",
        )
        moved["Location"] = response["Location"]
        return moved
    return HttpResponse(
        json.dumps({"detail": f"No endpoint at {request.path}; did you mean {target} (API "
                              "paths end with a slash)?"}),
        status=HTTPStatus.NOT_FOUND,
        content_type="application/json",
    )


class ApiJsonErrorsMiddleware(MiddlewareMixin):
    """Answer every error under ``/api/`` with JSON ``{"detail"}`` (statuses 400 and up).

    DRF's views answer JSON themselves, except to a browser asking for HTML (the browsable
    API), whose error keeps its body as JSON; this also turns Django's own HTML answers (no
    route matched, a 500 page, a CSRF refusal) into ``{"detail"}`` with the same status and
    headers. Install it first in ``MIDDLEWARE`` so it also sees the other middlewares' answers.
    """

    def process_response(
        self, request: HttpRequest, response: HttpResponseBase
    ) -> HttpResponseBase:
        if (
            response.status_code == HTTPStatus.MOVED_PERMANENTLY
            and _is_api_path(request)
            and response.get("Location", "").endswith(request.path + "/")
        ):
            return _missing_slash_answer(request, response)
        if (
            response.status_code < HTTPStatus.BAD_REQUEST
            or not _is_api_path(request)
            or response.get("Content-Type", "").startswith("application/json")
            or not isinstance(response, HttpResponse)
        ):
            return response
        # A DRF answer rendered as HTML (the browsable API, for a browser's Accept header) keeps
        # its own error body.
        data = getattr(response, "data", None)
        if not isinstance(data, dict) or not data:
            data = {"detail": _error_detail(request, response.status_code)}
        response.content = json.dumps(data).encode()
        response["Content-Type"] = "application/json"
        if response.has_header("Content-Length"):
            # CommonMiddleware measured the HTML page this replaces.
            response["Content-Length"] = str(len(response.content))
        return response
