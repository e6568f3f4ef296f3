"""The decision history (:class:`DecisionTimeline`) and what a :class:`VerdictRules` records in it:
the rows, their plain JSON form, the 200 bound across a long run, no state content unless content
capture is on, and — as a hypothesis state machine — that each event tells exactly the story of the
decisions since the one before, ending with the decision that fired."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from airflow_provider_systemzero.decisions.conditions import DecisionCondition
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.decisions.timeline import (
    ENDING_DISPOSITIONS,
    HISTORY_LIMIT,
    PREVIEW_CHARS,
    DecisionTimeline,
    iso_time,
    merge_histories,
    settle_billed,
)
from airflow_provider_systemzero.decisions.watch import VerdictRules, WatchEvent, answers_payload
from airflow_provider_systemzero.protocol.reply import Answer, DecisionResult
from tests.helpers import decision_result

#: 2026-09-21T14:13:20Z
T0 = 1_790_000_000.0
#: Text no history may hold unless content capture is on.
SECRET_STATE = "build log: password=hunter2, customer list follows"


def _decision(
    decision: object = True,
    *,
    probability: float | None = 0.9,
    confidence: float | None = 0.9,
    version: int = 1,
    reply: str | None = None,
) -> DecisionResult:
    return decision_result(version, reply=reply, ready=(decision, probability, confidence))


class Clock:
    """The wall clock a watch writes into its history (advanced by hand)."""

    def __init__(self, at: float = T0) -> None:
        self.at = at

    def __call__(self) -> float:
        return self.at


def _decisions(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [row for row in rows if row["kind"] == "decision"]


# ------------------------------------------------------------------------------------ the rows


def test_a_decision_row_holds_what_the_watch_saw_and_reads_back() -> None:
    timeline = DecisionTimeline()
    timeline.watching(DecisionCondition("ready", min_confidence=0.8).to_dict())
    timeline.decision(
        _decision(True, probability=0.72, confidence=0.64, version=3),
        question="ready",
        at=T0 + 0.1234,
        disposition="waiting",
        state_key="ab" * 32,
        state_bytes=120,
        billed=True,
    )
    timeline.mark("reconnect", T0 + 1, close_code=1012, replay=True)
    rows = timeline.to_list()
    assert rows == [
        {
            "kind": "condition",
            "question": "ready",
            "expect": True,
            "min_confidence": 0.8,
            "min_probability": None,
        },
        {
            "kind": "decision",
            "at": "2026-09-21T14:13:20.123Z",
            "question": "ready",
            "answer": True,
            "probability": 0.72,
            "confidence": 0.64,
            "state_version": 3,
            "state_bytes": 120,
            "state_hash": "ab" * 32,
            "reply_id": f"szd_{3:032x}",
            "billed": True,
            "current": True,
            "disposition": "waiting",
        },
        {"kind": "reconnect", "at": "2026-09-21T14:13:21.000Z", "close_code": 1012, "replay": True},
    ]
    assert json.loads(json.dumps(rows)) == rows  # plain JSON
    assert DecisionTimeline.from_list(rows).to_list() == rows


def test_times_are_utc_iso_8601_whatever_the_local_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    monkeypatch.setenv("TZ", "America/Los_Angeles")
    time.tzset()
    try:
        assert iso_time(T0) == "2026-09-21T14:13:20.000Z"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()


def test_rows_come_in_time_order_and_a_marker_of_an_unknown_kind_reads_back() -> None:
    timeline = DecisionTimeline()
    timeline.mark("state_change", T0 + 2, state_version=2)
    timeline.decision(_decision(version=1), question="ready", at=T0 + 1, disposition="waiting")
    timeline.decision(_decision(version=2), question="ready", at=T0 + 3, disposition="waiting")
    rows = timeline.to_list()
    assert [row["kind"] for row in rows] == ["decision", "state_change", "decision"]
    newer = [*rows, {"kind": "lease_moved", "at": "2026-09-21T14:13:30Z", "to": "triggerer-2"}]
    assert DecisionTimeline.from_list(newer).to_list()[-1] == {
        "kind": "lease_moved",
        "at": "2026-09-21T14:13:30.000Z",
        "to": "triggerer-2",
    }


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"kind": "decision", "at": "yesterday"}], r"decisions\[0\]\.at must be an ISO 8601 time"),
        ([{"kind": "decision", "at": "2026-09-21T14:13:20Z", "disposition": "maybe"}], r"'maybe' is not a"),
        (
            [{"kind": "decision", "at": "2026-09-21T14:13:20Z", "disposition": "waiting"}, 7],
            r"decisions\[1\]",
        ),
    ],
)
def test_a_row_that_is_not_a_history_row_is_named(rows: list[Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DecisionTimeline.from_list(rows)


def test_a_mistaken_kind_or_disposition_is_refused_when_recorded() -> None:
    timeline = DecisionTimeline()
    with pytest.raises(ValueError, match="a marker's kind must be one of"):
        timeline.mark("reconect", T0)
    with pytest.raises(ValueError, match="disposition must be one of"):
        timeline.decision(_decision(), question="ready", at=T0, disposition="done")
    assert timeline.to_list() == []


# ------------------------------------------------------------------------------------ the watch


def test_the_watch_records_what_it_did_with_each_decision() -> None:
    clock = Clock()
    watch = VerdictRules(
        DecisionCondition("ready", min_confidence=0.8, consecutive=2), reviews=False, clock=clock
    )
    steps = [
        (_decision(False, version=1), "s1", None),  # not the expected answer
        (_decision(True, confidence=0.5, version=2), "s2", None),  # under the bar
        (_decision(True, version=3), "s3", None),  # qualifies: 1 of 2
        (_decision(True, version=4), "s4", "success"),  # 2 of 2: fires
        (_decision(True, version=5), "s5", None),  # this run fired already
    ]
    events = []
    for decision, key, status in steps:
        clock.at += 10
        verdict = watch.observe(decision, key, f"state {key}", clock.at - T0)
        assert (verdict.status if verdict else None) == status
        if verdict is not None:
            events.append(watch.event(verdict))
    fired = _decisions(events[0].decisions or [])
    assert [(row["state_version"], row["disposition"]) for row in fired] == [
        (1, "waiting"),
        (2, "waiting"),
        (3, "hysteresis"),
        (4, "fired"),
    ]
    assert events[0].decisions[0]["kind"] == "condition"  # type: ignore[index]
    assert fired[0]["answer"] is False and fired[1]["confidence"] == 0.5
    assert fired[3]["state_hash"] == "s4" and fired[3]["state_bytes"] == len('"state s4"')
    assert [row["at"] for row in fired] == [iso_time(T0 + 10 * n) for n in range(1, 5)]
    # the event started the next story: the decision after it, held
    assert [(row["state_version"], row["disposition"]) for row in _decisions(watch.timeline.to_list())] == [
        (5, "held")
    ]


def test_a_hold_rule_met_by_time_alone_marks_the_moment_and_fires_its_decision() -> None:
    clock = Clock()
    watch = VerdictRules(DecisionCondition("ready", min_true_for=30), clock=clock)
    assert watch.observe(_decision(True, version=1), "a", "a", 0.0) is None
    clock.at += 30
    verdict = watch.due(30.0)
    assert verdict is not None
    rows = watch.sensor_event(verdict, key_namespace="ns", deadline=None).decisions or []
    assert [(row["kind"], row.get("disposition")) for row in rows[1:]] == [
        ("decision", "fired"),
        ("hold_met", None),
    ]
    assert rows[2] == {"kind": "hold_met", "at": iso_time(T0 + 30), "state_version": 1}


def test_reviews_policies_skipped_states_and_static_states_each_have_their_disposition() -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below="fail").to_dict()

    def disposition(watch: VerdictRules, decision: DecisionResult, key: str = "a") -> str:
        verdict = watch.observe(decision, key, key, 0.0)
        rows = watch.event(verdict).decisions if verdict is not None else watch.timeline.to_list()
        return _decisions(rows or [])[-1]["disposition"]

    assert disposition(
        VerdictRules(DecisionCondition("ready", policy=policy)), _decision(confidence=0.6)
    ) == ("review")
    assert disposition(
        VerdictRules(DecisionCondition("ready", policy=policy)), _decision(confidence=0.2)
    ) == ("failed")
    skipping = DecisionCondition("ready", policy={**policy, "below": "skip"})
    assert disposition(VerdictRules(skipping), _decision(confidence=0.2)) == "skipped"
    assert disposition(VerdictRules(DecisionCondition("ready"), skip_states=["a"]), _decision()) == "declined"
    assert (
        disposition(VerdictRules(DecisionCondition("ready"), end_when_unmet=True), _decision(False))
        == "unmet"
    )


def test_the_event_carries_the_history_through_its_payload() -> None:
    watch = VerdictRules(DecisionCondition("ready"), clock=Clock())
    verdict = watch.observe(_decision(version=7), "hash-a", "a", 0.0)
    assert verdict is not None
    payload = watch.sensor_event(verdict, key_namespace="ns", deadline=None).to_payload()
    again = WatchEvent.from_payload(json.loads(json.dumps(payload)))
    assert again.decisions == payload["decisions"]
    assert _decisions(again.decisions or [])[0]["state_version"] == 7
    assert WatchEvent.from_payload({"status": "timeout"}).decisions is None


def test_an_operators_decision_is_one_row_per_question() -> None:
    decision = DecisionResult(
        reply={"id": "szd_" + "2" * 32},
        state_version=2,
        covered_event_ids=(),
        request_id="r",
        stream_id="s",
        answers={
            "ready": Answer(name="ready", type="boolean", decision=True, probability=0.9, confidence=0.9),
            "tier": Answer(name="tier", type="choice", decision="gold", probability=0.6, confidence=0.7),
        },
    )
    rows = answers_payload(decision, {"k": SECRET_STATE}, key_namespace="ns", at=T0)["decisions"]
    assert [(row["question"], row["answer"], row["disposition"]) for row in rows] == [
        ("ready", True, "decided"),
        ("tier", "gold", "decided"),
    ]
    assert rows[0]["state_bytes"] == len(json.dumps({"k": SECRET_STATE}, separators=(",", ":")))
    assert "hunter2" not in json.dumps(rows)


# ------------------------------------------------------------------------------------ bounds and content


def test_the_history_stays_bounded_across_a_long_run() -> None:
    """A wait of 5,000 decisions (a flapping answer and a hold rule: every disposition but the ending
    ones) and 5,000 markers: the history holds the newest 200 of each, and its JSON stays small."""
    clock = Clock()
    watch = VerdictRules(DecisionCondition("ready", min_confidence=0.8, consecutive=3), clock=clock)
    sizes = []
    for version in range(1, 5001):
        clock.at += 1
        met = version % 3 != 0  # two met, one not: the run of three never completes
        assert (
            watch.observe(_decision(met, version=version), f"s{version}", "x" * 5000, float(version)) is None
        )
        watch.timeline.mark("state_change", clock.at + 0.5, state_version=version)
        if version % 500 == 0:
            sizes.append(len(json.dumps(watch.timeline.to_list())))
    rows = watch.timeline.to_list()
    decisions = _decisions(rows)
    assert len(watch.timeline) == len(decisions) == HISTORY_LIMIT
    assert [row["state_version"] for row in decisions] == list(range(4801, 5001))
    markers = [row for row in rows if row["kind"] == "state_change"]
    assert len(markers) == HISTORY_LIMIT and markers[-1]["state_version"] == 5000
    assert {row["disposition"] for row in decisions} == {"waiting", "hysteresis"}
    assert max(sizes) < 100_000 and max(sizes) - min(sizes) < 2_000  # flat from the 500th decision on
    assert "xxxxx" not in json.dumps(rows)


def test_with_content_capture_off_no_state_text_is_held_and_on_only_the_newest_end() -> None:
    state = f"{SECRET_STATE}\n" + "line\n" * 200 + "Job is ready.\n"
    for capture in (False, True):
        watch = VerdictRules(DecisionCondition("ready"), timeline=DecisionTimeline(capture_content=capture))
        verdict = watch.observe(_decision(), "h", state, 0.0)
        assert verdict is not None
        text = json.dumps(watch.sensor_event(verdict, key_namespace="ns", deadline=None).decisions)
        assert "hunter2" not in text and "customer" not in text
        row = _decisions(json.loads(text))[0]
        if capture:
            assert row["state"].endswith("Job is ready.\n") and len(row["state"]) == PREVIEW_CHARS
        else:
            assert "state" not in row and "Job is ready" not in text and "line" not in text


# ------------------------------------------------------------------------------------ merging


def test_two_histories_merge_each_row_once_in_time_order_and_bounded() -> None:
    first, second = DecisionTimeline(), DecisionTimeline()
    for version in range(1, 4):
        first.decision(_decision(version=version), question="ready", at=T0 + version, disposition="waiting")
    second.decision(_decision(version=4), question="ready", at=T0 + 4, disposition="fired")
    merged = merge_histories(first.to_list(), second.to_list())
    assert [row["state_version"] for row in merged] == [1, 2, 3, 4]
    assert merge_histories(merged, second.to_list()) == merged  # the same event delivered twice
    bounded = merge_histories(merged, [], limit=2)
    assert [row["state_version"] for row in bounded] == [3, 4]


def test_billed_is_told_by_whoever_counted_the_bill() -> None:
    timeline = DecisionTimeline()
    for version in (1, 2, 3):
        timeline.decision(
            _decision(version=version), question="ready", at=T0 + version, disposition="waiting"
        )
    rows = timeline.to_list()
    assert [row["billed"] for row in rows] == [None, None, None]
    # a trigger's run counted every decision: the ones it did not bill were replays
    counted = settle_billed(rows, counted=[f"szd_{1:032x}", f"szd_{3:032x}"])
    assert [row["billed"] for row in counted] == [True, False, True]
    # a worker's own count of the replies it decided
    told = settle_billed(rows, {f"szd_{2:032x}": False})
    assert [row["billed"] for row in told] == [None, False, None]


# ------------------------------------------------------------------------------------ the state machine

LIMIT = 6


class HistoryOfAWatch(RuleBasedStateMachine):
    """An asset watch (it goes on after each event) with a hold rule, fed met and unmet decisions
    about new or repeated states while time passes: each event tells the decisions since the one
    before (the newest ``LIMIT``), in order, and exactly the decision that fired ends it."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.now = 0.0
        self.watch = VerdictRules(
            DecisionCondition("ready", min_confidence=0.5, consecutive=2, min_true_for=3),
            reviews=False,
            timeline=DecisionTimeline(limit=LIMIT),
            clock=self.clock,
        )
        self.version = 0
        self.key = "s0"
        #: (version, disposition expected while no event came) of each decision since the last event
        self.since: list[tuple[int, str]] = []

    def _advance(self, seconds: float) -> None:
        self.now += seconds
        self.clock.at += seconds

    def _ended(self, verdict: Any, by_time: bool) -> None:
        rows = self.watch.event(verdict).decisions or []
        decisions = _decisions(rows)
        expected = self.since[-LIMIT:]
        assert [row["state_version"] for row in decisions] == [version for version, _ in expected]
        ending = [row for row in decisions if row["disposition"] in ENDING_DISPOSITIONS]
        assert [row["state_version"] for row in ending] == [verdict.decision.state_version]
        assert ending[0]["disposition"] == "fired"
        marks = [row for row in rows if row["kind"] == "hold_met"]
        assert len(marks) == (1 if by_time else 0)
        self.since = []

    @rule(met=st.booleans(), new_state=st.booleans(), seconds=st.sampled_from([0.0, 0.5, 1.0, 2.5]))
    def decide(self, met: bool, new_state: bool, seconds: float) -> None:
        self._advance(seconds)
        self.version += 1
        if new_state:
            self.key = f"s{self.version}"
        was_fired = self.watch.fired
        verdict = self.watch.observe(_decision(met, version=self.version), self.key, self.key, self.now)
        self.since.append((self.version, ("held" if was_fired else "hysteresis") if met else "waiting"))
        if verdict is not None:
            self._ended(verdict, by_time=False)

    @rule(seconds=st.sampled_from([0.5, 1.0, 3.0]))
    def time_passes(self, seconds: float) -> None:
        self._advance(seconds)
        verdict = self.watch.due(self.now)
        if verdict is not None:
            self._ended(verdict, by_time=True)

    @invariant()
    def the_history_is_bounded_ordered_and_says_what_the_watch_did(self) -> None:
        rows = self.watch.timeline.to_list()
        decisions = _decisions(rows)
        assert len(decisions) == len(self.watch.timeline) <= LIMIT
        assert [row["at"] for row in rows[1:]] == sorted(row["at"] for row in rows[1:])
        assert [(row["state_version"], row["disposition"]) for row in decisions] == self.since[-LIMIT:]


TestHistoryOfAWatch = HistoryOfAWatch.TestCase
TestHistoryOfAWatch.settings = settings(
    max_examples=80, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
