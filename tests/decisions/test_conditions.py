"""DecisionCondition with a policy and hysteresis, and the Streak that debounces a flapping answer."""

from __future__ import annotations

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition, Streak
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult


def _decision(decision: object, confidence: float | None) -> DecisionResult:
    answer = Answer(name="ready", type="boolean", decision=decision, probability=0.9, confidence=confidence)
    return DecisionResult(
        reply={"id": "szd_x"},
        state_version=1,
        covered_event_ids=(),
        request_id="r",
        stream_id="s",
        answers={"ready": answer},
    )


POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="wait").to_dict()


@pytest.mark.parametrize(
    ("decision", "confidence", "met", "action"),
    [
        (True, 0.9, True, "act"),
        (True, 0.6, False, "review"),
        (True, 0.3, False, "wait"),
        (True, None, False, "review"),
        (False, 0.99, False, "wait"),  # not the expected answer: the policy is not asked
    ],
)
def test_the_policy_decides_what_an_expected_answer_does(
    decision: bool, confidence: float | None, met: bool, action: str
) -> None:
    result = DecisionCondition("ready", policy=POLICY).evaluate(_decision(decision, confidence))
    assert (result.met, result.action) == (met, action)
    assert result.candidate == (action in ("act", "review"))


def test_a_default_answer_counts_only_when_it_is_the_expected_one() -> None:
    yes = DecisionPolicy(act_above=0.8, below="default", default=True).to_dict()
    no = DecisionPolicy(act_above=0.8, below="default", default=False).to_dict()
    assert DecisionCondition("ready", policy=yes).evaluate(_decision(True, 0.2)).action == "default"
    assert DecisionCondition("ready", policy=no).evaluate(_decision(True, 0.2)).action == "wait"


@pytest.mark.parametrize(
    ("expect", "decision", "expected"),
    [
        (True, True, True),
        (True, False, False),
        (True, 1, False),  # a number is not a boolean, though 1 == True
        ("deploy", "deploy", True),
        (["deploy", "wait"], "wait", True),
        (["deploy", "wait"], "rollback", False),
        (["deploy"], True, False),
    ],
)
def test_the_expected_answer_is_one_rule_for_a_decision_a_default_and_a_person(
    expect: object, decision: object, expected: bool
) -> None:
    condition = DecisionCondition("ready", expect)
    assert condition.expects(decision) is expected
    # the same rule says whether a decision meets the condition
    assert condition.evaluate(_decision(decision, 0.9)).met is expected


def test_legacy_bars_still_apply_before_the_policy() -> None:
    condition = DecisionCondition("ready", min_probability=0.95, policy=POLICY)
    assert condition.evaluate(_decision(True, 0.99)).action == "wait"  # probability 0.9 < 0.95


def test_dict_form_is_unchanged_without_the_new_fields() -> None:
    plain = DecisionCondition("ready", True, 0.8)
    assert plain.to_dict() == {
        "question": "ready",
        "expect": True,
        "min_confidence": 0.8,
        "min_probability": None,
    }
    full = DecisionCondition("ready", policy=POLICY, consecutive=3, min_true_for=2.5)
    assert DecisionCondition.from_dict(full.to_dict()) == full and full.has_hysteresis


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"consecutive": 0}, "consecutive"),
        ({"min_true_for": -1}, "min_true_for"),
        ({"policy": {"act_above": 2}}, "policy"),
    ],
)
def test_invalid_hysteresis_and_policy(kwargs: dict, field: str) -> None:
    with pytest.raises(SystemZeroArgumentError) as info:
        DecisionCondition("ready", **kwargs)
    assert info.value.field == field


def test_the_policy_must_fit_the_watched_question() -> None:
    condition = DecisionCondition("tier", expect="gold", policy={"act_above": 0.8, "default": True})
    with pytest.raises(SystemZeroArgumentError, match="is not an option"):
        condition.check_questions({"tier": {"type": "choice", "options": ["gold", "silver"]}})


def test_streak_counts_successive_states_and_time() -> None:
    streak = Streak(consecutive=3, min_true_for=10)
    streak.observe(True, 0.0, "a")
    streak.observe(True, 1.0, "a")  # the same state replayed: not a new decision
    streak.observe(True, 2.0, "b")
    assert streak.count == 2 and not streak.ready(2.0)
    streak.observe(False, 3.0, "c")  # flapped: start again
    assert streak.count == 0 and streak.wait_time(3.0) is None
    for t, key in ((4.0, "d"), (5.0, "e"), (6.0, "f")):
        streak.observe(True, t, key)
    assert not streak.ready(6.0) and streak.wait_time(6.0) == pytest.approx(8.0)
    assert streak.ready(14.0) and streak.to_dict(14.0)["true_for"] == 10.0
