"""The restricted JSON Schema of MCP form elicitation, and checking answers against it
(platform addition; MCP specification 2025-11-25, "Client features/Elicitation",
``PrimitiveSchemaDefinition``).

A server's ``requestedSchema`` is a flat object whose properties are each one of:

- a string: ``minLength``, ``maxLength``, ``format`` (``email``, ``uri``, ``date``,
  ``date-time``), ``default``;
- a number or an integer: ``minimum``, ``maximum``, ``default``;
- a boolean: ``default``;
- a single choice: a string with ``enum`` (and, in the legacy form, ``enumNames`` as its
  labels) or with ``oneOf: [{"const", "title"}]``;
- a multiple choice: an array whose ``items`` have ``enum`` or ``anyOf: [{"const",
  "title"}]``, with ``minItems`` and ``maxItems``;

plus ``title`` and ``description`` on each, and ``required`` (property names) on the object.
Other keywords are ignored. Anything else (a nested object, an array of free values, a
property without a known ``type``) makes the schema unusable: the platform declines such a
question instead of asking the user.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any
from urllib.parse import urlsplit

from dex_agents._wire_types import resolve_annotations

#: Formats a string property may declare.
STRING_FORMATS = frozenset({"email", "uri", "date", "date-time"})
#: Most properties one form may have; a larger form is unusable.
MAX_PROPERTIES = 50
#: Longest text value of one field, in characters.
MAX_TEXT_CHARS = 10_000

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[^@\s]+$")


class ElicitationSchemaError(ValueError):
    """A ``requestedSchema`` that is not the restricted elicitation schema; the message says
    what is wrong, in words a user or a model can read."""


@dataclass(frozen=True)
class ElicitationField:
    """One property of a form, as the page renders it and the check reads it.

    Attributes:
        name: The property name (the content key).
        kind: ``string``, ``number``, ``integer``, ``boolean``, ``choice`` (one value) or
            ``choices`` (several values).
        title: The label: ``title``, else the name.
        description: Help text, or empty.
        required: Listed in the schema's ``required``.
        options: ``(value, label)`` pairs of a choice.
        string_format: A string's ``format``, or empty.
        minimum, maximum: Bounds of a number, or ``None``.
        min_length, max_length: Bounds of a string's length, or ``None``.
        min_items, max_items: Bounds of a multiple choice, or ``None``.
        default: The schema's ``default``, or ``None``.
    """

    name: str
    kind: str
    title: str
    description: str = ""
    required: bool = False
    options: tuple[tuple[str, str], ...] = ()
    string_format: str = ""
    minimum: float | None = None
    maximum: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    min_items: int | None = None
    max_items: int | None = None
    default: Any = None


@dataclass(frozen=True)
class ElicitationForm:
    """A parsed ``requestedSchema``: its fields in the server's order."""

    fields: tuple[ElicitationField, ...] = field(default_factory=tuple)


def elicitation_form(schema: object) -> ElicitationForm:
    """Parse a server's ``requestedSchema``.

    Returns:
        The form's fields, in the order the server listed its properties.

    Raises:
        ElicitationSchemaError: Not a flat object of the primitive properties the MCP
            specification allows (see the module docstring), more than ``MAX_PROPERTIES``
            properties, or a ``required`` name that is not a property.
    """
    if not isinstance(schema, dict):
        raise ElicitationSchemaError("the requested schema is not a JSON object")
    if schema.get("type", "object") != "object":
        raise ElicitationSchemaError("the requested schema is not of type object")
    properties = schema.get("properties", {})
    if not isinstance(properties, dict):
        raise ElicitationSchemaError("the requested schema's properties are not an object")
    if len(properties) > MAX_PROPERTIES:
        raise ElicitationSchemaError(f"the form has more than {MAX_PROPERTIES} fields")
    required = schema.get("required", [])
    if not isinstance(required, list) or not all(isinstance(name, str) for name in required):
        raise ElicitationSchemaError("the requested schema's required is not a list of names")
    unknown = [name for name in required if name not in properties]
    if unknown:
        raise ElicitationSchemaError(f"required names no property: {', '.join(unknown)}")
    return ElicitationForm(
        tuple(
            _field(str(name), spec, name in required) for name, spec in properties.items()
        )
    )


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _number(spec: dict[str, Any], key: str, name: str) -> float | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ElicitationSchemaError(f"field {name!r}: {key} is not a number")
    return float(value)


def _count(spec: dict[str, Any], key: str, name: str) -> int | None:
    value = spec.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ElicitationSchemaError(f"field {name!r}: {key} is not a non-negative integer")
    return value


def _titled_options(items: object, name: str) -> tuple[tuple[str, str], ...]:
    """``(const, title)`` pairs of a ``oneOf`` / ``anyOf`` list."""
    if not isinstance(items, list) or not items:
        raise ElicitationSchemaError(f"field {name!r}: its options are not a list")
    options = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("const"), str):
            raise ElicitationSchemaError(f"field {name!r}: an option has no text const")
        options.append((item["const"], _text(item.get("title")) or item["const"]))
    return tuple(options)


def _enum_options(spec: dict[str, Any], name: str) -> tuple[tuple[str, str], ...]:
    """``(value, label)`` pairs of an ``enum`` (labels from the legacy ``enumNames``)."""
    values = spec.get("enum")
    if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
        raise ElicitationSchemaError(f"field {name!r}: enum is not a list of strings")
    labels = spec.get("enumNames")
    if isinstance(labels, list) and len(labels) == len(values):
        return tuple((value, str(label)) for value, label in zip(values, labels, strict=True))
    return tuple((value, value) for value in values)


def _field(name: str, spec: object, required: bool) -> ElicitationField:
    if not isinstance(spec, dict):
        raise ElicitationSchemaError(f"field {name!r} is not a JSON object")
    base: dict[str, Any] = {
        "name": name,
        "title": _text(spec.get("title")) or name,
        "description": _text(spec.get("description")),
        "required": required,
        "default": spec.get("default"),
    }
    kind = spec.get("type")
    if kind == "string" and ("enum" in spec or "oneOf" in spec):
        options = (
            _titled_options(spec["oneOf"], name) if "oneOf" in spec else _enum_options(spec, name)
        )
        return ElicitationField(kind="choice", options=options, **base)
    if kind == "string":
        string_format = _text(spec.get("format"))
        if string_format and string_format not in STRING_FORMATS:
            raise ElicitationSchemaError(f"field {name!r}: unknown format {string_format!r}")
        return ElicitationField(
            kind="string",
            string_format=string_format,
            min_length=_count(spec, "minLength", name),
            max_length=_count(spec, "maxLength", name),
            **base,
        )
    if kind in ("number", "integer"):
        return ElicitationField(
            kind=str(kind),
            minimum=_number(spec, "minimum", name),
            maximum=_number(spec, "maximum", name),
            **base,
        )
    if kind == "boolean":
        return ElicitationField(kind="boolean", **base)
    if kind == "array":
        items = spec.get("items")
        if not isinstance(items, dict):
            raise ElicitationSchemaError(f"field {name!r}: an array needs items with options")
        options = (
            _titled_options(items["anyOf"], name)
            if "anyOf" in items
            else _enum_options(items, name)
        )
        return ElicitationField(
            kind="choices",
            options=options,
            min_items=_count(spec, "minItems", name),
            max_items=_count(spec, "maxItems", name),
            **base,
        )
    raise ElicitationSchemaError(
        f"field {name!r} has type {kind!r}; a form field is a string, number, integer, "
        "boolean or a choice"
    )


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _bound(value: float) -> str:
    return str(int(value)) if value.is_integer() else str(value)


def _string_problem(item: ElicitationField, value: str) -> str | None:
    if len(value) > MAX_TEXT_CHARS:
        return f"Enter at most {MAX_TEXT_CHARS} characters."
    if item.min_length is not None and len(value) < item.min_length:
        return f"Enter at least {_plural(item.min_length, 'character')}."
    if item.max_length is not None and len(value) > item.max_length:
        return f"Enter at most {_plural(item.max_length, 'character')}."
    if item.string_format == "email" and not _EMAIL.match(value):
        return "Enter a valid email address."
    if item.string_format == "uri":
        parts = urlsplit(value)
        if not parts.scheme or not (parts.netloc or parts.path) or " " in value:
            return "Enter a valid URI, such as https://example.com/."
    if item.string_format == "date":
        try:
            date.fromisoformat(value)
        except ValueError:
            return "Enter a valid date: YYYY-MM-DD."
    if item.string_format == "date-time":
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return "Enter a valid date and time, such as 2026-12-04T15:30:00Z."
    return None


def _number_problem(item: ElicitationField, value: float) -> str | None:
    if item.minimum is not None and value < item.minimum:
        return f"Enter a number of at least {_bound(item.minimum)}."
    if item.maximum is not None and value > item.maximum:
        return f"Enter a number of at most {_bound(item.maximum)}."
    return None


def _checked(item: ElicitationField, value: object) -> tuple[Any, str | None]:
    """``(clean value, None)`` or ``(None, message)`` for one field's value."""
    values = {option for option, _label in item.options}
    if item.kind == "string":
        if not isinstance(value, str):
            return None, "Enter text."
        return value, _string_problem(item, value)
    if item.kind == "integer":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            return None, "Enter a whole number."
        return value, _number_problem(item, float(value))
    if item.kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None, "Enter a number."
        if not math.isfinite(value):
            return None, "Enter a finite number."
        return value, _number_problem(item, float(value))
    if item.kind == "boolean":
        if not isinstance(value, bool):
            return None, "Choose yes or no (true or false)."
        return value, None
    if item.kind == "choice":
        if not isinstance(value, str) or value not in values:
            return None, f"Choose one of: {', '.join(option for option, _ in item.options)}."
        return value, None
    # choices
    if not isinstance(value, list) or not all(isinstance(one, str) for one in value):
        return None, "Choose from the list (a list of values)."
    if any(one not in values for one in value) or len(set(value)) != len(value):
        return None, f"Choose each at most once from: {', '.join(o for o, _ in item.options)}."
    if item.min_items is not None and len(value) < item.min_items:
        return None, f"Choose at least {item.min_items}."
    if item.max_items is not None and len(value) > item.max_items:
        return None, f"Choose at most {item.max_items}."
    return list(value), None


def elicitation_content_check(
    form: ElicitationForm, content: object
) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """Check an accepted answer's ``content`` against ``form``.

    Absent optional fields stay absent; a ``null`` value, and an empty text, count as absent
    (so an empty required text field is missing).

    Returns:
        ``(clean content, errors)``: errors map a field name to its messages, and ``""`` to
        messages about the content as a whole (not an object, an unknown field). The content
        is usable only when ``errors`` is empty; integers given as ``5.0`` become ``5``.
    """
    if not isinstance(content, dict):
        return {}, {"": ["The answer's content must be a JSON object of field values."]}
    errors: dict[str, list[str]] = {}
    clean: dict[str, Any] = {}
    names = {item.name for item in form.fields}
    extra = sorted(str(name) for name in content if name not in names)
    if extra:
        errors[""] = [f"Not a field of this form: {', '.join(extra)}."]
    for item in form.fields:
        value = content.get(item.name)
        if value is None or (value == "" and item.kind == "string"):
            if item.required:
                errors[item.name] = ["This field is required."]
            continue
        checked, problem = _checked(item, value)
        if problem is not None:
            errors[item.name] = [problem]
        else:
            clean[item.name] = checked
    return clean, errors


resolve_annotations(globals())
