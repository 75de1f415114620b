"""What this package's wire dataclasses share: evaluated annotations and decoding fixes.

The SDK's JSON codec (``dex.codec``, dex-python-sdk 1.23.0) calls ``typing.get_type_hints`` on a
dataclass every time it decodes one. The modules here use ``from __future__ import
annotations``, so each of those calls compiled and evaluated every field's annotation string
again: about half of the cost of reading an Attribute, and Steps read dozens (issue 13,
``bench/turn.py``). With the annotations already evaluated, ``get_type_hints`` only copies them.

The SDK codec also leaves a dataclass or a ``datetime`` inside an ``X | None`` field as plain
JSON data; the records convert such fields in ``__post_init__`` with ``coerce`` and
``coerce_datetime``. This module imports only the SDK; every records module imports it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import typing
from datetime import datetime
from typing import TypeVar

from dex import CodecRegistry, Value, WireKind

_T = TypeVar("_T")
_CODECS = CodecRegistry()


def coerce(value: object, value_type: type[_T]) -> _T:
    """``value`` as a ``value_type``: itself when it is one, else plain JSON data the SDK codec
    left undecoded, decoded with the SDK's codec for ``value_type``.

    Raises:
        Whatever the SDK codec raises for data that does not fit ``value_type`` (``KeyError``
        for a missing required field, ``TypeError`` or ``ValueError`` for a wrong value).
    """
    if isinstance(value, value_type):
        return value
    codec = _CODECS.resolve(value_type)
    decoded: _T = codec.decode(Value(WireKind.JSON, json.dumps(value)))
    return decoded


def coerce_datetime(value: datetime | str | None) -> datetime | None:
    """``value`` as a ``datetime``: an ISO 8601 string the SDK codec left is parsed.

    Raises:
        ValueError: ``value`` is a string that is not an ISO 8601 time.
    """
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)


def resolve_annotations(namespace: dict[str, object]) -> None:
    """Replace the annotations of each dataclass defined in module ``namespace`` (its
    ``globals()``) by the types they name. Call it at the end of the module.

    A dataclass whose annotations name something the module cannot see at run time (an import
    under ``TYPE_CHECKING``) keeps its strings; the codec would fail on it either way.
    """
    module = namespace.get("__name__")
    for value in list(namespace.values()):
        if not (
            isinstance(value, type)
            and dataclasses.is_dataclass(value)
            and value.__module__ == module
        ):
            continue
        own = inspect.get_annotations(value)
        try:
            hints = typing.get_type_hints(value)
        except NameError:
            continue
        value.__annotations__ = {name: hints[name] for name in own}
