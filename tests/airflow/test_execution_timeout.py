"""A deferred task's wait ends by its ``execution_timeout`` too.

Airflow applies ``execution_timeout`` only to the time a task runs on a worker, not while it is
deferred; a deferrable operator or sensor whose own bound (``decision_timeout``, ``timeout``) is
longer waits until the shorter of the two. Each case runs the real task with ``dag.test()``
against the emulator, whose decisions are held back far longer than the ``execution_timeout``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from tests.helpers import READY_RULES, file_sensor, rules_emulator, run_dag, task_states, task_tries, xcoms_of

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CONN = "systemzero_exec_timeout"
#: The task's execution_timeout, and how long the emulator holds each decision back.
BOUND, HELD = 3, 30


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        READY_RULES, tmp_path_factory.mktemp("rules"), "exec-key", CONN, model="sz-test"
    ) as emu:
        emu.call(lambda e: setattr(e.faults, "delay_decisions_ms", HELD * 1000))
        yield emu


def test_a_deferred_operator_waits_no_longer_than_its_execution_timeout(
    emulator: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    with DAG("exec_timeout_operator", schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN,
            deferrable=True,
            state="Job is ready.",
            questions={"ready": "Is the job ready?"},
            decision_timeout=600,
            execution_timeout=timedelta(seconds=BOUND),
        )
    started = time.monotonic()
    dag_run = run_dag(dag)
    assert time.monotonic() - started < HELD  # not the held decision, nor decision_timeout
    assert task_states(dag_run) == {"decide": "failed"}
    printed = capsys.readouterr().out
    # whose deadline it was, and what to raise
    assert (
        f"decide: the task's execution_timeout of {BOUND} s passed: no decision before the task's deadline"
        in printed
    )
    assert (
        f"raise execution_timeout (now {BOUND} s), which is shorter than decision_timeout (10 min)" in printed
    )


def test_a_deferred_sensor_waits_no_longer_than_its_execution_timeout(emulator: Any, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("Job is ready.\n")
    with DAG("exec_timeout_sensor", schedule=None, start_date=START) as dag:
        file_sensor(
            log,
            CONN,
            timeout=600,
            execution_timeout=timedelta(seconds=BOUND),
            retries=1,
            retry_delay=timedelta(seconds=0),
        )
    started = time.monotonic()
    dag_run = run_dag(dag)
    assert time.monotonic() - started < 2 * HELD
    assert task_states(dag_run) == {"wait": "failed"}
    # cut by execution_timeout, as Airflow cuts a running task (AirflowTaskTimeout): retried, where
    # the sensor's own timeout (AirflowSensorTimeout) is not
    assert task_tries(dag_run)["wait"] == 2
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert record["effect"]["timed_out"] is True  # the sensor's own timeout record, with its cause
    assert record["reason"].startswith(f"the task's execution_timeout of {BOUND} s passed: ")
    assert (
        f"raise execution_timeout (now {BOUND} s), which is shorter than timeout (10 min)" in record["reason"]
    )
