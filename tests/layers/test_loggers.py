"""One logger per module, under its own name: a line's logger says which module wrote it.

Every ``logging.getLogger(...)`` in the package names ``__name__`` or a child of it
(``f"{__name__}.websockets"``); the few that log under another name are listed below, each with
its reason.
"""

from __future__ import annotations

import ast

from tests.helpers.modules import MODULES, PACKAGE

#: ``(module, the logger name it uses)``: why it is not the module's own.
ELSEWHERE: dict[tuple[str, str], str] = {
    (f"{PACKAGE}.stream.connection", "websockets.client"): (
        "websockets' own client logger, wrapped so that the request headers it logs lose the key"
    ),
}


def _is_module_name(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "__name__"


def _own(node: ast.expr) -> bool:
    """``__name__``, or an f-string that starts with ``__name__.``."""
    if _is_module_name(node):
        return True
    if isinstance(node, ast.JoinedStr) and len(node.values) >= 2:
        first, second = node.values[0], node.values[1]
        return (
            isinstance(first, ast.FormattedValue)
            and _is_module_name(first.value)
            and isinstance(second, ast.Constant)
            and str(second.value).startswith(".")
        )
    return False


def loggers_elsewhere() -> dict[tuple[str, str], int]:
    """Each ``getLogger`` call whose name is not its module's own: ``(module, name)`` to its line."""
    found: dict[tuple[str, str], int] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "getLogger"
                and not (node.args and _own(node.args[0]))
            ):
                name = ast.unparse(node.args[0]).strip("'\"") if node.args else "<root>"
                found[module, name] = node.lineno
    return found


def test_the_walk_tells_an_own_logger_from_another() -> None:
    call = ast.parse('logging.getLogger(f"{__name__}.websockets")').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call) and _own(call.value.args[0])
    call = ast.parse('logging.getLogger("airflow_provider_systemzero.emulator")').body[0]
    assert isinstance(call, ast.Expr) and isinstance(call.value, ast.Call) and not _own(call.value.args[0])


def test_each_module_logs_under_its_own_name() -> None:
    found = loggers_elsewhere()
    unexplained = sorted(
        f"{module}:{line} logs as {name!r}"
        for (module, name), line in found.items()
        if (module, name) not in ELSEWHERE
    )
    assert not unexplained, "a module logs under another name: " + "; ".join(unexplained)
    stale = sorted(f"{module} as {name!r}" for module, name in ELSEWHERE if (module, name) not in found)
    assert not stale, "listed as logging elsewhere but no longer does (drop it from ELSEWHERE): " + "; ".join(
        stale
    )
