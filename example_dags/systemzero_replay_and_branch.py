"""Replay three tasks' outputs as state, ask System Zero, and branch on its answers.

``extract``, ``validate`` and ``measure_freshness`` return plain JSON. ``decide`` replays their
outputs as an array state (one item per output: ``{"task_id", "output"}``), asks two questions
once, and pushes ``{question: decision}`` to XCom (plus ``answers``, ``reply`` and
``decision_id``). ``choose`` branches on the ``publish`` answer.
"""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

with DAG(
    dag_id="systemzero_replay_and_branch",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["systemzero", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def extract() -> dict:
        return {"rows": 1200, "source": "orders"}

    @task
    def validate() -> dict:
        return {"checks": "all passed", "null_rate": 0.001}

    @task
    def measure_freshness() -> dict:
        return {"age_minutes": 12}

    decide = SystemZeroDecideOperator(
        task_id="decide",
        upstream_task_ids=["extract", "validate", "measure_freshness"],
        questions={
            "publish": "Do all checks pass so the data can be published?",
            "tier": {
                "type": "choice",
                "instructions": "Which service tier fits this dataset?",
                "options": ["gold", "silver", "bronze"],
            },
        },
        deferrable=True,  # wait for the answers in the triggerer
    )

    @task.branch
    def choose(ti=None) -> str:
        answers = ti.xcom_pull(task_ids="decide")
        return "publish" if answers["publish"] else "quarantine"

    @task
    def publish(ti=None) -> str:
        tier = ti.xcom_pull(task_ids="decide")["tier"]
        confidence = ti.xcom_pull(task_ids="decide", key="answers")["publish"]["confidence"]
        return f"published as {tier} (confidence {confidence})"

    @task
    def quarantine() -> str:
        return "quarantined"

    [extract(), validate(), measure_freshness()] >> decide >> choose() >> [publish(), quarantine()]
