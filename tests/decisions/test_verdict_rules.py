"""VerdictRules: the one place that says when a decision ends a wait (trigger and poke alike)."""

from __future__ import annotations

import dataclasses
import time

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.decisions.timeline import parse_time
from airflow_provider_systemzero.decisions.watch import VerdictRules, WatchEvent, answers_payload
from airflow_provider_systemzero.protocol.reply import DecisionResult
from tests.helpers import decision_result


def _decision(decision: object, confidence: float | None = 0.9, version: int = 1) -> DecisionResult:
    return decision_result(version, reply=f"szd_{version}", ready=(decision, 0.9, confidence))


POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="fail").to_dict()


def test_a_met_decision_ends_the_wait_once_per_run() -> None:
    watch = VerdictRules(DecisionCondition("ready"), reviews=False)
    verdict = watch.observe(_decision(True), "a", "state a", 0.0)
    assert verdict is not None and verdict.status == "success" and verdict.state == "state a"
    assert watch.observe(_decision(True, version=2), "b", "state b", 1.0) is None  # the same run
    assert watch.observe(_decision(False, version=3), "c", "state c", 2.0) is None
    assert watch.observe(_decision(True, version=4), "d", "state d", 3.0) is not None  # a new run


def test_hysteresis_needs_successive_states_and_time() -> None:
    watch = VerdictRules(DecisionCondition("ready", consecutive=2, min_true_for=5))
    assert watch.observe(_decision(True), "a", "a", 0.0) is None
    assert watch.observe(_decision(True, version=2), "a", "a", 1.0) is None  # the same state again
    assert watch.observe(_decision(True, version=3), "b", "b", 2.0) is None  # two states, but 2 s < 5 s
    assert watch.wait_time(2.0) == 3.0
    verdict = watch.due(5.0)
    assert verdict is not None and verdict.state_key == "b" and verdict.streak["consecutive"] == 2
    assert watch.wait_time(6.0) is None


def test_a_state_a_person_said_no_about_does_not_qualify() -> None:
    watch = VerdictRules(DecisionCondition("ready"), skip_states=["a"])
    assert watch.observe(_decision(True), "a", "a", 0.0) is None
    assert watch.observe(_decision(True, version=2), "b", "b", 1.0) is not None


def test_the_policy_can_end_the_wait_only_when_a_person_could_review() -> None:
    condition = DecisionCondition("ready", policy=POLICY)
    verdict = VerdictRules(condition).observe(_decision(True, 0.2), "a", "a", 0.0)
    assert verdict is not None and verdict.status == "policy" and verdict.result.action == "fail"
    review = VerdictRules(condition).observe(_decision(True, 0.6), "a", "a", 0.0)
    assert review is not None and review.status == "success" and review.result.action == "review"
    assert VerdictRules(condition, reviews=False).observe(_decision(True, 0.6), "a", "a", 0.0) is None


def test_a_static_state_that_does_not_qualify_ends_the_wait_unmet() -> None:
    watch = VerdictRules(DecisionCondition("ready"), end_when_unmet=True)
    verdict = watch.observe(_decision(False), "a", "a", 0.0)
    assert verdict is not None
    assert watch.event(verdict).status == "unmet"


def test_the_event_round_trips_through_its_payload() -> None:
    condition = DecisionCondition("ready", policy=POLICY)
    watch = VerdictRules(condition)
    verdict = watch.observe(_decision(True, 0.6, version=7), "hash-a", "a", 0.0)
    assert verdict is not None
    event = watch.event(verdict, extra={"key_namespace": "ns", "deadline": 12.5})
    payload = event.to_payload()
    assert list(payload)[:3] == ["status", "key_namespace", "question"]
    assert payload["status"] == "success" and payload["decision"] is True and payload["state_version"] == 7
    assert payload["action"] == "review" and payload["state_hash"] == "hash-a" and payload["deadline"] == 12.5
    again = WatchEvent.from_payload(payload)
    assert again == event and again.to_payload() == payload and again.action == "review"
    assert again.summary()["reply_id"] == "szd_7"


def test_every_decision_event_says_when_system_zero_decided_in_utc() -> None:
    created = 1_790_000_000  # reply.created, as the public example gives it
    decision = dataclasses.replace(_decision(True), reply={"id": "szd_1", "created": created})
    watch = VerdictRules(DecisionCondition("ready"), reviews=False)
    verdict = watch.observe(decision, "a", "a", 0.0)
    assert verdict is not None
    payload = watch.event(verdict).to_payload()
    assert payload["decided_at"] == "2026-09-21T14:13:20.000Z"  # as the history writes its times
    assert WatchEvent.from_payload(payload).summary()["decided_at"] == payload["decided_at"]
    assert answers_payload(decision, "a", key_namespace="ns")["decided_at"] == payload["decided_at"]
    # a reply without a time of its own: when it arrived, in UTC too (to the millisecond)
    before = time.time()
    arrived = answers_payload(_decision(True), "a", key_namespace="ns")["decided_at"]
    assert arrived.endswith("Z") and before - 0.001 <= parse_time(arrived) <= time.time() + 0.001


def test_without_policy_fields_the_event_is_the_decision_alone() -> None:
    watch = VerdictRules(DecisionCondition("ready"), reviews=False)
    verdict = watch.observe(_decision(True), "a", "a", 0.0)
    assert verdict is not None
    payload = watch.event(verdict, policy_fields=False, extra={"watch_id": "w"}).to_payload()
    assert "action" not in payload and payload["watch_id"] == "w"
    assert WatchEvent.from_payload(payload).action == "act"


def test_a_restored_fired_flag_waits_for_an_unmet_decision_and_reports_each_change() -> None:
    """An asset watch restored with ``fired`` (its memory of an event before a restart) does not
    fire for the run it fired for; ``on_fired`` hears each change of the flag."""
    heard: list[tuple[bool, str]] = []
    watch = VerdictRules(
        DecisionCondition("ready"),
        reviews=False,
        fired=True,
        on_fired=lambda f, d: heard.append((f, d.reply_id)),
    )
    assert watch.observe(_decision(True), "a", "a", 0.0) is None  # still the run it fired for
    assert watch.observe(_decision(True, version=2), "b", "b", 1.0) is None and heard == []
    assert watch.observe(_decision(False, version=3), "c", "c", 2.0) is None
    assert heard == [(False, "szd_3")] and not watch.fired
    assert watch.observe(_decision(False, version=4), "d", "d", 3.0) is None and len(heard) == 1
    assert watch.observe(_decision(True, version=5), "e", "e", 4.0) is not None
    assert heard[-1] == (True, "szd_5") and watch.fired


def test_a_restored_fired_flag_keeps_a_hysteresis_run_from_waiting_on_time() -> None:
    watch = VerdictRules(DecisionCondition("ready", min_true_for=5), reviews=False, fired=True)
    assert watch.observe(_decision(True), "a", "a", 0.0) is None
    assert watch.wait_time(1.0) is None and watch.due(10.0) is None


def test_a_run_held_back_by_min_true_for_says_how_long_it_held_and_the_fix() -> None:
    watch = VerdictRules(DecisionCondition("ready", min_true_for=7200))
    assert watch.observe(_decision(True), "a", "a", 0.0) is None
    assert watch.held_back(20.0, more_time="raise the timeout") == (
        "min_true_for (2 h) needs the condition to hold longer (held 20 s): "
        "shorten min_true_for, or raise the timeout"
    )
    assert watch.observe(_decision(False, version=2), "b", "b", 21.0) is None
    assert watch.held_back(22.0, more_time="raise the timeout") is None  # nothing met: no hold to name


def test_a_run_held_back_by_consecutive_says_how_many_decisions_it_had_and_the_fix() -> None:
    watch = VerdictRules(DecisionCondition("ready", consecutive=3, min_true_for=60))
    assert watch.observe(_decision(True), "a", "a", 0.0) is None
    assert watch.observe(_decision(True, version=2), "a", "a", 5.0) is None  # the same state: not counted
    assert watch.held_back(10.0, more_time="raise the timeout") == (
        "consecutive=3 needs 3 qualifying decisions in a row, each about a new state (had 1), and "
        "min_true_for (1 min) needs the condition to hold longer (held 10 s): a change of state "
        "(a decision about the same state does not count again), a smaller consecutive, a shorter "
        "min_true_for, or raise the timeout"
    )
    # a plain condition is never held back
    plain = VerdictRules(DecisionCondition("ready"))
    assert plain.observe(_decision(False), "a", "a", 0.0) is None
    assert plain.held_back(1.0, more_time="raise the timeout") is None
