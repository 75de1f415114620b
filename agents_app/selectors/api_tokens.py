"""Reads of API tokens: a user's own tokens (``api_token_list``).

May import: the foundation (tests/test_layering.py).
"""



from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.db.models import QuerySet

from agents_app.models import ApiToken


def api_token_list(*, user: AbstractBaseUser | AnonymousUser) -> QuerySet[ApiToken]:
    """``user``'s own API tokens, newest first (expired ones included, until revoked)."""
    return ApiToken.objects.filter(user_id=user.pk).order_by("-created", "-id")
