"""SystemZeroDecisionSensor's checks when the Dag is parsed: a literal that can never work is a
``ValueError`` starting ``<task_id>: `` that names the argument the author wrote, while a templated
value (``question="{{ params.q }}"``) is left for the task to check when it runs."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import READY_RULES, ready_log, rules_emulator, run_dag, task_states

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CONN = "sz_parse_time"
READY = "Is the job ready?"


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        READY_RULES, tmp_path_factory.mktemp("rules"), "parse-key", CONN, model="sz-test"
    ) as emu:
        yield emu


def _build(dag_id: str = "parse_time", **kwargs: Any) -> SystemZeroDecisionSensor:
    """Construct task ``t`` in a Dag, as the Dag file does when it is parsed."""
    arguments: dict[str, Any] = {
        "task_id": "t",
        "systemzero_conn_id": CONN,
        "question": "ready",
        "instructions": READY,
        "state": "Job is ready.",
        "timeout": 60,
    }
    with DAG(dag_id, schedule=None, start_date=START, params={"q": "ready"}):
        return SystemZeroDecisionSensor(**(arguments | kwargs))


def test_a_templated_question_is_left_for_the_run() -> None:
    sensor = _build(questions={"ready": READY}, question="{{ params.q }}")
    assert "question" in sensor.template_fields
    assert sensor.question == "{{ params.q }}"


def test_a_templated_question_still_checks_the_rest_of_the_condition() -> None:
    with pytest.raises(ValueError, match=r"^t: min_confidence 80 must be a number from 0 to 1"):
        _build(questions={"ready": READY}, question="{{ params.q }}", min_confidence=80)


@pytest.mark.parametrize(
    ("rendered", "message"),
    [
        ("ready", None),  # a question asked: decided
        ("1ready", "t: question '1ready' must start with a letter or underscore"),
        ("done", "t: question 'done' is not among the questions asked (['ready'])"),
    ],
)
def test_a_templated_question_is_checked_when_the_task_runs(
    emulator: Any, capsys: pytest.CaptureFixture[str], rendered: str, message: str | None
) -> None:
    before = emulator.stats
    with DAG(
        f"parse_time_question_{rendered}", schedule=None, start_date=START, params={"q": rendered}
    ) as dag:
        SystemZeroDecisionSensor(
            task_id="t",
            systemzero_conn_id=CONN,
            questions={"ready": READY},
            question="{{ params.q }}",
            state="Job is ready.",
            timeout=60,
        )
    if message is None:
        assert task_states(run_dag(dag)) == {"t": "success"}
        return
    assert task_states(run_dag(dag)) == {"t": "failed"}
    assert message in capsys.readouterr().out
    assert emulator.stats.streams_total == before.streams_total  # refused before any connection


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"lease_after": "5"}, "t: lease_after must be a number of seconds (0 or more), got str '5'"),
        ({"lease_after": -5}, "t: lease_after must be a number of seconds (0 or more), got int -5"),
        ({"lease_after": float("nan")}, "t: lease_after must be a number of seconds"),
        ({"lease_after": True}, "t: lease_after must be a number of seconds"),
        ({"lease": "yes"}, "t: lease must be True or False, got str 'yes'"),
        ({"wait_on_static_state": "no"}, "t: wait_on_static_state must be True or False, got str 'no'"),
        ({"allow_empty": "no"}, "t: allow_empty must be True or False, got str 'no'"),
        ({"deferrable": "no"}, "t: deferrable must be True or False, got str 'no'"),
        ({"start_from_trigger": "yes"}, "t: start_from_trigger must be True or False, got str 'yes'"),
        ({"key_salt": 5}, "t: key_salt must be a string or None, got int 5: pass e.g. key_salt='5'"),
        ({"systemzero_conn_id": 5}, "t: systemzero_conn_id must be the ID of a System Zero connection"),
        ({"systemzero_conn_id": " "}, "t: systemzero_conn_id must be the ID of a System Zero connection"),
        ({"review_subject": 5}, "t: review_subject must be a string or None, got int 5"),
        ({"review_assigned_users": 5}, "t: review_assigned_users must be a user"),
        ({"review_assigned_users": [{"id": "alice"}]}, "t: review_assigned_users must be a user"),
        ({"review_notifiers": 5}, "t: review_notifiers must be a notifier"),
        (
            {"min_interval_ms": "100"},
            "t: min_interval_ms must be an integer number of milliseconds from 0 to 60000, got str '100'",
        ),
        ({"min_interval_ms": 60_001}, "t: min_interval_ms 60001 is out of range"),
        ({"max_staleness": "30"}, "t: max_staleness must be a number of seconds from 0 to 3600, got '30'"),
        (
            {"max_staleness": float("nan")},
            "t: max_staleness must be a number of seconds from 0 to 3600, got nan",
        ),
        (
            {"source": {"type": "file", "path": "/j.log", "poll_interval": float("inf")}},
            "t: source.poll_interval inf",
        ),
        ({"source": {"type": "file", "path": Path("job.log")}}, "t: source.path 'job.log' is relative"),
        (
            {"debounce_ms": "100"},
            "t: debounce_ms must be a whole number of milliseconds from 0 to 3600000 or None, got str '100'",
        ),
        (
            {"debounce_ms": -1},
            "t: debounce_ms must be a whole number of milliseconds from 0 to 3600000 or None, got int -1",
        ),
        ({"decide_initial": "no"}, "t: decide_initial must be True or False, got 'no'"),
        (
            {"state": "x" * 3_700_000},
            "t: state makes the decide body 3700206 bytes: the body may not exceed max_decide_body_bytes "
            "(3665920): send less (a summary, the last part of a log)",
        ),
        ({"decide_initial": False}, "t: decide_initial=False with no source"),
        ({"timeout": 0, "deferrable": True}, "t: timeout=0 leaves a deferred sensor no time to decide"),
        (
            {"poke_interval": 0, "deferrable": False},
            "t: poke_interval=0 would open a stream and ask a decision in a tight loop: pass the "
            "seconds between pokes",
        ),
        (
            {"decide_initial": False, "source": {"type": "static"}},
            "t: decide_initial=False with a static source: the state never changes",
        ),
        (
            {"consecutive": 2, "source": {"type": "static"}},
            "t: consecutive=2 needs successive states, but with a static source",
        ),
        ({"request_mode": "fastest"}, "t: request_mode 'fastest' is not one of ['fast', 'deliberate']"),
        ({"route": "fastest"}, "t: route 'fastest' is not one of ['direct', 'committee']"),
        (
            {"route": "committee", "request_mode": "deliberate"},
            "t: route 'committee' cannot be combined with request_mode 'deliberate'",
        ),
        ({"max_decisions": -1}, "t: max_decisions must be a whole number"),
        ({"policy": {"act_above": 2}}, "t: act_above 2 must be a number from 0 to 1"),
        (
            {"min_true_for": "30s"},
            "t: min_true_for must be a number of seconds (0 or more) or a timedelta, got str '30s': pass "
            "e.g. min_true_for=30 or min_true_for=timedelta(seconds=30)",
        ),
        ({"min_true_for": True}, "t: min_true_for must be a number of seconds (0 or more) or a timedelta"),
        (
            {"min_true_for": timedelta(seconds=-5)},
            "t: min_true_for must be a number of seconds (0 or more) or a timedelta, got timedelta",
        ),
    ],
)
def test_a_literal_that_can_never_work_fails_naming_the_task(arguments: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(message)):
        _build(**arguments)


@pytest.mark.parametrize(
    ("min_true_for", "timeout", "message"),
    [
        (timedelta(hours=2), 20, "t: min_true_for (2 h) is not shorter than timeout (20 s)"),
        (60, timedelta(minutes=1), "t: min_true_for (1 min) is not shorter than timeout (1 min)"),
    ],
)
def test_a_min_true_for_the_timeout_cannot_allow_is_refused(
    tmp_path: Any, min_true_for: Any, timeout: Any, message: str
) -> None:
    source = {"type": "file", "path": str(tmp_path / "job.log")}
    for deferrable in (True, False):  # a deferred wait and a poking one alike
        with pytest.raises(SystemZeroArgumentError) as raised:
            _build(source=source, min_true_for=min_true_for, timeout=timeout, deferrable=deferrable)
        assert str(raised.value) == (
            f"{message}: the decisions must keep meeting the condition for min_true_for before the "
            "timeout ends the wait, so the sensor could never succeed: shorten min_true_for, or "
            "raise timeout above it"
        )
        assert raised.value.field == "min_true_for"
    # shorter than the timeout: accepted
    assert _build("parse_time_held", source=source, min_true_for=59, timeout=60).min_true_for == 59


def test_a_min_true_for_a_shorter_execution_timeout_cannot_allow_is_refused(tmp_path: Any) -> None:
    """Airflow's execution_timeout also ends the wait (deferred: the trigger's deadline is the
    shorter bound), so it is what min_true_for must be shorter than."""
    source = {"type": "file", "path": str(tmp_path / "job.log")}
    for deferrable in (True, False):  # a deferred wait and a poking one alike
        with pytest.raises(SystemZeroArgumentError) as raised:
            _build(
                source=source,
                min_true_for=120,
                timeout=3600,
                execution_timeout=timedelta(minutes=1),
                deferrable=deferrable,
            )
        assert str(raised.value) == (
            "t: min_true_for (2 min) is not shorter than execution_timeout (1 min), which ends the wait "
            "before timeout (1 h) does: the decisions must keep meeting the condition for "
            "min_true_for before the execution_timeout ends the wait, so the sensor could never "
            "succeed: shorten min_true_for, or raise execution_timeout above it"
        )
        assert raised.value.field == "min_true_for"
    # shorter than both, or an execution_timeout longer than the timeout: accepted
    for dag_id, timeout, execution_timeout in (
        ("parse_time_exec_held", 3600, timedelta(minutes=1)),
        ("parse_time_exec_longer", 60, timedelta(hours=1)),
    ):
        built = _build(
            dag_id, source=source, min_true_for=59, timeout=timeout, execution_timeout=execution_timeout
        )
        assert built.min_true_for == 59, dag_id


def test_a_route_or_request_mode_is_checked_even_when_the_request_is_templated() -> None:
    with pytest.raises(ValueError, match=r"^t: request_mode 'fastest' is not one of"):
        _build(question="{{ params.q }}", questions={"ready": READY}, request_mode="fastest")


def test_a_state_of_the_wrong_type_is_named_once() -> None:
    with pytest.raises(ValueError) as raised:
        _build(state=42)
    assert str(raised.value) == "t: state must be a string, an array or an object, got int"


def test_plain_values_in_their_domain_are_accepted() -> None:
    sensor = _build(
        lease=False,
        lease_after=0,
        wait_on_static_state=True,
        allow_empty=True,
        deferrable=False,
        mode="poke",
        key_salt="",
        route="committee",
        request_mode="fast",
        min_interval_ms=0,
        review_assigned_users={"id": "alice", "name": "Alice"},
        review_notifiers=[print],
        review_subject="Ship it?",
    )
    assert sensor.lease_after == 0 and sensor.review_assigned_users == [{"id": "alice", "name": "Alice"}]
    assert _build("parse_time_more", lease_after=2.5, review_notifiers=print).review_notifiers == [print]


def test_a_named_error_keeps_its_class_and_field() -> None:
    with pytest.raises(SystemZeroArgumentError) as raised:
        _build(lease_after="5")
    assert raised.value.field == "lease_after" and str(raised.value).startswith("t: lease_after ")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"decide_when": "(?i)ready", "deferrable": False},
            "t: decide_when takes effect only while the sensor waits in the triggerer, and this one pokes "
            "(deferrable=False, or [operators] default_deferrable off): pass deferrable=True, or drop it",
        ),
        (
            {"decide_when": "(?i)ready", "debounce_ms": 2000, "decide_initial": False, "deferrable": False},
            "t: decide_when, debounce_ms, decide_initial=False take effect only while the sensor waits in "
            "the triggerer, and this one pokes (deferrable=False, or [operators] default_deferrable off): "
            "pass deferrable=True, or drop them",
        ),
    ],
)
def test_triggerer_only_knobs_in_a_poking_sensor_are_refused(
    tmp_path: Any, kwargs: dict[str, Any], message: str
) -> None:
    source = {"type": "file", "path": str(tmp_path / "job.log")}
    with pytest.raises(SystemZeroArgumentError) as raised:
        _build(source=source, **kwargs)
    assert str(raised.value) == message
    assert raised.value.field == "decide_when"
    # the same knobs in a deferrable sensor are what they are for
    deferred = _build("parse_time_deferred", source=source, **{**kwargs, "deferrable": True})
    assert deferred.decision_filter.active


def test_a_path_object_as_a_file_source_path_is_taken_as_its_text(
    emulator: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = ready_log(tmp_path)
    with DAG("parse_time_path_object", schedule=None, start_date=START) as dag:
        sensor = SystemZeroDecisionSensor(
            task_id="t",
            systemzero_conn_id=CONN,
            instructions=READY,
            state="",
            source={"type": "file", "path": log},  # a pathlib.Path, not its text
            deferrable=True,
            timeout=60,
        )
    assert sensor.source == {"type": "file", "path": str(log)}  # plain JSON in the trigger kwargs
    assert task_states(run_dag(dag)) == {"t": "success"}, capsys.readouterr().out
