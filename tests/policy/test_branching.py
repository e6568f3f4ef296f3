"""Branching and short-circuiting on a System Zero decision, through ``dag.test()``: one branch,
several branches, an option that runs several tasks, a person choosing the branch, a mapped task
group, and the yes/no gate both ways."""

from __future__ import annotations

from typing import Any

import pytest
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, task

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.operators.branch import (
    BranchOption,
    SystemZeroBranchOperator,
    SystemZeroShortCircuitOperator,
)
from tests.helpers import run_dag, task_states, xcoms_of
from tests.helpers.policy import CONN_ID, START, Reviewer

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="fail")


def _teams(dag_id: str, state: str, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroBranchOperator(
            task_id="route",
            instructions="Which team should handle this ticket?",
            state=state,
            systemzero_conn_id=CONN_ID,
            **kwargs,
        ) >> [EmptyOperator(task_id=name) for name in ("support", "billing", "sales")]
    return dag


def test_one_branch_runs_and_the_others_are_skipped(emulator: Any) -> None:
    dag = _teams(
        "branch_one",
        "route:billing",
        policy=POLICY,
        descriptions={"billing": "payments and invoices", "sales": "new contracts"},
    )
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {
        "route": "success",
        "billing": "success",
        "sales": "skipped",
        "support": "skipped",
    }
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("route", "decision", -1)]
    assert (record["proposed"], record["decision"], record["decided_by"]) == ("billing", "billing", "model")
    assert record["effect"] == {"branches": ["billing"], "follow": ["billing"]}
    # the options were the downstream task IDs, sorted, and the descriptions reached the model
    body = [r for r in emulator.decider.requests if r["state"] == "route:billing"][-1]
    question = body["questions"]["branch"]
    assert question["options"] == ["billing", "sales", "support"]
    assert "- billing: payments and invoices\n- sales: new contracts" in question["instructions"]


def test_several_branches_run_with_multiple(emulator: Any) -> None:
    dag = _teams("branch_multiple", "multi:billing+support", policy=POLICY, multiple=True)
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {
        "route": "success",
        "billing": "success",
        "sales": "skipped",
        "support": "success",
    }
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("route", "decision", -1)]
    assert record["decision"] == ["billing", "support"] and record["decided_by"] == "model"
    assert record["options"]["sales"] == {
        "decision": False,
        "probability": pytest.approx(0.92),
        "confidence": pytest.approx(0.9),
    }
    assert record["bars"]["measured"] == pytest.approx(0.85)  # the least certain option decides


def test_an_option_can_run_several_tasks(emulator: Any) -> None:
    with DAG("branch_mapping", schedule=None, start_date=START) as dag:
        route = SystemZeroBranchOperator(
            task_id="triage",
            instructions="How should this alert be handled?",
            state="incident:sev1",
            systemzero_conn_id=CONN_ID,
            policy=POLICY,
            branches={
                "escalate": BranchOption(
                    tasks=["page_oncall", "open_incident"], description="customers hurt"
                ),
                "ignore": "close_alert",
            },
        )
        route >> [EmptyOperator(task_id=name) for name in ("page_oncall", "open_incident", "close_alert")]
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {
        "triage": "success",
        "page_oncall": "success",
        "open_incident": "success",
        "close_alert": "skipped",
    }
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("triage", "decision", -1)]
    assert record["effect"] == {"branches": ["escalate"], "follow": ["page_oncall", "open_incident"]}


def test_a_person_chooses_the_branch_in_the_review_band(emulator: Any, core_api: Any) -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below="fail")
    dag = _teams(
        "branch_review",
        "route:support-unsure",
        policy=policy,
        branches={
            "billing": BranchOption(),
            "sales": BranchOption(),
            "support": BranchOption(act_above=0.95),
        },
    )
    with Reviewer(core_api, dag.dag_id, lambda request: ["sales"], username="bob") as reviewer:
        dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    (request,) = reviewer.seen
    assert request["options"] == ["billing", "sales", "support"] and request["multiple"] is False
    assert "1. `support` — probability 0.6, confidence 0.55 (proposed)" in request["body"]
    assert task_states(dag_run) == {
        "route": "success",
        "billing": "skipped",
        "sales": "success",
        "support": "skipped",
    }
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("route", "decision", -1)]
    assert (record["proposed"], record["decision"], record["decided_by"]) == ("support", "sales", "human")
    assert record["bars"]["act_above"] == 0.95  # support's own bar
    assert record["review"]["responded_by"] == {"id": "bob", "name": "bob"}


def test_a_mapped_branch_skips_per_map_index(emulator: Any) -> None:
    with DAG("branch_mapped", schedule=None, start_date=START) as dag:

        @task
        def billing(n: int) -> int:
            return n

        @task
        def support(n: int) -> int:
            return n

        route = SystemZeroBranchOperator.partial(
            task_id="route",
            instructions="Which team should handle this ticket?",
            systemzero_conn_id=CONN_ID,
            policy=POLICY,
            branches=["billing", "support"],
        ).expand(state=["ticket:1", "ticket:2"])
        route >> [billing.expand(n=[0, 1]), support.expand(n=[0, 1])]
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {
        "route[0]": "success",
        "route[1]": "success",
        "billing[0]": "success",
        "billing[1]": "skipped",
        "support[0]": "skipped",
        "support[1]": "success",
    }
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert [xcoms[("route", "decision", i)]["decision"] for i in (0, 1)] == ["billing", "support"]
    assert xcoms[("route", "decision", 0)]["state_hash"] != xcoms[("route", "decision", 1)]["state_hash"]


# ------------------------------------------------------------------------------ the yes/no gate


def _gate(dag_id: str, state: str, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        gate = SystemZeroShortCircuitOperator(
            task_id="gate",
            instructions="Is the data fresh enough to publish?",
            state=state,
            systemzero_conn_id=CONN_ID,
            policy=POLICY,
            **kwargs,
        )
        publish = EmptyOperator(task_id="publish")
        gate >> publish >> EmptyOperator(task_id="notify", trigger_rule="all_done")
    return dag


@pytest.mark.parametrize("deferrable", [True, False])
def test_short_circuit_proceeds_on_yes(emulator: Any, deferrable: bool) -> None:
    dag = _gate(f"gate_yes_{deferrable}", "gate:yes", deferrable=deferrable)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"gate": "success", "publish": "success", "notify": "success"}
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("gate", "return_value", -1)] is True
    assert xcoms[("gate", "decision", -1)]["effect"] == {"proceed": True, "skipped": []}


@pytest.mark.parametrize(("ignore_rules", "notify"), [(True, "skipped"), (False, "success")])
def test_short_circuit_skips_on_no(emulator: Any, ignore_rules: bool, notify: str) -> None:
    dag = _gate(f"gate_no_{ignore_rules}", "gate:no", ignore_downstream_trigger_rules=ignore_rules)
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_states(dag_run) == {"gate": "success", "publish": "skipped", "notify": notify}
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("gate", "decision", -1)]
    assert record["decision"] is False and record["decided_by"] == "model"
    assert record["effect"] == {
        "proceed": False,
        "skipped": ["notify", "publish"] if ignore_rules else ["publish"],
    }


def test_skip_if_gate_with_proceed_when_false(emulator: Any) -> None:
    dag = _gate("gate_skip_if", "gate:no", proceed_when=False)
    dag_run = run_dag(dag)
    assert task_states(dag_run) == {"gate": "success", "publish": "success", "notify": "success"}


def test_a_branch_to_a_task_that_is_not_downstream_fails_before_asking(emulator: Any) -> None:
    before = emulator.stats.decisions_dispatched
    dag = _teams(
        "branch_bad_target", "route:billing", branches={"billing": "billing", "refunds": "refund_task"}
    )
    dag_run = run_dag(dag)
    assert task_states(dag_run)["route"] == "failed"
    assert emulator.stats.decisions_dispatched == before


def test_a_policy_on_several_questions_names_the_gated_one() -> None:
    from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator

    with pytest.raises(ValueError, match="policy_question"):
        SystemZeroDecideOperator(task_id="d", questions={"a": "A?", "b": "B?"}, state="x", policy=POLICY)
    with pytest.raises(TypeError, match="builds its own question"):
        SystemZeroBranchOperator(task_id="b", instructions="Which?", questions={"a": "A?"})


@pytest.mark.parametrize(
    ("branches", "message"),
    [
        (
            {"billing": BranchOption(act_above=90)},
            "route: option 'billing': act_above 90 must be a number from 0 to 1, or None for no bar "
            "(a percentage: 90 % is 0.9)",
        ),
        (
            {"billing": {"review_above": 80, "act_above": 0.9}},
            "route: option 'billing': review_above 80 must be a number from 0 to 1, or None for no bar "
            "(a percentage: 80 % is 0.8)",
        ),
        (
            {"billing": BranchOption(act_above=0.5, review_above=0.8)},
            "route: option 'billing': review_above (0.8) must not be above act_above (0.5)",
        ),
        (
            {"billing": {"act_abov": 0.5}},
            "route: branches['billing'] has unknown key 'act_abov'; did you mean 'act_above'? (keys: "
            "tasks, description, act_above, review_above)",
        ),
    ],
)
def test_a_bad_branch_option_names_the_task_and_the_option(branches: dict[str, Any], message: str) -> None:
    with DAG("branch_option_mistake", schedule=None, start_date=START), pytest.raises(ValueError) as raised:
        SystemZeroBranchOperator(task_id="route", instructions="Which team?", state="s", branches=branches)
    assert str(raised.value) == message


def test_a_bad_option_bar_in_a_policy_names_the_option() -> None:
    with pytest.raises(ValueError) as raised:
        DecisionPolicy.coerce(DecisionPolicy(act_above=0.8, options={"refund": {"act_above": 95}}))
    assert str(raised.value) == (
        "option 'refund': act_above 95 must be a number from 0 to 1, or None for no bar (a percentage: 95 % is 0.95)"
    )
    assert isinstance(raised.value, SystemZeroArgumentError)
    assert (raised.value.code, raised.value.field) == ("invalid_threshold", "options.refund.act_above")
