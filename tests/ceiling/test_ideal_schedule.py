"""The ceiling benchmark's ideal schedule (benchmarks/ceiling.py): the best the published budget
allows for given lines, against which the last decisive line → event is judged."""

from __future__ import annotations

import pytest

from benchmarks.ceiling import ideal

T0 = 1.7e9  # wall-clock seconds, as the benchmark records them


def test_a_dozen_files_with_three_lines_each_are_decided_within_eleven_gaps() -> None:
    # the burst takes five initial lines, a start a second follows; lines replaced before their
    # start never get one; the twelve decisive lines (at 5 s) take the tokens of 5 s to 16 s
    lines = {f"c{i}": [(T0, False), (T0 + 2, False), (T0 + 5, True)] for i in range(12)}
    decided = ideal(lines, 5, 1.0)
    assert sorted(decided) == sorted(lines)
    assert max(decided.values()) - (T0 + 5) == pytest.approx(11.0)
    assert min(decided.values()) - (T0 + 5) == pytest.approx(0.0)


def test_the_newest_line_that_waited_longest_goes_first() -> None:
    # a's first line takes the one token; at 1 s the next: a's newest line came at 0.5, b's at 0.2,
    # so b goes first
    lines = {"a": [(T0, False), (T0 + 0.5, True)], "b": [(T0 + 0.2, True)]}
    decided = ideal(lines, 1, 1.0)
    assert decided["b"] - T0 == pytest.approx(1.0)
    assert decided["a"] - T0 == pytest.approx(2.0)


def test_a_quiet_account_decides_each_line_at_once() -> None:
    lines = {f"c{i}": [(T0 + 10 * i, True)] for i in range(5)}
    decided = ideal(lines, 5, 1.0)
    assert all(decided[c] == lines[c][0][0] for c in lines)
