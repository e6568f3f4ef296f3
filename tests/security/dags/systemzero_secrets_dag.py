"""The Dag the secrets test runs with ``dag.test()``: the deferrable sensor, then the operator.

It lives in its own bundle (see ``tests/security/test_secrets.py``), away from the examples.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor

with DAG(
    "systemzero_secrets",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["test"],
) as dag:
    wait = SystemZeroDecisionSensor(
        task_id="wait",
        instructions="Is the job ready?",
        state="build started\nREADY\n",
        systemzero_conn_id="systemzero_secrets",
        deferrable=True,
        timeout=60,
    )
    decide = SystemZeroDecideOperator(
        task_id="decide",
        questions={"ready": "Is the job ready?"},
        state="READY\n",
        systemzero_conn_id="systemzero_secrets",
        deferrable=True,
        decision_timeout=60,
    )
    wait >> decide
