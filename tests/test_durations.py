"""How a duration reads in a message (:func:`~airflow_provider_systemzero.durations.readable`), and
how a deferred task's timeout says whose deadline ended the wait, read from the trigger's facts."""

from __future__ import annotations

import re
from datetime import timedelta
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_systemzero.durations import readable
from airflow_provider_systemzero.tasks.deadlines import decision_times, timeout_reason


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 ms"),
        (0.35, "350 ms"),
        (0.9994, "999 ms"),
        (0.9996, "1 s"),
        (2.5, "2.5 s"),
        (3, "3 s"),
        (7.99, "7.99 s"),
        (9.996, "10 s"),
        (44.6, "45 s"),
        (59.6, "1 min"),
        (250, "4 min 10 s"),
        (3600, "1 h"),
        (3660, "1 h 1 min"),
        (14_400, "4 h"),
        (183_600, "2 d 3 h"),
    ],
)
def test_a_duration_reads_as_people_say_it(seconds: float, text: str) -> None:
    assert readable(seconds) == text


@given(st.floats(min_value=0, max_value=10**9, allow_nan=False))
def test_a_duration_reads_as_at_most_two_units_that_add_up(seconds: float) -> None:
    text = readable(seconds)
    parts = re.fullmatch(r"(\d+(?:\.\d\d?)?) (ms|s|min|h|d)(?: (\d+) (s|min|h))?", text)
    assert parts is not None, text
    size = {"ms": 0.001, "s": 1, "min": 60, "h": 3600, "d": 86_400}
    total = float(parts[1]) * size[parts[2]] + (float(parts[3]) * size[parts[4]] if parts[3] else 0)
    # off by at most the rounding of the smallest unit shown (a minute under an hour, an hour under a day)
    tolerance = {"ms": 0.0005, "s": 0.005 if "." in parts[1] or seconds < 10 else 0.5, "min": 0.5}
    tolerance |= {"h": 60.5, "d": 3600.5}
    assert abs(total - seconds) <= tolerance[parts[2]], (seconds, text)


def _task(execution_timeout: timedelta | None = None) -> SimpleNamespace:
    return SimpleNamespace(execution_timeout=execution_timeout)


def test_the_times_of_the_last_decisions_and_a_decision_still_owed() -> None:
    assert decision_times({"decision_seconds": [0.4, 1.25, 2], "deciding_for": 3.5}) == (
        "the last 3 decisions took 400 ms, 1.25 s and 2 s, and the gateway had owed a decision for 3.5 s "
        "when the deadline passed"
    )
    assert (
        decision_times({"decision_seconds": [0.4], "deciding_for": None}) == "the last decision took 400 ms"
    )
    assert decision_times({"decision_seconds": [], "deciding_for": 1.2}) == (
        "no decision arrived during the wait, and the gateway had owed a decision for 1.2 s when the "
        "deadline passed"
    )
    # an event without the facts (a trigger that does not report them) says nothing about them
    assert decision_times({}) is None


def test_a_timeout_names_the_tasks_own_bound_and_what_to_raise() -> None:
    reason = timeout_reason(
        _task(),
        "timeout",
        3,
        {"message": "no decision met the condition before the deadline", "decision_seconds": [0.5, 0.6]},
        needs="the job",
    )
    assert reason == (
        "the task's timeout of 3 s passed: no decision met the condition before the deadline; the last 2 "
        "decisions took 500 ms and 600 ms: raise timeout (now 3 s) to cover the job"
    )


def test_a_timeout_names_a_shorter_execution_timeout_and_a_slow_gateway() -> None:
    reason = timeout_reason(
        _task(timedelta(seconds=30)),
        "decision_timeout",
        600,
        {"message": "no decision before the task's deadline", "decision_seconds": [], "deciding_for": 29.5},
        needs="a decision",
    )
    assert reason == (
        "the task's execution_timeout of 30 s passed: no decision before the task's deadline; no decision "
        "arrived during the wait, and the gateway had owed a decision for 30 s when the deadline passed: "
        "raise execution_timeout (now 30 s), which is shorter than decision_timeout (10 min), or find out "
        "why the gateway's decisions take this long"
    )


def test_a_timeout_event_without_the_facts_still_names_the_deadline() -> None:
    assert timeout_reason(_task(), "decision_timeout", timedelta(minutes=2), {}, needs="a decision") == (
        "the task's decision_timeout of 2 min passed: the wait had no decision before the deadline: raise "
        "decision_timeout (now 2 min) to cover a decision"
    )


def test_a_timeout_without_a_known_bound_says_so_without_a_length() -> None:
    assert timeout_reason(_task(), "decision_timeout", None, {}, needs="a decision") == (
        "the task's decision_timeout passed: the wait had no decision before the deadline: raise "
        "decision_timeout to cover a decision"
    )


def test_a_decision_still_owed_is_said_once_when_the_trigger_says_it() -> None:
    said = (
        "no decision before the task's deadline; the gateway was still deciding (for 1.9 s): raise the "
        "operator's decision_timeout, or find out why its decisions take this long"
    )
    reason = timeout_reason(
        _task(),
        "decision_timeout",
        2,
        {"message": said, "decision_seconds": [], "deciding_for": 1.9},
        needs="a decision",
    )
    assert reason == (
        f"the task's decision_timeout of 2 s passed: {said}; no decision arrived during the wait: raise "
        "decision_timeout (now 2 s) to cover a decision"
    )
