"""``manage.py createtoken <username> [--staff]``: print a DRF API token for a user.

Creates the user (without a usable password) when it does not exist yet; ``--staff`` creates
it as staff, or marks an existing user as staff, so the token can approve tool calls. The
username must pass the user model's username validators and maximum length. The same token
is printed on every run until it is deleted in the admin.
"""

from argparse import ArgumentParser
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError

from agents_app.services import user_token_get_or_create


class Command(BaseCommand):
    help = "Print the API token of a user, creating the user and the token if needed."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")
        parser.add_argument(
            "--staff",
            action="store_true",
            help="Create the user as staff, or mark an existing user as staff (may approve).",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username:
            raise CommandError("The username must not be blank.")
        try:
            key, user_created = user_token_get_or_create(username=username, staff=options["staff"])
        except ValidationError as error:
            reason = " ".join(error.messages)
            raise CommandError(f"Invalid username {username!r}: {reason}") from None
        if user_created:
            self.stderr.write(f"Created {'staff ' if options['staff'] else ''}user {username!r}.")
        elif options["staff"]:
            self.stderr.write(f"User {username!r} is staff.")
        self.stdout.write(key)
