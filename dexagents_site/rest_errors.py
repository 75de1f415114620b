"""Moved to ``agents_app.rest_errors`` (it ships with the installable apps); kept as an alias
so settings and imports written against the old path keep working."""

from agents_app.rest_errors import (
    JSON_MAX_NESTING_DEPTH,
    UNAVAILABLE_PARTS,
    ApiJsonErrorsMiddleware,
    BoundedJSONParser,
    ServiceUnavailable,
    UnavailablePart,
    api_exception_handler,
    unavailable_detail,
)

__all__ = [
    "JSON_MAX_NESTING_DEPTH",
    "UNAVAILABLE_PARTS",
    "ApiJsonErrorsMiddleware",
    "BoundedJSONParser",
    "ServiceUnavailable",
    "UnavailablePart",
    "api_exception_handler",
    "unavailable_detail",
]
