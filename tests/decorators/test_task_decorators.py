"""``@task.systemzero`` and ``@task.systemzero_branch``, registered through the provider info's
``task-decorators`` and used from ``airflow.sdk.task``."""

from __future__ import annotations

from typing import Any

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, task

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from tests.helpers import run_dag, task_states, xcoms_of
from tests.helpers.policy import CONN_ID, START


def test_the_decorators_are_registered() -> None:
    from airflow_provider_systemzero.decorators.branch import systemzero_branch_task
    from airflow_provider_systemzero.decorators.systemzero import systemzero_task

    assert task.systemzero is systemzero_task
    assert task.systemzero_branch is systemzero_branch_task


def test_systemzero_task_decides_about_the_returned_state(emulator: Any) -> None:
    with DAG("decorator_decide", schedule=None, start_date=START) as dag:

        @task
        def fetch_ticket() -> dict:
            return {"subject": "Checkout is down", "body": "Customers report an outage since 09:10."}

        @task.systemzero(
            questions={"urgent": "Does this ticket report an outage?"},
            systemzero_conn_id=CONN_ID,
            policy=DecisionPolicy(act_above=0.8, review_above=0.5, below="default", default=False),
        )
        def triage(ticket: dict) -> dict:
            return {"ticket": ticket, "channel": "email"}  # the state

        @task
        def report(answers: dict) -> str:
            return f"urgent={answers['urgent']}"

        report(triage(fetch_ticket()))
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("triage", "return_value", -1)] == {"urgent": True}
    assert xcoms[("report", "return_value", -1)] == "urgent=True"
    record = xcoms[("triage", "decision", -1)]
    assert (record["question"], record["decision"], record["decided_by"]) == ("urgent", True, "model")
    assert (
        "Checkout is down"
        in [r for r in emulator.decider.requests if "urgent" in r["questions"]][-1]["state"]["ticket"][
            "subject"
        ]
    )


def test_systemzero_branch_picks_a_downstream_task(emulator: Any) -> None:
    with DAG("decorator_branch", schedule=None, start_date=START) as dag:

        @task.systemzero_branch(
            instructions="Which team should handle this ticket?",
            systemzero_conn_id=CONN_ID,
            descriptions={"billing": "payments and invoices"},
            policy=DecisionPolicy(act_above=0.8),
        )
        def route(kind: str) -> str:
            return f"route:{kind}"  # the state

        route("billing") >> [EmptyOperator(task_id=name) for name in ("billing", "sales", "support")]
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {
        "route": "success",
        "billing": "success",
        "sales": "skipped",
        "support": "skipped",
    }
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("route", "decision", -1)]
    assert record["effect"] == {"branches": ["billing"], "follow": ["billing"]}
