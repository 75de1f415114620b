"""Writes of API tokens: create (``api_token_create``), revoke (``api_token_revoke``), and the
user-and-token of ``manage.py createtoken`` (``user_token_create``).

Keys are shown once and stored as django-rest-knox stores them (``agents_app.models.ApiToken``).

May import: the foundation (tests/test_layering.py).
"""


import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db import models, transaction
from knox.models import get_digest_token
from knox.settings import CONSTANTS as KNOX_CONSTANTS

from agents_app.conf import dexagents_setting
from agents_app.models import ApiToken


class ApiTokenLimitError(Exception):
    """The user already holds ``DEXAGENTS["MAX_API_TOKENS_PER_USER"]`` API tokens."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"You already have {limit} API tokens, the most one user may hold: revoke one "
            "you no longer use (DELETE /api/v1/tokens/<id>/), then create this one."
        )
        self.limit = limit


def api_token_create(
    *,
    user: AbstractBaseUser,
    name: str,
    expires_at: datetime.datetime | None = None,
    replace: bool = False,
) -> tuple[ApiToken, str]:
    """Create an API token for ``user`` and return ``(token, key)``.

    The key (``"dxa_"`` + 64 hex characters, django-rest-knox's generator) is returned here
    only: the database keeps its SHA-512 digest (``ApiToken``), so callers show it once.

    Args:
        name: What the token is for (1-100 characters; callers validate).
        expires_at: Aware datetime after which the token is refused; None: never.
        replace: Revoke ``user``'s other tokens named ``name`` first (``manage.py dev``
            prints a fresh demo token on every start without piling them up).

    Raises:
        ApiTokenLimitError: ``user`` holds ``DEXAGENTS["MAX_API_TOKENS_PER_USER"]`` tokens
            already (counted after ``replace``); nothing is created.
    """
    limit = int(dexagents_setting("MAX_API_TOKENS_PER_USER"))
    digest, key = get_digest_token()
    with transaction.atomic():
        if replace:
            ApiToken.objects.filter(user=user, name=name).delete()
        if ApiToken.objects.filter(user=user).count() >= limit:
            raise ApiTokenLimitError(limit)
        # Not knox's manager ``create``: it takes a time-to-live, not a moment.
        token = ApiToken(
            user=user,
            name=name,
            expiry=expires_at,
            digest=digest,
            token_key=key[: KNOX_CONSTANTS.TOKEN_KEY_LENGTH],
        )
        token.save(force_insert=True)
    return token, key


def api_token_revoke(*, user: AbstractBaseUser | AnonymousUser, token_id: int) -> bool:
    """Delete ``user``'s API token ``token_id``; False when ``user`` has no such token (another
    user's token counts as none). Clients using its key get 401 from the next request on."""
    deleted, _ = ApiToken.objects.filter(user_id=user.pk, pk=token_id).delete()
    return bool(deleted)


def user_token_create(
    *,
    username: str,
    staff: bool = False,
    name: str = "createtoken",
    expires_at: datetime.datetime | None = None,
    replace: bool = False,
) -> tuple[str, bool]:
    """Return ``(new API token key, user_created)`` for ``username``, creating the user when
    missing (``manage.py createtoken``).

    A new user gets no usable password; it authenticates with the token only. ``staff``
    creates the user as staff, or marks an existing one (it never takes staff away). Every
    call makes a new token (keys are stored hashed, so an old one cannot be shown again);
    ``name``, ``expires_at`` and ``replace`` are ``api_token_create``'s.

    Raises:
        django.core.exceptions.ValidationError: ``username`` fails the user model's
            username field (its validators and max length); nothing is created.
        ApiTokenLimitError: The user holds the most tokens one user may; nothing changes.
    """
    from django.contrib.auth import get_user_model

    user_model = get_user_model()
    username_field = user_model._meta.get_field(user_model.USERNAME_FIELD)
    if isinstance(username_field, models.Field):
        username_field.clean(username, None)
    lookup: dict[str, Any] = {user_model.USERNAME_FIELD: username}
    with transaction.atomic():
        user, created = user_model._default_manager.get_or_create(**lookup)
        if created:
            user.set_unusable_password()
        if staff:
            user.is_staff = True
        if created or staff:
            user.save()
        _, key = api_token_create(user=user, name=name, expires_at=expires_at, replace=replace)
    return key, created
