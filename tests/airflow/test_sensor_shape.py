"""The sensor stays a thin Airflow class: its logic lives in plain modules it uses."""

from __future__ import annotations

import ast
import inspect

from airflow_provider_systemzero.sensors import decision


def test_the_sensor_class_body_is_under_150_lines() -> None:
    tree = ast.parse(inspect.getsource(decision))
    (sensor,) = [node for node in tree.body if isinstance(node, ast.ClassDef)]
    docstring = sensor.body[0]
    assert isinstance(docstring, ast.Expr) and isinstance(docstring.value, ast.Constant)
    assert sensor.end_lineno is not None and docstring.end_lineno is not None
    lines = sensor.end_lineno - sensor.lineno + 1 - (docstring.end_lineno - docstring.lineno + 1)
    assert lines < 150, f"SystemZeroDecisionSensor's body is {lines} lines without its docstring"
