"""The dexworker's filter for the SDK's log of a task whose blobs arrived in parts."""

from __future__ import annotations

import logging
import sys

from agents_app.management.commands.dexworker import HydrationShortfallFilter


def record_of(error: Exception) -> logging.LogRecord:
    try:
        raise error
    except Exception:
        exc_info = sys.exc_info()
    return logging.LogRecord("dex._pull_worker", logging.ERROR, __file__, 1,
                             "Python Worker invocation failed", None, exc_info)


def test_a_hydration_shortfall_is_logged_as_info_without_its_traceback() -> None:
    record = record_of(RuntimeError("LoadBlobs omitted blob 0123abcd"))
    assert HydrationShortfallFilter().filter(record) is True
    assert (record.levelno, record.levelname, record.exc_info) == (logging.INFO, "INFO", None)
    assert "0123abcd" in record.getMessage()


def test_other_failures_keep_their_level_and_traceback() -> None:
    for error in (RuntimeError("boom"), ValueError("LoadBlobs omitted blob x")):
        record = record_of(error)
        assert HydrationShortfallFilter().filter(record) is True
        assert record.levelno == logging.ERROR and record.exc_info is not None
