"""Fair use: per-user read and write budgets (``agents_app.api.throttling``) answer 429 with
``Retry-After`` once spent, per user, staff included, reads and writes counted apart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from agents_app.conf import dexagents_settings
from agents_app.rates import rate_or_none
from tests.agents_app.test_settings import load

pytestmark = pytest.mark.django_db

UNKNOWN = "/api/v1/sessions/ses_fffffffffffffffffffffffffffffff9/messages/"


def budgets(reads: str, writes: str) -> Any:
    return override_settings(
        DEXAGENTS={**dexagents_settings(), "THROTTLE_READS": reads, "THROTTLE_WRITES": writes}
    )


def test_reads_over_the_budget_get_429_with_retry_after(owner_client: Any,
                                                        other_client: Any) -> None:
    with budgets("3/min", "off"):
        for _ in range(3):
            assert owner_client.get("/api/v1/sessions/").status_code == 200
        refused = owner_client.get("/api/v1/sessions/")
        assert refused.status_code == 429
        assert set(refused.json()) == {"detail"}
        assert 0 < int(refused["Retry-After"]) <= 60
        # Per user: someone else still reads; writes have their own budget.
        assert other_client.get("/api/v1/sessions/").status_code == 200
        assert owner_client.post(UNKNOWN, {"text": "hi"}, format="json").status_code == 404


def test_writes_over_the_budget_get_429_and_staff_are_counted_too(staff_client: Any) -> None:
    with budgets("off", "2/min"):
        for _ in range(2):
            assert staff_client.post(UNKNOWN, {"text": "hi"}, format="json").status_code == 404
        refused = staff_client.post(UNKNOWN, {"text": "hi"}, format="json")
        assert refused.status_code == 429, refused.content
        assert "Retry-After" in refused
        assert staff_client.get("/api/v1/sessions/").status_code == 200


def test_off_means_no_budget(owner_client: Any) -> None:
    with budgets("off", "off"):
        for _ in range(50):
            assert owner_client.get("/api/v1/sessions/").status_code == 200


def test_rates_are_checked() -> None:
    assert rate_or_none("600/min") == "600/min"
    assert rate_or_none(" OFF ") is None
    for bad in ("600", "0/min", "ten/min", "5/week"):
        with pytest.raises(ValueError, match="not a rate"):
            rate_or_none(bad)


@pytest.mark.parametrize("value", ["lots", "10/week"])
def test_a_bad_rate_in_the_environment_stops_the_settings(tmp_path: Path, value: str) -> None:
    result = load(tmp_path, DEXAGENTS_THROTTLE_WRITES=value)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert "DEXAGENTS_THROTTLE_WRITES" in result.stderr
