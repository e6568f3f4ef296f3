"""Dags of the deployment test's Celery mode (``make test-deployment EXECUTOR=celery``), run by a
real scheduler, two Celery workers and two triggerer processes against one System Zero account at
the published limits.

``sz_celery_decide`` has every kind of System Zero task a worker or a triggerer runs: mapped
``SystemZeroDecideOperator`` instances and mapped ``@task.systemzero`` calls (each a stream and a
budget mirror of its own in the worker process that runs it), a poking sensor (in a worker) and a
deferrable one (in a triggerer), both on files the test writes. ``sz_celery_held`` is one decision
the emulator holds until the test has killed the worker that asked it. ``sz_celery_on_release``
runs on the events of an asset watcher (in a triggerer) on a file the test writes.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers.deployment.dag_parts import BUILDS, TICKETS, released_on_ready

START = pendulum.datetime(2026, 1, 1, tz="UTC")
DEFAULTS: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=2)}
WAIT: dict[str, Any] = {
    "question": "ready",
    "instructions": "Is the job ready?",
    "min_confidence": 0.8,
    "timeout": 300,
}


def _file(name: str) -> dict[str, Any]:
    return {"type": "file", "path": "{{ params.dir }}/" + name, "poll_interval": 0.5}


with DAG(
    "sz_celery_decide",
    schedule=None,
    start_date=START,
    catchup=False,
    default_args=DEFAULTS,
    params={"dir": ""},
    max_active_tasks=32,
    tags=["systemzero", "deployment-test"],
):
    SystemZeroDecideOperator.partial(
        task_id="decide", questions={"ready": "Is the job ready?"}, deferrable=False
    ).expand(state=BUILDS)

    @task.systemzero(questions={"urgent": "Does this ticket report an outage?"}, deferrable=False)
    def triage(ticket: str) -> str:
        return ticket

    triage.expand(ticket=list(TICKETS))

    SystemZeroDecisionSensor(
        task_id="poke", source=_file("poke.log"), deferrable=False, mode="poke", poke_interval=2, **WAIT
    )
    SystemZeroDecisionSensor(
        task_id="deferred", source=_file("deferred.log"), deferrable=True, lease_after=1.0, **WAIT
    )

with DAG(
    "sz_celery_held",
    schedule=None,
    start_date=START,
    catchup=False,
    default_args=DEFAULTS,
    tags=["systemzero", "deployment-test"],
):
    # the emulator holds this decision until the test has killed the worker that asked it
    SystemZeroDecideOperator(
        task_id="decide",
        questions={"ready": "Is the job ready?"},
        state="held-decision: tests passed\nJob is ready.\n",
        deferrable=False,
    )

on_release = released_on_ready("sz_celery", "celery-release", "systemzero://celery/release", DEFAULTS)
