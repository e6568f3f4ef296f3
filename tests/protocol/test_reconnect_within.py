"""The core's one rule for bringing a reconnect forward: a stream that gives up at a fixed time
(a loopback origin that never answered) makes its last attempt by then, never in a tight loop."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.protocol.reconnect import MIN_BROUGHT_FORWARD_DELAY_S, delay_within


def test_a_delay_is_cut_to_the_time_left() -> None:
    assert delay_within(30.0, 8.0) == 8.0
    assert delay_within(3.0, 8.0) == 3.0  # already sooner: the backoff stands


def test_no_time_left_still_waits_a_little() -> None:
    assert delay_within(30.0, 0.0) == MIN_BROUGHT_FORWARD_DELAY_S
    assert delay_within(30.0, -5.0) == MIN_BROUGHT_FORWARD_DELAY_S
    assert MIN_BROUGHT_FORWARD_DELAY_S > 0


@pytest.mark.parametrize("delay", [0.0, 0.2, 30.0])
def test_without_a_point_to_give_up_the_delay_stands(delay: float) -> None:
    assert delay_within(delay, None) == delay
