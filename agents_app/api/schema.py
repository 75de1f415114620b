"""OpenAPI documentation of the REST API's error bodies, in one place.

Every error the API serves has one of the reusable, uniquely named components below, and
``ApiAutoSchema`` (``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]``) adds the errors that follow
from an operation's shape to every operation, so a new endpoint is documented without
listing them:

=====  =================================  ==============================================
code   component                          added to
=====  =================================  ==============================================
400    ``<RequestComponent>Error``        operations with a request body: one property per
                                          input field (a list of messages; an object of
                                          them for list, dict and nested fields), plus
                                          ``non_field_errors`` and ``detail`` (a body
                                          that does not parse)
400    ``PaginationQueryError``           paginated lists: a bad ``limit`` or ``offset``
401    ``NotAuthenticatedError``          every operation that needs a signed-in caller
403    ``PermissionDeniedError``          staff-only views and every unsafe method (a
                                          browser session without its CSRF token)
404    ``NotFoundError``                  operations with a path parameter
413    ``RequestTooLargeError``           operations with a request body
415    ``UnsupportedMediaTypeError``      operations with a request body
429    ``TooManyRequestsError``           operations with throttles (the per-user budgets)
503    ``ServiceUnavailableError``        methods that call the Dex engine
                                          (``DexErrorsMixin.engine_methods``)
=====  =================================  ==============================================

409 bodies depend on the operation and are declared with ``extend_schema`` on the view
(``ConflictError`` or a specific component); an explicit ``responses`` entry always wins over
the defaults. ``agents_app.api.session_access.DexErrorsMixin`` is what actually serves the 503s
and 404s listed here, ``agents_app.rest_errors`` the 413.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache, wraps
from pathlib import Path
from typing import Any

from django.contrib.staticfiles import finders
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.templatetags.static import static
from django.utils.cache import patch_cache_control
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance, is_serializer
from drf_spectacular.utils import OpenApiResponse, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.settings import api_settings

from agents_app.api.fields import BodySerializer
from agents_app.rest_errors import UNAVAILABLE_PARTS

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

#: The characters ``str.strip()`` removes (``str.isspace``), as a regex class body. DRF's
#: ``CharField`` strips them before its blank check, so a text made only of them is blank.
_PYTHON_WHITESPACE = (
    r"\t\n\x0b\x0c\r\x1c-\x1f \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
)
#: Request strings DRF's ``CharField`` accepts: no NUL character (its
#: ``ProhibitNullCharactersValidator``) and, unless blank is allowed, one character that is
#: not whitespace. ECMA-262 and Python ``re`` read these patterns alike. ``NO_NUL_PATTERN``
#: does not match "": drf-spectacular documents a blank-allowed string as ``oneOf`` this
#: pattern and ``maxLength: 0``, so exactly one of them must match.
NO_NUL_PATTERN = r"^[^\x00]+$"
NOT_BLANK_PATTERN = rf"^[^\x00]*[^\x00{_PYTHON_WHITESPACE}][^\x00]*$"


def _detail_body(name: str, help_text: str) -> serializers.Serializer:
    return inline_serializer(name, {"detail": serializers.CharField(help_text=help_text)})


NOT_AUTHENTICATED = _detail_body(
    "NotAuthenticatedError",
    "No credentials, or a token that is unknown, expired or revoked. Send "
    "`Authorization: Bearer <token>` or log in; the response carries `WWW-Authenticate`.",
)
PERMISSION_DENIED = _detail_body(
    "PermissionDeniedError",
    "The caller may read this but not do this: staff-only endpoints for other users, writes "
    "to someone else's session for staff, or a browser session without its CSRF token.",
)
NOT_FOUND = _detail_body(
    "NotFoundError",
    "No such object, or one the caller may not read (other users' sessions look unknown).",
)
CONFLICT = _detail_body(
    "ConflictError",
    "The request is well formed but the object's state refuses it (see the operation).",
)
REQUEST_TOO_LARGE = _detail_body(
    "RequestTooLargeError",
    "The request body is larger than DATA_UPLOAD_MAX_MEMORY_SIZE (2.5 MB by default).",
)
TOO_MANY_REQUESTS = _detail_body(
    "TooManyRequestsError",
    "Over the caller's per-user request budget (DEXAGENTS_THROTTLE_READS / _WRITES); the "
    "Retry-After header says how many seconds to wait.",
)
NOT_ACCEPTABLE = _detail_body(
    "NotAcceptableError",
    "The Accept header names no type the operation answers with.",
)
UNSUPPORTED_MEDIA_TYPE = _detail_body(
    "UnsupportedMediaTypeError",
    "The Content-Type is not one the operation parses (JSON, form or multipart).",
)
SERVICE_UNAVAILABLE = inline_serializer(
    "ServiceUnavailableError",
    {
        "detail": serializers.CharField(
            help_text="What is down, or that the session is too large for the engine to load "
            "at once. Retry later."
        ),
        "unavailable": serializers.ChoiceField(
            choices=list(UNAVAILABLE_PARTS),
            help_text="The part of the platform that is down (agents_app.rest_errors).",
        ),
    },
)

PAGINATION_QUERY_ERROR = inline_serializer(
    "PaginationQueryError",
    {
        name: serializers.ListField(
            child=serializers.CharField(), required=False, help_text="Messages for this field."
        )
        for name in ("limit", "offset")
    },
)

#: Default descriptions of the error responses, shown in Swagger UI and Redoc.
ERROR_DESCRIPTIONS = {
    400: "The input is invalid: a list of messages per field.",
    401: "Not authenticated.",
    403: "Not allowed.",
    404: "Not found.",
    406: "No answer of an accepted type.",
    409: "Conflicts with the object's current state.",
    429: "Too many requests; wait Retry-After seconds.",
    413: "Request body too large.",
    415: "Unsupported Content-Type.",
    503: "A part of the platform is down; retry later.",
}


def error_response(status_code: int, body: Any, description: str = "") -> OpenApiResponse:
    """An ``extend_schema`` ``responses`` value for an error: ``body`` with a description.

    Args:
        status_code: The HTTP status, for the default description.
        body: A serializer (one of this module's components) or None for no body.
        description: Replaces the default description when given.
    """
    return OpenApiResponse(body, description=description or ERROR_DESCRIPTIONS[status_code])


@extend_schema_field(
    {
        "oneOf": [
            {"type": "array", "items": {"type": "string"}},
            {"type": "object", "additionalProperties": True},
        ],
        "description": "Messages for the field; an object of them by index or key for list, "
        "dict and nested fields.",
    }
)
class _CompositeFieldErrors(serializers.Field):
    """Errors of a list, dict or nested field (DRF keys them by index or key)."""


COMPOSITE_FIELDS = (
    serializers.ListField,
    serializers.DictField,
    serializers.HStoreField,
    serializers.BaseSerializer,
    serializers.MultipleChoiceField,
)


def field_errors_serializer(
    input_serializer: Any, *, name: str, extra_fields: tuple[str, ...] = ()
) -> serializers.Serializer:
    """The 400 body DRF serves when ``input_serializer`` rejects a request, as a component.

    Args:
        input_serializer: A serializer class or instance (the request body).
        name: The component's name (``ApiAutoSchema`` uses ``<request component>Error``).
        extra_fields: More plain fields validated elsewhere (a list's ``limit``, ``offset``).

    Returns:
        An ``inline_serializer`` with one optional property per writable field,
        ``non_field_errors`` and ``detail``.
    """
    instance = force_instance(input_serializer)
    fields: dict[str, serializers.Field] = {}
    for field_name, field in instance.fields.items():
        if field.read_only:
            continue
        if isinstance(field, COMPOSITE_FIELDS):
            fields[field_name] = _CompositeFieldErrors(required=False)
        else:
            fields[field_name] = serializers.ListField(
                child=serializers.CharField(), required=False, help_text="Messages for this field."
            )
    for field_name in extra_fields:
        fields[field_name] = serializers.ListField(
            child=serializers.CharField(), required=False, help_text="Messages for this field."
        )
    fields[api_settings.NON_FIELD_ERRORS_KEY] = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="Messages about the body as a whole (e.g. not a JSON object).",
    )
    fields["detail"] = serializers.CharField(
        required=False, help_text="The body could not be parsed (for example invalid JSON)."
    )
    return inline_serializer(name, fields)


class ApiAutoSchema(AutoSchema):
    """drf-spectacular's ``AutoSchema`` that documents every error an operation can serve.

    See the module docstring for which errors are added where. Views name the methods that
    call Dex with ``engine_methods`` (``DexErrorsMixin``); explicit ``extend_schema``
    responses override the defaults per status code.
    """

    def _map_serializer_field(
        self, field: Any, direction: Any, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        """drf-spectacular's field schema, plus for request strings what DRF's ``CharField``
        refuses: blank (or whitespace-only, as it strips) text and NUL characters."""
        schema: dict[str, Any] = super()._map_serializer_field(
            field, direction, bypass_extensions
        )
        if (
            direction == "request"
            and isinstance(field, serializers.CharField)
            and schema.get("type") == "string"
            and "pattern" not in schema
            and "format" not in schema
            and "enum" not in schema
        ):
            if field.allow_blank:
                schema["pattern"] = NO_NUL_PATTERN
            else:
                schema["minLength"] = max(schema.get("minLength", 0), 1)
                schema["pattern"] = (
                    NOT_BLANK_PATTERN if field.trim_whitespace else NO_NUL_PATTERN
                )
        return schema

    def _map_serializer(
        self, serializer: Any, direction: Any, bypass_extensions: bool = False
    ) -> dict[str, Any]:
        """drf-spectacular's object schema, closed (``additionalProperties: false``) for a
        ``BodySerializer`` request body, which refuses names it does not declare."""
        schema: dict[str, Any] = super()._map_serializer(serializer, direction, bypass_extensions)
        if direction == "request" and isinstance(force_instance(serializer), BodySerializer):
            schema["additionalProperties"] = False
        return schema

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses: dict[str, Any] = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for status_code, body in self._default_errors().items():
            key = str(status_code)
            if key not in responses:
                responses[key] = self._get_response_for_code(
                    error_response(status_code, body), key, direction=direction
                )
        return dict(sorted(responses.items()))

    def _default_errors(self) -> dict[int, Any]:
        errors: dict[int, Any] = {}
        permissions = [type(permission) for permission in self.view.get_permissions()]
        needs_user = not any(issubclass(kind, AllowAny) for kind in permissions)
        request_body = self.get_request_serializer() if self.method in BODY_METHODS else None
        if is_serializer(request_body):
            name = self._get_serializer_name(force_instance(request_body), "request")
            errors[400] = field_errors_serializer(request_body, name=f"{name}Error")
        elif self.method == "GET" and self._is_list_view() and self._get_paginator():
            errors[400] = PAGINATION_QUERY_ERROR
        if needs_user:
            errors[401] = NOT_AUTHENTICATED
        if self.method in UNSAFE_METHODS or any(
            issubclass(kind, IsAdminUser) for kind in permissions
        ):
            errors[403] = PERMISSION_DENIED
        if "{" in self.path:
            errors[404] = NOT_FOUND
        if request_body is not None:
            errors[413] = REQUEST_TOO_LARGE
            errors[415] = UNSUPPORTED_MEDIA_TYPE
        if self.view.get_throttles():
            errors[429] = TOO_MANY_REQUESTS
        engine_methods = getattr(self.view, "engine_methods", ())
        if self.method in engine_methods:
            errors[503] = SERVICE_UNAVAILABLE
        return errors



#: The policy of the Swagger UI and Redoc pages: everything from this site. Both render with
#: inline styles; Redoc's search runs in a blob: worker. Redoc's sidebar logo would come from
#: cdn.redoc.ly; ``redoc_bundle_view`` serves a bundle that does not ask for it.
DOCS_CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; font-src 'self' data:; connect-src 'self'; "
    "worker-src 'self' blob:; object-src 'none'; base-uri 'self'; frame-ancestors 'self'"
)


def offline_docs_page(view: Callable[..., HttpResponseBase]) -> Callable[..., HttpResponseBase]:
    """Wrap a docs page view so its response carries ``DOCS_CONTENT_SECURITY_POLICY``: the
    browser then loads nothing from another host, even what the vendored bundles link to."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        response = view(request, *args, **kwargs)
        response.headers["Content-Security-Policy"] = DOCS_CONTENT_SECURITY_POLICY
        return response

    return wrapped


#: The one file Redoc's bundle loads from another host: the Redocly logo beside "API docs by
#: Redocly" in the sidebar (Redoc has no option to leave it out).
REDOC_LOGO_URL = "https://cdn.redoc.ly/redoc/logo-mini.svg"
#: What ``redoc_bundle`` links instead: an empty ``data:`` image, which fails to decode, so the
#: logo's component takes its own ``onError`` path and draws nothing, as it does offline,
#: without a request the docs policy would have to refuse (a console violation).
REDOC_LOGO_REPLACEMENT = "data:,"
REDOC_BUNDLE_PATH = "drf_spectacular_sidecar/redoc/bundles/redoc.standalone.js"


@lru_cache(maxsize=1)
def redoc_bundle() -> bytes:
    """drf-spectacular-sidecar's ``redoc.standalone.js`` (UTF-8 bytes, about 1.1 MB), with
    ``REDOC_LOGO_URL`` replaced by ``REDOC_LOGO_REPLACEMENT`` and its source map linked at
    its static URL. Read once per process.

    Raises:
        ImproperlyConfigured: The sidecar's bundle is not found, or no longer contains
            ``REDOC_LOGO_URL`` (a new Redoc version: check what it loads before serving it).
    """
    found = finders.find(REDOC_BUNDLE_PATH)
    if not found or not isinstance(found, str):
        raise ImproperlyConfigured(f"{REDOC_BUNDLE_PATH} not found (drf-spectacular-sidecar)")
    text = Path(found).read_text(encoding="utf-8")
    if REDOC_LOGO_URL not in text:
        raise ImproperlyConfigured(f"{REDOC_BUNDLE_PATH} no longer links {REDOC_LOGO_URL}")
    text = text.replace(f'"{REDOC_LOGO_URL}"', f'"{REDOC_LOGO_REPLACEMENT}"')
    text = text.replace(
        "//# sourceMappingURL=redoc.standalone.js.map",
        f"//# sourceMappingURL={static(REDOC_BUNDLE_PATH)}.map",
    )
    return text.encode()


def redoc_bundle_view(request: HttpRequest) -> HttpResponse:
    """``GET /api/redoc/redoc.standalone.js``: ``redoc_bundle()`` as JavaScript, cacheable
    for an hour (the file changes only with the installed sidecar)."""
    response = HttpResponse(redoc_bundle(), content_type="text/javascript; charset=utf-8")
    patch_cache_control(response, private=True, max_age=3600)
    return response
