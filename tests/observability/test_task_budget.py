"""Budgets and the ``usage`` XCom of the sensor and the operator, end to end with ``dag.test()``
against the emulator (connection in the metadata DB, state total in the task state store)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pendulum
import pytest

from airflow_provider_systemzero.compat import AIRFLOW_TASK_STATE_STORE, airflow_version
from airflow_provider_systemzero.protocol.limits import Limits
from tests.helpers import (
    REPO,
    EmulatorThread,
    needs_task_state_store,
    run_dag,
    systemzero_connection,
    task_states,
    task_tries,
    xcoms_of,
)

pytestmark = pytest.mark.airflow

RULES = REPO / "example_dags" / "emulator_rules.json"
CONN_ID = "systemzero_budget"
LINES = [f"Step {n} done.\n" for n in range(1, 9)]  # never "job is ready": the sensor keeps waiting


@pytest.fixture(scope="module")
def emulator(airflow_db: None) -> Iterator[Any]:
    limits = Limits(account_decision_burst=1000, account_decision_ceiling_per_minute=100_000)
    with (
        EmulatorThread(api_keys={"budget-key": 8}, decider=f"rules:{RULES}", limits=limits) as emu,
        systemzero_connection(CONN_ID, emu.origin, "budget-key", model="sz-demo"),
    ):
        yield emu


def billed(emu: Any, since: int = 0) -> list[Any]:
    return [e for e in emu.ledger.get("budget-key", [])[since:] if e.billed]


def ledger_tokens(entries: list[Any]) -> dict[str, int]:
    return {
        name: sum((e.usage or {}).get(name, 0) for e in entries)
        for name in ("input_tokens", "cached_input_tokens", "media_tokens")
    }


def sensor(task_id: str, **kwargs: Any) -> Any:
    from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

    source = {
        "type": "callable",
        "path": "tests.helpers.observed_sources.ticking",
        "kwargs": {
            "name": kwargs.pop("name", task_id),
            "lines": LINES,
            "gap": 0.25,
            "fail_first_try_after": kwargs.pop("fail_first_try_after", None),
        },
        "retries": 0,
    }  # a lost source fails the try at once: the task's retry is what is tested
    return SystemZeroDecisionSensor(
        task_id=task_id,
        question="ready",
        instructions="Is the job ready?",
        source=source,
        decision_mode="on_change",
        systemzero_conn_id=CONN_ID,
        timeout=60,
        lease=False,
        **kwargs,
    )


def test_budget_of_two_stops_the_third_before_dispatch(
    emulator: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    start = len(emulator.ledger.get("budget-key", []))
    with DAG(
        "systemzero_budget_two", schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC")
    ) as dag:
        sensor("wait", max_decisions=2)
        SystemZeroDecideOperator(
            task_id="decide",
            questions={"ready": "Is the job ready?"},
            state="Job is ready.\n",
            systemzero_conn_id=CONN_ID,
            max_decisions=1,
        )
    dag_run = run_dag(dag)
    states = task_states(dag_run)
    assert states == {"wait": "failed", "decide": "success"}, states
    output = capfd.readouterr().out
    scope = "all tries" if airflow_version()[:2] >= AIRFLOW_TASK_STATE_STORE else "this try only"
    assert (
        f"System Zero budget max_decisions=2 for task 'systemzero_budget_two.wait' ({scope}) would be "
        "exceeded: 2 decisions spent so far" in output
    )
    assert "Raise max_decisions / max_input_tokens on task 'systemzero_budget_two.wait'" in output

    xcoms = xcoms_of("systemzero_budget_two", dag_run.run_id)
    usage = xcoms[("wait", "usage", -1)]
    decide_usage = xcoms[("decide", "usage", -1)]
    entries = billed(emulator, start)
    assert len(entries) == 3  # two for the sensor, one for the operator: the third change was never sent
    assert (usage["billed"], usage["replayed"], usage["refused"], usage["refused_by"]) == (
        2,
        0,
        1,
        "max_decisions",
    )
    assert (decide_usage["billed"], decide_usage["dispatched"], decide_usage["refused_by"]) == (1, 1, None)
    # the XCom sums equal what the emulator billed, reply by reply
    by_reply = {e.reply_id: e for e in entries}
    reply_id = xcoms[("decide", "decision_id", -1)]
    sensor_entries = [e for e in entries if e.reply_id != reply_id]
    assert {k: usage[k] for k in ("input_tokens", "cached_input_tokens", "media_tokens")} == ledger_tokens(
        sensor_entries
    )
    assert decide_usage["input_tokens"] == by_reply[reply_id].usage["input_tokens"] > 0


@needs_task_state_store
def test_budget_holds_across_a_retry(emulator: Any) -> None:
    from airflow.sdk import DAG

    start = len(emulator.ledger.get("budget-key", []))
    with DAG(
        "systemzero_budget_retry", schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC")
    ) as dag:
        sensor(
            "wait",
            name="retry-source",
            max_decisions=3,
            fail_first_try_after=2,
            retries=1,
            retry_delay=timedelta(0),
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "failed"} and task_tries(dag_run) == {"wait": 2}
    entries = emulator.ledger.get("budget-key", [])[start:]
    # try 1 paid for two states; try 2 replayed them unbilled, paid for one more, then was refused
    assert [e.billed for e in entries] == [True, True, False, False, True]
    usage = xcoms_of("systemzero_budget_retry", dag_run.run_id)[("wait", "usage", -1)]
    assert usage["try_number"] == 2 and usage["refused_by"] == "max_decisions"
    assert (usage["billed"], usage["replayed"]) == (1, 2)
    assert usage["total"]["billed"] == 3 and usage["total"]["refused"] == 1
    assert usage["total"]["input_tokens"] == ledger_tokens([e for e in entries if e.billed])["input_tokens"]


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_connection_window_refusal_is_retried(emulator: Any, deferrable: bool) -> None:
    from airflow.sdk import DAG

    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    conn_id = f"systemzero_hourly_{deferrable}"  # the window is per connection, in this process
    with (
        systemzero_connection(
            conn_id, emulator.origin, "budget-key", model="sz-demo", budget_decisions_per_hour=1
        ),
        DAG(
            f"systemzero_hourly_{deferrable}",
            schedule=None,
            start_date=pendulum.datetime(2025, 1, 1, tz="UTC"),
        ) as dag,
    ):
        decide = {"systemzero_conn_id": conn_id, "questions": {"ready": "Is the job ready?"}}
        first = SystemZeroDecideOperator(
            task_id="first", state="Step 1 done.", deferrable=deferrable, **decide
        )
        second = SystemZeroDecideOperator(
            task_id="second",
            state="Step 2 done.",
            deferrable=deferrable,
            retries=1,
            retry_delay=timedelta(0),
            **decide,
        )
        first >> second
        dag_run = run_dag(dag)
    assert task_states(dag_run) == {"first": "success", "second": "failed"}
    # the hour's window frees room as it moves: Airflow retried (and the window refused again)
    assert task_tries(dag_run) == {"first": 1, "second": 2}
    usage = xcoms_of(f"systemzero_hourly_{deferrable}", dag_run.run_id)[("second", "usage", -1)]
    assert usage["refused_by"] == "budget_decisions_per_hour"


@pytest.mark.parametrize("deferrable", [False, True])
def test_a_token_cap_the_state_cannot_fit_is_refused_before_connecting(
    emulator: Any, deferrable: bool, capsys: pytest.CaptureFixture[str]
) -> None:
    from airflow.sdk import DAG

    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    before = emulator.stats
    dag_id = f"systemzero_token_cap_{deferrable}"
    with DAG(dag_id, schedule=None, start_date=pendulum.datetime(2025, 1, 1, tz="UTC")) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN_ID,
            questions={"ready": "Is the job ready?"},
            state="Step 1 done.",
            max_input_tokens=10,  # the decide body alone is estimated at more
            deferrable=deferrable,
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"decide": "failed"}
    assert "max_input_tokens=10" in capsys.readouterr().out
    # known on the worker: no trigger, no stream, nothing billed
    assert emulator.stats.streams_total == before.streams_total
    usage = xcoms_of(dag_id, dag_run.run_id)[("decide", "usage", -1)]
    assert usage["refused_by"] == "max_input_tokens" and usage["total"]["billed"] == 0
