"""The Airflow layer's seams are typed, and exceptions are told apart by class, not by name.

Read from the source: a parameter or attribute that carries one of the provider's own objects
(a stream, a trigger, a hook, a store, a budget, a source, a task, a log) names its type or a
``Protocol``; ``Any`` is left to values that are arbitrary author input. And nowhere outside the
stream client (whose network diagnosis has its own owner) is an exception matched by comparing
its class's name with a string.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import airflow_provider_systemzero

ROOT = Path(airflow_provider_systemzero.__file__).parent
AIRFLOW_LAYER = ("triggers", "sensors", "operators", "tasks", "decorators", "hooks")
#: Names that always carry one of the provider's objects, never arbitrary input.
SEAMS = frozenset(
    {"stream", "trigger", "hook", "store", "budget", "source", "task", "log", "driver", "watch"}
)


def _files(folders: tuple[str, ...]) -> list[Path]:
    return [path for folder in folders for path in sorted((ROOT / folder).rglob("*.py"))]


def _is_any(annotation: ast.expr | None) -> bool:
    return isinstance(annotation, ast.Name) and annotation.id == "Any"


def _untyped_seams(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.arg) and node.arg in SEAMS and _is_any(node.annotation):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} parameter {node.arg}: Any")
        elif isinstance(node, ast.AnnAssign) and _is_any(node.annotation):
            target = node.target
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
            if name.lstrip("_") in SEAMS:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} attribute {name}: Any")
    return found


@pytest.mark.parametrize("path", _files(AIRFLOW_LAYER), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_seam_names_its_type(path: Path) -> None:
    assert _untyped_seams(path) == []


def _name_matches(path: Path) -> list[str]:
    """``type(e).__name__ == "X"`` / ``e.__class__.__name__ in (...)``: a class told by its name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            if isinstance(side, ast.Attribute) and side.attr in ("__name__", "__qualname__"):
                owner = side.value
                if (isinstance(owner, ast.Call) and getattr(owner.func, "id", None) == "type") or (
                    isinstance(owner, ast.Attribute) and owner.attr == "__class__"
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    return found


def test_no_exception_is_matched_by_its_class_name_outside_the_stream_client() -> None:
    outside = [path for path in sorted(ROOT.rglob("*.py")) if path.relative_to(ROOT).parts[0] != "stream"]
    assert [hit for path in outside for hit in _name_matches(path)] == []
