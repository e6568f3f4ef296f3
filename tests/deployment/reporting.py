"""The pytest side of the deployment and UI tests: component logs on a failure, the scenario lines
in the terminal summary, and the markers that must be asked for."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.deployment.harness import RESULTS, Deployment


def logs_section(item: Any) -> tuple[str, str] | None:
    """The component logs of the deployment a pytest item used, as a report section (or ``None``)."""
    for value in getattr(item, "funcargs", {}).values():
        if isinstance(value, Deployment):
            return "component logs", value.diagnostics()
    return None


def with_logs_section(item: Any, report: Any) -> Any:
    """``report``, with the component logs of the deployment ``item`` used when it failed (the
    ``pytest_runtest_makereport`` wrapper of the deployment and UI tests)."""
    section = logs_section(item) if report.failed else None
    if section:
        report.sections.append(section)
    return report


def write_results(terminalreporter: Any, title: str, ui: bool) -> None:
    """The scenario lines of :data:`RESULTS` in a terminal summary section: the UI tests' (``ui``)
    or the deployment tests'."""
    lines = [line for line in RESULTS if line.startswith("(ui") == ui]
    if lines:
        terminalreporter.section(title)
        for line in lines:
            terminalreporter.write_line(line)


def skip_unless_marked(config: Any, items: list[Any], marker: str, reason: str) -> None:
    """Skip the items carrying ``marker`` unless the run's ``-m`` expression asks for it (``-m
    deployment``, ``-m ui``; ``not <marker>`` does not count)."""
    if re.search(rf"(?<!not )\b{marker}\b", config.getoption("markexpr", default="") or ""):
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if item.get_closest_marker(marker):
            item.add_marker(skip)
