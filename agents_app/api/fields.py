"""Serializer fields for JSON request bodies that take only the JSON type the schema names.

DRF's fields also convert other types: ``CharField`` takes ``0`` as ``"0"``,
``BooleanField`` takes ``0``, ``"yes"`` or ``"off"``, ``IntegerField`` takes ``"3"``. The API
parses JSON only (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), where a value's type is
explicit, so these fields refuse any other type with DRF's own ``invalid`` message (400
``{"field": [...]}``), and a request the OpenAPI schema calls invalid is never accepted.
Query parameters are always text: their serializers keep DRF's fields.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    """``CharField`` for a JSON string; numbers and other types are invalid."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return str(super().to_internal_value(data))


class StrictBooleanField(serializers.BooleanField):
    """``BooleanField`` for JSON ``true`` or ``false`` only."""

    def to_internal_value(self, data: Any) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictIntegerField(serializers.IntegerField):
    """``IntegerField`` for a JSON number with no fraction (``3`` or ``3.0``); strings and
    booleans are invalid."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return int(super().to_internal_value(data))


class BodySerializer(serializers.Serializer):
    """A JSON object request body that takes only the names of its fields.

    DRF ignores names a serializer does not declare, so a misspelt ``plan_mod`` would be
    dropped in silence; here each such name is a 400 ``{"<name>": ["Unknown field ..."]}``
    listing the names the body takes, and nothing of the request is applied. The schema
    says the same (``additionalProperties: false``, from
    ``agents_app.api.schema.ApiAutoSchema``).
    """

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(name) for name in data if name not in self.fields)
            if unknown:
                raise serializers.ValidationError(
                    {name: [unknown_field_message(self.fields)] for name in unknown}
                )
        return super().to_internal_value(data)


def unknown_field_message(fields: Iterable[str]) -> str:
    """``"Unknown field; this body takes a, b."`` (``"...takes no fields."`` for none)."""
    names = ", ".join(sorted(fields))
    return (
        f"Unknown field; this body takes {names}."
        if names
        else ("Unknown field; this request takes no body.")
    )


def body_refuse(data: Any) -> None:
    """Refuse a request body on an endpoint that takes none (steer, stop, ...).

    An empty body, ``{}`` and ``null`` pass; any object with a name is a 400
    ``{"<name>": ["Unknown field; this request takes no body."]}``, and any other JSON
    value a 400 ``{"non_field_errors": [...]}``.

    Raises:
        rest_framework.exceptions.ValidationError: As above.
    """
    if data is None or (isinstance(data, Mapping) and not data):
        return
    if isinstance(data, Mapping):
        raise serializers.ValidationError({str(name): [unknown_field_message(())] for name in data})
    raise serializers.ValidationError({"non_field_errors": ["This request takes no body."]})
