"""Act on System Zero's answers with a policy: triage a support ticket, route it to a team, and
send a canned reply only when the model is sure.

* ``triage`` (``@task.systemzero``): the function returns the state (the ticket); the task asks
  whether it reports an outage and returns ``{"urgent": …}``. Below the act bar the policy's
  default (not urgent) applies.
* ``route`` (``SystemZeroBranchOperator``): which team gets the ticket. Two bars: at or above 0.8
  the chosen team's task runs and the others are skipped; between 0.5 and 0.8 a person chooses
  the team on Airflow's Required Actions page (the task waits in ``awaiting_input``, holding no
  worker slot); below 0.5 — or when nobody answers within four hours — the ticket goes to
  support. Engineering has its own, stricter bar.
* ``auto_reply_ok`` (``SystemZeroShortCircuitOperator``): ``send_canned_reply`` runs only when
  the model is at least 0.9 confident that a canned reply answers the ticket.

Every System Zero task pushes a ``decision`` XCom: what the model proposed, with probability,
confidence and alternatives, what was done, who decided (``model``, ``human``, ``policy`` or
``timeout_default``), the policy, the reply ID and the state's hash. A retry replays the same
answers unbilled and pushes the same record.

``airflow dags test systemzero_ticket_policy`` routes ticket T-1001 without anyone's help. Pass
``-c '{"ticket": "T-1003"}'`` for an ambiguous ticket: the run waits until someone picks the team
on the Required Actions page (or ``PATCH /api/v2/dags/…/taskInstances/route/-1/hitlDetails``).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.operators.branch import (
    BranchOption,
    SystemZeroBranchOperator,
    SystemZeroShortCircuitOperator,
)

TICKETS = {
    "T-1001": {"subject": "Charged twice", "body": "I was charged twice for my March invoice."},
    "T-1002": {"subject": "Checkout", "body": "The checkout page is down, customers cannot pay."},
    "T-1003": {"subject": "Account", "body": "Something looks off with my account since yesterday."},
    "T-1004": {"subject": "Password", "body": "How do I reset my password?"},
}

#: Act at 0.8, ask a person from 0.5; below that, or without an answer in 4 hours: support.
TEAM_POLICY = DecisionPolicy(
    act_above=0.8, review_above=0.5, below="default", default="support", review_timeout=timedelta(hours=4)
)

with DAG(
    dag_id="systemzero_ticket_policy",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    params={"ticket": Param("T-1001", enum=sorted(TICKETS))},
    tags=["systemzero", "example"],
    doc_md=__doc__,
) as dag:

    @task
    def fetch_ticket(params: dict | None = None) -> dict:
        ticket_id = (params or {}).get("ticket", "T-1001")
        return {"id": ticket_id, **TICKETS[ticket_id]}

    @task.systemzero(
        questions={"urgent": "Does this ticket report an outage or customers who are blocked?"},
        policy=DecisionPolicy(act_above=0.8, below="default", default=False),
        deferrable=True,
    )
    def triage(ticket: dict) -> dict:
        return {"subject": ticket["subject"], "body": ticket["body"]}  # the state System Zero decides about

    ticket = fetch_ticket()

    route = SystemZeroBranchOperator(
        task_id="route",
        question="team",
        instructions="Which team should handle this support ticket?",
        upstream_task_ids=[ticket],
        branches={
            "billing": BranchOption(description="payments, invoices and refunds"),
            "engineering": BranchOption(description="outages, errors and bugs", act_above=0.9),
            "support": BranchOption(description="how-to questions and everything else"),
        },
        policy=TEAM_POLICY,
        deferrable=True,
    )

    @task
    def billing(ticket: dict) -> str:
        return f"{ticket['id']} queued for billing"

    @task
    def engineering(ticket: dict) -> str:
        return f"{ticket['id']} paged to engineering"

    @task
    def support(ticket: dict) -> str:
        return f"{ticket['id']} queued for support"

    auto_reply_ok = SystemZeroShortCircuitOperator(
        task_id="auto_reply_ok",
        question="auto_reply",
        instructions="Can this ticket be fully answered with a canned help-centre reply?",
        upstream_task_ids=[ticket],
        policy=DecisionPolicy(act_above=0.9, below="default", default=False),
        deferrable=True,
    )

    @task
    def send_canned_reply(ticket: dict) -> str:
        return f"canned reply sent for {ticket['id']}"

    triage(ticket)
    route >> [billing(ticket), engineering(ticket), support(ticket)]
    auto_reply_ok >> send_canned_reply(ticket)
