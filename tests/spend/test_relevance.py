"""The pure rules of decide_when / debounce_ms / decide_initial (no clock, no Airflow, no network)."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.decisions.relevance import (
    MAX_HOLD_FACTOR,
    DecisionDebounce,
    DecisionFilter,
    Relevance,
    validate_debounce_ms,
    validate_decide_when,
    what_changed,
)
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError


def is_decisive(previous: object, new: object) -> bool:
    """A decide_when callable for the tests: the change adds a line saying the job failed."""
    return isinstance(new, str) and "FAILED" in new[len(previous) if isinstance(previous, str) else 0 :]


def not_a_bool(previous: object, new: object) -> object:
    """A broken decide_when callable: returns a string."""
    return "yes"


NOT_CALLABLE = 42


# ------------------------------------------------------------------ what a regex is searched in


def test_what_changed_is_the_appended_text_for_a_growing_string() -> None:
    assert what_changed("a\nb\n", "a\nb\nREADY\n") == "READY\n"


def test_what_changed_is_the_appended_items_as_json_for_a_growing_array() -> None:
    assert what_changed([{"n": 1}], [{"n": 1}, {"status": "done"}]) == '[{"status": "done"}]'


def test_what_changed_is_the_new_state_for_a_replace() -> None:
    assert what_changed("old log\n", "new log\n") == "new log\n"
    assert what_changed({"status": "running"}, {"status": "done"}) == '{"status": "done"}'
    assert what_changed([1, 2], [3]) == "[3]"


def test_a_regex_looks_only_at_what_changed() -> None:
    relevance = Relevance(r"^READY$")
    # READY already in the state: a later irrelevant line does not match again
    assert relevance.matches("", "READY\n")
    assert not relevance.matches("READY\n", "READY\nstep 2\n")
    assert not relevance.matches("x\n", "x\nNOT READY YET\n")  # MULTILINE anchors, whole line


def test_a_regex_on_items_and_objects() -> None:
    relevance = Relevance(r'"status": "(done|failed)"')
    assert relevance.matches([], [{"status": "done"}])
    assert not relevance.matches([{"status": "done"}], [{"status": "done"}, {"status": "running"}])
    assert relevance.matches({"status": "running"}, {"status": "failed"})


def test_a_callable_gets_previous_and_new() -> None:
    relevance = Relevance({"callable": "tests.spend.test_relevance.is_decisive"})
    assert relevance.is_callable
    assert relevance.matches("ok\n", "ok\nFAILED\n")
    assert not relevance.matches("FAILED\n", "FAILED\nok\n")


def test_a_callable_that_returns_no_bool_is_a_clear_error() -> None:
    relevance = Relevance({"callable": "tests.spend.test_relevance.not_a_bool"})
    with pytest.raises(SystemZeroArgumentError, match="returned str, not a bool") as info:
        relevance.matches("", "x")
    assert info.value.field == "decide_when.callable"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("tests.spend.no_such_module.func", "cannot be imported in the triggerer"),
        ("tests.spend.test_relevance.no_such_function", "cannot be imported in the triggerer"),
        ("tests.spend.test_relevance.NOT_CALLABLE", "is not callable"),
    ],
)
def test_a_callable_that_cannot_be_loaded_names_the_path(path: str, problem: str) -> None:
    decision_filter = DecisionFilter(decide_when={"callable": path})  # parse time: only the form is checked
    with pytest.raises(SystemZeroArgumentError, match=problem) as info:
        decision_filter.relevance()
    assert info.value.field == "decide_when.callable" and path in str(info.value)


# ------------------------------------------------------------------ parse-time checks


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        ("(unclosed", "decide_when", "not a valid regular expression"),
        ("", "decide_when", "empty regular expression"),
        (3, "decide_when", "must be a regular expression"),
        ({"callable": "nodots"}, "decide_when.callable", "not a dotted path"),
        ({"callable": "pkg.mod.func", "extra": 1}, "decide_when", "no other key"),
        ({"callable": "pkg.1bad.func"}, "decide_when.callable", "not a dotted path"),
    ],
)
def test_bad_decide_when_names_field_problem_and_fix(value: object, field: str, words: str) -> None:
    with pytest.raises(SystemZeroArgumentError, match=words) as info:
        validate_decide_when(value)
    assert info.value.field == field and info.value.code == "invalid_decide_when"
    assert "pass" in str(info.value) or "fix" in str(info.value) or "drop" in str(info.value)


@pytest.mark.parametrize("value", [-1, 1.5, True, "100", 3_600_001])
def test_bad_debounce_ms_names_the_field(value: object) -> None:
    with pytest.raises(
        SystemZeroArgumentError,
        match=r"debounce_ms must be a whole number of milliseconds from 0 to \d+ or None, got",
    ) as info:
        validate_debounce_ms(value)
    assert info.value.field == "debounce_ms"


def test_decide_initial_must_be_a_bool() -> None:
    with pytest.raises(SystemZeroArgumentError) as info:
        DecisionFilter(decide_initial="no")  # type: ignore[arg-type]
    assert info.value.field == "decide_initial"


def test_filter_kwargs_are_plain_json_and_absent_when_default() -> None:
    assert DecisionFilter().to_kwargs() == {}
    assert not DecisionFilter().active and DecisionFilter().stream_mode("on_change") == "on_change"
    chosen = DecisionFilter(decide_when="READY", debounce_ms=500, decide_initial=False)
    assert chosen.to_kwargs() == {"decide_when": "READY", "debounce_ms": 500, "decide_initial": False}
    assert chosen.stream_mode("on_change") == "on_request"
    assert DecisionFilter(debounce_ms=0).stream_mode("on_change") == "on_change"  # 0: no debounce
    assert DecisionFilter(decide_initial=False).active


# ------------------------------------------------------------------ when a decision is due


def test_initial_state_is_due_at_once_even_with_a_debounce() -> None:
    gate = DecisionDebounce(debounce_ms=2000, decide_initial=True, now=100.0)
    assert gate.pending and gate.due_at() is not None and gate.due_at() <= 100.0


def test_without_decide_initial_nothing_is_due_until_a_relevant_change() -> None:
    gate = DecisionDebounce(debounce_ms=None, decide_initial=False, now=0.0)
    assert gate.due_at() is None
    gate.changed(False, 1.0)
    assert gate.due_at() is None and gate.changes == 1 and gate.relevant_changes == 0
    gate.changed(True, 2.0)
    assert gate.due_at() == 2.0


def test_a_burst_within_the_debounce_is_one_decision() -> None:
    gate = DecisionDebounce(debounce_ms=500, decide_initial=False, now=0.0)
    decisions = []
    now = 0.0
    for line in range(20):  # 20 lines, 100 ms apart
        now = 10.0 + line * 0.1
        gate.changed(True, now)
        due = gate.due_at()
        assert due is not None and due > now  # never due while the burst goes on
    assert gate.due_at() == pytest.approx(now + 0.5)
    gate.started()
    decisions.append(now + 0.5)
    assert gate.due_at() is None and len(decisions) == 1


def test_irrelevant_changes_extend_the_quiet_time_but_start_nothing() -> None:
    gate = DecisionDebounce(debounce_ms=1000, decide_initial=False, now=0.0)
    gate.changed(True, 1.0)
    gate.changed(False, 1.5)
    assert gate.due_at() == pytest.approx(2.5)


def test_a_source_that_never_goes_quiet_is_still_decided_about() -> None:
    gate = DecisionDebounce(debounce_ms=1000, decide_initial=False, now=0.0)
    for step in range(100):
        gate.changed(True, 5.0 + step * 0.5)  # a change every 500 ms, forever
    assert gate.due_at() == pytest.approx(5.0 + MAX_HOLD_FACTOR * 1.0)


def test_a_superseded_decision_makes_the_newest_state_due() -> None:
    gate = DecisionDebounce(debounce_ms=None, decide_initial=True, now=0.0)
    gate.started()
    gate.changed(False, 1.0)  # arrived while the decision was in flight
    assert gate.due_at() is None
    gate.again(1.2)
    assert gate.due_at() == 1.0  # at once: the newest state is decided, never the superseded one
