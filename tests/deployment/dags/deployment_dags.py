"""Dags of the deployment test (``tests/deployment``), run by a real scheduler, LocalExecutor
workers and two triggerer processes.

Every sensor waits on its own file under ``params.dir``; the test passes ``dir`` in the run's
conf, appends to the files over time, and finally writes "Job is ready.", which the emulator's
rules decider (``example_dags/emulator_rules.json``) answers with ``ready: true``.

Every task has ``retries=2``: a task that defers and is resumed quickly can be failed by the
scheduler processing the worker's stale "success" event after the resume (apache/airflow#71580),
and the retry of a sensor whose condition is already met is itself the fastest possible
deferral, exposed to the same race. The test accepts a retry only when the scheduler logged that
"state mismatch" for every earlier try of the task; any other retry fails it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers.deployment.dag_parts import released_on_ready

START = pendulum.datetime(2026, 1, 1, tz="UTC")
DEFAULTS: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=2)}
WAIT: dict[str, Any] = {
    "question": "ready",
    "instructions": "Is the job ready?",
    "min_confidence": 0.8,
    "lease_after": 1.0,
    "timeout": 240,
}


def _file(name: str) -> dict[str, Any]:
    return {"type": "file", "path": "{{ params.dir }}/" + name, "poll_interval": 0.5}


def _dag(dag_id: str, **kwargs: Any) -> DAG:
    return DAG(
        dag_id,
        schedule=None,
        start_date=START,
        catchup=False,
        default_args=DEFAULTS,
        params={"dir": ""},
        tags=["systemzero", "deployment-test"],
        **{"max_active_tasks": 32, **kwargs},
    )


# (1) 20 deferrable sensors on files appended to over time, shared by two triggerers
with _dag("sz_deploy_fanout"):
    for index in range(20):
        SystemZeroDecisionSensor(task_id=f"wait_{index:02d}", source=_file(f"job_{index:02d}.log"), **WAIT)

# (2) sensors that keep waiting while the triggerer running half of them is killed
with _dag("sz_deploy_handover"):
    for index in range(8):
        SystemZeroDecisionSensor(task_id=f"wait_{index:02d}", source=_file(f"job_{index:02d}.log"), **WAIT)

# (4) more sensors than the account has streams: the pool (include_deferred=True) bounds how many wait
with _dag("sz_deploy_pool"):
    for index in range(6):
        SystemZeroDecisionSensor(
            task_id=f"wait_{index:02d}",
            source=_file(f"job_{index:02d}.log"),
            systemzero_conn_id="systemzero_small",
            pool="systemzero_account",
            **WAIT,
        )

# (3) a sensor that starts in the triggerer: no worker runs until the decision arrives
with _dag("sz_deploy_start_from_trigger"):
    wait = SystemZeroDecisionSensor(task_id="wait", source=_file("job.log"), start_from_trigger=True, **WAIT)

    @task
    def report(decision: dict[str, Any]) -> str:
        return f"ready={decision['decision']} at state version {decision['state_version']}"

    report(wait.output)

# (5) the operator's answers consumed by a downstream task
with _dag("sz_deploy_operator_xcom"):

    @task
    def build_log() -> dict[str, Any]:
        return {"build": 41, "log": "compiling\ntests passed\nJob is ready.\n"}

    decide = SystemZeroDecideOperator(
        task_id="decide", upstream_task_ids=[build_log()], questions={"ready": "Is the job ready?"}
    )

    @task
    def consume(answers: dict[str, Any], ti: Any = None) -> dict[str, Any]:
        full = ti.xcom_pull(task_ids="decide", key="answers")
        if answers != {"ready": True} or full["ready"]["decision"] is not True:
            raise ValueError(f"unexpected answers {answers!r} / {full!r}")
        return {
            "ship": True,
            "probability": full["ready"]["probability"],
            "decision_id": ti.xcom_pull(task_ids="decide", key="decision_id"),
        }

    consume(decide.output)

# (6, PostgreSQL mode) 50 waiting sensors; one triggerer is killed mid-wait. Not start_from_trigger:
# a triggerer adopting such triggers hands each one the whole serialized Dag to render, which held
# the survivor's loop for ~90 s when it adopted 30 of them on a busy machine.
with _dag("sz_deploy_failover", max_active_tasks=64):
    for index in range(50):
        SystemZeroDecisionSensor(task_id=f"wait_{index:02d}", source=_file(f"job_{index:02d}.log"), **WAIT)

# (7) an asset watcher on a file the test writes (until then it has no content: no stream, nothing
# billed), and the Dag its events schedule; the test kills the triggerer running the watcher
on_release = released_on_ready("sz_deploy", "deploy-release", "systemzero://deployment/release", DEFAULTS)
