"""Move plain-text DRF tokens (``rest_framework.authtoken``, used before hashed API tokens)
into ``ApiToken``, hashed, and delete the plain-text rows.

Clients keep working with the key they have: ``ApiToken`` stores what django-rest-knox
stores for a key (its SHA-512 hex digest and its first 15 characters), so the same
``Authorization`` header finds the moved token. The ``authtoken_token`` table itself is left
in place, empty (``rest_framework.authtoken`` is no longer installed, so nothing writes it).
Raw SQL, because the DRF app and its model are gone from the project.
"""

import datetime
import hashlib

from django.db import migrations
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.migrations.state import StateApps
from django.utils.dateparse import parse_datetime

DRF_TOKEN_TABLE = "authtoken_token"
#: knox.settings.CONSTANTS.TOKEN_KEY_LENGTH, frozen here as the stored format.
TOKEN_KEY_LENGTH = 15
MOVED_TOKEN_NAME = "API token (from before hashed tokens)"


def digest(key: str) -> str:
    """knox.crypto.hash_token with its default SHA-512, frozen here as the stored format."""
    return hashlib.sha512(key.encode("utf-8")).hexdigest()


def aware(value: object) -> datetime.datetime | None:
    """A stored ``created`` as an aware datetime: SQLite hands back naive UTC text."""
    moment = parse_datetime(value) if isinstance(value, str) else value
    if not isinstance(moment, datetime.datetime):
        return None
    return moment if moment.tzinfo else moment.replace(tzinfo=datetime.UTC)


def move_drf_tokens(apps: StateApps, schema_editor: BaseDatabaseSchemaEditor) -> None:
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        if DRF_TOKEN_TABLE not in connection.introspection.table_names(cursor):
            return
        table = schema_editor.quote_name(DRF_TOKEN_TABLE)
        cursor.execute(f"SELECT key, user_id, created FROM {table}")  # noqa: S608
        rows = cursor.fetchall()
    api_token = apps.get_model("agents_app", "ApiToken")
    for key, user_id, created in rows:
        token = api_token(
            digest=digest(key),
            token_key=key[:TOKEN_KEY_LENGTH],
            user_id=user_id,
            expiry=None,
            name=MOVED_TOKEN_NAME,
        )
        token.save(force_insert=True)
        made = aware(created)
        if made is not None:
            # auto_now_add set "now"; keep when the key was really made.
            api_token.objects.filter(pk=token.pk).update(created=made)
    with connection.cursor() as cursor:
        cursor.execute(f"DELETE FROM {table}")  # noqa: S608


class Migration(migrations.Migration):
    dependencies = [("agents_app", "0006_api_token")]

    operations = [migrations.RunPython(move_drf_tokens, migrations.RunPython.noop)]
