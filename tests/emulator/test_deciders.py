"""The emulator's deciders: keyword, rules:FILE, python:module:function."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.emulator.deciders import (
    KeywordDecider,
    RulesDecider,
    content_words,
    load_decider,
    newest_lines,
)

READY = {"ready": {"type": "boolean", "instructions": "Is the job ready?"}}
COLOUR = {
    "colour": {"type": "choice", "instructions": "Which light is on?", "options": ["red", "green", "amber"]}
}


def keyword(state: Any, questions: dict[str, Any] = READY) -> dict[str, Any]:
    return KeywordDecider().decide({"state": state, "questions": questions}, now=0.0)


def test_content_words_drop_stopwords_and_stem() -> None:
    assert content_words("Is the job ready?") == ("job", "ready")
    assert content_words("Have all the tests passed?") == ("test", "pass")
    assert content_words("Is it not done yet?") == ()


def test_demo_question_over_the_example_log() -> None:
    answer = keyword("Initial log\nJob is ready.\n")["ready"]
    assert answer == {
        "decision": True,
        "probability": 0.95,
        "confidence": 0.9,
        "alternatives": [{"decision": False, "confidence": 0.05}],
    }
    answer = keyword("Initial log\n")["ready"]
    assert answer["decision"] is False
    assert answer["probability"] == 0.77
    assert answer["alternatives"] == [{"decision": True, "confidence": 0.23}]


@pytest.mark.parametrize(
    ("state", "decision"),
    [
        ("Job is ready.\nJob is not ready anymore.\n", False),  # the newest evidence wins, negated
        ("Job started\n", False),  # half the words: not above 0.5
        ("Job is ready.\ncleaning up\n", True),  # older evidence, discounted
        (["boot", {"job": "ready"}], True),  # array items are lines; non-strings as compact JSON
        ({"status": "job ready"}, True),  # object keys are lines
        ("", False),
    ],
)
def test_keyword_boolean_cases(state: Any, decision: bool) -> None:
    assert keyword(state)["ready"]["decision"] is decision


def test_keyword_is_deterministic() -> None:
    state = "x\n" * 5000 + "the job is finally ready\n"
    assert keyword(state) == keyword(state)


def test_keyword_looks_at_the_newest_part_only() -> None:
    assert keyword("Job is ready.\n" + "filler line\n" * 400)["ready"]["decision"] is False
    assert newest_lines("a\nb\n\nc") == ["a", "b", "c"]
    assert len("".join(newest_lines("y" * 10_000))) == 2048


def test_keyword_choice_picks_the_newest_best_match() -> None:
    answer = keyword("red light\ngreen light is on\n", COLOUR)["colour"]
    assert answer["decision"] == "green"
    assert [a["decision"] for a in answer["alternatives"]] == ["red", "amber"]
    assert 0 < answer["confidence"] <= answer["probability"] <= 1
    assert keyword("nothing relevant", COLOUR)["colour"]["decision"] == "red"  # ties: the first option


def test_rules_decider(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(
        json.dumps(
            {
                "rules": [
                    {
                        "question": "ready",
                        "pattern": "(?i)job is ready",
                        "answer": True,
                        "probability": 0.93,
                        "confidence": 0.9,
                    },
                    {"pattern": "amber", "answer": "amber", "probability": 0.6},
                    {"pattern": "job", "answer": "not-an-option"},
                ],
                "default": {"answer": False, "probability": 0.2, "confidence": 0.8},
            }
        )
    )
    decider = load_decider(f"rules:{path}")
    questions = {**READY, **COLOUR}
    answers = decider.decide({"state": "Job is ready.", "questions": questions}, now=0)
    assert answers["ready"] == {"decision": True, "probability": 0.93, "confidence": 0.9}
    # A rule for every question whose answer does not fit one is passed over for it (and the
    # default, a boolean, does not fit a choice question: the first option).
    assert answers["colour"] == {"decision": "red", "probability": 0.2, "confidence": 0.8}
    answers = decider.decide({"state": {"light": "amber"}, "questions": questions}, now=0)
    assert answers["ready"] == {"decision": False, "probability": 0.2, "confidence": 0.8}
    assert answers["colour"] == {"decision": "amber", "probability": 0.6, "confidence": 1.0}


@pytest.mark.parametrize(
    ("rule", "message"),
    [
        (
            {"question": "ready", "pattern": "(?i)say yes", "answer": "yes"},
            "rules.json: rules[1] matched, but its answer 'yes' does not fit boolean question 'ready': "
            "make it true or false",
        ),
        (
            {"question": "colour", "pattern": "(?i)say yes", "answer": "marketing"},
            "rules.json: rules[1] matched, but its answer 'marketing' is not one of the options of "
            "choice question 'colour' ['red', 'green', 'amber']: make the rule's answer one of them",
        ),
    ],
)
def test_a_rule_for_one_question_never_turns_into_another_answer(
    tmp_path: Path, rule: dict[str, Any], message: str
) -> None:
    path = tmp_path / "rules.json"
    other = {"question": "elsewhere", "pattern": ".", "answer": True}
    path.write_text(json.dumps({"rules": [other, rule], "default": {"answer": False}}))
    decider = load_decider(f"rules:{path}")
    questions = {**READY, **COLOUR}
    with pytest.raises(ValueError) as error:
        decider.decide({"state": "please say yes", "questions": questions}, now=0)
    assert str(error.value).endswith(message)
    # unmatched, the rule is no mistake: the default answers
    answers = decider.decide({"state": "nothing", "questions": questions}, now=0)
    assert answers["ready"]["decision"] is False and answers["colour"]["decision"] == "red"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "expected an object"),
        ({"rules": [{"pattern": "("}]}, "answer"),
        ({"rules": [{"pattern": "(", "answer": True}]}, "not a valid regular expression"),
        ({"rules": [{"pattern": "x", "answer": True, "probability": 2}]}, "between 0 and 1"),
        ({"rules": [], "extra": 1}, "unknown key"),
        ({"rules": [], "default": {"probability": 1}}, "default"),
    ],
)
def test_rules_file_errors(document: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RulesDecider.from_dict(document)


def answer_everything(request: dict[str, Any], now: float) -> dict[str, Any]:
    return {name: True for name in request["questions"]}


def test_python_decider_and_spec_errors() -> None:
    decider = load_decider(f"python:{__name__}:answer_everything")
    assert decider.decide({"state": "", "questions": READY}, now=1.0) == {"ready": True}
    with pytest.raises(ValueError, match="cannot load"):
        load_decider(f"python:{__name__}:missing")
    with pytest.raises(ValueError, match="python:module:function"):
        load_decider("python:onlymodule")
    with pytest.raises(ValueError, match="unknown decider"):
        load_decider("magic")
    with pytest.raises(ValueError, match="cannot read rules file"):
        load_decider("rules:/nonexistent/rules.json")
    keyword_decider = KeywordDecider()
    assert load_decider(keyword_decider) is keyword_decider
