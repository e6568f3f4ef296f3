"""The rate-limit arithmetic both sides share (time passed in)."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.ratelimit import SlidingWindow, TokenBucket


def test_a_sliding_window_forgets_what_is_as_old_as_the_window() -> None:
    window = SlidingWindow(60)
    assert [window.add(t) for t in (0, 30, 59.9)] == [1, 2, 3]
    assert window.add(60) == 3  # the refusal at 0 is exactly 60 s old: out
    assert window.add(200) == 1


@given(st.lists(st.floats(0, 1000, allow_nan=False), max_size=40).map(sorted))
def test_a_sliding_window_counts_what_is_younger_than_the_window(times: list[float]) -> None:
    window = SlidingWindow(60)
    for i, now in enumerate(times):
        assert window.add(now) == sum(1 for t in times[: i + 1] if t > now - 60)


def test_a_token_bucket_refills_at_its_rate_up_to_its_burst() -> None:
    bucket = TokenBucket(rate=5, burst=10, now=0)
    assert all(bucket.try_take(0) for _ in range(10)) and not bucket.try_take(0)
    assert math.isclose(bucket.delay(0), 0.2)
    assert bucket.try_take(0.2) and not bucket.try_take(0.2)
    assert math.isclose(bucket.tokens(100), 10)
    assert TokenBucket(rate=0, burst=1, now=0).try_take(0) and math.isinf(TokenBucket(0, 1, 0).delay(0, 2))
