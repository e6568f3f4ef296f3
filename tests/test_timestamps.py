"""When something happened, as records and events say it: UTC ISO 8601 text to the millisecond,
the form the decision history writes its times in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.timeline import iso_time, parse_time
from airflow_provider_systemzero.timestamps import now_iso, utc_iso


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (1_790_000_000, "2026-09-21T14:13:20.000Z"),  # a reply's created (epoch seconds)
        (1_790_000_000.25, "2026-09-21T14:13:20.250Z"),
        (datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2))), "2026-01-01T10:00:00.000Z"),
        (datetime(2026, 1, 1, 12), "2026-01-01T12:00:00.000Z"),  # naive: taken as UTC
        ("2026-12-04T20:37:28.506603+01:00", "2026-12-04T19:37:28.507Z"),  # a responded_at
    ],
)
def test_a_time_reads_as_utc_iso_text(value: Any, text: str) -> None:
    assert utc_iso(value) == text


@pytest.mark.parametrize("value", [None, 0, -5, float("nan"), 1e20, True, "", "soon", "P1D", [1]])
def test_what_is_no_time_reads_as_none(value: Any) -> None:
    assert utc_iso(value) is None


def test_now_is_utc_with_its_offset() -> None:
    now = now_iso()
    assert now.endswith("Z") and utc_iso(now) == now == iso_time(parse_time(now))
