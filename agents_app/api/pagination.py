"""Paging of the REST API's lists (``REST_FRAMEWORK["DEFAULT_PAGINATION_CLASS"]``).

A module of its own: DRF imports the pagination class while ``rest_framework.generics`` loads,
before any view module could be imported.
"""

from typing import Any

from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request

#: The largest page a list endpoint serves (``?limit=``), and the largest ``?offset=``.
LIST_LIMIT_MAX = 1000
LIST_OFFSET_MAX = 1_000_000_000


class StrictLimitOffsetPagination(LimitOffsetPagination):
    """DRF's ``LimitOffsetPagination`` that refuses what its schema does not allow.

    ``?limit=`` (1 to ``LIST_LIMIT_MAX``, default ``PAGE_SIZE``) and ``?offset=`` (0 to
    ``LIST_OFFSET_MAX``, default 0) are whole numbers; anything else answers 400
    ``{"limit": [...]}`` or ``{"offset": [...]}`` instead of being ignored.
    """

    def get_limit(self, request: Request) -> int | None:
        raw = request.query_params.get(self.limit_query_param)
        if raw is None:
            return self.default_limit
        return self._whole_number(raw, self.limit_query_param, 1, LIST_LIMIT_MAX)

    def get_offset(self, request: Request) -> int:
        raw = request.query_params.get(self.offset_query_param)
        if raw is None:
            return 0
        return self._whole_number(raw, self.offset_query_param, 0, LIST_OFFSET_MAX)

    @staticmethod
    def _whole_number(raw: str, name: str, minimum: int, maximum: int) -> int:
        message = f"A whole number from {minimum} to {maximum}."
        if not raw.isascii() or not raw.isdigit() or len(raw) > len(str(maximum)):
            raise serializers.ValidationError({name: [message]})
        value = int(raw)
        if not minimum <= value <= maximum:
            raise serializers.ValidationError({name: [message]})
        return value

    def get_schema_operation_parameters(self, view: Any) -> list[dict[str, Any]]:
        parameters: list[dict[str, Any]] = super().get_schema_operation_parameters(view)
        bounds = {
            self.limit_query_param: (1, LIST_LIMIT_MAX),
            self.offset_query_param: (0, LIST_OFFSET_MAX),
        }
        for parameter in parameters:
            minimum, maximum = bounds[parameter["name"]]
            parameter["schema"].update(minimum=minimum, maximum=maximum)
        return parameters
