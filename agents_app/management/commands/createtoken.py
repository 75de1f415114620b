"""``manage.py createtoken <username> [--staff] [--name NAME] [--expires WHEN] [--replace]``:
create an API token for a user and print its key.

Creates the user (without a usable password) when it does not exist yet; ``--staff`` creates
it as staff, or marks an existing user as staff, so the token can approve tool calls. The
username must pass the user model's username validators and maximum length. Keys are stored
hashed, so each run creates a new token and prints its key, the only time it is shown; list
and revoke tokens with ``/api/v1/tokens/`` or in the admin. ``--expires`` takes a lifetime
(``30d``, ``12h``, ``45m``, or ISO 8601 such as ``P30D``) or an ISO 8601 date-time.
``--replace`` revokes the user's other tokens of the same name first.
"""

import datetime
import re
from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone
from django.utils.dateparse import parse_datetime, parse_duration

from agents_app.services.api_tokens import ApiTokenLimitError, user_token_create

TOKEN_NAME_MAX_CHARS = 100
_SHORT_LIFETIME = re.compile(r"^(\d+)([dhm])$")
_UNITS = {"d": "days", "h": "hours", "m": "minutes"}


def expiry_parse(value: str, *, now: datetime.datetime) -> datetime.datetime:
    """The expiry moment of ``--expires``: ``now`` plus a lifetime (``30d``, ``12h``, ``45m``,
    ISO 8601 ``P30D``), or an ISO 8601 date-time (UTC when it has no offset).

    Raises:
        CommandError: Unreadable, or not after ``now``.
    """
    text = value.strip()
    short = _SHORT_LIFETIME.match(text)
    moment: datetime.datetime | None = None
    try:
        if short:
            moment = now + datetime.timedelta(**{_UNITS[short.group(2)]: int(short.group(1))})
        elif text.upper().startswith("P"):
            lifetime = parse_duration(text)
            if lifetime is not None:
                moment = now + lifetime
    except OverflowError:
        raise CommandError(
            f"--expires {value!r} is past the year 9999; leave --expires out for a token that "
            "never expires."
        ) from None
    if not short and not text.upper().startswith("P"):
        try:
            moment = parse_datetime(text)
        except ValueError:
            moment = None
        if moment is not None and timezone.is_naive(moment):
            moment = moment.replace(tzinfo=datetime.UTC)
    if moment is None:
        raise CommandError(
            f"--expires {value!r}: give a lifetime such as 30d, 12h, 45m or P30D, or an "
            "ISO 8601 date-time such as 2027-01-31T12:00:00Z."
        )
    if moment <= now:
        raise CommandError(f"--expires {value!r} is not in the future.")
    return moment


class Command(BaseCommand):
    help = "Create an API token for a user (creating the user if needed) and print its key."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--staff",
            action="store_true",
            help="Create the user as staff, or mark an existing user as staff (may approve).",
        )
        parser.add_argument(
            "--name", default="createtoken", help="What the token is for (default: createtoken)."
        )
        parser.add_argument(
            "--expires",
            default="",
            help="Lifetime (30d, 12h, 45m, P30D) or ISO 8601 date-time; default: never.",
        )
        parser.add_argument(
            "--replace",
            action="store_true",
            help="Revoke the user's other tokens with the same name first.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username:
            raise CommandError("The username must not be blank.")
        name = options["name"].strip()
        if not name or len(name) > TOKEN_NAME_MAX_CHARS:
            raise CommandError(f"--name must be 1 to {TOKEN_NAME_MAX_CHARS} characters.")
        expires_at = None
        if options["expires"]:
            expires_at = expiry_parse(options["expires"], now=timezone.now())
        try:
            key, user_created = user_token_create(
                username=username,
                staff=options["staff"],
                name=name,
                expires_at=expires_at,
                replace=options["replace"],
            )
        except ValidationError as error:
            reason = " ".join(error.messages)
            raise CommandError(f"Invalid username {username!r}: {reason}") from None
        except ApiTokenLimitError as error:
            raise CommandError(str(error)) from None
        if user_created:
            self.stderr.write(f"Created {'staff ' if options['staff'] else ''}user {username!r}.")
        elif options["staff"]:
            self.stderr.write(f"User {username!r} is staff.")
        until = f", expires {expires_at.isoformat()}" if expires_at else ", never expires"
        self.stderr.write(
            f"New API token {name!r} for {username!r}{until}. The key is shown only now:"
        )
        self.stdout.write(key)
