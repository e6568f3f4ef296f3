"""A review is about one state, and the sensor goes on watching while a person decides, through
``dag.test()`` against the emulator and Airflow's own Core API (the person's answers):

* a newer state decided above the act bar while a person is asked fires the sensor with no answer
  (``decided_by: model``), and the request is closed on Airflow's side (it leaves Required Actions);
* an answer given after the source moved on is recorded and fires nothing;
* a newer state that needs a person in the same try is never shown in the first request;
* an answer is kept as soon as it resumes the task: a try lost while its trigger judges the answer
  leaves a retry that takes it, not a person asked again (Airflow 3.3's task state store).

Each step changes the log when the run gets there (a message of the trigger, a decision the
gateway billed), not on a clock.
"""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.decisions.policy import DecisionPolicy
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import (
    ResumedTaskInstance,
    TaskStateStore,
    append_once_logged,
    needs_task_state_store,
    run_dag_while,
    task_states,
    wait_until,
    xcoms_of,
)
from tests.helpers.policy import CONN_ID, START, Reviewer, connection_from_the_environment, pending_reviews

pytestmark = pytest.mark.filterwarnings("ignore:The HMAC key is:Warning")

POLICY = DecisionPolicy(act_above=0.8, review_above=0.5, below="wait")
#: What the trigger says once it watches on with a review open.
WATCHING_ON = "the sensor goes on watching meanwhile"
REVIEW_LOGGER = "airflow_provider_systemzero.triggers.review"


def _file_sensor(dag_id: str, log: Path, policy: DecisionPolicy = POLICY, **kwargs: Any) -> DAG:
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        SystemZeroDecisionSensor(
            task_id="wait",
            instructions="Is the service ready?",
            systemzero_conn_id=CONN_ID,
            source={"type": "file", "path": str(log)},
            lease=False,
            policy=policy,
            timeout=180,
            **kwargs,
        )
    return dag


def _requests(dag_id: str) -> list[dict[str, Any]]:
    """Every review request of the Dag's tasks, answered or not, with its answer."""
    from airflow.models.hitl import HITLDetail
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(HITLDetail)
            .join(TaskInstance, TaskInstance.id == HITLDetail.ti_id)
            .filter(TaskInstance.dag_id == dag_id)
            .all()
        )
        return [
            {
                "body": row.body,
                "chosen_options": list(row.chosen_options or []),
                "params_input": dict(row.params_input or {}),
                "answered": row.responded_at is not None,
                "responded_by": row.responded_by_user,
            }
            for row in rows
        ]


def _review_marks(xcoms: dict[Any, Any]) -> list[str]:
    return [row["kind"] for row in xcoms[("wait", "decisions", -1)] if row["kind"].startswith("review_")]


def test_a_newer_decisive_state_fires_without_an_answer_and_closes_the_request(
    emulator: Any, tmp_path: Path
) -> None:
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    ready_while_asked = append_once_logged(REVIEW_LOGGER, WATCHING_ON, log, "tick 2: ready", timeout=150)
    dag = _file_sensor("review_superseded", log)
    dag_run = run_dag_while(dag, ready_while_asked, within=180)  # nobody answers
    assert task_states(dag_run) == {"wait": "success"}
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    record = xcoms[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("act", "model", True)
    assert record["confidence"] == pytest.approx(0.92)
    closed = record["review_request"]
    assert closed["ended"] == "superseded" and closed["open"] is False
    assert isinstance(closed["by_state_version"], int) and closed["state_hash"] != record["state_hash"]
    # the request left Required Actions: answered on Airflow's side, saying why, by nobody
    (request,) = _requests(dag.dag_id)
    assert request["answered"] and request["responded_by"] is None
    assert "superseded" in request["params_input"]["systemzero"]
    assert "tick 1: unsure ready" in request["body"] and "While you decide" in request["body"]
    assert pending_reviews(dag.dag_id) == []
    assert _review_marks(xcoms) == ["review_superseded"]


def test_an_answer_about_a_replaced_state_is_recorded_and_fires_nothing(
    emulator: Any, core_api: Any, tmp_path: Path
) -> None:
    """The person answers "Yes" after a line that starts no decision (``decide_when``) replaced
    the state they saw: the answer does not fire the sensor; the ready line later does."""
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    moved_on = threading.Event()
    noise_while_asked = append_once_logged(REVIEW_LOGGER, WATCHING_ON, log, "tick 2: noise", timeout=150)
    ready_after_the_answer = append_once_logged(
        REVIEW_LOGGER, "after the source moved on", log, "tick 3: ready", timeout=150
    )

    def steps() -> None:
        noise_while_asked()
        moved_on.set()
        ready_after_the_answer()

    def answer(request: dict[str, Any]) -> list[str]:
        wait_until(moved_on.is_set, timeout=150, what="the line that replaces the reviewed state")
        return ["Yes"]

    dag = _file_sensor("review_answer_outdated", log, decide_when="ready$")
    with Reviewer(core_api, dag.dag_id, answer) as reviewer:
        dag_run = run_dag_while(dag, steps, within=180)
    assert task_states(dag_run) == {"wait": "success"}
    assert len(reviewer.seen) == 1 and reviewer.responses[0][0] == 200
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    record = xcoms[("wait", "decision", -1)]
    # the ready line fired it, decided by the model: not the person's "Yes" about the older state
    assert (record["action"], record["decided_by"], record["decision"]) == ("act", "model", True)
    assert record["review_request"]["ended"] == "answered" and record["review_request"]["counted"] is False
    (request,) = _requests(dag.dag_id)
    assert request["chosen_options"] == ["Yes"] and request["responded_by"]["name"] == "alice"
    assert _review_marks(xcoms) == ["review_outdated"]


def test_a_second_review_never_shows_the_first_reviews_state(
    emulator: Any, core_api: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """After a "No", a newer unsure state would need a person again; Airflow keeps one request
    per task try and never changes its text, so no request shows it: the sensor says so and
    waits for a state the model decides on its own."""
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    unsure_again = append_once_logged(
        "airflow_provider_systemzero.decisions.watch",
        "a person already said no about this state",
        log,
        "tick 2: unsure ready",
        timeout=150,
    )
    billed_before = emulator.stats.decisions_billed

    def steps() -> None:
        unsure_again()
        # the newer unsure state is decided (billed), then the ready line comes
        wait_until(
            lambda: emulator.stats.decisions_billed >= billed_before + 2,
            timeout=150,
            what="the decision about the second unsure state",
        )
        wait_until(
            lambda: "Airflow keeps one request per task try" in capfd.readouterr().out or None,
            timeout=150,
            what="the sensor saying it cannot ask about the newer state",
        )
        with log.open("a") as out:
            out.write("tick 3: ready\n")

    dag = _file_sensor("review_second", log)
    with Reviewer(core_api, dag.dag_id, lambda request: ["No"]) as reviewer:
        dag_run = run_dag_while(dag, steps, within=180)
    assert task_states(dag_run) == {"wait": "success"}
    # one request, about the first state, answered once: never reopened for the second state
    assert len(reviewer.seen) == 1
    (request,) = _requests(dag.dag_id)
    assert "tick 1: unsure ready" in request["body"] and "tick 2" not in request["body"]
    assert request["chosen_options"] == ["No"]
    record = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "decision", -1)]
    assert (record["action"], record["decided_by"], record["decision"]) == ("act", "model", True)
    assert record["review_request"]["ended"] == "answered" and record["review_request"]["counted"] is True


def test_review_timeout_applies_the_default_while_the_sensor_watches(emulator: Any, tmp_path: Path) -> None:
    """The scheduler's review-timeout sweep sees only ``awaiting_input`` tasks; a sensor that
    watches on is deferred, so its trigger writes the policy's default itself when nobody answers."""
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    policy = DecisionPolicy(
        act_above=0.8, review_above=0.5, below="wait", default=True, review_timeout=timedelta(seconds=2)
    )
    dag = _file_sensor("review_timeout_watching", log, policy)
    dag_run = run_dag_while(dag, lambda: None, within=180)  # nobody answers
    assert task_states(dag_run) == {"wait": "success"}
    xcoms = xcoms_of(dag.dag_id, dag_run.run_id)
    record = xcoms[("wait", "decision", -1)]
    assert (record["decided_by"], record["decision"]) == ("timeout_default", True)
    assert record["review"]["timedout"] is True
    (request,) = _requests(dag.dag_id)
    assert request["answered"] and request["chosen_options"] == ["Yes"]
    assert _review_marks(xcoms) == ["review_timed_out"]


@needs_task_state_store
def test_an_answer_is_kept_before_its_trigger_judges_it_and_a_retry_takes_it(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow 3.3's API resumes a deferred sensor with the person's answer; the sensor defers
    again for its trigger to judge the answer against the source. A try lost then (a worker gone,
    or the stale exit event of apache/airflow#71580) must not cost the answer: the retry, which
    reaches the same state and the same verdict, takes it and asks nobody."""
    from airflow.models.hitl import HITLDetail
    from airflow.sdk.exceptions import TaskDeferred
    from airflow.sdk.execution_time import hitl
    from airflow.sdk.timezone import utcnow

    from tests.helpers import first_event

    asked: list[dict[str, Any]] = []
    monkeypatch.setattr(hitl, "upsert_hitl_detail", lambda **request: asked.append(request))
    connection_from_the_environment(monkeypatch, emulator)  # outside a task, as a worker can
    log = tmp_path / "service.log"
    log.write_text("tick 1: unsure ready\n")
    store = TaskStateStore()

    def a_try(number: int) -> tuple[SystemZeroDecisionSensor, dict[str, Any]]:
        dag = _file_sensor(f"review_kept_{number}", log)
        ti = ResumedTaskInstance("review_kept", "wait", "manual", try_number=number)
        return dag.get_task("wait"), {"ti": ti, "task_instance": ti, "task_state_store": store}

    def decided(sensor: SystemZeroDecisionSensor, context: dict[str, Any]) -> dict[str, Any]:
        """The first decision of the sensor's trigger, as the triggerer runs it."""
        with pytest.raises(TaskDeferred) as deferred:
            sensor.execute(context)
        return asyncio.run(first_event(deferred.value.trigger, within=60))

    sensor, context = a_try(1)
    with pytest.raises(TaskDeferred) as watching:  # the request written, it watches on
        sensor.execute_complete(context, event=decided(sensor, context))
    (request,) = asked
    assert request["options"] == ["Yes", "No"] and "tick 1: unsure ready" in request["body"]
    answer = HITLDetail(
        ti_id=request["ti_id"],
        options=request["options"],
        subject=request["subject"],
        chosen_options=["Yes"],
        responded_by={"id": "1", "name": "alice"},
        responded_at=utcnow(),
    ).as_resume_event_payload()
    with pytest.raises(TaskDeferred) as judging:  # the answer resumes it, and its trigger judges it
        sensor.execute_complete(context, event=answer, **watching.value.kwargs)
    assert judging.value.trigger.serialize()[1]["review"]["answer"]["chosen_options"] == ["Yes"]
    # ... and that try is lost before the trigger fires: the retry decides the same state again
    sensor, context = a_try(2)
    summary = sensor.execute_complete(context, event=decided(sensor, context))
    assert len(asked) == 1  # nobody is asked again
    assert (summary["decision"], summary["decided_by"]) == (True, "human")
    record = context["ti"].xcoms["decision"]
    assert (record["action"], record["decided_by"], record["decision"]) == ("review", "human", True)
    assert record["review"]["chosen_options"] == ["Yes"] and record["effect"] == {"fired": True}
