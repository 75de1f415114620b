"""Query parameters of the list endpoints: a misspelt one answers 400 instead of being ignored.

``KnownQueryParametersFilter`` is one of the API's default filter backends
(``REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"]``), so every generic list view runs it. The names a
view takes are its pagination's (``limit``, ``offset``), DRF's ``format``, and the fields of its
``query_serializer_class`` (the serializer that validates its filters), when it has one. A list
view that is not a generic view (``ApprovalListApi``) calls :func:`query_parameters_check`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rest_framework.exceptions import ValidationError
from rest_framework.filters import BaseFilterBackend
from rest_framework.request import Request
from rest_framework.settings import api_settings


def query_parameters_check(*, request: Request, known: Iterable[str]) -> None:
    """Refuse the query parameters of ``request`` that are not in ``known`` (DRF's ``format``
    is always allowed).

    Raises:
        ValidationError: 400 ``{"<name>": ["Unknown query parameter; this endpoint takes:
            a, b."]}`` for each unknown name.
    """
    allowed = set(known)
    if api_settings.URL_FORMAT_OVERRIDE:
        allowed.add(api_settings.URL_FORMAT_OVERRIDE)
    unknown = sorted(name for name in request.query_params if name not in allowed)
    if unknown:
        takes = ", ".join(sorted(allowed)) or "none"
        raise ValidationError(
            {name: [f"Unknown query parameter; this endpoint takes: {takes}."] for name in unknown}
        )


def query_values(request: Request) -> dict[str, str]:
    """The query string as a plain dict (the last value of a repeated parameter).

    A serializer given the ``QueryDict`` itself reads it as an HTML form and takes an empty
    value (``?before=``) for a missing one; from a dict, ``""`` is validated like any value
    (400 for a number field), as the schema says.
    """
    return {key: request.query_params[key] for key in request.query_params}



def view_query_parameters(view: Any) -> set[str]:
    """The query parameters ``view`` takes: its paginator's and its
    ``query_serializer_class``'s fields."""
    names: set[str] = set()
    paginator = getattr(view, "paginator", None)
    for attribute in ("limit_query_param", "offset_query_param", "page_query_param",
                      "page_size_query_param", "cursor_query_param"):
        name = getattr(paginator, attribute, None)
        if name:
            names.add(name)
    query_serializer = getattr(view, "query_serializer_class", None)
    if query_serializer is not None:
        names.update(query_serializer().fields)
    return names


class KnownQueryParametersFilter(BaseFilterBackend):
    """Answers 400 for a query parameter the list view does not take (``view_query_parameters``);
    filters nothing itself."""

    def filter_queryset(self, request: Request, queryset: Any, view: Any) -> Any:
        query_parameters_check(request=request, known=view_query_parameters(view))
        return queryset
