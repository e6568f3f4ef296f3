"""Every module, attribute and repository path the documentation names exists.

The pages (``docs/**/*.md``), ``README.md`` and ``DESCRIPTION.md`` are read outside their fenced
code blocks (those are an author's own code). What is checked:

* a dotted name in backticks or after ``:::`` (mkdocstrings): ``airflow_provider_systemzero.x.Y``,
  or the same without the package's name when it starts with one of the package's modules
  (``stream.gateway_socket.GatewaySocket``, ``dependency_internals.release_transport``): the
  module imports and each attribute is there (an instance attribute counts: one its class
  annotates or its ``__init__`` sets);
* a path in backticks or a link (``scripts/x.py``, ``tests/…/test_x.py::test_y``,
  ``protocol/keys.py``, ``benchmarks/…``): it exists in the repository (a path inside the package
  may leave out ``airflow_provider_systemzero/``), and a named test is defined in its file;
* the names in parentheses right after a module's path (the ownership table's
  `` `decisions/budget.py` (`DecisionBudget`, `WindowBudget`) ``): attributes of that module.

Names that look like the package's but are not are listed in :data:`NOT_PACKAGE_NAMES`, each with
its reason; paths a run writes (not tracked) in :data:`WRITTEN_PATHS`.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import tomllib
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import airflow_provider_systemzero

PACKAGE = "airflow_provider_systemzero"
#: The source tree these tests belong to: the pages and the paths they name are read there.
REPO = Path(__file__).resolve().parents[1]
PACKAGE_DIR = REPO / PACKAGE
PAGES = [*sorted((REPO / "docs").rglob("*.md")), REPO / "README.md", REPO / "DESCRIPTION.md"]

#: The package's top-level modules and subpackages: a dotted name starting with one is the package's.
TOP_LEVEL = {
    path.stem
    for path in Path(airflow_provider_systemzero.__file__).parent.iterdir()
    if (path.suffix == ".py" and path.stem != "__init__") or (path / "__init__.py").is_file()
}

#: Packages of the wheel kept elsewhere in the source tree (pyproject's ``package-dir``).
MAPPED = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
    "package-dir"
]

#: Dotted names that start like one of the package's modules but name something else.
NOT_PACKAGE_NAMES = {
    "triggers.running": "an Airflow metric (the triggerer's running triggers)",
    "triggers.blocked_main_thread": "an Airflow metric",
    "triggers.failed": "an Airflow metric",
    "triggers.succeeded": "an Airflow metric",
    "stream.usage": "an author's DecisionStream variable (``stream = hook.stream(...)``) and its usage",
    "questions.NAME": "a field of the request's questions (``NAME`` stands for the question's name)",
    "questions.NAME.instructions": "a field of the request's questions, as above",
}

#: Paths a run writes (untracked), named by the pages that say where to find them.
WRITTEN_PATHS = {
    ".cache/",
    "dist/",
    "site/",
    "benchmarks/results/latest.json",
}

pytestmark = pytest.mark.skipif(
    not (REPO / "docs").is_dir() or not (PACKAGE_DIR / "__init__.py").is_file(),
    reason=f"no docs/ or {PACKAGE}/ beside the tests (a copy of tests/ run against an installed wheel)",
)

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_SPAN = re.compile(r"`([^`\n]+)`")
_DIRECTIVE = re.compile(r"^:::\s*(\S+)", re.M)
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_DOTTED = re.compile(r"^([a-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\(\))?$")
_PATH = re.compile(
    r"^[A-Za-z_][\w.\-]*(?:/[\w.\-]*)*\.(?:py|md|txt|toml|yml|yaml|json|cfg|ini|sh)(?:::\w+)?$|^[A-Za-z_.][\w.\-]*/(?:[\w.\-]+/?)*$"
)
_OWNED = re.compile(r"`([\w/.\-]+\.py)` \(((?:`[^`]+`(?:,\s*|\s*\)|\s+))+)")
_ATTRIBUTE = re.compile(r"^([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)(?:\(\))?$")


def _text(page: Path) -> str:
    """The page without its fenced code blocks (line numbers kept)."""
    text = page.read_text(encoding="utf-8")
    return _FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)


def mentions() -> Iterator[tuple[str, str, str]]:
    """``(where, kind, name)`` for each checkable mention: kind ``dotted``, ``path`` or ``owned``
    (``module path:attribute``)."""
    for page in PAGES:
        relative = page.relative_to(REPO)
        for number, line in enumerate(_text(page).splitlines(), 1):
            where = f"{relative}:{number}"
            for directive in _DIRECTIVE.findall(line):
                yield where, "dotted", directive
            for span in _SPAN.findall(line):
                if (
                    (dotted := _DOTTED.match(span))
                    and (span.startswith(f"{PACKAGE}.") or span.split(".")[0] in TOP_LEVEL)
                    and not span.endswith(".py")
                ):
                    yield where, "dotted", dotted.group(1)
                # a bare file name is the package's only when it names a top-level module
                # (`identity.py`); `spec.py` after `sources/`, an author's `airflow_local_settings.py`
                elif _PATH.match(span) and ("/" in span or span.removesuffix(".py") in TOP_LEVEL):
                    yield where, "path", span
            for target in _LINK.findall(line):
                if "://" in target or target.startswith("mailto:") or target.endswith(".md"):
                    continue
                resolved = (page.parent / target).resolve()
                if resolved.is_relative_to(REPO) and not resolved.is_relative_to(REPO / "docs"):
                    yield (
                        where,
                        "path",
                        str(resolved.relative_to(REPO)) + ("/" if target.endswith("/") else ""),
                    )
            for path, names in _OWNED.findall(line):
                for name in _SPAN.findall(names):
                    if _ATTRIBUTE.match(name):
                        yield where, "owned", f"{path}:{_ATTRIBUTE.match(name).group(1)}"  # type: ignore[union-attr]


def _has(owner: Any, name: str) -> bool:
    """Whether ``owner`` has ``name``, counting a class's instance attributes (annotated in its
    MRO, or set as ``self.<name>`` in its source). A deprecated name the docs list (changelog,
    glossary) counts without its warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        if hasattr(owner, name):
            return True
    if not inspect.isclass(owner):
        return False
    for cls in owner.__mro__:
        if name in getattr(cls, "__annotations__", {}):
            return True
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            continue
        for node in ast.walk(ast.parse(inspect.cleandoc(source) if source[:1].isspace() else source)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == name
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and isinstance(node.ctx, ast.Store)
            ):
                return True
    return False


def resolve(dotted: str) -> str | None:
    """``None`` when ``dotted`` (a name in the package) names a module or an attribute chain of
    one; otherwise what is missing."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        module_name = ".".join(parts[:end])
        try:
            owner: Any = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and not module_name.startswith(exc.name):
                raise  # the module exists but imports something missing
            continue
        break
    else:
        return f"no module {parts[0]}"
    for depth, name in enumerate(parts[end:], end):
        if not _has(owner, name):
            return f"{'.'.join(parts[:depth])} has no {name!r}"
        owner = getattr(owner, name, None)
    return None


def _mapped_problem(dotted: str) -> str | None:
    """What is missing of a name in a package kept elsewhere in the source tree (the wheel's
    ``airflow_provider_systemzero.example_dags`` is ``example_dags/``): its module's file."""
    package = next(name for name in MAPPED if dotted == name or dotted.startswith(f"{name}."))
    rest = dotted.removeprefix(package).lstrip(".").split(".")
    base = REPO / MAPPED[package]
    if base.is_dir() and (rest == [""] or (base / f"{rest[0]}.py").is_file()):
        return None
    return f"no {'.'.join(rest)} in {MAPPED[package]}/"


def _full(dotted: str) -> str:
    return dotted if dotted.startswith(f"{PACKAGE}.") or dotted == PACKAGE else f"{PACKAGE}.{dotted}"


def _path_problem(path: str) -> str | None:
    file, _, test = path.partition("::")
    if (
        any(file == written or file.startswith(written) for written in WRITTEN_PATHS if written.endswith("/"))
        or file in WRITTEN_PATHS
    ):
        return None
    found = next((base / file for base in (REPO, PACKAGE_DIR) if (base / file).exists()), None)
    if found is None:
        return "no such path"
    if test and not re.search(
        rf"^\s*(async )?def {re.escape(test)}\b|^class {re.escape(test)}\b",
        found.read_text(encoding="utf-8"),
        re.M,
    ):
        return f"{file} defines no {test}"
    return None


def problems() -> list[str]:
    found: list[str] = []
    for where, kind, name in mentions():
        if kind == "dotted":
            if name.removeprefix(f"{PACKAGE}.") in NOT_PACKAGE_NAMES:
                continue
            full = _full(name)
            mapped = any(full == package or full.startswith(f"{package}.") for package in MAPPED)
            if problem := (_mapped_problem(full) if mapped else resolve(full)):
                found.append(f"{where}: `{name}`: {problem}")
        elif kind == "path":
            if problem := _path_problem(name):
                found.append(f"{where}: `{name}`: {problem}")
        else:
            path, attribute = name.split(":")
            module = (PACKAGE / Path(path) if not path.startswith(f"{PACKAGE}/") else Path(path)).with_suffix(
                ""
            )
            dotted = ".".join(module.parts).removesuffix(".__init__")
            if (PACKAGE_DIR.parent / module.with_suffix(".py")).is_file() and (
                problem := resolve(f"{dotted}.{attribute}")
            ):
                found.append(f"{where}: `{path}` (`{attribute}`): {problem}")
    return found


def test_the_scan_finds_the_names_the_pages_use() -> None:
    """The scan reads each kind of mention (a scan that matches nothing would pass every page)."""
    seen = {(kind, name) for _, kind, name in mentions()}
    assert ("dotted", f"{PACKAGE}.triggers.decision.SystemZeroDecisionTrigger") in seen  # ::: directive
    assert ("dotted", "stream.gateway_socket.GatewaySocket") in seen  # a short name in backticks
    assert ("path", "decisions/budget.py") in seen  # a path in the package
    assert ("owned", "decisions/budget.py:DecisionBudget") in seen  # the ownership table
    assert any(kind == "path" and name.startswith("tests/") for kind, name in seen)


@pytest.mark.parametrize(
    ("name", "missing"),
    [
        ("stream.gateway_socket.GatewaySocket", False),
        ("tasks.usage.UsageBudgetMixin.billed_by_reply", False),  # set in __init__
        ("triggers.reading.SourceReading", True),
        ("budget", True),
        ("decisions.budget.NoSuchBudget", True),
    ],
)
def test_resolve_tells_a_name_that_exists(name: str, missing: bool) -> None:
    assert (resolve(_full(name)) is not None) is missing


def test_a_path_is_checked_with_its_test() -> None:
    assert _path_problem("tests/test_docs_names.py::test_a_path_is_checked_with_its_test") is None
    assert _path_problem("tests/test_docs_names.py::test_no_such_test") is not None
    assert _path_problem("scripts/rename_names.py") == "no such path"
    assert _path_problem("protocol/keys.py") is None


def test_every_listed_exception_is_still_used() -> None:
    used = {name.removeprefix(f"{PACKAGE}.") for _, kind, name in mentions() if kind == "dotted"}
    assert not [name for name in NOT_PACKAGE_NAMES if name not in used], "drop it from NOT_PACKAGE_NAMES"


def test_every_name_the_docs_use_exists() -> None:
    found = problems()
    assert not found, "the documentation names what does not exist:\n" + "\n".join(found)
