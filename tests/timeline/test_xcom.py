"""The ``decisions`` XCom through real Airflow paths (``dag.test()`` against the emulator): a
deferrable sensor that saw three states, a poking one, the decide operator (deferred and on the
worker, with content capture on and off), and an asset watcher's events."""

from __future__ import annotations

import json
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.decisions.timeline import HISTORY_LIMIT
from airflow_provider_systemzero.identity import state_hash
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.tasks import observability
from airflow_provider_systemzero.triggers.decision import SystemZeroDecisionEventTrigger
from tests import helpers
from tests.helpers import run_dag, task_states, xcoms_of
from tests.helpers.timeline import CONN_ID, START, STATES, ready_sensor
from tests.helpers.timeline import decisions_of as _decisions

#: The fixtures of the asset watcher's trigger test (its own emulator on the test's loop).
rules_file = helpers.rules_file
emulator = helpers.emulator


def test_a_sensor_pushes_every_decision_of_its_wait_beside_decision_and_usage(sensor_run: Any) -> None:
    _, _, xcoms = sensor_run
    rows = xcoms[("wait", "decisions", -1)]
    assert rows[0] == {
        "kind": "condition",
        "question": "ready",
        "expect": True,
        "min_confidence": 0.8,
        "min_probability": None,
    }
    decisions = _decisions(rows)
    assert [(row["state_version"], row["answer"], row["disposition"]) for row in decisions] == [
        (1, False, "waiting"),
        (2, True, "waiting"),  # 0.64 is under the bar
        (3, True, "fired"),
    ]
    assert [(row["probability"], row["confidence"]) for row in decisions] == [
        (0.1, 0.8),
        (0.72, 0.64),
        (0.96, 0.92),
    ]
    # the state each was about, numbered in the wait, and why, in the words of the task's log
    assert [row["generation"] for row in decisions] == [1, 2, 3]
    assert [row["reason"] for row in decisions] == [
        "ready = False, waiting for True",
        "ready = True but confidence 0.64 is below 0.8",
        "ready = True (probability 0.96, confidence 0.92)",
    ]
    assert [row["state_hash"] for row in decisions] == [state_hash(state) for state in STATES]
    assert [row["state_bytes"] for row in decisions] == [len(json.dumps(state)) for state in STATES]
    assert all(
        row["billed"] is True and row["current"] is True for row in decisions
    )  # told by the trigger's budget
    times = [pendulum.parse(row["at"]) for row in decisions]
    assert times == sorted(times) and all(
        t.tzinfo is not None and t.utcoffset().total_seconds() == 0 for t in times
    )
    record = xcoms[("wait", "decision", -1)]
    assert (record["reply_id"], record["state_version"]) == (decisions[-1]["reply_id"], 3)
    assert xcoms[("wait", "usage", -1)]["billed"] == 3


def test_with_content_capture_off_the_history_holds_no_state_text(sensor_run: Any) -> None:
    _, _, xcoms = sensor_run
    text = json.dumps(xcoms[("wait", "decisions", -1)])
    assert "s3cr3t" not in text and "compiling" not in text and "looks ready" not in text
    assert all("state" not in row for row in _decisions(xcoms[("wait", "decisions", -1)]))


def test_a_poking_sensor_pushes_its_history_with_the_bill_its_own_budget_counted(gateway: Any) -> None:
    from tests.helpers import policy_sources as sources

    sources.READS["timeline-poke"] = 0
    stepping = {
        "type": "callable",
        "path": "tests.helpers.policy_sources.stepping",
        "kwargs": {"name": "timeline-poke", "states": STATES},
    }
    with DAG("timeline_poke", schedule=None, start_date=START) as dag:
        ready_sensor(stepping, deferrable=False, mode="poke", poke_interval=0.1)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    decisions = _decisions(xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decisions", -1)])
    assert [row["disposition"] for row in decisions] == ["waiting", "waiting", "fired"]
    assert [row["billed"] for row in decisions] == [True, True, True]


@pytest.mark.parametrize("deferrable", [True, False])
def test_the_decide_operator_pushes_its_decision_as_one_row_per_question(
    gateway: Any, deferrable: bool
) -> None:
    dag_id = f"timeline_operator_{'deferred' if deferrable else 'worker'}"
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            questions={"ready": "Is the job ready?", "urgent": "Is it urgent?"},
            state="Job is ready. outage in eu-west",
            systemzero_conn_id=CONN_ID,
            deferrable=deferrable,
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"decide": "success"}
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    rows = xcoms[("decide", "decisions", -1)]
    assert [(row["question"], row["answer"], row["disposition"], row["billed"]) for row in rows] == [
        ("ready", True, "decided", True),
        ("urgent", True, "decided", True),
    ]
    assert rows[0]["reply_id"] == xcoms[("decide", "decision_id", -1)]
    assert "outage" not in json.dumps(rows)


def test_with_content_capture_on_an_operators_history_holds_the_newest_end_of_its_state(gateway: Any) -> None:
    with DAG("timeline_operator_capture", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            questions={"ready": "Is the job ready?"},
            state="line\n" * 100 + "Job is ready.",
            systemzero_conn_id=CONN_ID,
            deferrable=False,
        )
    observability.configure(capture_content=True)
    try:
        dag_run = run_dag(dag)
    finally:
        observability.configure(capture_content=None)
    (row,) = xcoms_of(dag.dag_id, dag_run.run_id)[("decide", "decisions", -1)]
    assert row["state"].endswith("line\nJob is ready.") and len(row["state"]) <= 160


async def test_each_asset_event_tells_the_decisions_since_the_one_before(emulator: Any) -> None:
    from tests.helpers import flag_sources as sources_for_tests

    sources_for_tests.STATES["timeline-watch"] = "waiting\n"
    trigger = SystemZeroDecisionEventTrigger(
        systemzero_conn_id=helpers.TRIGGER_CONN_ID,
        request=helpers.TRIGGER_REQUEST,
        condition=helpers.TRIGGER_CONDITION,
        state="",
        watch_id="timeline",
        source={
            "type": "callable",
            "path": "tests.helpers.flag_sources.flag_state",
            "kwargs": {"name": "timeline-watch"},
            "poll_interval": 0.02,
        },
        lease=False,
    )
    async with helpers.watching_events(trigger) as (events, _):
        await emulator.wait_for(lambda emu: emu.stats.decisions_delivered >= 1, timeout=20)
        for round_ in (1, 2):
            sources_for_tests.STATES["timeline-watch"] = f"waiting {round_}\nJob is ready.\n"
            await helpers.until(lambda r=round_: len(events) >= r, within=20, what=f"asset event {round_}")
            delivered = emulator.stats.decisions_delivered
            sources_for_tests.STATES["timeline-watch"] = f"waiting again {round_}\n"
            await emulator.wait_for(lambda emu, d=delivered: emu.stats.decisions_delivered > d, timeout=20)
    first, second = (_decisions(event.payload["decisions"]) for event in events[:2])
    assert [row["disposition"] for row in first][-1] == "fired" and "waiting" in [
        r["disposition"] for r in first
    ]
    assert [row["disposition"] for row in second][-1] == "fired"
    assert min(row["at"] for row in second) > first[-1]["at"]  # the story since the first event
    assert all(row["billed"] is None for row in first + second)  # an asset watch has no budget to tell it
    assert len(first) <= HISTORY_LIMIT
