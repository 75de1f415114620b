"""An audit of an engine database's blobs that does not trust the engine's ``blob_refs``.

It reads every place a reference can be stored (Attributes, pending channel messages,
history events, and the protobuf messages base64-encoded in the ``runs`` rows' JSON) and
finds references by their serialized bytes with its own pattern, so a reference the
engine's index missed still counts.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A serialized reference Value: field 1 (string) or 2 (object), length 40, the id.
_REFERENCE = re.compile(rb"[\n\x12]\(([0-9a-f]{40})")


def _ids(data: bytes) -> set[str]:
    return {match.decode() for match in _REFERENCE.findall(data)}


def _json_ids(node: Any) -> set[str]:
    """References inside base64-encoded messages anywhere in a JSON document."""
    if isinstance(node, dict):
        return set().union(*(_json_ids(value) for value in node.values()))
    if isinstance(node, list):
        return set().union(*(_json_ids(value) for value in node))
    if isinstance(node, str) and len(node) >= 56:
        try:
            return _ids(base64.b64decode(node, validate=True))
        except (binascii.Error, ValueError):
            return set()
    return set()


@dataclass
class BlobAudit:
    """Blob ids referenced by stored state, and blob ids stored."""

    referenced: set[str]
    stored: set[str]

    @property
    def dangling(self) -> set[str]:
        """Referenced ids whose blob is not stored: a reader would fail on them."""
        return self.referenced - self.stored

    @property
    def unreferenced(self) -> set[str]:
        """Stored blobs nothing references (a leak, once the engine has swept)."""
        return self.stored - self.referenced


def audit(db: Path) -> BlobAudit:
    """Read ``db`` in one read transaction (a consistent snapshot while the engine writes)."""
    connection = sqlite3.connect(db, isolation_level=None)
    try:
        connection.execute("BEGIN")
        referenced: set[str] = set()
        for table, column in (("attributes", "value"), ("channel_messages", "value"),
                              ("history", "event")):
            for (data,) in connection.execute(f"SELECT {column} FROM {table}"):
                referenced |= _ids(bytes(data))
        for header, core in connection.execute("SELECT header, core FROM runs"):
            referenced |= _json_ids(json.loads(header)) | _json_ids(json.loads(core))
        stored = {row[0] for row in connection.execute("SELECT blob_id FROM blobs")}
        connection.execute("COMMIT")
    finally:
        connection.close()
    return BlobAudit(referenced, stored)
