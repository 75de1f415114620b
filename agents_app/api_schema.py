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
401    ``NotAuthenticatedError``          every operation that needs a signed-in caller
403    ``PermissionDeniedError``          staff-only views and every unsafe method (a
                                          browser session without its CSRF token)
404    ``NotFoundError``                  operations with a path parameter
413    ``RequestTooLargeError``           operations with a request body
415    ``UnsupportedMediaTypeError``      operations with a request body
503    ``ServiceUnavailableError``        methods that call the Dex engine
                                          (``DexErrorsMixin.engine_methods``)
=====  =================================  ==============================================

409 bodies depend on the operation and are declared with ``extend_schema`` on the view
(``ConflictError`` or a specific component); an explicit ``responses`` entry always wins over
the defaults. ``agents_app.apis.DexErrorsMixin`` is what actually serves the 503s and 404s
listed here, ``dexagents_site.rest_errors`` the 413.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import force_instance, is_serializer
from drf_spectacular.utils import OpenApiResponse, extend_schema_field, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny, IsAdminUser
from rest_framework.settings import api_settings

UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


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
UNSUPPORTED_MEDIA_TYPE = _detail_body(
    "UnsupportedMediaTypeError",
    "The Content-Type is not one the operation parses (JSON, form or multipart).",
)
SERVICE_UNAVAILABLE = _detail_body(
    "ServiceUnavailableError",
    "A part the request needs is down (the Dex engine or the worker) or the session is too "
    "large for the engine to load at once; the text says which. Retry later.",
)

#: Default descriptions of the error responses, shown in Swagger UI and Redoc.
ERROR_DESCRIPTIONS = {
    400: "The input is invalid: a list of messages per field.",
    401: "Not authenticated.",
    403: "Not allowed.",
    404: "Not found.",
    409: "Conflicts with the object's current state.",
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


def field_errors_serializer(input_serializer: Any, *, name: str) -> serializers.Serializer:
    """The 400 body DRF serves when ``input_serializer`` rejects a request, as a component.

    Args:
        input_serializer: A serializer class or instance (the request body).
        name: The component's name (``ApiAutoSchema`` uses ``<request component>Error``).

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
        engine_methods = getattr(self.view, "engine_methods", ())
        if self.method in engine_methods:
            errors[503] = SERVICE_UNAVAILABLE
        return errors

