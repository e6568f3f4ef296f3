"""The sensor with decide_when: parse-time checks, and a deferrable run through dag.test() against
the real emulator (a tailed file gains irrelevant lines, then the decisive one)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest
from airflow.sdk import DAG

from airflow_provider_systemzero.exceptions import SystemZeroArgumentError
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from tests.helpers import (
    READY_RULES,
    file_sensor,
    rules_emulator,
    run_dag_while,
    task_states,
    wait_until,
    xcoms_of,
)

START = pendulum.datetime(2026, 1, 1, tz="UTC")


@pytest.fixture(scope="module")
def emulator(airflow_db: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with rules_emulator(
        READY_RULES, tmp_path_factory.mktemp("rules"), "spend-key", "systemzero_spend"
    ) as emu:
        yield emu


def _sensor(log: Path, **kwargs: Any) -> SystemZeroDecisionSensor:
    return file_sensor(log, "systemzero_spend", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"decide_when": "([unclosed"}, "decide_when"),
        ({"decide_when": {"callable": "not a path"}}, "decide_when.callable"),
        ({"debounce_ms": -5}, "debounce_ms"),
        ({"decide_initial": "yes"}, "decide_initial"),
    ],
)
def test_bad_arguments_fail_the_dag_at_parse_time(tmp_path: Path, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(SystemZeroArgumentError) as info:
        _sensor(tmp_path / "job.log", **kwargs)
    assert info.value.field == field and field in str(info.value)


def test_decide_initial_false_needs_a_source() -> None:
    with pytest.raises(SystemZeroArgumentError, match="nothing would ever be decided") as info:
        SystemZeroDecisionSensor(
            task_id="wait", instructions="Is the job ready?", state="log\n", decide_initial=False
        )
    assert info.value.field == "decide_initial"


def test_the_knobs_reach_the_trigger(tmp_path: Path) -> None:
    sensor = _sensor(tmp_path / "job.log", decide_when=r"(?i)job is ready", debounce_ms=250)
    inputs = sensor.parse_inputs()
    kwargs = sensor.trigger_kwargs(
        inputs, namespace="ns", deadline=None, budget=sensor.start_trigger_budget(), skip=[]
    )
    assert kwargs["decide_when"] == r"(?i)job is ready" and kwargs["debounce_ms"] == 250
    assert "decide_initial" not in kwargs  # the default is not spelled out


def test_deferrable_sensor_with_decide_when_bills_the_initial_and_the_decisive_line(
    emulator: Any, tmp_path: Path
) -> None:
    log = tmp_path / "job.log"
    log.write_text("started\n")
    with DAG("sensor_decide_when", schedule=None, start_date=START) as dag:
        _sensor(log, decide_when=r"(?im)^job is ready")
    before = emulator.stats

    def write_lines() -> None:
        wait_until(lambda: emulator.stats.decisions_billed > before.decisions_billed, timeout=60)
        for number in range(1, 4):
            with log.open("a") as handle:
                handle.write(f"step {number} done\n")
            wait_until(
                lambda n=number: emulator.stats.events_accepted >= before.events_accepted + 1 + n, timeout=60
            )
        with log.open("a") as handle:
            handle.write("Job is ready.\n")

    dag_run = run_dag_while(dag, write_lines)
    assert dag_run.state == "success", task_states(dag_run)
    decision = xcoms_of(dag.dag_id, dag_run.run_id)[("wait", "return_value", -1)]
    assert decision["decision"] is True
    after = emulator.stats
    assert after.events_accepted - before.events_accepted >= 5  # every line reached the gateway
    assert after.decisions_billed - before.decisions_billed == 2  # the initial state and the decisive line
