"""When something happened, as records and events say it: UTC ISO 8601 text to the millisecond,
the form the decision history writes its times in."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_provider_systemzero.decisions.timeline import iso_time, parse_time
from airflow_provider_systemzero.timestamps import back_dated, now_iso, utc_iso


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


#: The ends of the range a record holds, as written.
EARLIEST_TEXT, LATEST_TEXT = "1970-01-01T00:00:00.000Z", "9999-12-31T23:59:59.000Z"


@settings(max_examples=300, deadline=None)
@given(
    st.one_of(
        st.integers(),
        st.floats(),  # NaN and the infinities too
        st.sampled_from([1e300, -1e300, 3e14, 10**400, -(10**400), 253_402_300_800]),
    )
)
def test_any_number_is_written_as_a_time_within_the_range_a_record_holds(number: float) -> None:
    """One place turns a number into a time, and it never raises (issue 54 items 1 and 2)."""
    text = iso_time(number)
    assert EARLIEST_TEXT <= text <= LATEST_TEXT and text.endswith("Z")
    assert EARLIEST_TEXT <= iso_time(back_dated(1_790_000_000.0, number)) <= LATEST_TEXT
    written = utc_iso(number)
    assert written is None or EARLIEST_TEXT <= written <= LATEST_TEXT


@pytest.mark.parametrize(
    ("milliseconds", "text"),
    [
        (40_000, "2026-09-21T14:12:40.000Z"),
        (0, "2026-09-21T14:13:20.000Z"),
        (None, "2026-09-21T14:13:20.000Z"),  # not reported
        (-5, "2026-09-21T14:13:20.000Z"),  # no time at all
        (1e300, EARLIEST_TEXT),  # as far back as a record goes
        (3e14, EARLIEST_TEXT),
        (float("inf"), EARLIEST_TEXT),
    ],
)
def test_a_billed_start_is_back_dated_within_the_range(milliseconds: Any, text: str) -> None:
    assert iso_time(back_dated(1_790_000_000.0, milliseconds)) == text


def test_a_time_out_of_the_range_is_written_at_its_nearest_end() -> None:
    assert iso_time(1e300) == LATEST_TEXT and iso_time(-1e300) == EARLIEST_TEXT
    assert iso_time(float("nan")) == EARLIEST_TEXT
    assert utc_iso("0001-01-01T00:00:00Z") is None  # a year-1 text is no time a record holds
