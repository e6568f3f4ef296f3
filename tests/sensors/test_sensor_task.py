"""The sensor's plain modules name the sensor by a protocol (``sensors/task.py``), not by its class:
the protocol must stay what they read of the sensor, and the sensor must stay a protocol instance."""

from __future__ import annotations

import ast
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_provider_systemzero.sensors import inputs, outcomes, poking
from airflow_provider_systemzero.sensors.decision import SystemZeroDecisionSensor
from airflow_provider_systemzero.sensors.task import DecisionSensorTask

PLAIN_MODULES = (inputs, outcomes, poking)


def _members() -> set[str]:
    methods = {
        name
        for name, value in vars(DecisionSensorTask).items()
        if callable(value) and not name.startswith("__")
    }
    return set(DecisionSensorTask.__annotations__) | methods


def _read_of_the_sensor(module: object) -> set[str]:
    """Every ``sensor.<name>`` the module's source reads, writes or calls."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))  # type: ignore[attr-defined]
    return {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sensor"
    }


def test_the_protocol_names_everything_the_plain_modules_read_of_the_sensor() -> None:
    read = set().union(*(_read_of_the_sensor(module) for module in PLAIN_MODULES))
    assert {"task_id", "question", "decide_with_budget"} <= read, "the walk reads nothing"
    assert read <= _members(), (
        f"read of the sensor but not in DecisionSensorTask: {sorted(read - _members())}"
    )


def test_the_sensor_has_every_member_of_the_protocol() -> None:
    with DAG("sensor_task", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC")):
        sensor = SystemZeroDecisionSensor(
            task_id="t", question="ready", instructions="Is the job ready?", state="Job is ready.", timeout=60
        )
    missing = sorted(name for name in _members() if not hasattr(sensor, name))
    assert not missing, f"DecisionSensorTask names what the sensor lacks: {missing}"
