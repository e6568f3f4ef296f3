"""The sensor under a policy and with hysteresis, through ``dag.test()`` against the emulator:
a flapping answer does not fire it, a person confirms (or rejects) an unsure answer, and the
bars below fail it."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import (
    append_once,
    append_once_logged,
    once_logged,
    run_dag,
    run_dag_while,
    task_states,
    xcoms_of,
)
from tests.helpers.policy import CONN_ID, START, Reviewer, connection_from_the_environment

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

FLAPPING = [f"tick {i}: {'ready' if i % 2 else 'down'}" for i in range(1, 13)]


def _sensor(dag_id: str, states: list[str], interval: float = 0.3, **kwargs: Any) -> DAG:
    """The sensor on a paced source of ``states``, one every ``interval`` seconds."""
    paced = {"type": "callable", "path": "tests.helpers.policy_sources.paced"}
    return _sensor_on(dag_id, paced | {"kwargs": {"states": states, "interval": interval}}, **kwargs)


def _sensor_on(dag_id: str, source: dict[str, Any], **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroDecisionSensor(
            task_id="wait",
            instructions="Is the service ready?",
            systemzero_conn_id=CONN_ID,
            source=source,
            lease=False,
            **kwargs,
        )
    return dag


def test_without_hysteresis_the_first_ready_fires(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # fires at the first "ready"; the timeout only has to outlast the trigger's start
    connection_from_the_environment(monkeypatch, emulator)
    dag = _sensor("sensor_flap_plain", FLAPPING, interval=0.25, timeout=10)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("wait", "return_value", -1)]["decision"] is True
    record = xcoms[("wait", "decision", -1)]
    assert record["decided_by"] == "model" and record["effect"] == {"fired": True}
    assert record["state_version"] == 1  # "tick 1: ready"


def test_a_flapping_answer_does_not_fire_the_sensor(emulator: Any) -> None:
    dag = _sensor(
        "sensor_flap_hysteresis",
        FLAPPING,
        interval=0.25,
        timeout=2.5,
        soft_fail=True,
        consecutive=2,
        min_true_for=1.0,
    )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "skipped"}  # timed out (soft_fail) without firing
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]  # every end of the wait has one
    assert record["decision"] is None and record["effect"] == {
        "fired": False,
        "timed_out": True,
        "soft_fail": True,
    }


def test_consecutive_fires_after_the_answer_settles(emulator: Any) -> None:
    states = [
        "tick 1: ready",
        "tick 2: down",
        "tick 3: ready",
        "tick 4: down",
        "tick 5: ready",
        "tick 6: ready",
        "tick 7: ready",
    ]
    dag = _sensor("sensor_consecutive", states, consecutive=3, timeout=20)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert record["state_version"] == 7 and record["decision"] is True
    assert record["streak"]["consecutive"] == 3 and record["streak"]["required"]["consecutive"] == 3


def test_min_true_for_waits_while_the_answer_holds(emulator: Any) -> None:
    dag = _sensor(
        "sensor_min_true_for",
        ["tick 1: down", "tick 2: ready"],
        min_true_for=timedelta(seconds=1),
        timeout=20,
    )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert record["state_version"] == 2 and record["streak"]["true_for"] >= 1.0


POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="wait")


def _file_sensor(dag_id: str, log: Path, **kwargs: Any) -> DAG:
    """The sensor on a log file the test appends to, holding its stream (each line a new version)."""
    return _sensor_on(dag_id, {"type": "file", "path": str(log)}, **kwargs)


# The review tests change the log when the run gets there, not on a clock: on Airflow 3.1 and 3.2
# under dag.test() a trigger's first connection takes seconds, and a state that changed meanwhile
# would open the stream in its newest form. Their timeouts are bounds, not targets: each trigger
# run there builds an in-process API and looks the connection up, which took over half a minute on
# a loaded 2-core machine, and the review's trigger is one more run.


def test_a_person_confirms_an_unsure_answer(emulator: Any, core_api: Any, tmp_path: Path) -> None:
    log = tmp_path / "service.log"
    log.write_text("tick 1: down\n")
    unsure_after_the_first_decision = append_once(
        emulator, "decisions_dispatched", log, "tick 2: unsure ready", timeout=150, what="the first decision"
    )
    dag = _file_sensor("sensor_review_yes", log, policy=POLICY, timeout=180)
    with Reviewer(core_api, dag.dag_id, lambda request: ["Yes"]) as reviewer:
        dag_run = run_dag_while(dag, unsure_after_the_first_decision, within=180)
    assert task_states(dag_run) == {"wait": "success"}
    (request,) = reviewer.seen
    assert request["options"] == ["Yes", "No"] and "tick 2: unsure ready" in request["body"]
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("wait", "return_value", -1)]["decided_by"] == "human"
    record = xcoms[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("review", "human", True)
    assert record["confidence"] == pytest.approx(0.6) and record["state_version"] == 2


def test_a_person_saying_no_keeps_the_sensor_waiting_and_usage_counts_the_whole_try(
    emulator: Any, core_api: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """A review answered "no", then a state that fires: one try in three waits (the first, the
    watch while the person decides, the wait after the "no"). The ``usage`` XCom, the task's log
    line and the decision timeline count them all, the same figures in each."""
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    before = emulator.stats

    # after the "no" the sensor waits again and first hears the answered state's reply again: the
    # ready line comes once the watch has declined that replay (the gateway's count of replays
    # comes earlier, and a line appended then makes the replay one about a superseded state)
    ready_once_the_answered_state_came_back = append_once_logged(
        "airflow_provider_systemzero.decisions.watch",
        "a person already said no about this state",
        log,
        "tick 2: ready",
        timeout=170,
    )
    # the person answers once the watch that goes on meanwhile heard the reviewed state again
    heard_again = once_logged(
        "airflow_provider_systemzero.decisions.watch", "a person is being asked about this state", timeout=170
    )

    def no(request: dict[str, Any]) -> list[str]:
        heard_again()
        return ["No"]

    dag = _file_sensor("sensor_review_no", log, policy=POLICY, timeout=180)
    with Reviewer(core_api, dag.dag_id, no) as reviewer:
        dag_run = run_dag_while(dag, ready_once_the_answered_state_came_back, within=180)
    assert task_states(dag_run) == {"wait": "success"}
    assert len(reviewer.seen) == 1  # the answered state is not asked about again
    assert emulator.stats.decisions_billed == before.decisions_billed + 2  # that state, then the ready one
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    record = xcoms[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("act", "model", True)
    assert record["confidence"] == pytest.approx(0.92)
    # one history for the try: the wait that asked the person; the watch while the person
    # decided, where the reviewed state came back as a replay of its reply and was not asked about
    # again; then the wait that fired, where the state answered "no" came back too and was
    # declined. The later waits' budgets know the first one's reply IDs (the try's record travels
    # with the task, with or without a task state store), so no replay is counted as billed.
    history = [row for row in xcoms[("wait", "decisions", -1)] if row["kind"] == "decision"]
    assert [(row["disposition"], row["billed"]) for row in history] == [
        ("review", True),
        ("declined", False),
        ("declined", False),
        ("fired", True),
    ]
    assert [row["at"] for row in history] == sorted(row["at"] for row in history)
    marks = [row["kind"] for row in xcoms[("wait", "decisions", -1)] if row["kind"].startswith("review_")]
    assert marks == ["review_answered"]
    # the usage of the whole try, all three waits, at the top of the XCom; each wait's own beside it
    usage = xcoms[("wait", "usage", -1)]
    assert (usage["dispatched"], usage["billed"], usage["replayed"]) == (4, 2, 2), usage
    assert [(r["dispatched"], r["billed"], r["replayed"]) for r in usage["resumes"]] == [
        (1, 1, 0),
        (1, 0, 1),
        (2, 1, 1),
    ]
    # the same figures in the task's last usage line and on the timeline
    lines = [line for line in capfd.readouterr().out.splitlines() if "System Zero usage of" in line]
    assert "try 1 (decided): 4 dispatched, 2 billed, 2 replayed unbilled" in lines[-2], lines
    assert "(in 3 parts; this one: 2 dispatched, 1 billed, 1 replayed unbilled" in lines[-2], lines
    from airflow_provider_systemzero.plugins.timeline_app import task_page

    page = task_page(dag.dag_id, dag_run.run_id, "wait", "-1").body.decode()
    assert (
        "Usage of try 1, all 3 parts (each deferral&#x27;s resume, or each poke): 2 decision(s) billed, 2 replayed unbilled, 4 dispatched."
        in page
    )


def test_below_the_bars_fails_the_sensor(emulator: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    connection_from_the_environment(monkeypatch, emulator)  # the policy fails it, not the timeout
    policy = DecisionPolicy(act_above=0.8, below="fail")
    dag = _sensor("sensor_below_fail", ["tick 1: unsure ready"], policy=policy, timeout=10)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("fail", "policy", None)


def test_poke_mode_hysteresis(emulator: Any) -> None:
    states = ["a: ready", "b: down", "c: ready", "d: ready"]
    with DAG("sensor_poke_consecutive", schedule=None, start_date=START) as dag:
        SystemZeroDecisionSensor(
            task_id="wait",
            instructions="Is the service ready?",
            systemzero_conn_id=CONN_ID,
            deferrable=False,
            mode="poke",
            poke_interval=0.1,
            timeout=20,
            consecutive=2,
            decision_mode="on_request",
            source={
                "type": "callable",
                "path": "tests.helpers.policy_sources.stepping",
                "kwargs": {"name": "poke-consecutive", "states": states},
            },
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert record["streak"]["consecutive"] == 2 and record["decision"] is True


def test_hysteresis_refuses_reschedule_mode() -> None:
    with pytest.raises(ValueError, match="reschedule"):
        SystemZeroDecisionSensor(
            task_id="wait", instructions="Ready?", deferrable=False, mode="reschedule", consecutive=2
        )


def test_poke_mode_review(emulator: Any, core_api: Any) -> None:
    with DAG("sensor_poke_review", schedule=None, start_date=START) as dag:
        SystemZeroDecisionSensor(
            task_id="wait",
            instructions="Is the service ready?",
            systemzero_conn_id=CONN_ID,
            deferrable=False,
            mode="poke",
            poke_interval=0.1,
            timeout=20,
            decision_mode="on_request",
            policy=POLICY,
            source={
                "type": "callable",
                "path": "tests.helpers.policy_sources.stepping",
                "kwargs": {"name": "poke-review", "states": ["a: down", "b: unsure ready"]},
            },
        )
    with Reviewer(core_api, dag.dag_id, lambda request: ["Yes"]) as reviewer:
        dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"} and len(reviewer.seen) == 1
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("review", "human", True)


def test_waiting_again_after_a_no_keeps_the_spending_cap(emulator: Any, core_api: Any) -> None:
    """The trigger that watches on while a person is asked carries the task's budget: with one
    decision allowed and spent on the reviewed state, the next state is not decided. On every
    release: without a task state store (3.1, 3.2) the try's record travels with the task."""
    dag = _sensor(
        "sensor_review_no_budget",
        ["tick 1: unsure ready", "tick 2: ready"],
        interval=1.5,
        policy=POLICY,
        timeout=30,
        max_decisions=1,
    )
    with Reviewer(core_api, dag.dag_id, lambda request: ["No"]) as reviewer:
        dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"}
    assert len(reviewer.seen) <= 1  # the newer state came while the person was asked
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("wait", "decision", -1)]["status"] == "pending_review"  # a person was asked
    usage = xcoms[("wait", "usage", -1)]
    # the second deferral was refused before it dispatched anything: one decision billed in all
    assert usage["refused_by"] == "max_decisions" and usage["total"]["billed"] == 1, usage
