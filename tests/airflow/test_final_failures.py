"""A failure that retrying cannot fix fails the task at once, whichever way the task decides.

The operator and the sensor decide in the triggerer (deferrable) or on their worker (the
operator's ``deferrable=False``, the sensor's poke mode). Each path reads its error the same way
(``tasks.payloads.task_failure``): a client error (4xx) the gateway did not call retryable, or
a wrong key, ends the task with no retry, while a server error (5xx) leaves Airflow's retries to
act. Each case runs the real task with ``dag.test()`` against the emulator, with one retry
allowed, and counts the tries.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.operators.decide import SystemZeroDecideOperator
from tests.helpers import (
    READY_RULES,
    file_sensor,
    rules_emulator,
    run_dag,
    systemzero_connection,
    task_states,
    task_tries,
)

START = pendulum.datetime(2026, 1, 1, tz="UTC")
CONN = "systemzero_final"
RETRY = {"retries": 1, "retry_delay": timedelta(seconds=0)}


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        READY_RULES, tmp_path_factory.mktemp("rules"), "final-key", CONN, model="sz-test"
    ) as emu:
        yield emu


def _operator(conn_id: str, deferrable: bool, _: Path) -> Any:
    return SystemZeroDecideOperator(
        task_id="decide",
        systemzero_conn_id=conn_id,
        deferrable=deferrable,
        state="Job is ready.",
        questions={"ready": "Is the job ready?"},
        decision_timeout=60,
        **RETRY,
    )


def _sensor(conn_id: str, deferrable: bool, tmp: Path) -> Any:
    log = tmp / "job.log"
    log.write_text("Job is ready.\n")
    mode = {} if deferrable else {"deferrable": False, "mode": "poke", "poke_interval": 0.1}
    return file_sensor(log, conn_id, task_id="decide", **mode, **RETRY)


TASKS: dict[str, Callable[[str, Path], Any]] = {
    "operator, deferred": lambda conn, tmp: _operator(conn, True, tmp),
    "operator, on the worker": lambda conn, tmp: _operator(conn, False, tmp),
    "sensor, deferred": lambda conn, tmp: _sensor(conn, True, tmp),
    "sensor, poking": lambda conn, tmp: _sensor(conn, False, tmp),
}


def _run(name: str, task: Callable[[str, Path], Any], conn: str, tmp: Path) -> Any:
    dag_id = "final_" + "".join(c if c.isalnum() else "_" for c in name)
    with DAG(dag_id, schedule=None, start_date=START) as dag:
        task(conn, tmp)
    return run_dag(dag)


@pytest.mark.parametrize("name", list(TASKS))
def test_a_client_error_fails_at_once(
    emulator: Any, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    emulator.call(lambda emu: emu.faults.fail_decides(2, status=400, code="invalid_request", retryable=False))
    try:
        dag_run = _run(name, TASKS[name], CONN, tmp_path)
    finally:
        emulator.call(lambda emu: emu.faults.clear())
    assert task_states(dag_run) == {"decide": "failed"}
    assert task_tries(dag_run)["decide"] == 1  # the retry allowed was not spent
    assert "HTTP 400, code invalid_request; not retryable" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["operator, on the worker", "sensor, poking", "sensor, deferred"])
def test_a_wrong_key_fails_at_once(emulator: Any, name: str, tmp_path: Path) -> None:
    with systemzero_connection("systemzero_final_wrong", emulator.origin, "not-the-key", model="sz-test"):
        dag_run = _run(name + " wrong key", TASKS[name], "systemzero_final_wrong", tmp_path)
    assert task_states(dag_run) == {"decide": "failed"}
    assert task_tries(dag_run)["decide"] == 1


@pytest.mark.parametrize("name", ["operator, deferred", "sensor, poking"])
def test_an_upgrade_refused_for_good_fails_at_once(
    emulator: Any, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a 400 on the upgrade: the client does not retry it, and neither does Airflow
    emulator.call(
        lambda emu: emu.faults.refuse_upgrades(2, status=400, code="invalid_request", retry_after_s=None)
    )
    try:
        dag_run = _run(name + " upgrade refused", TASKS[name], CONN, tmp_path)
    finally:
        emulator.call(lambda emu: emu.faults.clear())
    assert task_states(dag_run) == {"decide": "failed"}
    assert task_tries(dag_run)["decide"] == 1
    assert "refused the stream upgrade with HTTP 400" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["operator, on the worker", "sensor, poking"])
def test_a_server_error_is_left_to_airflows_retries(emulator: Any, name: str, tmp_path: Path) -> None:
    # one failure the gateway does not call retryable, with a server's status: the next try decides
    emulator.call(lambda emu: emu.faults.fail_decides(1, status=500, code="internal", retryable=False))
    try:
        dag_run = _run(name + " server error", TASKS[name], CONN, tmp_path)
    finally:
        emulator.call(lambda emu: emu.faults.clear())
    assert dag_run.state == "success", task_states(dag_run)
    assert task_tries(dag_run)["decide"] == 2
