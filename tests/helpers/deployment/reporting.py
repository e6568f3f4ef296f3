"""The pytest side of the deployment and UI tests: component logs on a failure, the scenario lines
in the terminal summary, and the markers that must be asked for."""

from __future__ import annotations

import contextlib
import json
import re
from datetime import datetime
from typing import Any

import pytest

from tests.helpers.deployment.harness import RESULTS, Deployment


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


def trigger_spans(
    deployment: Deployment, dag_id: str, run_id: str
) -> dict[str, dict[int, tuple[float, float]]]:
    """Task ID -> triggerer job ID -> (first, last) epoch seconds of the lines that triggerer wrote
    to the task's trigger log (``attempt=N.log.trigger.<job ID>.log``, JSON lines with a timestamp):
    when each triggerer ran the task's trigger."""
    spans: dict[str, dict[int, tuple[float, float]]] = {}
    base = deployment.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}"
    for path in base.glob("task_id=*/attempt=*.log.trigger.*.log"):
        task = path.parent.name.removeprefix("task_id=")
        job = int(path.name.rsplit(".", 2)[-2])
        stamps = []
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError, KeyError, TypeError, AttributeError):
                stamps.append(
                    datetime.fromisoformat(json.loads(line)["timestamp"].replace("Z", "+00:00")).timestamp()
                )
        if stamps:
            first, last = spans.setdefault(task, {}).get(job, (min(stamps), max(stamps)))
            spans[task][job] = (min(first, *stamps), max(last, *stamps))
    return spans


def double_runs(spans: dict[str, dict[int, tuple[float, float]]]) -> dict[str, float]:
    """Task ID -> seconds during which two triggerers both ran its trigger (only tasks with any)."""
    out = {}
    for task, by_job in spans.items():
        ranges = sorted(by_job.values())
        overlap = max(
            (min(a[1], b[1]) - max(a[0], b[0]) for i, a in enumerate(ranges) for b in ranges[i + 1 :]),
            default=0.0,
        )
        if overlap > 0:
            out[task] = overlap
    return out
