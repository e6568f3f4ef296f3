"""The package's layers: no import cycle, and each layer imports only the layers to its left.

The graph is read from the source and counts every import statement wherever it stands: at module
level, inside a function (it runs later, but it still ties the two modules both ways) and under
``if TYPE_CHECKING:`` (it never runs, but a type named across a loop is the same loop). A cycle
cannot hide behind a deferred import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.modules import MODULES, PACKAGE

PURE = f"{PACKAGE}.decisions"


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


def module_level_imports(name: str, *, deferred: bool = False, source: str | None = None) -> set[str]:
    """The package modules that importing ``name`` imports at once; with ``deferred``, every
    package module an import statement of ``name`` names wherever it stands (inside a function,
    under ``if TYPE_CHECKING:``). ``source`` stands in for the module's file."""
    found: set[str] = set()

    def add(node: ast.Import | ast.ImportFrom) -> None:
        for target in _imported(name, node):
            found.update(_loaded(name, target))

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Import | ast.ImportFrom):
                add(node)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                continue
            elif isinstance(node, ast.If | ast.Try | ast.With | ast.For | ast.While):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(node, field, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if source is None else source)
    if deferred:
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                add(node)
    else:
        visit(tree.body)
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


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected parts of ``graph`` that hold a cycle (Tarjan's algorithm): the modules
    of each part all reach each other."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    parts: list[set[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for following in sorted(graph.get(node, ())):
            if following not in index:
                connect(following)
                low[node] = min(low[node], low[following])
            elif following in stack:
                low[node] = min(low[node], index[following])
        if low[node] == index[node]:
            part = set()
            while not part or node not in part:
                part.add(stack.pop())
            if len(part) > 1 or node in graph.get(node, ()):
                parts.append(part)

    for start in sorted(graph):
        if start not in index:
            connect(start)
    return sorted(parts, key=min)


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each tangle of ``graph``, each a path that ends where it starts; empty when
    the graph has no cycle."""
    return [_cycle_in(graph, part) for part in tangles(graph)]


def _cycle_in(graph: dict[str, set[str]], part: set[str]) -> list[str]:
    """The shortest cycle through the first module of ``part`` (breadth first, inside the part)."""
    start = min(part)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following_frontier = []
        for node in frontier:
            for following in sorted(graph[node] & part):
                if following == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start] if node != start else [start, start]
                if following not in came_from:
                    came_from[following] = node
                    following_frontier.append(following)
        frontier = following_frontier
    raise AssertionError(f"no cycle through {start} in {sorted(part)}")


def _short(name: str) -> str:
    return name.removeprefix(f"{PACKAGE}.")


def describe_tangles(graph: dict[str, set[str]]) -> str:
    """Each tangle of ``graph`` as one of its cycles and every import inside it (what to untie)."""
    return "\n".join(
        " -> ".join(map(_short, _cycle_in(graph, part)))
        + " (imports in this loop: "
        + ", ".join(f"{_short(a)} -> {_short(b)}" for a in sorted(part) for b in sorted(graph[a] & part))
        + ")"
        for part in tangles(graph)
    )


def test_the_cycle_finder_finds_every_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"e"}, "e": {"d", "f"}, "f": set(), "g": {"g"}}
    assert find_cycles(graph) == [["a", "b", "c", "a"], ["d", "e", "d"], ["g", "g"]]
    assert find_cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_the_walk_counts_deferred_imports() -> None:
    """An import inside a function and one under ``if TYPE_CHECKING:`` are edges of the graph."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        f"    from {PACKAGE}.stream.observer import StreamObserver\n"
        "def configure():\n"
        f"    from {PACKAGE}.compat import conf\n"
    )
    name = f"{PURE}.budget"
    assert module_level_imports(name, source=source) == set()
    assert module_level_imports(name, deferred=True, source=source) == {
        f"{PACKAGE}.stream",
        f"{PACKAGE}.stream.observer",
        f"{PACKAGE}.compat",
    }


def test_the_package_has_no_import_cycle() -> None:
    """No cycle at import time, nor through an import inside a function (it runs later, to dodge a
    cycle that still ties the two modules both ways) or under ``if TYPE_CHECKING:``."""
    graph = {name: module_level_imports(name, deferred=True) for name in MODULES}
    assert graph[f"{PURE}.conditions"], "the import graph is empty: the walk reads nothing"
    assert not find_cycles(graph), "import cycles:\n" + describe_tangles(graph)


def test_an_import_runs_the_packages_above_the_module() -> None:
    """Importing ``stream.exceptions`` runs ``stream/__init__`` first: a cycle through a package's
    ``__init__`` is a cycle (the walk saw none when it only followed the deepest module)."""
    loaded = _loaded(f"{PURE}.budget", f"{PACKAGE}.stream.exceptions.SystemZeroError")
    assert loaded == {f"{PACKAGE}.stream.exceptions", f"{PACKAGE}.stream"}
    assert _loaded(f"{PACKAGE}.stream.settings", f"{PACKAGE}.stream.exceptions") == {
        f"{PACKAGE}.stream.exceptions"
    }


def test_from_a_package_import_a_module_is_an_edge_to_the_module() -> None:
    node = ast.parse(f"from {PACKAGE}.sensors import inputs as sz_inputs").body[0]
    assert isinstance(node, ast.ImportFrom)
    loaded = {
        target
        for name in _imported(f"{PACKAGE}.operators.decide", node)
        for target in _loaded(f"{PACKAGE}.operators.decide", name)
    }
    assert loaded == {f"{PACKAGE}.sensors", f"{PACKAGE}.sensors.inputs"}


def _package(folder: str) -> dict[str, Path]:
    prefix = f"{PACKAGE}.{folder}"
    return {name: path for name, path in MODULES.items() if name == prefix or name.startswith(f"{prefix}.")}


@pytest.mark.parametrize("folder", ["protocol", "decisions", "stream"])
def test_the_layers_below_the_airflow_classes_name_no_airflow_import(folder: str) -> None:
    """The protocol core, the pure decision logic and the stream client name no Airflow module, not
    even inside a function or for a type hint."""
    modules = _package(folder)
    assert len(modules) > 3, f"{folder}/ holds no modules: the check reads nothing"
    offending = {
        name: sorted(
            target for target in all_imports(path) if target == "airflow" or target.startswith("airflow.")
        )
        for name, path in modules.items()
    }
    assert not {name: targets for name, targets in offending.items() if targets}


def test_the_protocol_core_imports_only_itself() -> None:
    """``protocol/`` is sans-I/O and self-contained: it imports no other module of the package (no
    stream, no Airflow glue, no shared helper), wherever the import stands."""
    core = _package("protocol")
    outside = sorted(
        f"{_short(name)} -> {_short(target)}"
        for name in core
        for target in module_level_imports(name, deferred=True)
        if target not in core and target != PACKAGE
    )
    assert module_level_imports(f"{PACKAGE}.protocol.client", deferred=True), "the walk reads nothing"
    assert not outside, "the protocol core imports outside protocol/: " + ", ".join(outside)
    io = {"asyncio", "socket", "selectors", "ssl", "websockets"}
    for name, path in core.items():
        named = {target.split(".")[0] for target in all_imports(path)}
        assert not named & io, f"{_short(name)} imports I/O: {sorted(named & io)}"


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


def test_the_stream_imports_the_budget_one_way() -> None:
    """The stream's accounting asks the budget by its own type
    (:class:`~airflow_provider_systemzero.decisions.budget.DecisionBudget`), with no interface of
    its own in between: that holds because the budget, and the decisions layer it lives in, import
    nothing of the stream."""
    accounting = MODULES[f"{PACKAGE}.stream.accounting"]
    assert f"{PACKAGE}.decisions.budget" in all_imports(accounting)
    bases = {
        ast.unparse(base)
        for node in ast.walk(ast.parse(accounting.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef)
        for base in node.bases
    }
    assert "Protocol" not in bases, "the budget's interface is the budget itself"
    decisions = [path for name, path in MODULES.items() if name.startswith(f"{PACKAGE}.decisions.")]
    assert decisions, "the walk reads nothing"
    for path in decisions:
        stream = {name for name in all_imports(path) if name.startswith(f"{PACKAGE}.stream")}
        assert not stream, f"{path.name} imports {sorted(stream)}: the stream imports the budget, not back"


def test_the_observer_modules_import_first() -> None:
    """The stream's observer interface, the Airflow observer and the documented path between them
    each load in a fresh interpreter (a cycle through a package's ``__init__`` would not)."""
    for module in ("tasks.observability", "stream.observer", "observability", "hooks.systemzero"):
        subprocess.run([sys.executable, "-c", f"import {PACKAGE}.{module}"], check=True, timeout=120)


#: The layers, left to right (docs/architecture.md): each one imports only the layers to its left.
LAYERS = ("protocol", "decisions", "stream", "hooks|triggers|sensors|operators|decorators|tasks|plugins")


def _part(name: str) -> str:
    """The part a module belongs to: its folder under the package (a top-level module is a part)."""
    return name.removeprefix(f"{PACKAGE}.").split(".")[0]


def _layer(name: str) -> int | None:
    top = _part(name)
    return next((rank for rank, layer in enumerate(LAYERS) if top in layer.split("|")), None)


def test_each_layer_imports_only_the_layers_to_its_left() -> None:
    """The protocol core, the pure decision logic and the stream client never import a layer to their
    right, not even inside a function (the stream asks the budget arithmetic; no budget asks the stream)."""
    assert _layer(f"{PACKAGE}.stream.settings") == 2 and _layer(f"{PACKAGE}.tasks.review") == 3
    upward = sorted(
        f"{name} -> {target}"
        for name in MODULES
        if (rank := _layer(name)) is not None
        for target in module_level_imports(name, deferred=True)
        if (target_rank := _layer(target)) is not None and target_rank > rank
    )
    assert not upward, "imports against the layers: " + ", ".join(upward)


def test_the_glue_imports_no_hook() -> None:
    """``tasks/`` (the Airflow glue the tasks share) is what the hook and the tasks are built on (the hook imports its observer): a
    function of the glue that builds a hook belongs with the hook, not behind a deferred import."""
    glue = _package("tasks")
    assert f"{PACKAGE}.tasks.checks" in glue, "the check reads nothing"
    upward = sorted(
        f"{_short(name)} -> {_short(target)}"
        for name in glue
        for target in module_level_imports(name, deferred=True)
        if _short(target).split(".")[0] == "hooks"
    )
    assert not upward, "the glue imports the hook: " + ", ".join(upward)


def test_the_parts_import_no_cycle() -> None:
    """No two parts (``hooks/``, ``triggers/``, ``tasks/``, ``timestamps.py``…) import each other,
    through any chain and with deferred imports counted: each part builds on the ones below it."""
    graph: dict[str, set[str]] = {}
    for name in MODULES:
        if name == PACKAGE:
            continue
        edges = graph.setdefault(_part(name), set())
        edges.update(
            _part(target)
            for target in module_level_imports(name, deferred=True)
            if target != PACKAGE and _part(target) != _part(name)
        )
    assert graph["triggers"] >= {"sources", "hooks"}, "the part graph reads nothing"
    assert not find_cycles(graph), "cycles between parts:\n" + describe_tangles(graph)
