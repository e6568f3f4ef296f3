"""A sensor whose hold rule (``consecutive``, ``min_true_for``) keeps a met condition from ending
the wait: the timeout (and the soft-fail skip) says the hold rule blocked it, not that no decision
met the condition; and a ``min_true_for`` the timeout can never allow is refused at parse time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import append_once, ready_log, run_dag, run_dag_while, task_states
from tests.helpers.mistakes import CONN, START


def _sensor(**kwargs: Any) -> SystemZeroDecisionSensor:
    base: dict[str, Any] = {
        "task_id": "wait",
        "systemzero_conn_id": CONN,
        "question": "ready",
        "instructions": "Is the job ready?",
        "lease_after": 0.2,
    }
    return SystemZeroDecisionSensor(**{**base, **kwargs})


def test_a_deferred_sensor_held_back_by_min_true_for_names_it_at_the_deadline(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "job.log"
    log.write_text("Job is starting.\n")
    # the run of met decisions then begins at least 1 s after the deadline was set: min_true_for,
    # shorter than the timeout (accepted), cannot be met before the deadline, and is at least 0.9 s
    # short of it then, however soon the first decision came
    ready_a_second_after_the_first_decision = append_once(
        emulator,
        "decisions_dispatched",
        log,
        "Job is ready.",
        timeout=60,
        what="the first decision",
        pause=1.0,
    )

    with DAG("mistake_hold_min_true_for", schedule=None, start_date=START) as dag:
        _sensor(source={"type": "file", "path": str(log)}, min_true_for=7.9, timeout=8, deferrable=True)
    dag_run = run_dag_while(dag, ready_a_second_after_the_first_decision)
    assert task_states(dag_run) == {"wait": "failed"}
    printed = capsys.readouterr().out
    assert "no decision met the condition" not in printed
    assert (
        "wait: the task's timeout of 8 s passed: a decision met the condition, but a hold rule kept it "
        "from ending the wait before the deadline; the last decision (state version 1): ready = True"
    ) in printed
    assert "; min_true_for (7.9 s) needs the condition to hold longer (held " in printed
    assert "shorten min_true_for, or raise the sensor's timeout" in printed


def test_a_soft_failing_poking_sensor_held_back_by_consecutive_names_it_in_the_skip(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = ready_log(tmp_path)  # never changes: one decision, however many pokes
    with DAG("mistake_hold_consecutive", schedule=None, start_date=START) as dag:
        _sensor(
            source={"type": "file", "path": str(log)},
            consecutive=2,
            timeout=1.5,
            poke_interval=0.2,
            mode="poke",
            deferrable=False,
            soft_fail=True,
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "skipped"}
    printed = capsys.readouterr().out
    assert "; the last decision (state version 1): ready = True" in printed
    assert (
        "; consecutive=2 needs 2 qualifying decisions in a row, each about a new state (had 1): a "
        "change of state (a decision about the same state does not count again), a smaller "
        "consecutive, or raise the sensor's timeout"
    ) in printed
