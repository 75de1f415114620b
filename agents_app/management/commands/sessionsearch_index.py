"""``manage.py sessionsearch_index [SESSION_ID ...]``: fill the sessions' full-text search
index from Dex (``session_search.message_texts_backfill``).

The Dex worker indexes every turn's messages as it runs; sessions older than the index
(created before migration 0016) have none until this runs once. Needs the engine and a
worker (reading messages is an RPC). Idempotent: a message indexed twice keeps one row.
"""

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from agents_app.sessions.session_search import message_texts_backfill


class Command(BaseCommand):
    help = "Index the stored messages of every session (or the given ones) for search."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("session_ids", nargs="*", help="Only these sessions.")

    def handle(self, *args: Any, **options: Any) -> None:
        count = message_texts_backfill(session_ids=options["session_ids"] or None)
        self.stdout.write(f"Indexed {count} messages.")
