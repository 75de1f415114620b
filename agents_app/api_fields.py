"""Serializer fields for JSON request bodies that take only the JSON type the schema names.

DRF's fields also convert other types: ``CharField`` takes ``0`` as ``"0"``,
``BooleanField`` takes ``0``, ``"yes"`` or ``"off"``, ``IntegerField`` takes ``"3"``. The API
parses JSON only (``REST_FRAMEWORK["DEFAULT_PARSER_CLASSES"]``), where a value's type is
explicit, so these fields refuse any other type with DRF's own ``invalid`` message (400
``{"field": [...]}``), and a request the OpenAPI schema calls invalid is never accepted.
Query parameters are always text: their serializers keep DRF's fields.
"""

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
