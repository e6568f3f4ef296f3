"""Mistakes in an asset watcher's trigger, which the Dag author builds: each fails where the Dag
file is parsed, naming the argument and the fix, before the triggerer could restart it every few
seconds or bill every change of a condition that can never be met."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.exceptions import ARGUMENT_ERRORS
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests.helpers import TRIGGER_CONDITION, TRIGGER_REQUEST, dagbag_module


def watcher(**overrides: Any) -> SystemZeroDecisionEventTrigger:
    kwargs: dict[str, Any] = {
        "systemzero_conn_id": "systemzero_default",
        "request": TRIGGER_REQUEST,
        "condition": TRIGGER_CONDITION,
        "state": "",
        "watch_id": "nightly",
        "source": {"type": "file", "path": "/data/status.log"},
    }
    return SystemZeroDecisionEventTrigger(**{**kwargs, **overrides})


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        (
            {"condition": DecisionCondition("done", True).to_dict()},
            "question",
            "question 'done' is not among the questions asked (['ready'])",
        ),
        (
            {"condition": DecisionCondition("ready", "yes").to_dict()},
            "expect",
            "expect 'yes' must be true or false for boolean question 'ready'",
        ),
        (
            {"condition": "ready"},
            "condition",
            "condition must be a DecisionCondition or its to_dict(), got str",
        ),
        ({"condition": {"question": "ready", "expected": True}}, "condition", "is not a condition"),
        (
            {"source": {"type": "file", "path": "/data/status.log", "decide_emtpy": True}},
            "source.decide_emtpy",
            "source has unknown field 'decide_emtpy'",
        ),
        ({"source": {"type": "file", "path": "status.log"}}, "source.path", "is relative"),
        ({"decision_mode": "always"}, "decision_mode", "decision_mode 'always' is not one of"),
        ({"systemzero_conn_id": 5}, "systemzero_conn_id", "must be the ID of a System Zero connection"),
        ({"state": 5, "source": None}, "state", "state must be a string, an array or an object, got int"),
        ({"state": 5}, "state", "a file source needs a string initial state"),
        ({"watch_id": " "}, "watch_id", "watch_id must be a non-empty string"),
        (
            {"debounce_ms": "500"},
            "debounce_ms",
            "debounce_ms must be a whole number of milliseconds from 0 to",
        ),
        ({"max_staleness": -1}, "max_staleness", "max_staleness must be a number of seconds from 0 to 3600"),
        ({"decide_when": "(unclosed"}, "decide_when", "decide_when"),
        (
            {"source": None, "condition": DecisionCondition("ready", True, consecutive=3).to_dict()},
            "consecutive",
            "condition: consecutive=3 needs successive states, but with no source the state never changes",
        ),
        (
            {"source": {"type": "static"}, "decide_initial": False},
            "decide_initial",
            "decide_initial=False with a static source: the state never changes, so nothing would ever be "
            "decided",
        ),
        ({"lease_after": "x"}, "lease_after", "lease_after must be a number of seconds (0 or more), got str"),
        ({"lease": "no"}, "lease", "lease must be True or False, got str 'no'"),
        ({"request": {"model": "m"}}, "request", "request must be a dict with 'questions'"),
        (
            {"request": {"questions": {"ready": "Is the job ready?"}}},
            "questions.ready",
            "questions.ready must be an object {type, instructions[, options]}: write each question as "
            "{'type': 'boolean', 'instructions': 'Is the job ready?'}",
        ),
    ],
)
def test_a_watcher_mistake_fails_when_the_trigger_is_built(
    overrides: dict[str, Any], field: str, message: str
) -> None:
    with pytest.raises(ARGUMENT_ERRORS, match=re.escape(message)) as error:
        watcher(**overrides)
    assert error.value.field == field
    # an import error's traceback shows only the provider's frames: the message names the watch
    if field != "watch_id":
        assert str(error.value).startswith("SystemZeroDecisionEventTrigger(watch_id='nightly'): ")


@pytest.mark.parametrize(
    ("condition", "message"),
    [
        (
            {"min_confidence": 80},
            "condition: min_confidence 80 must be a number from 0 to 1, or None for no bar "
            "(a percentage: 80 % is 0.8)",
        ),
        (
            {"min_probability": -1},
            "condition: min_probability -1 must be a number from 0 to 1, or None for no bar",
        ),
        ({"min_true_for": -1}, "condition: min_true_for -1 must be a number of seconds (0 or more)"),
        (
            {"policy": {"act_above": 0.8, "below": "default", "default": "yes"}},
            "condition: policy: default 'yes' must be true or false for a boolean question",
        ),
        (
            {"policy": {"act_above": 2}},
            "condition: policy: act_above 2 must be a number from 0 to 1, or None for no bar "
            "(a percentage: 2 % is 0.02)",
        ),
    ],
)
def test_a_mistake_inside_the_condition_is_labelled_condition(
    condition: dict[str, Any], message: str
) -> None:
    """Not ``request:``: the bad value is in the condition the author wrote."""
    with pytest.raises(ARGUMENT_ERRORS) as error:
        watcher(condition={"question": "ready", "expect": True, **condition})
    assert str(error.value) == f"SystemZeroDecisionEventTrigger(watch_id='nightly'): {message}"


@pytest.mark.parametrize(
    ("policy", "named"),
    [
        (DecisionPolicy(act_above=0.85, review_above=0.5), "review_above (0.5)"),
        (
            {"act_above": 0.85, "options": {"high": {"act_above": 0.9, "review_above": 0.6}}},
            "options['high'] review_above (0.6)",
        ),
    ],
)
def test_a_review_band_in_a_watch_is_refused_with_the_reason_and_the_fix(policy: Any, named: str) -> None:
    """A watch never asks a person, so a decision in the review band would never fire, silently."""
    request = {
        "questions": {"level": {"type": "choice", "instructions": "Level?", "options": ["high", "low"]}}
    }
    condition = DecisionCondition(
        "level" if isinstance(policy, dict) else "ready",
        "high" if isinstance(policy, dict) else True,
        policy=policy if isinstance(policy, dict) else policy.to_dict(),
    )
    with pytest.raises(ARGUMENT_ERRORS) as error:
        watcher(condition=condition, **({"request": request} if isinstance(policy, dict) else {}))
    assert str(error.value) == (
        "SystemZeroDecisionEventTrigger(watch_id='nightly'): condition: policy: "
        f"{named} sends a decision to a person, but an asset watch never asks one (nobody can "
        "review an asset event): a decision in the review band would never fire, and nothing would "
        "say why; drop review_above (only an answer that passes act_above fires), or wait with a "
        "SystemZeroDecisionSensor, which can ask a person"
    )
    assert error.value.field == "policy"
    # the sensor asks a person in that band: the same condition is accepted there
    DecisionCondition.from_dict(condition.to_dict()).check_questions(
        request["questions"] if isinstance(policy, dict) else {"ready": {"type": "boolean"}}
    )


def test_below_wait_in_a_watch_is_refused_with_the_reason_and_the_fix() -> None:
    """below='wait' keeps a sensor waiting; a watch always keeps watching, so it could never fire."""
    policy = DecisionPolicy(act_above=0.85, below="wait").to_dict()
    with pytest.raises(ARGUMENT_ERRORS) as error:
        watcher(condition=DecisionCondition("ready", True, policy=policy))
    assert str(error.value) == (
        "SystemZeroDecisionEventTrigger(watch_id='nightly'): condition: policy: below='wait' keeps a "
        "sensor waiting for more state, but an asset watch always keeps watching: a decision below "
        "the bar produces no event, so below='wait' would never fire and says nothing the watch does "
        "not do anyway; drop below, or pass below='default' with default=<the expected answer> to "
        "produce an event for such a decision"
    )
    assert error.value.field == "policy"
    # what the message offers is accepted, and the sensor keeps below='wait'
    for fixed in ({"act_above": 0.85}, {"act_above": 0.85, "below": "default", "default": True}):
        watcher(condition=DecisionCondition("ready", True, policy=fixed))
    DecisionCondition("ready", True, policy=policy).check_questions({"ready": {"type": "boolean"}})


def test_a_question_mistake_names_the_condition_and_the_fix() -> None:
    with pytest.raises(ARGUMENT_ERRORS) as error:
        watcher(condition=DecisionCondition("redy", True))
    assert str(error.value) == (
        "SystemZeroDecisionEventTrigger(watch_id='nightly'): condition: question 'redy' is "
        "not among the questions asked (['ready']); did you mean 'ready'?: name one of them in the "
        "condition, or ask it"
    )


def test_a_condition_object_is_kept_as_its_dict() -> None:
    built = watcher(condition=DecisionCondition("ready", True, min_confidence=0.8))
    assert built.condition == DecisionCondition("ready", True, min_confidence=0.8).to_dict()
    assert built.serialize() == watcher(condition=built.condition).serialize()  # the same identity


def test_a_path_object_as_the_source_path_is_kept_as_its_text() -> None:
    built = watcher(source={"type": "file", "path": Path("/data/status.log")})
    assert built.source == {"type": "file", "path": "/data/status.log"}
    assert built.serialize() == watcher().serialize()  # plain JSON, and the same identity as the text


def test_a_watcher_mistake_is_an_import_error_of_the_dag_file(airflow_db: None, tmp_path: Path) -> None:
    (tmp_path / "watching_dag.py").write_text(
        textwrap.dedent("""
        import pendulum
        from airflow.sdk import DAG, Asset, AssetWatcher
        from airflow_provider_systemzero.decisions.conditions import DecisionCondition
        from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger

        trigger = SystemZeroDecisionEventTrigger(
            systemzero_conn_id="systemzero_default",
            request={"questions": {"ready": {"type": "boolean", "instructions": "Ready?"}}},
            condition=DecisionCondition("ready", True),
            state="",
            watch_id="status",
            source={"type": "file", "path": "/data/status.log", "decide_emtpy": True},
        )
        status = Asset("status", watchers=[AssetWatcher(name="status", trigger=trigger)])
        with DAG("on_status", schedule=[status], start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
            pass
    """)
    )
    bag = dagbag_module().DagBag(dag_folder=str(tmp_path))
    [error] = bag.import_errors.values()
    assert "source has unknown field 'decide_emtpy' for type 'file'" in error
