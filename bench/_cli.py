"""Argument types the benchmarks' command lines share."""

from __future__ import annotations

import argparse


def positive_int(text: str) -> int:
    """An ``argparse`` type: an integer of at least 1 (else a usage error)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def positive_float(text: str) -> float:
    """An ``argparse`` type: a number above 0 (else a usage error)."""
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, not {value}")
    return value


def byte_counts(text: str) -> tuple[int, ...]:
    """An ``argparse`` type: comma-separated byte counts (``65536,1024``), each at least 0
    (else a usage error)."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        values = ()
    if not values or any(value < 0 for value in values):
        raise argparse.ArgumentTypeError(f"not a comma-separated list of byte counts: {text!r}")
    return values
