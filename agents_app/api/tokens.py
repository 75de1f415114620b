"""REST endpoints of the caller's own API tokens: ``/api/v1/tokens/`` (ARCHITECTURE.md "Auth").

- ``GET /api/v1/tokens/``: the caller's tokens, newest first, paginated like every list
  (``limit``/``offset``); never a key.
- ``POST /api/v1/tokens/`` ``{"name", "expires_at"?}``: a new token; 201 with its ``key``,
  shown this once. Only a password (HTTP Basic) or a logged-in browser session may create
  one; a token may not (403), so a leaked token cannot mint itself a longer life.
- ``DELETE /api/v1/tokens/<id>/``: revoke one of the caller's tokens (204); 404 for an ID the
  caller has no token with (another user's included).

Tokens are stored hashed (django-rest-knox's format, ``agents_app.models.ApiToken``). Staff
have no say over other users' tokens here; the admin lists and deletes them.
"""

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.authentication import BasicAuthentication, SessionAuthentication
from rest_framework.exceptions import APIException, NotFound, PermissionDenied
from rest_framework.generics import ListAPIView
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from agents_app.api.fields import BodySerializer
from agents_app.api.query import KnownQueryParametersFilter
from agents_app.api.schema import CONFLICT, error_response
from agents_app.auth import BearerTokenAuthentication
from agents_app.models import ApiToken
from agents_app.selectors.api_tokens import api_token_list
from agents_app.services import api_tokens

TOKEN_NAME_MAX_CHARS = 100

#: Bearer first: its ``WWW-Authenticate`` challenge is the one a 401 carries (a Basic
#: challenge would make browsers pop up a password dialog).
TOKEN_AUTHENTICATION = (BearerTokenAuthentication, SessionAuthentication, BasicAuthentication)

CREATE_WITH_TOKEN_DETAIL = (
    "An API token cannot create tokens: authenticate with your password (HTTP Basic) or a "
    "logged-in browser session."
)


class ApiTokenOutputSerializer(serializers.ModelSerializer):
    """One API token as its owner sees it: never the key."""

    created_at = serializers.DateTimeField(source="created", read_only=True)
    expires_at = serializers.DateTimeField(
        source="expiry", read_only=True, allow_null=True, help_text="null: never expires."
    )
    expired = serializers.SerializerMethodField()

    class Meta:
        model = ApiToken
        fields: tuple[str, ...] = ("id", "name", "created_at", "expires_at", "expired")

    def get_expired(self, token: ApiToken) -> bool:
        """Whether the token is refused because its expiry passed."""
        return token.expiry is not None and token.expiry <= timezone.now()


class ApiTokenCreatedSerializer(ApiTokenOutputSerializer):
    """The answer to a create: the token and, this once, its key."""

    key = serializers.CharField(
        read_only=True,
        help_text="The secret to send as `Authorization: Bearer <key>`. Shown only in this "
        "answer: store it now.",
    )

    class Meta(ApiTokenOutputSerializer.Meta):
        fields: tuple[str, ...] = (*ApiTokenOutputSerializer.Meta.fields, "key")


class ApiTokenLimitReached(APIException):
    """409: the caller holds as many tokens as one user may."""

    status_code = status.HTTP_409_CONFLICT
    default_code = "api_token_limit"


class ApiTokenListCreateApi(ListAPIView):
    """``/api/v1/tokens/``: the caller's own API tokens.

    ``GET``: the caller's tokens, newest first, paginated (``limit``/``offset``), each
    ``{"id", "name", "created_at", "expires_at" (null: never), "expired"}``; never a key.
    Expired tokens stay listed (and refused) until revoked.

    ``POST`` ``{"name", "expires_at"?}`` with HTTP Basic (username and password) or a
    logged-in browser session (with its CSRF token): 201 with the token and its ``key``, shown
    only in this answer. 403 when a token authenticates the call (a token cannot create
    tokens), 400 with field messages, 409 when the caller holds the most tokens one user may
    (``DEXAGENTS_MAX_API_TOKENS_PER_USER``, 50).
    """

    authentication_classes = TOKEN_AUTHENTICATION
    serializer_class = ApiTokenOutputSerializer
    filter_backends = (KnownQueryParametersFilter,)

    class ApiTokenCreateInputSerializer(BodySerializer):
        name = serializers.CharField(
            max_length=TOKEN_NAME_MAX_CHARS, help_text="What the token is for, e.g. 'CI deploy'."
        )
        expires_at = serializers.DateTimeField(
            required=False,
            allow_null=True,
            help_text="ISO 8601 date-time after which the token is refused; absent or null: "
            "never expires.",
        )

        def validate_expires_at(self, value: Any) -> Any:
            if value is not None and value <= timezone.now():
                raise serializers.ValidationError("Give a moment in the future.")
            return value

    def get_queryset(self) -> Any:
        return api_token_list(user=self.request.user)

    @extend_schema(
        summary="List your API tokens",
        responses={200: ApiTokenOutputSerializer(many=True)},
    )
    def get(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        return super().get(request, *args, **kwargs)

    @extend_schema(
        summary="Create an API token (password or browser session only)",
        request=ApiTokenCreateInputSerializer,
        responses={
            201: ApiTokenCreatedSerializer,
            409: error_response(
                409, CONFLICT, "The user holds MAX_API_TOKENS_PER_USER tokens already."
            ),
        },
    )
    def post(self, request: Request) -> Response:
        if isinstance(request.successful_authenticator, BearerTokenAuthentication):
            raise PermissionDenied(CREATE_WITH_TOKEN_DETAIL)
        serializer = self.ApiTokenCreateInputSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        try:
            token, key = api_tokens.api_token_create(
                user=request.user,  # type: ignore[arg-type]  # IsAuthenticated passed
                name=serializer.validated_data["name"],
                expires_at=serializer.validated_data.get("expires_at"),
            )
        except api_tokens.ApiTokenLimitError as error:
            raise ApiTokenLimitReached(str(error)) from None
        return Response(
            {**ApiTokenOutputSerializer(token).data, "key": key}, status=status.HTTP_201_CREATED
        )


class ApiTokenRevokeApi(APIView):
    """``DELETE /api/v1/tokens/<id>/``: revoke one of the caller's API tokens; 204, and its key
    is refused (401) from the next request on. 404 when the caller has no token with this ID
    (another user's token included). Any authentication may revoke, a token itself included
    (a client logging out)."""

    authentication_classes = TOKEN_AUTHENTICATION

    @extend_schema(
        summary="Revoke one of your API tokens",
        request=None,
        responses={204: None},
    )
    def delete(self, request: Request, token_id: int) -> Response:
        if not api_tokens.api_token_revoke(user=request.user, token_id=token_id):
            raise NotFound("You have no API token with this ID.")
        return Response(status=status.HTTP_204_NO_CONTENT)
