"""Evaluate the string annotations of this package's dataclasses once, at import.

The SDK's JSON codec (``dex.codec``, dex-python-sdk 1.23.0) calls ``typing.get_type_hints`` on a
dataclass every time it decodes one. The modules here use ``from __future__ import
annotations``, so each of those calls compiled and evaluated every field's annotation string
again: about half of the cost of reading an Attribute, and Steps read dozens (issue 13,
``bench/turn.py``). With the annotations already evaluated, ``get_type_hints`` only copies them.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing


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
