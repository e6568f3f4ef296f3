"""The fleet benchmark's fair-share figure (benchmarks/fleet.py): a wait against the fair wait of
the triggers that compete for a start at each moment."""

from __future__ import annotations

import pytest

from benchmarks.fleet import PROCESSES, fair_waits


def _process(channel: str) -> int:
    return 0 if channel.startswith("a") else 1


def test_a_lone_waiter_is_owed_its_process_share() -> None:
    # alone in its process: a start every PROCESSES seconds is its fair wait
    worst = fair_waits({"a1": [(0.0, 10.0)]}, _process, 1.0)
    assert worst["longest_fair_wait_s"] == pytest.approx(PROCESSES)
    assert worst["process"] == pytest.approx(10.0 / PROCESSES)
    assert worst["fleet"] == pytest.approx(10.0)


def test_the_share_is_dealt_over_those_competing_at_each_moment() -> None:
    # a start every 2 s for the process: a1 alone for 1 s (1/2 start), then with a2 (1/4 a second
    # each) until 3 s: a1 had its start's worth at 3 s; a2 had 1/2 by then, alone again: at 4 s
    waits = {"a1": [(0.0, 3.0)], "a2": [(1.0, 9.0)]}
    worst = fair_waits(waits, _process, 1.0)
    assert worst["longest_fair_wait_s"] == pytest.approx(3.0)
    assert worst["process"] == pytest.approx(8.0 / 3.0)  # a2 waited 8 s for a fair 3 s
    # the other process's waiters do not shrink a process's share, only the fleet's
    both = fair_waits({**waits, "b1": [(0.0, 9.0)]}, _process, 1.0)
    assert both["process"] == pytest.approx(max(8.0 / 3.0, 9.0 / PROCESSES))
    assert worst["fleet"] == pytest.approx(4.0)  # over the fleet a2 was owed a start at 3 s
    assert both["fleet"] == pytest.approx(3.6)  # b1: a third of the ceiling from 1 s, owed at 2.5 s


def test_a_trigger_with_nothing_to_decide_does_not_compete() -> None:
    # a2's waits do not overlap a1's: a1 is owed the whole share of its process
    worst = fair_waits({"a1": [(0.0, 4.0)], "a2": [(5.0, 6.0)]}, _process, 1.0)
    assert worst["process"] == pytest.approx(4.0 / PROCESSES)
