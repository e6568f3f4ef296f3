"""DecisionPolicy: the bands, per-option bars, missing numbers, JSON round trip, the record."""

from __future__ import annotations

import json
from datetime import UTC, timedelta

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import (
    DecisionPolicy,
    OptionBars,
    decision_record,
    ranked_answers,
)
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.protocol.reply import Answer

POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", default=False, review_timeout=60)


def answer(decision: object = True, probability: float | None = 0.9, confidence: float | None = 0.9) -> dict:
    return {"decision": decision, "probability": probability, "confidence": confidence, "alternatives": []}


BAR_FIELDS = {
    "min_confidence": lambda v: DecisionCondition(question="ready", min_confidence=v),
    "min_probability": lambda v: DecisionCondition(question="ready", min_probability=v),
    # a policy refuses a bad bar when it is used (a task takes it), so the message can name the task
    "act_above": lambda v: DecisionPolicy.coerce(DecisionPolicy(act_above=v)),
    "review_above": lambda v: DecisionPolicy.coerce(DecisionPolicy(act_above=1, review_above=v)),
    "option act_above": lambda v: OptionBars(act_above=v),
}


@pytest.mark.parametrize("make", BAR_FIELDS.values(), ids=list(BAR_FIELDS))
@pytest.mark.parametrize(
    ("value", "fix"),
    [
        (80, "a number from 0 to 1, or None for no bar (a percentage: 80 % is 0.8)"),
        (-0.1, "a number from 0 to 1, or None for no bar"),
        (float("nan"), "a number from 0 to 1, or None for no bar"),
        (True, "a number from 0 to 1, or None for no bar"),
        ("0.8", "a number from 0 to 1, or None for no bar"),
    ],
)
def test_every_bar_is_refused_alike(make: object, value: object, fix: str) -> None:
    """A condition's bars and a policy's are one rule: one error type, one code, one message shape."""
    with pytest.raises(SystemZeroArgumentError) as raised:
        make(value)  # type: ignore[operator]
    field = raised.value.field
    assert field in ("min_confidence", "min_probability", "act_above", "review_above")
    assert raised.value.code == "invalid_threshold"
    assert str(raised.value) == f"{field} {value!r} must be {fix}"


@pytest.mark.parametrize("make", BAR_FIELDS.values(), ids=list(BAR_FIELDS))
@pytest.mark.parametrize("value", [None, 0, 1, 0.5])
def test_every_bar_takes_none_and_numbers_from_0_to_1(make: object, value: object) -> None:
    make(value)  # type: ignore[operator]


@pytest.mark.parametrize(
    ("confidence", "action", "code"),
    [
        (0.95, "act", "above_act_bar"),
        (0.8, "act", "above_act_bar"),  # the bars are inclusive
        (0.79, "review", "in_review_band"),
        (0.5, "review", "in_review_band"),
        (0.49, "skip", "below_review_bar"),
        (None, "review", "missing_measure"),  # no number: uncertain, so a person decides
    ],
)
def test_two_bars(confidence: float | None, action: str, code: str) -> None:
    outcome = POLICY.evaluate(answer(confidence=confidence))
    assert (outcome.action, outcome.code) == (action, code)
    assert (outcome.act_above, outcome.review_above) == (0.8, 0.5)


def test_below_actions_and_missing_number_without_review_band() -> None:
    for below in ("fail", "skip", "wait"):
        policy = DecisionPolicy(act_above=0.8, below=below)
        assert policy.evaluate(answer(confidence=0.7)).action == below
        assert policy.evaluate(answer(confidence=None)).action == below
    policy = DecisionPolicy(act_above=0.8, below="default", default=True)
    assert policy.evaluate(answer(decision=False, confidence=0.1)).action == "default"


def test_no_bar_always_acts() -> None:
    assert DecisionPolicy().evaluate(answer(confidence=None)).action == "act"


def test_measure_probability_and_both() -> None:
    low_p = answer(probability=0.6, confidence=0.95)
    assert DecisionPolicy(act_above=0.8).evaluate(low_p).action == "act"
    assert DecisionPolicy(act_above=0.8, measure="probability").evaluate(low_p).action == "fail"
    both = DecisionPolicy(act_above=0.8, review_above=0.5, measure="both")
    assert both.evaluate(low_p).action == "review" and both.evaluate(low_p).measured == 0.6
    assert both.evaluate(answer(probability=None, confidence=0.99)).code == "missing_measure"


def test_reads_typed_answers() -> None:
    typed = Answer(name="q", type="boolean", decision=True, probability=0.7, confidence=0.85)
    assert POLICY.evaluate(typed).action == "act"


def test_per_option_bars() -> None:
    policy = DecisionPolicy(
        act_above=0.8,
        review_above=0.5,
        options={"refund": OptionBars(act_above=0.95), "ignore": {"review_above": 0.3}},
    )
    assert policy.evaluate(answer("refund", confidence=0.9)).action == "review"
    assert policy.evaluate(answer("other", confidence=0.9)).action == "act"
    assert policy.evaluate(answer("ignore", confidence=0.4)).action == "review"
    assert policy.bars_for("ignore") == (0.8, 0.3)


def test_options_least_certain_answer_decides() -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, options={"b": {"act_above": 0.9}})
    sure = {"a": answer(True, confidence=0.9), "b": answer(False, confidence=0.95)}
    assert policy.evaluate_options(sure).action == "act"
    unsure = {"a": answer(True, confidence=0.9), "b": answer(False, confidence=0.85)}
    outcome = policy.evaluate_options(unsure)
    assert outcome.action == "review" and outcome.reason.startswith("option 'b'")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"act_above": 1.5}, "act_above"),
        ({"act_above": 0.5, "review_above": 0.8}, "must not be above"),
        ({"review_above": 0.5}, "no act bar"),
        ({"act_above": 0.8, "below": "retry"}, "below must be one of"),
        ({"act_above": 0.8, "below": "default"}, "needs a default"),
        ({"act_above": 0.8, "measure": "vibes"}, "measure"),
        ({"review_timeout": -1}, "review_timeout"),
        ({"options": {"x": {"act_above": 0.5, "review_above": 0.6}}}, "option 'x'"),
        ({"options": {"x": {"min_confidence": 0.5}}}, "unknown key"),
    ],
)
def test_invalid_policies(kwargs: dict, message: str) -> None:
    # refused when it is used (a task takes it: coerce), so the message can name the task
    policy = DecisionPolicy(**kwargs)
    with pytest.raises(ValueError, match=message):
        DecisionPolicy.coerce(policy)
    with pytest.raises(ValueError, match=message):
        policy.evaluate({"decision": True, "probability": 0.9, "confidence": 0.9})
    with pytest.raises(ValueError, match=message):
        DecisionPolicy.from_dict(kwargs)  # the dict form at once


def test_check_against_the_question() -> None:
    DecisionPolicy(act_above=0.8, below="wait").check(kind="boolean", allow_wait=True)
    with pytest.raises(ValueError, match="only applies to the sensor"):
        DecisionPolicy(act_above=0.8, below="wait").check(kind="boolean")
    with pytest.raises(ValueError, match="true or false"):
        DecisionPolicy(default="yes").check(kind="boolean")
    with pytest.raises(ValueError, match="not an option"):
        DecisionPolicy(default="gold").check(kind="choice", options=["silver"])
    with pytest.raises(ValueError, match="not an option"):
        DecisionPolicy(options={"gold": {"act_above": 0.9}}).check(kind="choice", options=["silver"])
    with pytest.raises(ValueError, match="list of options"):
        DecisionPolicy(default=["a", "z"]).check(kind="choice", options=["a", "b"], multiple=True)
    DecisionPolicy(default="a").check(kind="choice", options=["a", "b"], multiple=True)


def test_json_round_trip() -> None:
    policy = DecisionPolicy(
        act_above=0.8,
        review_above=0.5,
        below="default",
        default=["a"],
        measure="both",
        options={"a": OptionBars(act_above=0.9)},
        review_timeout=timedelta(minutes=5),
    )
    data = json.loads(json.dumps(policy.to_dict()))
    assert data["review_timeout"] == 300.0
    assert DecisionPolicy.from_dict(data) == policy
    assert DecisionPolicy.coerce(data) == policy and DecisionPolicy.coerce(None) is None
    with pytest.raises(ValueError, match="unknown policy key"):
        DecisionPolicy.from_dict({"min_confidence": 0.5})


def test_decision_record_is_plain_json() -> None:
    from datetime import datetime

    outcome = POLICY.evaluate(answer(confidence=0.6))
    record = decision_record(
        question="publish",
        answer={**answer(confidence=0.6), "alternatives": [{"decision": False, "confidence": 0.4}]},
        decision=False,
        action=outcome.action,
        decided_by="human",
        reason="asked",
        policy=POLICY,
        outcome=outcome,
        model="sz-1",
        reply_id="szd_x",
        state_version=3,
        state_hash="ab" * 32,
        review={"responded_at": datetime(2026, 1, 1, tzinfo=UTC), "chosen_options": ("No",)},
    )
    assert json.loads(json.dumps(record)) == record
    assert record["proposed"] is True and record["decision"] is False and record["action"] == "review"
    assert record["review"]["responded_at"] == "2026-01-01T00:00:00+00:00"
    assert record["review"]["chosen_options"] == ["No"]
    assert record["policy"]["act_above"] == 0.8 and record["bars"]["measured"] == 0.6
    with pytest.raises(ValueError, match="decided_by"):
        decision_record(question="q", answer=None, decision=None, action="act", decided_by="robot", reason="")


def test_ranked_answers_put_the_proposal_first() -> None:
    ranked = ranked_answers(
        {
            "decision": "b",
            "probability": 0.5,
            "confidence": 0.2,
            "alternatives": [
                {"decision": "a", "confidence": 0.3},
                {"decision": "b", "confidence": 0.1},
                {"decision": "c", "confidence": 0.2},
            ],
        }
    )
    assert [r["decision"] for r in ranked] == ["b", "a", "c"]
