"""``manage.py createtoken <username>``: print a DRF API token for a user.

Creates the user (without a usable password) when it does not exist yet. The same token is
printed on every run until it is deleted in the admin.
"""

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from agents_app.services import user_token_get_or_create


class Command(BaseCommand):
    help = "Print the API token of a user, creating the user and the token if needed."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("username")

    def handle(self, *args: Any, **options: Any) -> None:
        username = options["username"].strip()
        if not username:
            raise CommandError("The username must not be blank.")
        key, user_created = user_token_get_or_create(username=username)
        if user_created:
            self.stderr.write(f"Created user {username!r}.")
        self.stdout.write(key)
