"""The decide operator under a policy, through ``dag.test()`` against the emulator: each band
(act, review answered by a person through the Core API, review timed out, below: fail/skip/default)
and a retry billed once with the same ``decision`` record."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any
from urllib.parse import quote

import pendulum
import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowException

from airflow_provider_systemzero.compat import has_awaiting_input
from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.decisions.timeline import iso_time, parse_time
from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from tests.helpers import (
    needs_task_state_store,
    run_dag,
    task_states,
    task_tries,
    xcoms_of,
)
from tests.helpers.policy import CONN_ID, START, Reviewer, TimeoutSweep, billed

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", default=False)
QUESTION = {"publish": "Do all checks pass so the data can be published?"}


def _decide(dag_id: str, state: str, policy: DecisionPolicy, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroDecideOperator(
            task_id="decide",
            systemzero_conn_id=CONN_ID,
            state=state,
            questions=QUESTION,
            policy=policy,
            **kwargs,
        )
    return dag


def _record(dag: DAG, run_id: str) -> dict[str, Any]:
    record = xcoms_of(dag.dag_id, run_id)[("decide", "decision", -1)]
    assert json.loads(json.dumps(record)) == record  # JSON only
    return record


def test_act_band_takes_the_models_answer(emulator: Any) -> None:
    dag = _decide("policy_act", "publish:act", POLICY)
    before = billed(emulator)
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("decide", "return_value", -1)] == {"publish": True}
    record = _record(dag, dag_run.run_id)
    assert record["status"] == "final" and record["action"] == "act" and record["decided_by"] == "model"
    assert (record["proposed"], record["decision"]) == (True, True)
    assert (record["probability"], record["confidence"]) == (pytest.approx(0.93), pytest.approx(0.9))
    assert record["alternatives"] == [{"decision": False, "confidence": pytest.approx(0.07)}]
    assert record["model"] == "sz-policy" and record["question"] == "publish"
    assert record["reply_id"] == xcoms[("decide", "decision_id", -1)] and record["reply_id"].startswith(
        "szd_"
    )
    assert record["state_version"] >= 1
    assert record["state_hash"] == hashlib.sha256(json.dumps("publish:act").encode()).hexdigest()
    assert record["policy"] == POLICY.to_dict() and record["bars"]["code"] == "above_act_bar"
    assert record["effect"] == {"return_value": {"publish": True}}
    # when System Zero decided: the reply's own time, in UTC, with its offset; nobody answered
    created = xcoms[("decide", "reply", -1)]["created"]
    assert record["decided_at"] == iso_time(created) and record["decided_at"].endswith("Z")
    assert record["answered_at"] is None
    assert billed(emulator) == before + 1


def test_review_band_takes_the_persons_answer(
    emulator: Any, core_api: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    dag = _decide(
        "policy_review", "publish:review", POLICY, review_assigned_users={"id": "alice", "name": "alice"}
    )
    with Reviewer(core_api, dag.dag_id, lambda request: ["No"]) as reviewer:
        dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert [code for code, _ in reviewer.responses] == [200]
    # the task's log says where the person answers (the reviewer used that very endpoint)
    where = (
        "in awaiting_input"
        if has_awaiting_input()
        else "deferred, while Airflow's HITLTrigger checks for an answer"
    )
    run_id = quote(dag_run.run_id, safe="")
    assert (
        f"the task waits {where}: answer on Airflow's Required Actions page, or with PATCH "
        f"/api/v2/dags/policy_review/dagRuns/{run_id}/taskInstances/decide/-1/hitlDetails"
    ) in capsys.readouterr().out
    (request,) = reviewer.seen
    # what the person saw: the question, the numbers, the ranked answers, the state
    assert request["options"] == ["Yes", "No"] and request["defaults"] == ["No"] and not request["multiple"]
    assert request["assignees"] == [{"id": "alice", "name": "alice"}]
    body = request["body"]
    for text in (
        "`publish`",
        QUESTION["publish"],
        "probability 0.66, confidence 0.62",
        "**Ranked answers**",
        "1. `true` — probability 0.66, confidence 0.62 (proposed)",
        "2. `false` — confidence 0.34",
        "below the act bar 0.8 and at or above the review bar 0.5",
        "publish:review",
    ):
        assert text in body, text
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    assert xcoms[("decide", "return_value", -1)] == {"publish": False}
    assert (
        xcoms[("decide", "answers", -1)]["publish"]["decision"] is True
    )  # the model's answer stays on record
    record = _record(dag, dag_run.run_id)
    assert record["status"] == "final" and record["action"] == "review" and record["decided_by"] == "human"
    assert (record["proposed"], record["decision"]) == (True, False)
    assert record["review"]["responded_by"] == {"id": "alice", "name": "alice"}
    assert record["review"]["chosen_options"] == ["No"] and record["review"]["timedout"] is False
    assert isinstance(record["review"]["responded_at"], str)
    assert "alice answered false" in record["reason"]
    # the model decided, then the person answered: both times in UTC
    decided, answered = parse_time(record["decided_at"]), parse_time(record["answered_at"])
    assert record["answered_at"].endswith("Z") and record["decided_at"].endswith("Z")
    assert answered == pytest.approx(pendulum.parse(record["review"]["responded_at"]).timestamp(), abs=0.001)
    assert decided <= answered + 1  # the reply's time is whole seconds


def test_review_timeout_falls_back_to_the_policys_default(emulator: Any) -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", default=False, review_timeout=1)
    dag = _decide("policy_review_timeout", "publish:review", policy)
    with TimeoutSweep():
        dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    record = _record(dag, dag_run.run_id)
    assert record["decided_by"] == "timeout_default" and record["decision"] is False
    assert record["answered_at"] is None and record["decided_at"] is not None  # nobody answered
    assert record["review"]["timedout"] is True and record["review"]["responded_by"] is None
    assert xcoms_of(dag.dag_id, dag_run.run_id)[("decide", "return_value", -1)] == {"publish": False}


def test_review_timeout_without_default_does_what_below_says(emulator: Any) -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below="skip", review_timeout=1)
    dag = _decide("policy_review_timeout_skip", "publish:review", policy)
    with TimeoutSweep():
        dag_run = run_dag(dag)
    assert task_states(dag_run)["decide"] == "skipped"
    record = _record(dag, dag_run.run_id)
    assert (record["action"], record["decided_by"], record["decision"]) == ("skip", "policy", None)
    assert "nobody answered the review in time" in record["reason"]


@pytest.mark.parametrize(
    ("below", "state", "decision"),
    [
        ("fail", "failed", None),
        ("skip", "skipped", None),
        ("default", "success", False),
    ],
)
def test_below_the_bars(emulator: Any, below: str, state: str, decision: Any) -> None:
    policy = DecisionPolicy(act_above=0.8, review_above=0.5, below=below, default=False)
    dag = _decide(f"policy_below_{below}", "publish:low", policy)
    dag_run = run_dag(dag)
    assert task_states(dag_run)["decide"] == state
    record = _record(dag, dag_run.run_id)
    assert record["action"] == below and record["decided_by"] == "policy" and record["decision"] == decision
    assert record["bars"]["code"] == "below_review_bar" and record["confidence"] == pytest.approx(0.2)
    if below == "fail":
        assert task_tries(dag_run)["decide"] == 1  # the same state would get the same answer: no retry


@pytest.fixture
def pushed(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every ``decision`` record a task pushes to XCom, in order, over all its tries (XCom keeps
    only the last)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    records: list[dict[str, Any]] = []
    push = RuntimeTaskInstance.xcom_push

    def recording(ti: Any, key: str, value: Any) -> Any:
        if key == "decision":
            records.append(value)
        return push(ti, key, value)

    monkeypatch.setattr(RuntimeTaskInstance, "xcom_push", recording)
    return records


class _FailsOnceAfterDeciding(SystemZeroDecideOperator):
    """Decides and pushes its record, then fails its first try (a crash after the decision, before
    the task ends)."""

    def post_execute(self, context: Any, result: Any = None) -> None:
        if context["ti"].try_number == 1:
            raise AirflowException("the worker crashed after the decision")


def test_a_retry_is_billed_once_with_the_same_decision(emulator: Any, pushed: list[dict[str, Any]]) -> None:
    with DAG("policy_retry", schedule=None, start_date=START) as dag:
        _FailsOnceAfterDeciding(
            task_id="decide",
            systemzero_conn_id=CONN_ID,
            state="publish:act",
            questions=QUESTION,
            policy=POLICY,
            retries=1,
            retry_delay=timedelta(0),
        )
    before = billed(emulator)
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_tries(dag_run)["decide"] == 2
    assert billed(emulator) == before + 1
    first, second = pushed
    assert first == second == _record(dag, dag_run.run_id)


@needs_task_state_store
def test_a_retry_after_a_review_takes_the_same_answer_without_asking_again(
    emulator: Any, core_api: Any, pushed: list[dict[str, Any]]
) -> None:
    with DAG("policy_retry_review", schedule=None, start_date=START) as dag:
        _FailsOnceAfterDeciding(
            task_id="decide",
            systemzero_conn_id=CONN_ID,
            state="publish:review",
            questions=QUESTION,
            policy=POLICY,
            retries=1,
            retry_delay=timedelta(0),
        )
    before = billed(emulator)
    with Reviewer(core_api, dag.dag_id, lambda request: ["No"]) as reviewer:
        dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert task_tries(dag_run)["decide"] == 2
    assert len(reviewer.seen) == 1  # the person was asked once, on the first try
    assert billed(emulator) == before + 1
    pending, first, second = pushed
    assert pending["status"] == "pending_review" and pending["decision"] is None
    assert pending["decided_by"] is None  # nothing is decided while a person is asked
    assert first == second == _record(dag, dag_run.run_id)
    assert (second["decided_by"], second["decision"]) == ("human", False)
