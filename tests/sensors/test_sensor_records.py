"""The sensor's ``decision`` record on every end of the wait, through ``dag.test()``: a wait that
times out says so (nothing was decided)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import READY_RULES, rules_emulator, run_dag, task_states, xcoms_of

RULES = READY_RULES
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(RULES, tmp_path_factory.mktemp("rules"), "records-key", "systemzero_records") as emu:
        yield emu


@pytest.mark.parametrize("soft_fail", [False, True])
def test_a_sensor_that_times_out_pushes_its_decision_record(
    emulator: Any, tmp_path: Path, soft_fail: bool
) -> None:
    log = tmp_path / "job.log"
    log.write_text("started\nstill building\n")  # never ready
    with DAG(f"sensor_timeout_record_{soft_fail}", schedule=None, start_date=START) as dag:
        SystemZeroDecisionSensor(
            task_id="wait",
            systemzero_conn_id="systemzero_records",
            model="sz-test",
            question="ready",
            instructions="Is the job ready?",
            source={"type": "file", "path": str(log), "poll_interval": 0.05},
            timeout=2,
            soft_fail=soft_fail,
            lease_after=0.2,
        )
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "skipped" if soft_fail else "failed"}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert (record["status"], record["decision"], record["decided_by"], record["action"]) == (
        "final",
        None,
        None,
        "wait",
    ), record
    assert record["effect"] == {"fired": False, "timed_out": True, "soft_fail": soft_fail}
    assert "deadline" in record["reason"], record
