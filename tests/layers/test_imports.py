"""The package's layers: no import cycle, and the pure decision logic imports no Airflow.

The graph is read from the source (module-level imports only: an import inside a function or
under ``if TYPE_CHECKING:`` runs later or never, so it cannot close a cycle at import time).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import airflow_provider_systemzero

PACKAGE = "airflow_provider_systemzero"
ROOT = Path(airflow_provider_systemzero.__file__).parent
PURE = f"{PACKAGE}.decisions"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The module names an import statement in module ``name`` loads."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    if node.level:
        package = name.split(".")
        if MODULES[name].name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - node.level + 1]
        base = ".".join([*package, base] if base else package)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _loaded(name: str, target: str) -> set[str]:
    """The package modules an import of ``target`` in module ``name`` runs: the deepest module the
    dotted name reaches and every package ``__init__`` above it (Python runs those first).

    A module's own parent packages are left out: Python loads them before the module, so an edge
    back to one is the package's ``__init__`` re-exporting its modules, not a cycle.
    """
    parts = target.split(".")
    modules = [".".join(parts[:end]) for end in range(len(parts), 0, -1)]
    deepest = next((module for module in modules if module in MODULES), None)
    if deepest is None:
        return set()
    return {
        module
        for module in modules[modules.index(deepest) :]
        if module in MODULES and not (name == module or name.startswith(f"{module}."))
    }


def module_level_imports(name: str, *, in_functions: bool = False) -> set[str]:
    """The package modules that importing ``name`` imports at once (with ``in_functions``, also
    the ones its functions import when they run; never those under ``if TYPE_CHECKING:``)."""
    found: set[str] = set()

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _imported(name, node):
                    found.update(_loaded(name, target))
            elif isinstance(node, ast.If) and _is_type_checking(node):
                continue
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ClassDef) or (
                in_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            ):
                visit(node.body)

    visit(ast.parse(MODULES[name].read_text(encoding="utf-8")).body)
    return found


def all_imports(path: Path) -> set[str]:
    """Every module an import statement in ``path`` names, wherever the statement is."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for following in sorted(graph.get(node, ())):
            if state.get(following) == 1:
                return [*path[path.index(following) :], following]
            if following not in state and (cycle := walk(following)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := walk(start)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_package_has_no_import_cycle() -> None:
    graph = {name: module_level_imports(name) for name in MODULES}
    assert graph[f"{PURE}.conditions"], "the import graph is empty: the walk reads nothing"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_an_import_runs_the_packages_above_the_module() -> None:
    """Importing ``stream.exceptions`` runs ``stream/__init__`` first: a cycle through a package's
    ``__init__`` is a cycle (the walk saw none when it only followed the deepest module)."""
    loaded = _loaded(f"{PURE}.budget", f"{PACKAGE}.stream.exceptions.SystemZeroError")
    assert loaded == {f"{PACKAGE}.stream.exceptions", f"{PACKAGE}.stream"}
    assert _loaded(f"{PACKAGE}.stream.settings", f"{PACKAGE}.stream.exceptions") == {
        f"{PACKAGE}.stream.exceptions"
    }


def test_no_import_inside_a_function_dodges_a_cycle() -> None:
    """An import moved into a function (where it runs later) to keep a cycle from failing at import
    time still ties the two modules both ways: with those imports counted the graph has no cycle either."""
    graph = {name: module_level_imports(name, in_functions=True) for name in MODULES}
    assert f"{PACKAGE}.compat" in graph[f"{PACKAGE}.hooks.systemzero"], "the walk misses function imports"
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle through an import inside a function: " + " -> ".join(cycle or [])


def test_the_pure_decision_package_names_no_airflow_import() -> None:
    pure = {name: path for name, path in MODULES.items() if name == PURE or name.startswith(f"{PURE}.")}
    assert {f"{PURE}.conditions", f"{PURE}.policy", f"{PURE}.budget"} <= set(pure)
    offending = {
        name: sorted(
            target for target in all_imports(path) if target == "airflow" or target.startswith("airflow.")
        )
        for name, path in pure.items()
    }
    assert not {name: targets for name, targets in offending.items() if targets}


def test_importing_the_pure_decision_package_loads_no_airflow() -> None:
    pure = sorted(name for name in MODULES if name.startswith(f"{PURE}."))
    code = (
        "import importlib, sys\n"
        f"for name in {pure!r}:\n"
        "    importlib.import_module(name)\n"
        "loaded = sorted(m for m in sys.modules if m == 'airflow' or m.startswith('airflow.'))\n"
        "print(len(sys.modules), loaded)\n"
        "sys.exit(1 if loaded else 0)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, f"importing {pure} loaded Airflow: {result.stdout}{result.stderr}"


def test_the_stream_accounting_imports_no_budget() -> None:
    """The budget observes a stream's dispatches through ``stream.accounting.DispatchBudget``: the
    accounting names no budget module, not even for type hints."""
    path = MODULES[f"{PACKAGE}.stream.accounting"]
    budgets = {f"{PACKAGE}.budget", f"{PACKAGE}.decisions.budget"}
    assert all_imports(path), "the walk reads nothing"
    assert not all_imports(path) & budgets


def test_the_observer_modules_import_first() -> None:
    """The stream's observer interface, the Airflow observer and the documented path between them
    each load in a fresh interpreter (a cycle through a package's ``__init__`` would not)."""
    for module in ("utils.observability", "stream.observer", "observability", "hooks.systemzero"):
        subprocess.run([sys.executable, "-c", f"import {PACKAGE}.{module}"], check=True, timeout=120)


#: The layers, left to right (docs/architecture.md): each one imports only the layers to its left.
LAYERS = ("protocol", "decisions", "stream", "hooks|triggers|sensors|operators|decorators|utils|plugins")


def _layer(name: str) -> int | None:
    top = name.removeprefix(f"{PACKAGE}.").split(".")[0]
    return next((rank for rank, layer in enumerate(LAYERS) if top in layer.split("|")), None)


def test_each_layer_imports_only_the_layers_to_its_left() -> None:
    """The protocol core, the pure decision logic and the stream client never import a layer to their
    right, not even inside a function (the stream asks the budget arithmetic; no budget asks the stream)."""
    assert _layer(f"{PACKAGE}.stream.settings") == 2 and _layer(f"{PACKAGE}.utils.review") == 3
    upward = sorted(
        f"{name} -> {target}"
        for name in MODULES
        if (rank := _layer(name)) is not None
        for target in module_level_imports(name, in_functions=True)
        if (target_rank := _layer(target)) is not None and target_rank > rank
    )
    assert not upward, "imports against the layers: " + ", ".join(upward)
