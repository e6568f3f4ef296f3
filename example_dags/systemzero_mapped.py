"""Ask the same question about several inputs with a dynamically mapped operator.

Each mapped instance streams one support ticket and asks whether it is urgent; every instance
has its own idempotency keys (the map index is part of them), so a retry of one instance is
billed once and never collides with another.
"""

from __future__ import annotations

from collections.abc import Sequence

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

TICKETS = [
    "Customer reports the checkout page is down for everyone.",
    "Please update the billing address on my invoice.",
    "Users cannot log in since the last deploy.",
]

with DAG(
    dag_id="systemzero_mapped",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["systemzero", "example"],
    doc_md=__doc__,
) as dag:
    triage = SystemZeroDecideOperator.partial(
        task_id="triage",
        questions={"urgent": "Is this ticket urgent (an outage or users blocked)?"},
        deferrable=True,  # each mapped instance waits in the triggerer
    ).expand(state=TICKETS)

    @task
    def summarise(answers: Sequence[dict]) -> dict:
        # read by index up to its length: iterating the mapped outputs reads one past the last,
        # and Airflow's client logs that read's miss as an error
        if len(answers) != len(TICKETS):
            raise ValueError(f"{len(answers)} answers for {len(TICKETS)} tickets")
        urgent = [ticket for index, ticket in enumerate(TICKETS) if answers[index]["urgent"]]
        return {"urgent": len(urgent), "total": len(TICKETS)}

    summarise(triage.output)
