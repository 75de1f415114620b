"""Request rates as DRF's throttles write them (``<count>/<s|min|hour|day>``), or ``off``.

Imports nothing from Django or DRF, so ``settings.py`` can check ``DEXAGENTS_THROTTLE_*`` with
it while settings load (``agents_app.api.throttling`` uses the rates).
"""

from __future__ import annotations

import re

#: DRF's rate syntax as the settings accept it (DRF reads the first letter of the period).
RATE_PATTERN = re.compile(r"^[1-9][0-9]*/(s|sec|second|m|min|minute|h|hour|d|day)$")


def rate_or_none(value: str) -> str | None:
    """A rate setting as DRF takes it: ``None`` for ``off`` (no limit).

    Raises:
        ValueError: ``value`` is neither ``off`` nor ``<count>/<period>``.
    """
    text = value.strip().lower()
    if text in ("off", "none", ""):
        return None
    if not RATE_PATTERN.match(text):
        raise ValueError(
            f"{value!r} is not a rate: write <count>/<s|min|hour|day>, e.g. 600/min, or off."
        )
    return text
