"""The sensor stays a thin Airflow class: its public methods are the ones Airflow calls, and the
rest of its logic lives in plain modules it uses (``sensors/inputs.py``, ``outcomes.py``,
``poking.py``, ``utils/``)."""

from __future__ import annotations

import ast
import inspect

from airflow_provider_systemzero.sensors import decision

#: what Airflow calls on a deferrable sensor
AIRFLOW_ENTRY_POINTS = {"__init__", "execute", "poke", "execute_complete"}


def test_the_sensor_class_adds_no_public_method_airflow_does_not_call() -> None:
    tree = ast.parse(inspect.getsource(decision))
    (sensor,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    methods = {node.name for node in sensor.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    public = {name for name in methods if not name.startswith("_") or name == "__init__"}
    assert public <= AIRFLOW_ENTRY_POINTS, (
        f"public methods beyond Airflow's: {sorted(public - AIRFLOW_ENTRY_POINTS)}"
    )
    assert {"execute", "poke", "execute_complete"} <= public
