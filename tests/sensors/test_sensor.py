"""SystemZeroDecisionSensor end to end with dag.test(): deferrable with the gateway restarting
mid-wait, non-deferrable poking, and the event checks of execute_complete."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.compat import AirflowException, AirflowFailException, AirflowSkipException
from airflow_provider_systemzero.identity import task_namespace
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from airflow_provider_systemzero.sources.file import FileSource
from tests.helpers import (
    READY_RULES,
    file_sensor,
    rules_emulator,
    run_dag,
    run_dag_while,
    task_states,
    wait_until,
    xcoms_of,
)

RULES = READY_RULES
START = pendulum.datetime(2026, 1, 1, tz="UTC")


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(RULES, tmp_path_factory.mktemp("rules"), "sensor-key", "systemzero_sensor") as emu:
        yield emu


def _sensor(log: Path, **kwargs: Any) -> SystemZeroDecisionSensor:
    return file_sensor(log, "systemzero_sensor", **kwargs)


def test_gateway_restart_mid_wait_replays_and_still_fires(emulator: Any, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("started\n")
    with DAG("sensor_restart", schedule=None, start_date=START) as dag:
        _sensor(log)
    before = emulator.stats

    def restart_then_finish() -> None:
        wait_until(lambda: emulator.stats.decisions_delivered > before.decisions_delivered, timeout=60)
        with log.open("a") as handle:
            handle.write("still working\n")
        wait_until(lambda: emulator.stats.events_accepted > before.events_accepted + 1, timeout=60)
        emulator.call(lambda emu: emu.restart(retry_after_ms=300))
        wait_until(
            lambda: emulator.stats.closes_by_code.get(1012, 0) > before.closes_by_code.get(1012, 0),
            timeout=60,
        )
        with log.open("a") as handle:
            handle.write("Job is ready.\n")

    dag_run = run_dag_while(dag, restart_then_finish)
    assert dag_run.state == "success", task_states(dag_run)
    decision = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "return_value", -1)]
    assert decision["decision"] is True and decision["confidence"] == pytest.approx(0.9)
    after = emulator.stats
    assert after.closes_by_code.get(1012, 0) > before.closes_by_code.get(1012, 0)
    billed = after.decisions_billed - before.decisions_billed
    bodies = emulator.billed_bodies()
    assert len(bodies) == len(set(bodies))  # never billed twice for one state
    assert billed >= 2


def test_poke_mode_decides_on_request_each_poke(emulator: Any, tmp_path: Path) -> None:
    log = tmp_path / "job.log"
    log.write_text("started\nJob is ready.\n")
    with DAG("sensor_poke", schedule=None, start_date=START) as dag:
        _sensor(log, deferrable=False, poke_interval=0.1, mode="poke")
    dag_run = run_dag(dag)
    assert dag_run.state == "success", task_states(dag_run)
    assert xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "return_value", -1)]["decision"] is True


def _context() -> dict[str, Any]:
    # xcom_push: the sensor pushes its ``decision`` record when it fires
    return {
        "ti": SimpleNamespace(
            dag_id="d", task_id="wait", run_id="r", map_index=-1, xcom_push=lambda key, value: None
        )
    }


def test_execute_complete_is_idempotent_and_checks_ownership(tmp_path: Path) -> None:
    sensor = _sensor(tmp_path / "log")
    event = {
        "status": "success",
        "key_namespace": task_namespace("d", "wait", "r", -1),
        "question": "ready",
        "decision": True,
        "probability": 0.9,
        "confidence": 0.8,
        "reply_id": "szd_x",
        "state_version": 3,
    }
    first = sensor.execute_complete(_context(), event=dict(event))
    assert first == sensor.execute_complete(_context(), event=dict(event))  # delivered twice, same result
    with pytest.raises(AirflowException, match="belongs to another task instance"):
        sensor.execute_complete(_context(), event={**event, "key_namespace": "sz-other"})


@pytest.mark.parametrize(
    ("event", "soft_fail", "error"),
    [
        ({"status": "timeout", "message": "no decision met the condition"}, False, "AirflowSensorTimeout"),
        ({"status": "timeout", "message": "no decision met the condition"}, True, AirflowSkipException),
        (
            {"status": "error", "error_type": "authentication", "message": "HTTP 401"},
            False,
            AirflowFailException,
        ),
        ({"status": "error", "error_type": "stream_failed", "message": "closed"}, False, AirflowException),
    ],
)
def test_error_events_raise_what_airflow_expects(
    tmp_path: Path, event: dict[str, Any], soft_fail: bool, error: Any
) -> None:
    sensor = _sensor(tmp_path / "log", soft_fail=soft_fail)
    event = {**event, "key_namespace": task_namespace("d", "wait", "r", -1)}
    with pytest.raises(Exception) as info:
        sensor.execute_complete(_context(), event=event)
    if isinstance(error, str):
        assert type(info.value).__name__ == error
    else:
        assert isinstance(info.value, error)
    assert event["message"] in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"question": "ready", "instructions": None}, "instructions is required"),
        ({"questions": {"other": "x"}}, "question 'ready' is not among the questions asked"),
        ({"expect": "yes"}, "must be true or false for boolean question"),
        ({"min_confidence": 1.5}, "must be a number from 0 to 1"),
        ({"decision_mode": "sometimes"}, "decision_mode 'sometimes' is not one of"),
        ({"source": {"type": "tcp"}}, "source.type 'tcp' is not one of"),
        ({"source": {"type": "file"}}, "source.path is required"),
        (
            {"source": {"type": "file", "path": "data/job.log"}},
            "source.path 'data/job.log' is relative: the triggerer .* its own working directory, "
            "not the Dag file's; give an absolute path",
        ),
        (
            {"state": ["not", "a", "string"], "source": {"type": "file", "path": "/x"}},
            "needs a string initial",
        ),
    ],
)
def test_bad_sensor_input_fails_before_deferring(
    tmp_path: Path, kwargs: dict[str, Any], message: str
) -> None:
    base: dict[str, Any] = {
        "task_id": "wait",
        "systemzero_conn_id": "systemzero_sensor",
        "question": "ready",
        "instructions": "Is the job ready?",
    }
    base.update(kwargs)
    # a literal mistake fails when the DAG is parsed (ValueError), others when the task runs
    with pytest.raises((ValueError, AirflowFailException), match=message):
        SystemZeroDecisionSensor(**base).execute(_context())


def test_poke_mode_decides_nothing_while_the_file_has_no_content(
    emulator: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "job.log"
    reads: list[Any] = []
    read_now = FileSource.read_now

    def counted(source: FileSource) -> Any:  # the real read, counted
        reads.append(result := read_now(source))
        return result

    monkeypatch.setattr(FileSource, "read_now", counted)
    with DAG("sensor_poke_no_content", schedule=None, start_date=START) as dag:
        _sensor(log, deferrable=False, poke_interval=0.05, mode="poke")
    before = emulator.stats

    def write_after_pokes() -> None:
        wait_until(lambda: len(reads) >= 3, timeout=60, what="three pokes of the missing file")
        log.write_text("")
        wait_until(lambda: len(reads) >= 6, timeout=60, what="three pokes of the empty file")
        assert emulator.stats.decisions_dispatched == before.decisions_dispatched
        log.write_text("Job is ready.\n")

    dag_run = run_dag_while(dag, write_after_pokes)
    assert dag_run.state == "success", task_states(dag_run)
    assert emulator.stats.decisions_billed - before.decisions_billed == 1
    assert reads[:6] == [""] * 6  # the file's content: none (the sensor's initial state is empty)
