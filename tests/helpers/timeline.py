"""What the decision-history tests share: an emulator whose rules answer by the state's newest
line, and one run of a deferrable sensor that saw three states (its XComs are read by the XCom
tests and drawn by the view's)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import policy_sources as sources
from tests.helpers import rules_emulator, run_dag, task_states, xcoms_of

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CONN_ID = "systemzero_timeline"
#: The newest line of a state picks the answer: not ready, unsure, ready.
RULES: dict[str, Any] = {
    "rules": [
        {
            "question": "ready",
            "pattern": "(?i)job is ready",
            "answer": True,
            "probability": 0.96,
            "confidence": 0.92,
        },
        {
            "question": "ready",
            "pattern": "(?i)looks ready",
            "answer": True,
            "probability": 0.72,
            "confidence": 0.64,
        },
        {
            "question": "urgent",
            "pattern": "(?i)outage",
            "answer": True,
            "probability": 0.9,
            "confidence": 0.85,
        },
    ],
    "default": {"answer": False, "probability": 0.1, "confidence": 0.8},
}
#: The three states the sensor sees, a second apart (the first has text no history may hold).
STATES = [
    "tick 1: compiling, token=s3cr3t-build-token",
    "tick 2: unit tests passed, looks ready",
    "tick 3: Job is ready.",
]


@pytest.fixture(scope="package")
def gateway(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        RULES, tmp_path_factory.mktemp("rules"), "timeline-key", CONN_ID, model="sz-test"
    ) as emu:
        sources.GATEWAY = emu  # what the paced sources wait on
        try:
            yield emu
        finally:
            sources.GATEWAY = None


def decisions_of(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The decision rows of a history."""
    return [row for row in rows if row["kind"] == "decision"]


def ready_sensor(source: dict[str, Any], **kwargs: Any) -> SystemZeroDecisionSensor:
    """Task ``wait``: a sensor waiting for a confident "ready" (0.8) about ``source``'s states."""
    arguments = {"instructions": "Is the job ready?", "min_confidence": 0.8, "timeout": 60}
    return SystemZeroDecisionSensor(
        task_id="wait", systemzero_conn_id=CONN_ID, source=source, **(arguments | kwargs)
    )


@pytest.fixture(scope="package")
def sensor_run(gateway: Any) -> tuple[str, str, dict[tuple[str, str, int], Any]]:
    """A deferrable sensor that saw three states and fired on the third: (dag id, run id, XComs)."""
    paced = {
        "type": "callable",
        "path": "tests.helpers.policy_sources.paced",
        "kwargs": {"states": STATES, "interval": 1.0},
    }
    with DAG("timeline_sensor", schedule=None, start_date=START) as dag:
        ready_sensor(paced, lease=False)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"wait": "success"}
    return dag.dag_id, dag_run.run_id, xcoms_of(dag.dag_id, dag_run.run_id)
